//! The `gguf-bpe` tokenizer: GPT-2 style byte-level BPE from a GGUF vocabulary.
//!
//! The BPE merging itself runs in the `tokenizers` crate (a `BPE` model behind a
//! `Sequence` of `Split` regex pre-tokenizers and a `ByteLevel` byte mapper).
//! What sits around it follows llama.cpp's `llama-vocab.cpp`:
//!
//! * the pre-tokenizer regex list is chosen by `tokenizer.ggml.pre` exactly as the
//!   `llm_tokenizer_bpe` constructor chooses it, and each regex splits the pieces
//!   left by the previous one (llama.cpp's `unicode_regex_split`);
//! * special tokens are cut out of the text before any of that, the way
//!   `tokenizer_st_partition` does it: longest token text first, every occurrence,
//!   control/unknown tokens only when `parse_special`, user-defined tokens always.

use std::collections::HashMap;

use aho_corasick::AhoCorasick;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::TokenizerError;

// ---------------------------------------------------------------------------
// Pre-tokenizer regexes (llama.cpp `llm_tokenizer_bpe`)
// ---------------------------------------------------------------------------

/// GPT-2's word regex without the trailing `|\s+` alternative (as llama.cpp writes it;
/// the dropped alternative only ever matches text that would be left over as its own
/// piece anyway).
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's regex as llama.cpp adapts it (case-insensitive contractions spelled out).
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's regex: Llama 3's with single digits.
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's regex (GPT-4o, gpt-oss) as llama.cpp adapts it: tiktoken's letter
/// classes (`[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*` then `[\p{Ll}\p{Lm}\p{Lo}\p{M}]+`)
/// become "letters that are not a-z" then "letters that are not A-Z", so it
/// splits as llama.cpp does, which differs from tiktoken on some non-ASCII text.
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// BLOOM / Poro / GPT3-Finnish.
const RE_BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// How one `tokenizer.ggml.pre` value pre-tokenizes, and the flags llama.cpp ties to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PreTokenizerSpec {
    /// The llama.cpp pre-tokenizer type this name maps to (for messages and tests).
    pub family: &'static str,
    /// Regexes applied one after the other, each splitting the pieces of the last.
    pub regexes: Vec<&'static str>,
    /// Take a whole pre-tokenized word as one token when it is in the vocabulary,
    /// before any merging (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` when `tokenizer.ggml.add_bos_token` is absent.
    pub default_add_bos: bool,
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: key absent, which
/// llama.cpp treats as `default`, with a warning about degraded quality).
pub(crate) fn pre_tokenizer_spec(pre: Option<&str>) -> Result<PreTokenizerSpec, TokenizerError> {
    let spec =
        |family, regexes: &[&'static str], ignore_merges, default_add_bos| PreTokenizerSpec {
            family,
            regexes: regexes.to_vec(),
            ignore_merges,
            default_add_bos,
        };
    let name = pre.unwrap_or("default");
    Ok(match name {
        "default" => spec(
            "default",
            &[
                r"[\p{P}\$\+<=>\^~\|]+",
                RE_GPT2,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            false,
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            spec("llama3", &[RE_LLAMA3], true, true)
        }
        "dbrx" | "smaug-bpe" => spec("llama3", &[RE_LLAMA3], false, false),
        "chatglm-bpe" | "glm4" => spec("chatglm4", &[RE_LLAMA3], false, false),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => {
            spec("qwen2", &[RE_QWEN2], false, false)
        }
        "falcon" => spec(
            "falcon",
            &[r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        // llama.cpp puts smollm with starcoder: every digit on its own, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            spec("smollm", &[r"\p{N}", RE_GPT2], false, false)
        }
        // llama.cpp spells it "gpt-2"; "gpt2" is accepted as the same thing.
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
        | "gigachat" | "mpt" | "olmo" | "jais" => spec("gpt2", &[RE_GPT2], false, false),
        "bloom" | "poro-chat" | "gpt3-finnish" => spec("bloom", &[RE_BLOOM], false, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => spec("gpt4o", &[RE_GPT4O], false, false),
        "viking" => spec("viking", &[RE_BLOOM, r"\p{N}"], false, false),
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    })
}

// ---------------------------------------------------------------------------
// GPT-2 byte <-> unicode alphabet
// ---------------------------------------------------------------------------

/// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes (controls, space, DEL, NBSP, soft hyphen...) take the code points
/// from U+0100 up, in byte order. So `Ġ` (U+0120) is the space byte, `Ċ` newline.
pub(crate) fn byte_to_unicode() -> [char; 256] {
    let keeps_itself = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[b as usize] = if keeps_itself(b) {
            b as char
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are chars");
            next += 1;
            c
        };
    }
    table
}

/// The reverse of [`byte_to_unicode`], as a lookup from char to byte.
pub(crate) fn unicode_to_byte() -> HashMap<char, u8> {
    byte_to_unicode()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// The bytes a byte-level token text stands for. Characters outside the alphabet
/// (which a well-formed vocabulary never has) are kept as their own UTF-8 bytes.
pub(crate) fn byte_level_decode(text: &str, map: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match map.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Building the `tokenizers` pipeline
// ---------------------------------------------------------------------------

/// An added token for the `tokenizers` instance: its text and whether it is
/// special (control/unknown: matched only with `parse_special`) or user-defined.
pub(crate) struct AddedSpec<'a> {
    pub text: &'a str,
    pub special: bool,
}

/// What building reports back besides the tokenizer.
pub(crate) struct BuiltBpe {
    pub tokenizer: tokenizers::Tokenizer,
    /// Merges left out because a part or the result is not in the vocabulary
    /// (the `tokenizers` BPE cannot represent them) or that repeat an earlier pair.
    pub skipped_merges: usize,
}

/// Builds the byte-level BPE pipeline: model, pre-tokenizer, decoder, added tokens.
///
/// `vocab_texts` are the token strings by id, already made unique and non-empty.
/// Special added tokens are registered but never split out by `tokenizers` itself
/// (`encode_special_tokens` is on): the caller partitions special tokens the
/// llama.cpp way and hands only the plain text in between to this tokenizer.
pub(crate) fn build(
    vocab_texts: &[String],
    merges: &[String],
    pre: &PreTokenizerSpec,
    added: &[AddedSpec<'_>],
) -> Result<BuiltBpe, TokenizerError> {
    let vocab: Vocab = vocab_texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();

    // llama.cpp splits "a b" at the first space after the first byte and keeps the
    // first rank of a repeated pair; `tokenizers` would keep the last one and
    // refuses merges whose parts or result are not tokens.
    let mut seen = std::collections::HashSet::with_capacity(merges.len());
    let mut pairs = Vec::with_capacity(merges.len());
    let mut skipped = 0usize;
    for m in merges {
        let split = m
            .as_bytes()
            .iter()
            .skip(1)
            .position(|&c| c == b' ')
            .map(|p| p + 1);
        let Some(pos) = split else {
            skipped += 1;
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        let joined = format!("{a}{b}");
        if !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&joined) {
            skipped += 1;
            continue;
        }
        if !seen.insert((a.to_string(), b.to_string())) {
            skipped += 1;
            continue;
        }
        pairs.push((a.to_string(), b.to_string()));
    }

    let missing_bytes: String = byte_to_unicode()
        .iter()
        .filter(|c| !vocab.contains_key(c.to_string().as_str()))
        .map(|c| format!("\\x{{{:X}}}", *c as u32))
        .collect();

    let model = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Build(format!("BPE model: {e}")))?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for re in &pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    // Bytes whose character is not a token (SmolLM2 lacks 21 of the 256) never
    // merge with a neighbour in llama.cpp and are dropped from its output;
    // `tokenizers` would drop them *before* merging and let their neighbours merge
    // across the gap. So the words are cut there, the byte removed.
    if !missing_bytes.is_empty() {
        let re = format!("[{missing_bytes}]");
        let split = Split::new(
            SplitPattern::Regex(re.clone()),
            SplitDelimiterBehavior::Removed,
            false,
        )
        .map_err(|e| TokenizerError::Build(format!("byte split regex {re:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }

    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
    tokenizer.with_decoder(Some(ByteLevel::new(false, false, false)));

    let specials: Vec<AddedToken> = added
        .iter()
        .filter(|a| a.special)
        .map(|a| AddedToken::from(a.text.to_string(), true))
        .collect();
    let user: Vec<AddedToken> = added
        .iter()
        .filter(|a| !a.special)
        .map(|a| AddedToken::from(a.text.to_string(), false).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&specials);
    tokenizer.add_tokens(&user);
    tokenizer.set_encode_special_tokens(true);

    Ok(BuiltBpe {
        tokenizer,
        skipped_merges: skipped,
    })
}

// ---------------------------------------------------------------------------
// Special-token partition (llama.cpp `tokenizer_st_partition`)
// ---------------------------------------------------------------------------

/// A special token as the partition sees it.
#[derive(Debug, Clone)]
pub(crate) struct SpecialToken {
    pub id: u32,
    pub text: String,
    /// Control or unknown: only cut out when parsing special tokens.
    /// Otherwise (user-defined) it is always cut out.
    pub control_like: bool,
}

/// A piece of the input after the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// The special tokens the partition cuts out, longest text first, with an
/// automaton that finds in one pass which of them occur in a text. Gemma 3
/// has thousands of them, and trying each with `str::find` on every prompt
/// was measurable (benches/results/code-comment-figures.md); the automaton
/// leaves the few that occur.
pub(crate) struct SpecialTokens {
    list: Vec<SpecialToken>,
    finder: Option<AhoCorasick>,
}

impl SpecialTokens {
    /// `list` in any order; tokens without text are dropped and the rest
    /// sorted longest text first (stable, so equal lengths keep their
    /// order, as llama.cpp's sort leaves them).
    pub fn new(mut list: Vec<SpecialToken>) -> Result<Self, TokenizerError> {
        list.retain(|s| !s.text.is_empty());
        list.sort_by_key(|s| std::cmp::Reverse(s.text.len()));
        let finder = if list.is_empty() {
            None
        } else {
            let built = AhoCorasick::new(list.iter().map(|s| s.text.as_str()))
                .map_err(|e| TokenizerError::Build(format!("special tokens: {e}")))?;
            Some(built)
        };
        Ok(Self { list, finder })
    }

    pub fn iter(&self) -> impl Iterator<Item = &SpecialToken> {
        self.list.iter()
    }

    /// [`partition`] over the special tokens that occur in `text` (a token
    /// that is not in the text is in none of its fragments, so leaving it
    /// out changes nothing).
    pub fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let Some(finder) = &self.finder else {
            return partition(text, [], parse_special);
        };
        let mut present = vec![false; self.list.len()];
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        let found = self.list.iter().zip(present).filter(|(_, p)| *p);
        partition(text, found.map(|(s, _)| s), parse_special)
    }
}

/// Cuts special tokens out of `text`. `specials` must be ordered longest text first;
/// each one in turn is cut out of every text fragment still left, all occurrences,
/// left to right, so a longer token wins over a shorter one inside it.
pub(crate) fn partition<'a, 's>(
    text: &'a str,
    specials: impl IntoIterator<Item = &'s SpecialToken>,
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(text));
    for sp in specials {
        if sp.text.is_empty() || (!parse_special && sp.control_like) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for frag in frags.drain(..) {
            let Fragment::Text(mut rest) = frag else {
                next.push(frag);
                continue;
            };
            while let Some(at) = rest.find(sp.text.as_str()) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(sp.id));
                rest = &rest[at + sp.text.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2_landmarks() {
        let t = byte_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'\t' as usize], 'ĉ');
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        // Same alphabet as the `tokenizers` crate's ByteLevel.
        let theirs: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(distinct, theirs);
    }

    #[test]
    fn byte_table_agrees_with_tokenizers_byte_level() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        // Every byte value that can occur in UTF-8 text, in a string.
        let text: String = (0u32..0x800).filter_map(char::from_u32).collect::<String>() + "😀";
        let mut pre = PreTokenizedString::from(text.as_str());
        ByteLevel::new(false, false, false)
            .pre_tokenize(&mut pre)
            .unwrap();
        let mapped: String = pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect();
        let t = byte_to_unicode();
        let ours: String = text.bytes().map(|b| t[b as usize]).collect();
        assert_eq!(mapped, ours);
        assert_eq!(
            byte_level_decode(&ours, &unicode_to_byte()),
            text.as_bytes()
        );
    }

    #[test]
    fn pre_tokenizer_names() {
        assert_eq!(
            pre_tokenizer_spec(Some("smollm")).unwrap().regexes,
            vec![r"\p{N}", RE_GPT2]
        );
        assert_eq!(pre_tokenizer_spec(Some("gpt2")).unwrap().family, "gpt2");
        assert_eq!(pre_tokenizer_spec(Some("gpt-2")).unwrap().family, "gpt2");
        let l3 = pre_tokenizer_spec(Some("llama-bpe")).unwrap();
        assert!(l3.ignore_merges && l3.default_add_bos);
        assert_eq!(pre_tokenizer_spec(Some("qwen2")).unwrap().family, "qwen2");
        assert_eq!(pre_tokenizer_spec(None).unwrap().family, "default");
        assert!(matches!(
            pre_tokenizer_spec(Some("no-such-pre")),
            Err(TokenizerError::UnknownPreTokenizer(n)) if n == "no-such-pre"
        ));
        // Every regex compiles.
        for name in [
            "default", "llama3", "dbrx", "glm4", "qwen2", "falcon", "smollm", "gpt2", "bloom",
            "viking", "gpt-4o",
        ] {
            for re in pre_tokenizer_spec(Some(name)).unwrap().regexes {
                fancy_regex_compiles(re);
            }
        }
    }

    fn fancy_regex_compiles(re: &str) {
        Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap_or_else(|e| panic!("{re}: {e}"));
    }

    #[test]
    fn partition_longest_first_and_parse_special() {
        let sp = |id, text: &str, control_like| SpecialToken {
            id,
            text: text.to_string(),
            control_like,
        };
        // Longest first, as the tokenizer sorts them.
        let specials = vec![
            sp(1, "<|im_start|>", true),
            sp(2, "<|im", false),
            sp(3, "<x>", true),
        ];
        let f = partition("a<|im_start|>b<|imc<x>", &specials, true);
        assert_eq!(
            f,
            vec![
                Fragment::Text("a"),
                Fragment::Token(1),
                Fragment::Text("b"),
                Fragment::Token(2),
                Fragment::Text("c"),
                Fragment::Token(3),
            ]
        );
        // Without parse_special only the user-defined token is cut out.
        let f = partition("a<|im_start|>b<x>", &specials, false);
        assert_eq!(
            f,
            vec![
                Fragment::Text("a"),
                Fragment::Token(2),
                Fragment::Text("_start|>b<x>")
            ]
        );
        assert!(partition("", &specials, true).is_empty());
    }

    /// The automaton only chooses which tokens to try: on random texts over a
    /// small alphabet, with tokens inside, overlapping and repeating each
    /// other (and one text twice), it cuts exactly as trying every token does.
    #[test]
    fn special_tokens_cut_as_trying_every_token_does() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let texts = [
            "ab", "ba", "aab", "b", "abab", "ca", "<a>", "a", "ab", "bca",
        ];
        let list: Vec<SpecialToken> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| SpecialToken {
                id: i as u32,
                text: t.to_string(),
                control_like: i % 3 == 0,
            })
            .collect();
        let specials = SpecialTokens::new(list).unwrap();
        for _ in 0..5000 {
            let len = rng.random_range(0..24);
            let text: String = (0..len)
                .map(|_| ['a', 'b', 'c', '<', '>', 'é'][rng.random_range(0..6)])
                .collect();
            for parse_special in [false, true] {
                assert_eq!(
                    specials.partition(&text, parse_special),
                    partition(&text, specials.iter(), parse_special),
                    "{text:?} parse_special={parse_special}"
                );
            }
        }
        assert!(SpecialTokens::new(Vec::new())
            .unwrap()
            .partition("abc", true)
            .eq(&[Fragment::Text("abc")]));
    }
}

//! The `hf-json` tokenizer: a Hugging Face `tokenizer.json` read with the
//! `tokenizers` crate, beside the GGUF file of the same model.
//!
//! The file decides how text becomes ids (normalizer, pre-tokenizer, model,
//! added tokens), which added tokens are special (its `special` flag), and
//! how each token renders (its decoder, applied one token at a time:
//! [`PieceRenderer`]). Around it the worker keeps the rules it has for every
//! kind: special tokens are cut out of the text the llama.cpp way
//! (`bpe::partition`), so that `parse_special` means the same for all kinds,
//! and BOS/EOS are added by the worker, never by the file's post-processor.
//!
//! Which file wins: the GGUF's `tokenizer.ggml.*` ids (BOS, EOS, EOT, EOM) and
//! `add_bos`/`add_eos` when the GGUF has a tokenizer, because llama.cpp (the
//! reference) takes them from there and `tokenizer.json` does not carry them
//! (its post-processor only says which token it would put first). Each of those
//! ids must name the same token text in both files, or the load fails: the
//! files would be of different vocabularies. A GGUF without a tokenizer leaves
//! BOS/EOS to the post-processor's template.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tokenizers::{DecoderWrapper, PostProcessorWrapper};

use super::bpe::{SpecialToken, SpecialTokens};
use super::codec::Parts;
use super::vocab::{self, token_type, VocabSpec};
use super::{Tokenizer, TokenizerError, TokenizerKind};

/// The file the worker looks for in the model file's folder.
pub const FILE_NAME: &str = "tokenizer.json";

/// The largest vocabulary accepted, the model configuration's own bound: ids
/// index a table, so an absurd id in the file must not size one.
const MAX_VOCAB: usize = 1 << 21;

/// An added token of the file, as the worker uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Added {
    pub id: u32,
    pub content: String,
    /// Marked `special` in the file: cut out only with `parse_special`,
    /// a control token for the end-of-generation rules.
    pub special: bool,
    /// Has `lstrip`, `rstrip` or `single_word`, which the llama.cpp-style
    /// partition of special tokens does not apply.
    pub has_match_flags: bool,
}

/// A `tokenizer.json`, read and made safe to encode with.
pub(crate) struct HfFile {
    /// Truncation and padding off: a prompt is never cut or padded behind
    /// the worker's back; special tokens are left to the caller's partition.
    pub tokenizer: tokenizers::Tokenizer,
    /// Token text by id (model vocabulary and added tokens); ids the file
    /// leaves out are empty.
    pub tokens: Vec<String>,
    pub added: Vec<Added>,
    /// The file's `truncation.max_length`, its only statement of a length.
    pub model_max_context: Option<usize>,
    /// The special tokens the file's post-processor puts first and last.
    pub template: TemplateEnds,
}

/// Reads `path`. A missing or unreadable file is an error naming it.
pub(crate) fn read(path: &Path) -> Result<HfFile, TokenizerError> {
    let fail = |message: String| TokenizerError::Read {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let mut tokenizer: tokenizers::Tokenizer = text.parse().map_err(|e| {
        fail(format!(
            "not a tokenizer.json the tokenizers crate reads: {e}"
        ))
    })?;
    let model_max_context = tokenizer.get_truncation().map(|t| t.max_length);
    tokenizer
        .with_truncation(None)
        .map_err(|e| fail(format!("cannot turn truncation off: {e}")))?;
    tokenizer.with_padding(None);
    tokenizer.set_encode_special_tokens(true);
    let tokens = tokens_by_id(&tokenizer.get_vocab(true)).map_err(|e| fail(e.to_string()))?;
    let added = added_tokens(&tokenizer);
    let template = template_ends(tokenizer.get_post_processor());
    Ok(HfFile {
        tokenizer,
        tokens,
        added,
        model_max_context,
        template,
    })
}

/// Inverts the vocabulary (text -> id) into text by id.
fn tokens_by_id(vocab: &HashMap<String, u32>) -> Result<Vec<String>, TokenizerError> {
    let Some(&max) = vocab.values().max() else {
        return Err(TokenizerError::Build("the vocabulary has no tokens".into()));
    };
    let n = max as usize + 1;
    if n > MAX_VOCAB {
        return Err(TokenizerError::Build(format!(
            "token id {max} is beyond the largest vocabulary accepted ({MAX_VOCAB})"
        )));
    }
    let mut tokens = vec![String::new(); n];
    for (text, &id) in vocab {
        tokens[id as usize] = text.clone();
    }
    Ok(tokens)
}

/// The added tokens, by id.
fn added_tokens(tokenizer: &tokenizers::Tokenizer) -> Vec<Added> {
    let mut added: Vec<Added> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| Added {
            id,
            has_match_flags: t.lstrip || t.rstrip || t.single_word,
            content: t.content,
            special: t.special,
        })
        .collect();
    added.sort_by_key(|a| a.id);
    added
}

impl Tokenizer {
    /// The `hf-json` tokenizer of `path` (a `tokenizer.json`), with the
    /// special-token ids of the GGUF metadata `md` of the same model when it
    /// has a tokenizer (see the module doc for which file wins).
    pub fn from_hf_json(
        path: &Path,
        md: &crate::gguf::Metadata,
    ) -> Result<Tokenizer, TokenizerError> {
        let file = read(path)?;
        let gguf = match md.get("tokenizer.ggml.model") {
            Some(_) => Some(VocabSpec::from_metadata(md)?),
            None => None,
        };
        let chat_template = md
            .opt_str("tokenizer.chat_template")
            .map_err(vocab::meta_err)?
            .map(str::to_string);
        let tokenizer = Tokenizer::from_hf_file(file, gguf.as_ref(), chat_template)?;
        tracing::info!(
            path = %path.display(),
            vocab_size = tokenizer.vocab_size(),
            bos_id = tokenizer.bos_id(),
            eos_id = tokenizer.eos_id(),
            add_bos = tokenizer.add_bos(),
            model_max_context = tokenizer.model_max_context(),
            "hf-json tokenizer loaded"
        );
        Ok(tokenizer)
    }

    fn from_hf_file(
        file: HfFile,
        gguf: Option<&VocabSpec>,
        chat_template: Option<String>,
    ) -> Result<Tokenizer, TokenizerError> {
        let mut spec = special_ids(&file, gguf)?;
        spec.token_types = token_types(file.tokens.len(), &file.added);
        spec.tokens = file.tokens;
        let derived = vocab::derive(&spec)?;
        let specials = special_tokens(&file.added, &derived.attrs)?;
        let renderer = PieceRenderer::new(file.tokenizer.get_decoder())?;
        let pieces = pieces(&spec.tokens, &file.added, &renderer);
        let parts = Parts {
            kind: TokenizerKind::HfJson,
            inner: file.tokenizer,
            spec,
            derived,
            pieces,
            specials,
            // The file's normalizer and pre-tokenizer place any prefix space.
            add_space_prefix: false,
            model_max_context: file.model_max_context,
        };
        Ok(Tokenizer::assemble(parts, chat_template.as_deref()))
    }
}

/// The ids and BOS/EOS rules, in a [`VocabSpec`] without tokens: the GGUF's
/// when it has a tokenizer (checked against the file), else the file's
/// post-processor template.
fn special_ids(file: &HfFile, gguf: Option<&VocabSpec>) -> Result<VocabSpec, TokenizerError> {
    let spec = match gguf {
        Some(g) => {
            check_ids_agree(&file.tokens, g)?;
            warn_if_template_differs(file.template, g);
            VocabSpec {
                bos_id: g.bos_id,
                eos_id: g.eos_id,
                eot_id: g.eot_id,
                eom_id: g.eom_id,
                add_bos: g.add_bos,
                add_eos: g.add_eos,
                ..VocabSpec::default()
            }
        }
        None => VocabSpec {
            bos_id: file.template.first,
            eos_id: file.template.last,
            add_bos: file.template.first.is_some(),
            add_eos: file.template.last.is_some(),
            ..VocabSpec::default()
        },
    };
    for id in [spec.bos_id, spec.eos_id].into_iter().flatten() {
        if id as usize >= file.tokens.len() {
            return Err(TokenizerError::TokenOutOfRange(id));
        }
    }
    Ok(spec)
}

/// Each special id the GGUF names must be the same token text in
/// tokenizer.json: otherwise generation would stop at the wrong token.
fn check_ids_agree(tokens: &[String], gguf: &VocabSpec) -> Result<(), TokenizerError> {
    let named = [
        ("BOS", gguf.bos_id),
        ("EOS", gguf.eos_id),
        ("EOT", gguf.eot_id),
        ("EOM", gguf.eom_id),
    ];
    for (what, id) in named {
        let Some(id) = id else { continue };
        let ours = tokens
            .get(id as usize)
            .ok_or(TokenizerError::TokenOutOfRange(id))?;
        // `VocabSpec::from_metadata` keeps only ids inside its vocabulary.
        let theirs = &gguf.tokens[id as usize];
        if ours != theirs {
            return Err(TokenizerError::Build(format!(
                "the GGUF's {what} id {id} is {theirs:?} but tokenizer.json's token {id} is \
                 {ours:?}: the two files are of different vocabularies"
            )));
        }
    }
    Ok(())
}

/// The GGUF's BOS/EOS rules win; say so when the file's template would have
/// done otherwise (transformers' export of SmolLM2 adds a BOS its GGUF does not).
fn warn_if_template_differs(template: TemplateEnds, gguf: &VocabSpec) {
    let file_bos = template.first;
    let file_eos = template.last;
    let gguf_bos = gguf.bos_id.filter(|_| gguf.add_bos);
    let gguf_eos = gguf.eos_id.filter(|_| gguf.add_eos);
    if (file_bos, file_eos) != (gguf_bos, gguf_eos) {
        tracing::warn!(
            ?file_bos,
            ?file_eos,
            ?gguf_bos,
            ?gguf_eos,
            "tokenizer.json's post-processor adds other BOS/EOS tokens than the GGUF says; \
             following the GGUF, as llama.cpp does"
        );
    }
}

/// llama.cpp token types for the derived attributes: special added tokens
/// are control tokens, other added tokens user-defined.
fn token_types(n: usize, added: &[Added]) -> Vec<i32> {
    let mut types = vec![token_type::NORMAL; n];
    for a in added {
        types[a.id as usize] = if a.special {
            token_type::CONTROL
        } else {
            token_type::USER_DEFINED
        };
    }
    types
}

/// The special added tokens, for the partition. Non-special added tokens
/// stay with the `tokenizers` pipeline, which matches them with their flags.
/// A special token is cut out only with `parse_special` when its derived
/// attributes (`attrs`, the llama.cpp rules of `vocab::derive`) keep it a
/// control token, as the GGUF kinds do: gpt-oss's structure tokens
/// (`<|start|>`, `<|message|>`, ...) are always cut out there.
fn special_tokens(added: &[Added], attrs: &[u32]) -> Result<SpecialTokens, TokenizerError> {
    let flagged: Vec<&str> = added
        .iter()
        .filter(|a| a.special && a.has_match_flags)
        .map(|a| a.content.as_str())
        .collect();
    if !flagged.is_empty() {
        tracing::warn!(
            tokens = ?flagged,
            "special tokens with lstrip, rstrip or single_word: hf-json cuts special tokens \
             out the llama.cpp way, which does not apply these flags"
        );
    }
    SpecialTokens::new(
        added
            .iter()
            .filter(|a| a.special)
            .map(|a| SpecialToken {
                id: a.id,
                text: a.content.clone(),
                control_like: attrs
                    .get(a.id as usize)
                    .is_none_or(|&t| t & (vocab::ATTR_CONTROL | vocab::ATTR_UNKNOWN) != 0),
            })
            .collect(),
    )
}

/// Each token's bytes, concatenated, with the offsets between them: added
/// tokens as their text (as llama.cpp renders control and user-defined
/// tokens), the others through the decoder.
fn pieces(tokens: &[String], added: &[Added], renderer: &PieceRenderer) -> (Vec<u8>, Vec<usize>) {
    let added: HashSet<u32> = added.iter().map(|a| a.id).collect();
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    let mut offsets = Vec::with_capacity(tokens.len() + 1);
    offsets.push(0);
    for (id, text) in tokens.iter().enumerate() {
        if added.contains(&(id as u32)) {
            bytes.extend_from_slice(text.as_bytes());
        } else {
            bytes.extend_from_slice(&renderer.render(text));
        }
        offsets.push(bytes.len());
    }
    bytes.shrink_to_fit();
    (bytes, offsets)
}

// ---------------------------------------------------------------------------
// BOS/EOS as the file's post-processor adds them
// ---------------------------------------------------------------------------

/// The special tokens a `TemplateProcessing` post-processor puts before and
/// after a single sequence (`None` where it puts none, or there is no such
/// post-processor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TemplateEnds {
    pub first: Option<u32>,
    pub last: Option<u32>,
}

fn template_ends(pp: Option<&PostProcessorWrapper>) -> TemplateEnds {
    // The serialized form is tokenizer.json's own, whose fields are public.
    pp.and_then(|pp| serde_json::to_value(pp).ok())
        .map(|v| template_ends_of(&v))
        .unwrap_or_default()
}

fn template_ends_of(pp: &serde_json::Value) -> TemplateEnds {
    match pp["type"].as_str() {
        Some("TemplateProcessing") => {
            let single = pp["single"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            let id_of = |piece: Option<&serde_json::Value>| {
                let name = piece?["SpecialToken"]["id"].as_str()?;
                match pp["special_tokens"][name]["ids"].as_array()?.as_slice() {
                    [id] => id.as_u64().and_then(|id| u32::try_from(id).ok()),
                    _ => None,
                }
            };
            TemplateEnds {
                first: id_of(single.first()),
                last: id_of(single.last()),
            }
        }
        Some("Sequence") => pp["processors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(template_ends_of)
            .find(|e| *e != TemplateEnds::default())
            .unwrap_or_default(),
        _ => TemplateEnds::default(),
    }
}

// ---------------------------------------------------------------------------
// Token bytes through the file's decoder
// ---------------------------------------------------------------------------

/// One decoder step, as it acts on a single token.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// GPT-2's byte alphabet back to bytes.
    ByteLevel,
    /// `<0xNN>` to the byte NN.
    ByteFallback,
    Replace {
        from: String,
        to: String,
    },
    /// The replacement character back to a space.
    Metaspace {
        replacement: char,
    },
    Strip {
        content: char,
        start: usize,
        stop: usize,
    },
}

/// Renders a token's text into the bytes it stands for, as the file's
/// decoder would inside a longer text: llama.cpp's `token_to_piece`, which
/// the streaming decoder needs one token at a time.
///
/// Steps that act on each token (byte-level, byte fallback, replacements,
/// `▁` to space) are applied to each token. Steps that only trim the start or
/// end of a whole text (a `Strip` after the tokens were fused, Metaspace's
/// dropping of the first token's leading space) are not: a piece is the same
/// wherever it stands, as for the GGUF kinds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PieceRenderer {
    steps: Vec<Step>,
    byte_of: HashMap<char, u8>,
}

/// A token's text while the steps run: text, or bytes once a step made
/// bytes of it (later steps leave bytes alone).
enum Piece {
    Text(String),
    Bytes(Vec<u8>),
}

impl PieceRenderer {
    /// The renderer for the file's decoder (none: a token is its text).
    pub fn new(decoder: Option<&DecoderWrapper>) -> Result<Self, TokenizerError> {
        let mut steps = Vec::new();
        if let Some(d) = decoder {
            // The serialized form is tokenizer.json's own, whose fields are public.
            let v = serde_json::to_value(d)
                .map_err(|e| TokenizerError::Build(format!("decoder: {e}")))?;
            let mut fused = false;
            steps_of(&v, &mut fused, &mut steps)?;
        }
        Ok(PieceRenderer {
            steps,
            byte_of: super::bpe::unicode_to_byte(),
        })
    }

    /// The bytes of a token whose text is `text`.
    pub fn render(&self, text: &str) -> Vec<u8> {
        let mut piece = Piece::Text(text.to_string());
        for step in &self.steps {
            if let Piece::Text(t) = &piece {
                piece = self.apply(step, t);
            }
        }
        match piece {
            Piece::Text(t) => t.into_bytes(),
            Piece::Bytes(b) => b,
        }
    }

    fn apply(&self, step: &Step, t: &str) -> Piece {
        match step {
            Step::ByteLevel => Piece::Bytes(self.byte_level(t)),
            Step::ByteFallback => match vocab::parse_byte_token(t) {
                Some(b) => Piece::Bytes(vec![b]),
                None => Piece::Text(t.to_string()),
            },
            Step::Replace { from, to } => Piece::Text(t.replace(from.as_str(), to)),
            Step::Metaspace { replacement } => Piece::Text(t.replace(*replacement, " ")),
            Step::Strip {
                content,
                start,
                stop,
            } => Piece::Text(strip(t, *content, *start, *stop)),
        }
    }

    /// As the `tokenizers` ByteLevel decoder: a token with any character
    /// outside the alphabet is taken as its own UTF-8.
    fn byte_level(&self, t: &str) -> Vec<u8> {
        t.chars()
            .map(|c| self.byte_of.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .unwrap_or_else(|| t.as_bytes().to_vec())
    }
}

/// Appends the per-token steps of a serialized decoder. `fused`: an earlier
/// step has joined the tokens into one text (Fuse, ByteLevel).
fn steps_of(
    v: &serde_json::Value,
    fused: &mut bool,
    steps: &mut Vec<Step>,
) -> Result<(), TokenizerError> {
    let kind = v["type"].as_str().unwrap_or("");
    let unsupported = |why: &str| {
        TokenizerError::UnsupportedModel(format!(
            "tokenizer.json decoder {kind}{why}: hf-json renders ByteLevel, ByteFallback, \
             Fuse, Replace (string), Metaspace, Strip and Sequences of them"
        ))
    };
    match kind {
        "Sequence" => {
            for d in v["decoders"].as_array().into_iter().flatten() {
                steps_of(d, fused, steps)?;
            }
        }
        "ByteLevel" => {
            steps.push(Step::ByteLevel);
            *fused = true;
        }
        "ByteFallback" => steps.push(Step::ByteFallback),
        "Fuse" => *fused = true,
        "Replace" => {
            let from = v["pattern"]["String"]
                .as_str()
                .ok_or_else(|| unsupported(" with a regex pattern"))?;
            let to = v["content"].as_str().unwrap_or("");
            steps.push(Step::Replace {
                from: from.to_string(),
                to: to.to_string(),
            });
        }
        "Metaspace" => {
            let replacement = v["replacement"]
                .as_str()
                .and_then(|s| s.chars().next())
                .unwrap_or(super::spm::SPACE);
            steps.push(Step::Metaspace { replacement });
        }
        // Once fused, a strip trims the whole text's ends, not each piece.
        "Strip" if *fused => {}
        "Strip" => {
            let count = |k: &str| v[k].as_u64().unwrap_or(0) as usize;
            let content = v["content"].as_str().and_then(|s| s.chars().next());
            steps.push(Step::Strip {
                content: content.unwrap_or(' '),
                start: count("start"),
                stop: count("stop"),
            });
        }
        _ => return Err(unsupported("")),
    }
    Ok(())
}

/// As the `tokenizers` Strip decoder: up to `start` leading and `stop`
/// trailing `content` characters removed.
fn strip(t: &str, content: char, start: usize, stop: usize) -> String {
    let chars: Vec<char> = t.chars().collect();
    let from = chars
        .iter()
        .take(start)
        .take_while(|&&c| c == content)
        .count();
    let trailing = chars[from..]
        .iter()
        .rev()
        .take(stop)
        .take_while(|&&c| c == content)
        .count();
    chars[from..chars.len() - trailing].iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn renderer(decoder: serde_json::Value) -> Result<PieceRenderer, TokenizerError> {
        let d: DecoderWrapper = serde_json::from_value(decoder).unwrap();
        PieceRenderer::new(Some(&d))
    }

    /// The decoder transformers writes for a byte-level GGUF vocabulary, and
    /// a bare ByteLevel: the GPT-2 alphabet back to raw bytes, also the bytes
    /// of half a character.
    #[test]
    fn byte_level_pieces_are_raw_bytes() {
        let exported = json!({"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}]});
        for r in [
            renderer(exported).unwrap(),
            renderer(json!({"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": false, "use_regex": true}))
            .unwrap(),
        ] {
            assert_eq!(r.render("Ġhello"), b" hello");
            assert_eq!(r.render("Ċ"), b"\n");
            // "ä½" is the first two of the three bytes of "你".
            assert_eq!(r.render("ä½"), vec![0xE4, 0xBD]);
            // Outside the alphabet: the token's own UTF-8, as tokenizers does.
            assert_eq!(r.render("a b"), b"a b");
        }
    }

    /// Gemma's decoder as transformers writes it: `▁` to space, byte tokens
    /// to their byte; the leading-space Strip after Fuse is a whole-text trim.
    #[test]
    fn sentencepiece_pieces() {
        let r = renderer(json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}))
        .unwrap();
        assert_eq!(r.render("\u{2581}Hello"), b" Hello");
        assert_eq!(r.render("<0xE4>"), vec![0xE4]);
        assert_eq!(r.render("<0xZZ>"), b"<0xZZ>");
        let r = renderer(json!({"type": "Metaspace", "replacement": "\u{2581}",
            "prepend_scheme": "always", "split": true}))
        .unwrap();
        assert_eq!(r.render("\u{2581}a\u{2581}b"), b" a b");
    }

    #[test]
    fn strip_before_fusion_acts_on_each_token() {
        let r = renderer(json!({"type": "Strip", "content": "x", "start": 2, "stop": 1})).unwrap();
        assert_eq!(r.render("xxxaxx"), b"xax");
        assert_eq!(r.render("x"), b"");
        assert_eq!(strip("ab", 'x', 3, 3), "ab");
    }

    #[test]
    fn decoders_it_cannot_render_per_token_are_errors() {
        for d in [
            json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
            json!({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}),
        ] {
            match renderer(d.clone()) {
                Err(TokenizerError::UnsupportedModel(m)) => {
                    assert!(m.contains("tokenizer.json decoder"), "{m}")
                }
                other => panic!("{d}: {other:?}"),
            }
        }
        assert_eq!(PieceRenderer::new(None).unwrap().render("ab"), b"ab");
    }

    #[test]
    fn template_ends_name_bos_and_eos() {
        let pp = json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}});
        let ends = TemplateEnds {
            first: Some(1),
            last: Some(2),
        };
        assert_eq!(template_ends_of(&pp), ends);
        let seq = json!({"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
            pp]});
        let parsed: PostProcessorWrapper = serde_json::from_value(seq).unwrap();
        assert_eq!(template_ends(Some(&parsed)), ends);
        let bare = json!({"type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}});
        assert_eq!(template_ends_of(&bare), TemplateEnds::default());
        assert_eq!(template_ends(None), TemplateEnds::default());
    }

    #[test]
    fn vocabulary_by_id_is_bounded() {
        let v: HashMap<String, u32> = [("a".to_string(), 0), ("c".to_string(), 2)].into();
        assert_eq!(tokens_by_id(&v).unwrap(), vec!["a", "", "c"]);
        let huge: HashMap<String, u32> = [("a".to_string(), u32::MAX)].into();
        assert!(matches!(
            tokens_by_id(&huge),
            Err(TokenizerError::Build(m)) if m.contains("beyond")
        ));
        assert!(tokens_by_id(&HashMap::new()).is_err());
    }
}

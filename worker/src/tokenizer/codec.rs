//! The [`Tokenizer`]: built from a [`VocabSpec`] (the GGUF kinds) or by
//! `hf.rs` from a `tokenizer.json`, it turns text into ids (special tokens
//! cut out first) and ids back into bytes and text.

use std::collections::HashSet;

use crate::tokenizer::bpe::{self, Fragment, SpecialToken, SpecialTokens};
use crate::tokenizer::fragments::FragmentCache;
use crate::tokenizer::vocab::{
    self, parse_byte_token, ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED,
};
use crate::tokenizer::{harmony, spm, think, ChatTemplate, TokenizerError, VocabSpec};

/// Which tokenizer implementation a [`Tokenizer`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// GGUF `tokenizer.ggml.model = "gpt2"`: byte-level BPE.
    GgufBpe,
    /// GGUF `tokenizer.ggml.model = "llama"`: SentencePiece BPE.
    GgufSpm,
    /// A Hugging Face `tokenizer.json` beside the model file.
    HfJson,
}

impl TokenizerKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            TokenizerKind::GgufBpe => "gguf-bpe",
            TokenizerKind::GgufSpm => "gguf-spm",
            TokenizerKind::HfJson => "hf-json",
        }
    }
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A loaded tokenizer. Immutable after loading; share it between jobs (`Send + Sync`).
pub struct Tokenizer {
    kind: TokenizerKind,
    /// The `tokenizers` pipeline; encodes the plain text between special
    /// tokens (it never splits special tokens out itself).
    inner: tokenizers::Tokenizer,
    /// Token text by id, as stored in the vocabulary.
    tokens: Vec<String>,
    /// llama.cpp token attributes by id (`vocab::ATTR_*`).
    attrs: Vec<u32>,
    /// The bytes each token stands for, concatenated; token `i` is
    /// `piece_bytes[piece_offsets[i]..piece_offsets[i + 1]]`.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<usize>,
    /// Control, unknown and user-defined tokens, longest text first.
    specials: SpecialTokens,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece: a space before text that opens the input or follows a
    /// special token.
    add_space_prefix: bool,
    /// hf-json: the file's `truncation.max_length`, when it has one.
    model_max_context: Option<usize>,
    chat_template: Option<ChatTemplate>,
    chat_template_error: Option<String>,
    /// The harmony structure tokens (gpt-oss), looked up on first use.
    harmony: std::sync::OnceLock<Option<harmony::HarmonyIds>>,
    /// The think block's markers (Qwen3 and its kind), looked up on first use.
    think: std::sync::OnceLock<Option<think::ThinkIds>>,
    /// Long fragments encoded lately (a resent system prompt, a chat's history).
    fragments: FragmentCache,
}

/// A tokenizer's parts as a loader has read them ([`Tokenizer::assemble`]).
pub(super) struct Parts {
    pub(super) kind: TokenizerKind,
    pub(super) inner: tokenizers::Tokenizer,
    pub(super) spec: VocabSpec,
    pub(super) derived: vocab::Derived,
    /// The bytes of every token and where each starts (`Tokenizer::piece_bytes`).
    pub(super) pieces: (Vec<u8>, Vec<usize>),
    pub(super) specials: SpecialTokens,
    pub(super) add_space_prefix: bool,
    pub(super) model_max_context: Option<usize>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds a tokenizer from a vocabulary description.
    pub fn from_spec(mut spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let kind = match spec.model.as_str() {
            "gpt2" => TokenizerKind::GgufBpe,
            "llama" => TokenizerKind::GgufSpm,
            other => {
                return Err(TokenizerError::UnsupportedModel(format!(
                    "tokenizer.ggml.model {other:?} is not supported; \"gpt2\" (byte-level BPE, \
                     gguf-bpe) and \"llama\" (SentencePiece, gguf-spm) are"
                )))
            }
        };
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::Build("the vocabulary has no tokens".into()));
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::Build(format!(
                "{n} tokens do not fit u32 ids"
            )));
        }
        for id in [
            spec.bos_id,
            spec.eos_id,
            spec.eot_id,
            spec.eom_id,
            spec.unk_id,
            spec.pad_id,
        ]
        .into_iter()
        .flatten()
        {
            if id as usize >= n {
                return Err(TokenizerError::TokenOutOfRange(id));
            }
        }
        if spec.add_bos && spec.bos_id.is_none() {
            return Err(TokenizerError::Build(
                "add_bos is set but there is no BOS token id".into(),
            ));
        }
        if spec.add_eos && spec.eos_id.is_none() {
            return Err(TokenizerError::Build(
                "add_eos is set but there is no EOS token id".into(),
            ));
        }

        let derived = vocab::derive(&spec)?;

        // The BPE model wants unique, non-empty token strings; llama.cpp renames
        // empty ones the same way and refuses duplicates.
        let mut seen = HashSet::with_capacity(n);
        let mut model_texts = Vec::with_capacity(n);
        for (i, t) in spec.tokens.iter().enumerate() {
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            if !seen.insert(text.clone()) {
                return Err(TokenizerError::Build(format!(
                    "duplicate token {text:?} at id {i}"
                )));
            }
            model_texts.push(text);
        }
        drop(seen);

        let specials: Vec<SpecialToken> = derived
            .attrs
            .iter()
            .enumerate()
            .filter(|(_, &a)| a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .map(|(i, &a)| SpecialToken {
                id: i as u32,
                text: spec.tokens[i].clone(),
                control_like: a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0,
            })
            .collect();
        let specials = SpecialTokens::new(specials)?;

        let inner = match kind {
            TokenizerKind::GgufSpm => {
                let scores = spec.scores.as_deref().ok_or_else(|| {
                    TokenizerError::MissingKey("tokenizer.ggml.scores".to_string())
                })?;
                spm::build(&model_texts, scores)?
            }
            _ => {
                let pre = bpe::pre_tokenizer_spec(spec.pre.as_deref())?;
                let added: Vec<bpe::AddedSpec<'_>> = specials
                    .iter()
                    .map(|s| bpe::AddedSpec {
                        text: &s.text,
                        special: s.control_like,
                    })
                    .collect();
                let built = bpe::build(&model_texts, &spec.merges, &pre, &added)?;
                if built.skipped_merges > 0 {
                    tracing::warn!(
                        skipped = built.skipped_merges,
                        "BPE merges left out: a part or the result is not a token, or the pair repeats"
                    );
                }
                built.tokenizer
            }
        };

        // Bytes per token, as llama.cpp's token_to_piece(special = true) renders them.
        let u2b = bpe::unicode_to_byte();
        let mut piece_bytes = Vec::with_capacity(n * 4);
        let mut piece_offsets = Vec::with_capacity(n + 1);
        piece_offsets.push(0);
        for (text, &attr) in spec.tokens.iter().zip(&derived.attrs) {
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED) != 0 {
                piece_bytes.extend_from_slice(text.as_bytes());
            } else if attr & ATTR_NORMAL != 0 && kind == TokenizerKind::GgufSpm {
                piece_bytes.extend_from_slice(&spm::piece_bytes(text));
            } else if attr & ATTR_NORMAL != 0 {
                piece_bytes.extend_from_slice(&bpe::byte_level_decode(text, &u2b));
            } else if attr & ATTR_BYTE != 0 {
                match parse_byte_token(text) {
                    Some(b) => piece_bytes.push(b),
                    None => piece_bytes.extend_from_slice(&bpe::byte_level_decode(text, &u2b)),
                }
            }
            // Unused and undefined tokens render as nothing.
            piece_offsets.push(piece_bytes.len());
        }
        piece_bytes.shrink_to_fit();

        let chat_template = spec.chat_template.take();
        Ok(Tokenizer::assemble(
            Parts {
                kind,
                inner,
                add_space_prefix: kind == TokenizerKind::GgufSpm && spec.add_space_prefix,
                spec,
                derived,
                pieces: (piece_bytes, piece_offsets),
                specials,
                model_max_context: None,
            },
            chat_template.as_deref(),
        ))
    }

    /// The one place a tokenizer is put together from what a loader (GGUF
    /// keys or tokenizer.json) has read, its chat template adopted last.
    pub(super) fn assemble(p: Parts, chat_template: Option<&str>) -> Tokenizer {
        let mut tokenizer = Tokenizer {
            kind: p.kind,
            inner: p.inner,
            tokens: p.spec.tokens,
            attrs: p.derived.attrs,
            piece_bytes: p.pieces.0,
            piece_offsets: p.pieces.1,
            specials: p.specials,
            eog: p.derived.eog,
            bos_id: p.spec.bos_id,
            eos_id: p.spec.eos_id,
            add_bos: p.spec.add_bos,
            add_eos: p.spec.add_eos,
            add_space_prefix: p.add_space_prefix,
            model_max_context: p.model_max_context,
            chat_template: None,
            chat_template_error: None,
            harmony: std::sync::OnceLock::new(),
            think: std::sync::OnceLock::new(),
            fragments: FragmentCache::default(),
        };
        tokenizer.adopt_chat_template(chat_template);
        tokenizer
    }

    /// The model's own chat template; one that does not compile is kept as
    /// an error for requests that need it, not a load failure.
    fn adopt_chat_template(&mut self, source: Option<&str>) {
        if let Some(source) = source {
            if let Err(e) = self.set_chat_template(source) {
                tracing::warn!(error = %e, "the model's chat template does not compile");
                self.chat_template_error = Some(e.to_string());
            }
        }
    }

    /// Builds the tokenizer a GGUF file describes (`tokenizer.*` keys).
    pub fn from_gguf(md: &crate::gguf::Metadata) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_metadata(md)?)
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// hf-json: the longest input the `tokenizer.json` states
    /// (`truncation.max_length`), when it states one. The worker never
    /// truncates with it; the model's context length is the limit.
    pub fn model_max_context(&self) -> Option<usize> {
        self.model_max_context
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether BOS is prepended by `encode(.., add_special = true, ..)`.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generation ends at this token.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Text to ids. `add_special`: add BOS/EOS as the vocabulary asks.
    /// `parse_special`: control-token texts in `text` become those tokens;
    /// otherwise they are tokenized as plain text (user-defined tokens always match).
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos_id);
        }
        // llama.cpp's SPM branch: "prefix with space if previous is special",
        // the start of the input counting as special.
        let mut prev_special = true;
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    let spaced;
                    let s = if self.add_space_prefix && prev_special {
                        spaced = format!(" {s}");
                        spaced.as_str()
                    } else {
                        s
                    };
                    out.extend_from_slice(&self.encode_fragment(s)?);
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos_id);
        }
        Ok(out)
    }

    /// The ids of text between special tokens, from the fragment cache when
    /// it was encoded lately.
    fn encode_fragment(&self, s: &str) -> Result<std::sync::Arc<[u32]>, TokenizerError> {
        if let Some(ids) = self.fragments.get(s) {
            return Ok(ids);
        }
        let enc = self
            .inner
            .encode_fast(s, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let ids: std::sync::Arc<[u32]> = enc.get_ids().into();
        self.fragments.put(s, &ids);
        Ok(ids)
    }

    /// Ids to text: the tokens' bytes joined, invalid UTF-8 replaced by U+FFFD,
    /// special tokens as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(
                self.token_bytes(id)
                    .ok_or(TokenizerError::TokenOutOfRange(id))?,
            );
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The raw bytes a token stands for (special tokens: their text).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.tokens.len() {
            return None;
        }
        Some(&self.piece_bytes[self.piece_offsets[i]..self.piece_offsets[i + 1]])
    }

    /// The token's text as stored in the vocabulary (`Ġ` for a space, etc.).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether the token is a control token (rendered, but not ordinary text).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & ATTR_CONTROL != 0)
    }

    /// The vocabulary's harmony structure tokens, when it has them (gpt-oss).
    pub fn harmony(&self) -> Option<harmony::HarmonyIds> {
        *self
            .harmony
            .get_or_init(|| harmony::HarmonyIds::of(&self.tokens))
    }

    /// The vocabulary's `<think>` and `</think>` tokens, when it has both
    /// (Qwen3 and its kind: see `think.rs`).
    pub fn think(&self) -> Option<think::ThinkIds> {
        *self.think.get_or_init(|| think::ThinkIds::of(&self.tokens))
    }

    /// The model's chat template, when it has one that compiles.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Why the model's chat template did not compile, when it did not.
    pub fn chat_template_error(&self) -> Option<&str> {
        self.chat_template_error.as_deref()
    }

    /// A rendered chat prompt as llama.cpp hands it to the tokenizer
    /// (`common_chat_templates_apply`): where `encode` adds BOS (EOS)
    /// itself, a BOS text the template wrote at the start (an EOS text at the
    /// end) is dropped, so that the prompt holds one, not two (Gemma's
    /// template begins with `<bos>` and its vocabulary adds BOS).
    pub fn without_added_specials<'a>(&self, rendered: &'a str) -> &'a str {
        let text = |add: bool, id: Option<u32>| {
            id.filter(|_| add)
                .and_then(|i| self.token_text(i))
                .filter(|t| !t.is_empty())
        };
        let mut s = rendered;
        if let Some(bos) = text(self.add_bos, self.bos_id) {
            s = s.strip_prefix(bos).unwrap_or(s);
        }
        if let Some(eos) = text(self.add_eos, self.eos_id) {
            s = s.strip_suffix(eos).unwrap_or(s);
        }
        s
    }

    /// Replaces the file's chat template (or gives one to a file without):
    /// `--chat-template` / `--chat-template-file`. `bos_token` and
    /// `eos_token` are the file's.
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), TokenizerError> {
        let text_of = |id: Option<u32>| {
            id.and_then(|i| self.tokens.get(i as usize))
                .map(String::as_str)
                .unwrap_or("")
        };
        self.chat_template = Some(ChatTemplate::new(
            source,
            text_of(self.bos_id),
            text_of(self.eos_id),
        )?);
        self.chat_template_error = None;
        Ok(())
    }
}

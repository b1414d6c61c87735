//! `VocabSpec`: everything the tokenizer needs from a GGUF file's `tokenizer.*` keys,
//! and the token attributes / end-of-generation set llama.cpp derives from it.

use super::TokenizerError;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const UNDEFINED: i32 = 0;
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer part of a GGUF file's metadata, by value, so that a tokenizer can
/// also be built by hand (tests) or from another source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece), ...
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer regexes a BPE vocabulary uses.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token text by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (empty: all normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: "left right", highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies).
    pub scores: Option<Vec<f32>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Prepend BOS when encoding with `add_special` (`tokenizer.ggml.add_bos_token`,
    /// or llama.cpp's per-pre-tokenizer default when the key is absent).
    pub add_bos: bool,
    /// Append EOS when encoding with `add_special` (`tokenizer.ggml.add_eos_token`).
    pub add_eos: bool,
    /// SentencePiece: a space before the text (`tokenizer.ggml.add_space_prefix`,
    /// llama.cpp's default true).
    pub add_space_prefix: bool,
    /// `tokenizer.chat_template` (Jinja source).
    pub chat_template: Option<String>,
}

// Token attribute bits (llama.cpp `llama_token_attr`, the subset that matters here).
pub(crate) const ATTR_UNDEFINED: u32 = 0;
pub(crate) const ATTR_UNKNOWN: u32 = 1 << 0;
pub(crate) const ATTR_UNUSED: u32 = 1 << 1;
pub(crate) const ATTR_NORMAL: u32 = 1 << 2;
pub(crate) const ATTR_CONTROL: u32 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u32 = 1 << 4;
pub(crate) const ATTR_BYTE: u32 = 1 << 5;

/// Token texts that end generation whatever their id keys say (llama.cpp builds its
/// EOG set from these texts, forcing such tokens to be control tokens).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

fn attr_of_type(t: i32) -> u32 {
    match t {
        token_type::UNKNOWN => ATTR_UNKNOWN,
        token_type::UNUSED => ATTR_UNUSED,
        token_type::NORMAL => ATTR_NORMAL,
        token_type::CONTROL => ATTR_CONTROL,
        token_type::USER_DEFINED => ATTR_USER_DEFINED,
        token_type::BYTE => ATTR_BYTE,
        _ => ATTR_UNDEFINED,
    }
}

/// Per-token attributes and the sorted end-of-generation ids, as llama.cpp's
/// `llama_vocab::impl::load` derives them from the token types and texts.
pub(crate) struct Derived {
    pub attrs: Vec<u32>,
    pub eog: Vec<u32>,
}

pub(crate) fn derive(spec: &VocabSpec) -> Result<Derived, TokenizerError> {
    let n = spec.tokens.len();
    if !spec.token_types.is_empty() && spec.token_types.len() < n {
        return Err(TokenizerError::Build(format!(
            "{} token types for {} tokens",
            spec.token_types.len(),
            n
        )));
    }
    let mut attrs: Vec<u32> = if spec.token_types.is_empty() {
        vec![ATTR_NORMAL; n]
    } else {
        spec.token_types[..n]
            .iter()
            .map(|&t| attr_of_type(t))
            .collect()
    };

    let mut eog: Vec<u32> = Vec::new();
    for (id, text) in spec.tokens.iter().enumerate() {
        if EOG_TEXTS.contains(&text.as_str()) {
            eog.push(id as u32);
            attrs[id] |= ATTR_CONTROL;
        }
    }
    // gpt-oss: these structure tokens are always rendered, so llama.cpp makes them user-defined.
    for (id, text) in spec.tokens.iter().enumerate() {
        if matches!(
            text.as_str(),
            "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
        ) {
            attrs[id] = ATTR_USER_DEFINED;
        }
    }
    for id in [spec.eos_id, spec.eot_id, spec.eom_id]
        .into_iter()
        .flatten()
    {
        if !eog.contains(&id) {
            eog.push(id);
        }
    }
    // o200k_harmony: with <|return|> and <|call|> present, <|end|> ends a message, not generation.
    let eog_has = |eog: &[u32], t: &str| eog.iter().any(|&id| spec.tokens[id as usize] == t);
    if eog_has(&eog, "<|return|>") && eog_has(&eog, "<|call|>") {
        if let Some(pos) = eog
            .iter()
            .position(|&id| spec.tokens[id as usize] == "<|end|>")
        {
            let end = eog.remove(pos);
            attrs[end as usize] = ATTR_USER_DEFINED;
        }
    }
    eog.sort_unstable();
    eog.dedup();
    Ok(Derived { attrs, eog })
}

impl VocabSpec {
    /// Reads the `tokenizer.*` keys of a GGUF file, with llama.cpp's defaults for
    /// absent optional keys. Special-token ids outside the vocabulary are dropped
    /// (llama.cpp ignores them with a warning).
    pub fn from_metadata(md: &crate::gguf::Metadata) -> Result<Self, TokenizerError> {
        let model = md
            .get_str("tokenizer.ggml.model")
            .map_err(meta_err)?
            .to_string();
        let pre = md
            .opt_str("tokenizer.ggml.pre")
            .map_err(meta_err)?
            .map(str::to_string);
        let tokens: Vec<String> = md
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(meta_err)?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();

        let token_types = match md.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(_) => md
                .get_i64_array("tokenizer.ggml.token_type")
                .map_err(meta_err)?
                .into_iter()
                .map(|t| i32::try_from(t).unwrap_or(token_type::UNDEFINED))
                .collect(),
        };
        // BPE needs its merges (llama.cpp refuses a gpt2 vocabulary without them).
        let merges: Vec<String> = match md.get("tokenizer.ggml.merges") {
            None if model == "gpt2" => {
                return Err(TokenizerError::MissingKey("tokenizer.ggml.merges".into()))
            }
            None => Vec::new(),
            Some(_) => md
                .get_str_array("tokenizer.ggml.merges")
                .map_err(meta_err)?
                .into_iter()
                .map(str::to_string)
                .collect(),
        };
        let scores = match md.get("tokenizer.ggml.scores") {
            None => None,
            Some(_) => Some(
                md.get_f32_array("tokenizer.ggml.scores")
                    .map_err(meta_err)?,
            ),
        };

        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match md.opt_u64(key).map_err(meta_err)? {
                Some(v) if (v as usize) < n && v <= u32::MAX as u64 => Ok(Some(v as u32)),
                Some(v) => {
                    tracing::warn!(
                        key,
                        id = v,
                        vocab = n,
                        "special token id outside the vocabulary; ignored"
                    );
                    Ok(None)
                }
                None => Ok(None),
            }
        };
        let bos_id = id("tokenizer.ggml.bos_token_id")?;
        let eos_id = id("tokenizer.ggml.eos_token_id")?;
        let eot_id = id("tokenizer.ggml.eot_token_id")?;
        let eom_id = id("tokenizer.ggml.eom_token_id")?;
        let unk_id = id("tokenizer.ggml.unknown_token_id")?;
        let pad_id = id("tokenizer.ggml.padding_token_id")?;

        // llama.cpp's defaults: SentencePiece adds BOS; BPE adds it only for some
        // pre-tokenizers (Llama 3 and kin); the GGUF keys override.
        let default_add_bos = match model.as_str() {
            "llama" => true,
            "gpt2" => super::bpe::pre_tokenizer_spec(pre.as_deref())
                .map(|p| p.default_add_bos)
                .unwrap_or(false),
            _ => false,
        };
        let add_bos = md
            .opt_bool("tokenizer.ggml.add_bos_token")
            .map_err(meta_err)?
            .unwrap_or(default_add_bos);
        let add_eos = md
            .opt_bool("tokenizer.ggml.add_eos_token")
            .map_err(meta_err)?
            .unwrap_or(false);
        let add_space_prefix = md
            .opt_bool("tokenizer.ggml.add_space_prefix")
            .map_err(meta_err)?
            .unwrap_or(true);
        let chat_template = md
            .opt_str("tokenizer.chat_template")
            .map_err(meta_err)?
            .map(str::to_string);

        Ok(VocabSpec {
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
            bos_id,
            eos_id,
            eot_id,
            eom_id,
            unk_id,
            pad_id,
            add_bos,
            add_eos,
            add_space_prefix,
            chat_template,
        })
    }
}

pub(crate) fn meta_err(e: crate::gguf::GgufError) -> TokenizerError {
    match e {
        crate::gguf::GgufError::MissingKey(k) => TokenizerError::MissingKey(k),
        other => TokenizerError::Build(other.to_string()),
    }
}

/// `<0xNN>` byte tokens.
pub(super) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

//! Specs to grammars: compiled once per distinct spec, refused with the
//! compiler's reason, each bounded in size and in the work it may take.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::constraint::formats;
use crate::constraint::numbers::NumberTokens;
use crate::constraint::vocab::{end_token, token_env};
use crate::tokenizer::Tokenizer;

/// Largest spec, in bytes of its text (a schema as compact JSON): larger than
/// any real tool or response schema, small enough that compiling one is a
/// matter of milliseconds.
pub const MAX_SPEC_BYTES: usize = 64 * 1024;

/// Compiled grammars kept for reuse.
const CACHED_GRAMMARS: usize = 256;

/// What a request asks its output to match.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// A JSON Schema (draft 2020-12 keywords, as llguidance supports them).
    JsonSchema(Value),
    /// A regular expression the whole output matches (Rust `regex` syntax).
    Regex(String),
    /// A Lark grammar in llguidance's dialect (`%json {...}` embeds a schema).
    Lark(String),
}

impl Spec {
    /// The request field that carries this kind of spec on `/execute`.
    pub fn field(&self) -> &'static str {
        match self {
            Spec::JsonSchema(_) => "json_schema",
            Spec::Regex(_) => "regex",
            Spec::Lark(_) => "grammar",
        }
    }

    /// The spec's text: what its size is judged by and its hash is taken of.
    fn text(&self) -> Cow<'_, str> {
        match self {
            Spec::JsonSchema(v) => Cow::Owned(v.to_string()),
            Spec::Regex(s) | Spec::Lark(s) => Cow::Borrowed(s),
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Spec::JsonSchema(v) => {
                let mut schema = v.clone();
                formats::narrow(&mut schema);
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            Spec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Spec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// JSON is written as Python's `json.dumps` writes it (`", "`, `": "`) and
/// without free whitespace between tokens, unless the schema says otherwise
/// in llguidance's `x-guidance` options: free whitespace lets a sampled
/// model spend its tokens on blank lines and end cut off.
fn with_layout(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Why a spec was refused, or a constraint failed while generating.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error("is {bytes} bytes long; at most {MAX_SPEC_BYTES}")]
    TooLarge { bytes: usize },
    /// The compiler's message: it names the keyword, rule or position.
    #[error("cannot be enforced: {0}")]
    Invalid(String),
    /// The grammar left no token to choose, or its work bound was reached.
    #[error("constraint failed at output token {index}: {reason}")]
    Failed { index: usize, reason: String },
}

/// A compiled spec: the start state every job's [`crate::constraint::Constraint`]
/// copies.
pub struct Grammar {
    pub(crate) start: Matcher,
    pub(crate) eog: Arc<[u32]>,
    pub(crate) end: u32,
    pub(crate) vocab: usize,
    /// A JSON Schema grammar's numbers are kept readable (`numbers.rs`).
    pub(crate) numbers: Option<Arc<NumberTokens>>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("vocab", &self.vocab)
            .finish()
    }
}

/// Compiles specs over one model's vocabulary, and keeps recent results.
pub struct Compiler {
    factory: ParserFactory,
    eog: Arc<[u32]>,
    end: u32,
    vocab: usize,
    numbers: Arc<NumberTokens>,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    grammars: HashMap<[u8; 32], Arc<Grammar>>,
    /// Keys oldest first: the first goes when the cache is full.
    order: VecDeque<[u8; 32]>,
}

impl Compiler {
    /// A compiler for `tokenizer`'s tokens and `n_vocab` logits.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize) -> Result<Self, ConstraintError> {
        let env = token_env(tokenizer, n_vocab);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Invalid(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        let mut eog: Vec<u32> = tokenizer.eog_ids().to_vec();
        eog.retain(|&id| (id as usize) < n_vocab);
        Ok(Compiler {
            factory,
            eog: eog.into(),
            end: end_token(tokenizer),
            vocab: n_vocab,
            numbers: Arc::new(NumberTokens::new(env)),
            cache: Mutex::default(),
        })
    }

    /// The grammar of `spec`: from the cache when the same spec was compiled
    /// before, else compiled now (milliseconds; call it off the async threads).
    pub fn compile(&self, spec: &Spec) -> Result<Arc<Grammar>, ConstraintError> {
        let text = spec.text();
        if text.len() > MAX_SPEC_BYTES {
            return Err(ConstraintError::TooLarge { bytes: text.len() });
        }
        let key = key(spec, &text);
        if let Some(g) = self.cache().grammars.get(&key) {
            return Ok(g.clone());
        }
        let t = Instant::now();
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|e| ConstraintError::Invalid(first_line(&e.to_string())))?;
        let start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(ConstraintError::Invalid(first_line(&e)));
        }
        tracing::debug!(
            kind = spec.field(),
            bytes = text.len(),
            us = t.elapsed().as_micros() as u64,
            "constraint compiled"
        );
        let grammar = Arc::new(Grammar {
            start,
            eog: self.eog.clone(),
            end: self.end,
            vocab: self.vocab,
            numbers: matches!(spec, Spec::JsonSchema(_)).then(|| self.numbers.clone()),
        });
        self.remember(key, grammar.clone());
        Ok(grammar)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves a usable map.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, key: [u8; 32], grammar: Arc<Grammar>) {
        let mut cache = self.cache();
        if cache.grammars.insert(key, grammar).is_none() {
            cache.order.push_back(key);
        }
        while cache.order.len() > CACHED_GRAMMARS {
            if let Some(old) = cache.order.pop_front() {
                cache.grammars.remove(&old);
            }
        }
    }
}

/// The bounds of one grammar's work: llguidance's defaults (what vLLM and
/// llama.cpp run with), which keep a compile to tens of milliseconds and one
/// token's mask to a few, with verbose errors off so that a refusal quotes
/// the reason, not the whole grammar.
fn limits() -> ParserLimits {
    ParserLimits {
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

fn key(spec: &Spec, text: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(spec.field().as_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    h.finalize().into()
}

/// The first line of a compiler message (the rest repeats the grammar).
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}

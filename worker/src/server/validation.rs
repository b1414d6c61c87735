//! `POST /execute` validation (M0-W-1300, M0-W-1302): the raw
//! [`ExecuteRequest`] becomes a [`ValidExecuteRequest`] with every default
//! filled in and the prompt tokenized, or a list of errors that each name
//! their field. The limits are the constants below; the API documentation
//! quotes them, so change both together.
//!
//! Numbers are parsed wider than their valid range (`seed` as i128,
//! `max_tokens` as i64, ...) so that an out-of-range value gets a message
//! naming the rule instead of a JSON type error.

use std::sync::{Arc, OnceLock};

use serde::Deserialize;

use crate::constraint::{Compiler, Grammar, Spec};
use crate::engine::generate::GenerationRequest;
use crate::sampling::{LogitBias, SamplingParams};
use crate::telemetry::logging::sha256_hex;
use crate::tokenizer::{TemplateInputs, Tokenizer};

mod bias;
mod limits;
mod messages;

use messages::MessageBounds;

pub use limits::{Caps, Door, Limits, BODY_BYTES_PER_TOKEN, DEFAULT_MAX_TOKENS_OUT};

pub use messages::{
    render_messages, template_vars, FunctionCallIn, MessageIn, ToolCallIn, CHAT_ROLES,
    DEFAULT_MAX_PROMPT_CHARS, MAX_MESSAGES,
};

/// Longest `job_id`, in characters.
pub const MAX_JOB_ID_CHARS: usize = 256;

/// The rules for a `job_id` wherever one arrives (`/execute`, `/cancel`):
/// not blank, at most [`MAX_JOB_ID_CHARS`], no control characters (it is
/// logged, and an over-long one must never reach the log).
pub fn check_job_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        Err("must not be empty".into())
    } else if id.chars().count() > MAX_JOB_ID_CHARS {
        Err(format!("must be at most {MAX_JOB_ID_CHARS} characters"))
    } else if id.chars().any(char::is_control) {
        Err("must not contain control characters".into())
    } else {
        Ok(())
    }
}
/// Values of `reasoning_effort`.
pub const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];
pub const TEMPERATURE_MAX: f64 = 2.0;
pub const DEFAULT_TEMPERATURE: f64 = 1.0;
pub const DEFAULT_TOP_P: f64 = 1.0;
pub const REPETITION_PENALTY_MAX: f64 = 2.0;
pub const DEFAULT_REPETITION_PENALTY: f64 = 1.0;
pub const DEFAULT_MIN_P: f64 = 0.0;
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Longest stop string, in tokens of the model's vocabulary.
pub const MAX_STOP_TOKENS: usize = 32;
/// What every backend's `sample` can return.
pub const MAX_LOGPROBS: usize = crate::sampling::MAX_LOGPROBS;

/// The `/execute` body as sent. Unknown fields are refused.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub job_id: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<MessageIn>>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub repetition_penalty: Option<f64>,
    pub min_p: Option<f64>,
    /// Issue #43: OpenAI's presence penalty, -2 to 2 (0: off): a token's
    /// logit is lowered by this once it has been generated.
    pub presence_penalty: Option<f64>,
    /// Issue #43: OpenAI's frequency penalty, -2 to 2 (0: off): a token's
    /// logit is lowered by this for each time it has been generated.
    pub frequency_penalty: Option<f64>,
    /// Issue #43: token id (a decimal string, as OpenAI sends it) → a bias
    /// of -100 to 100 added to its logit at every step.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    pub stop: Option<Vec<String>>,
    pub seed: Option<i128>,
    pub logprobs: Option<i64>,
    /// Issue 14 (gpt-oss): `low`, `medium` or `high`, handed to the chat
    /// template of `messages` (harmony's system message); templates that do
    /// not read it render as without it.
    pub reasoning_effort: Option<String>,
    /// Issue 46: variables for the chat template of `messages`, an object
    /// (vLLM's and llama-server's `chat_template_kwargs`: Qwen3's
    /// `{"enable_thinking": false}`); a key may not be one of the
    /// template's own variables (`messages`, `tools`, ...).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Issue #43: a JSON Schema the output is a JSON value of.
    #[schema(value_type = Option<Object>)]
    pub json_schema: Option<serde_json::Value>,
    /// Issue #43: a regular expression the whole output matches.
    pub regex: Option<String>,
    /// Issue #43: a Lark grammar (llguidance's dialect) the output matches.
    pub grammar: Option<String>,
    /// Not an `/execute` field (M0-W-1300 lists them, and unknown fields are
    /// refused): set only by the OpenAI routes' `ignore_eos`.
    #[serde(skip)]
    pub ignore_eos: bool,
    /// Not an `/execute` field: the OpenAI chat route's `tools`, the
    /// OpenAI-shaped definitions handed to the chat template with `messages`.
    #[serde(skip)]
    pub tools: Option<Vec<serde_json::Value>>,
    /// Not an `/execute` field: the route the request came through, which
    /// picks the caps it is held to ([`Limits::caps`]).
    #[serde(skip)]
    pub door: Door,
}

/// A request that passed every rule, ready to queue.
#[derive(Clone, Debug)]
pub struct ValidExecuteRequest {
    pub job_id: String,
    pub prompt_tokens: Vec<u32>,
    /// SHA-256 of the prompt text (the rendered template for `messages`).
    pub prompt_sha256: String,
    pub prompt_chars: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Whether the seed came from the client (else the worker picked it).
    pub seed_given: bool,
    pub stop: Vec<String>,
    pub logprobs: usize,
    /// Generation does not stop at end-of-generation tokens.
    pub ignore_eos: bool,
    /// What the output must match, as asked.
    pub constraint: Option<Spec>,
    /// `constraint` compiled (by the caller, which holds the compiler).
    pub grammar: Option<Arc<Grammar>>,
    /// `logit_bias` and the presence and frequency penalties.
    pub bias: LogitBias,
}

impl ValidExecuteRequest {
    pub fn generation_request(&self) -> GenerationRequest {
        GenerationRequest {
            prompt_tokens: self.prompt_tokens.clone(),
            max_tokens: self.max_tokens,
            sampling: self.sampling.clone(),
            stop: self.stop.clone(),
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            accepted_at: None,
            constraint: self.grammar.clone(),
            bias: self.bias.clone(),
        }
    }

    /// Choice `index` of a request of several (OpenAI's `n`): the first is
    /// the request itself; the others have the id `<job_id>-<index>` and
    /// the seed `seed + index`, so that the choices differ and each is
    /// reproducible from the request's seed.
    pub fn choice(&self, index: usize) -> ValidExecuteRequest {
        let mut c = self.clone();
        if index > 0 {
            c.job_id = format!("{}-{index}", self.job_id);
            c.sampling.seed = self.sampling.seed.wrapping_add(index as u64);
        }
        c
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

/// Every broken rule of one request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub fn fields(&self) -> Vec<&'static str> {
        self.0.iter().map(|e| e.field).collect()
    }
}

struct Collector(Vec<FieldError>);

impl Collector {
    fn add(&mut self, field: &'static str, message: impl Into<String>) {
        self.0.push(FieldError {
            field,
            message: message.into(),
        });
    }

    fn range_f64(
        &mut self,
        field: &'static str,
        value: Option<f64>,
        max: f64,
        default: f64,
    ) -> f32 {
        match value {
            None => default as f32,
            Some(v) if (0.0..=max).contains(&v) => v as f32,
            Some(v) => {
                self.add(field, format!("must be between 0 and {max} (got {v})"));
                default as f32
            }
        }
    }
}

/// Checks `req` against every rule and the worker's `limits`, renders and
/// tokenizes its input. `pick_seed` supplies the seed when none was given.
pub fn validate(
    req: ExecuteRequest,
    limits: &Limits,
    tokenizer: &Tokenizer,
    pick_seed: impl FnOnce() -> u64,
) -> Result<ValidExecuteRequest, ValidationErrors> {
    validate_with_ids(req, None, limits, tokenizer, pick_seed)
}

/// [`validate`], with `prompt_ids` as the prompt's tokens when the client sent
/// token ids (the OpenAI completions route); `req.prompt` is then their text,
/// for the field rules and the log's hash.
pub fn validate_with_ids(
    req: ExecuteRequest,
    prompt_ids: Option<Vec<u32>>,
    limits: &Limits,
    tokenizer: &Tokenizer,
    pick_seed: impl FnOnce() -> u64,
) -> Result<ValidExecuteRequest, ValidationErrors> {
    let mut checked = check_fields(req, limits, tokenizer)?;
    checked.prompt_ids = prompt_ids;
    checked.tokenize(limits, tokenizer, pick_seed)
}

/// A request whose fields passed every rule that does not need the prompt's
/// tokens; what is left is [`CheckedRequest::tokenize`].
#[derive(Clone, Debug)]
pub struct CheckedRequest {
    job_id: String,
    /// The text to tokenize (the prompt, or the rendered messages) and the
    /// field to blame for it.
    field: &'static str,
    text: String,
    /// The prompt's tokens as sent, instead of tokenizing `text`.
    prompt_ids: Option<Vec<u32>>,
    max_tokens: Option<usize>,
    max_tokens_cap: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    seed: Option<u64>,
    stop: Vec<String>,
    logprobs: usize,
    ignore_eos: bool,
    constraint: Option<Spec>,
    bias: LogitBias,
}

/// The cheap half of [`validate`]: every field's rule, the chat template and
/// the stop strings' token counts, but not the prompt's tokenization (which
/// grows with the prompt: milliseconds for a long one).
pub fn check_fields(
    mut req: ExecuteRequest,
    limits: &Limits,
    tokenizer: &Tokenizer,
) -> Result<CheckedRequest, ValidationErrors> {
    let mut errs = Collector(Vec::new());
    let constraint = check_constraint(&mut errs, &mut req, tokenizer);
    let caps = limits.caps(req.door);

    let job_id = match req.job_id {
        None => {
            errs.add("job_id", "is required");
            String::new()
        }
        Some(id) => {
            if let Err(reason) = check_job_id(&id) {
                errs.add("job_id", reason);
            }
            id
        }
    };

    let effort = req.reasoning_effort.as_deref();
    if let Some(e) = effort {
        if !REASONING_EFFORTS.contains(&e) {
            errs.add(
                "reasoning_effort",
                format!(
                    "must be one of {} (got {e:?})",
                    REASONING_EFFORTS.join(", ")
                ),
            );
        } else if req.prompt.is_some() {
            errs.add(
                "reasoning_effort",
                "applies to messages only (the chat template reads it)",
            );
        }
    }
    let kwargs = req.chat_template_kwargs.take();
    if kwargs.is_some() && req.prompt.is_some() {
        errs.add(
            "chat_template_kwargs",
            "applies to messages only (the chat template reads it)",
        );
    }
    let vars = template_vars(kwargs, effort).unwrap_or_else(|why| {
        errs.add("chat_template_kwargs", why);
        serde_json::Map::new()
    });
    // The text to tokenize, and the field to blame for its length.
    let input: Option<(&'static str, String)> = match (req.prompt, req.messages) {
        (Some(_), Some(_)) | (None, None) => {
            errs.add("prompt/messages", "give exactly one of prompt or messages");
            None
        }
        (Some(prompt), None) => {
            let chars = prompt.chars().count();
            if prompt.is_empty() {
                errs.add("prompt", "must not be empty");
                None
            } else if let Some(most) = caps.prompt_chars.filter(|&most| chars > most) {
                errs.add(
                    "prompt",
                    format!("must be at most {most} characters (got {chars})"),
                );
                None
            } else {
                Some(("prompt", prompt))
            }
        }
        (None, Some(messages)) => {
            let bounds = MessageBounds {
                chars: caps.prompt_chars,
                count: caps.messages.unwrap_or(limits.context_length),
            };
            let inputs = TemplateInputs {
                tools: req.tools.as_deref(),
                vars: Some(&vars),
            };
            match render_messages(messages, bounds, tokenizer, inputs) {
                Ok(text) => Some(("messages", text)),
                Err(broken) => {
                    for why in broken {
                        errs.add("messages", why);
                    }
                    None
                }
            }
        }
    };

    // Without a cap, what is left of the context after one prompt token.
    let max_tokens_cap = caps
        .tokens_out
        .unwrap_or(limits.context_length.saturating_sub(1).max(1));
    let max_tokens = match req.max_tokens {
        None => None,
        Some(n) if n >= 1 && n as u64 <= max_tokens_cap as u64 => Some(n as usize),
        Some(n) => {
            errs.add(
                "max_tokens",
                format!("must be between 1 and {max_tokens_cap} (got {n})"),
            );
            None
        }
    };
    let temperature = errs.range_f64(
        "temperature",
        req.temperature,
        TEMPERATURE_MAX,
        DEFAULT_TEMPERATURE,
    );
    let top_p = errs.range_f64("top_p", req.top_p, 1.0, DEFAULT_TOP_P);
    let repetition_penalty = errs.range_f64(
        "repetition_penalty",
        req.repetition_penalty,
        REPETITION_PENALTY_MAX,
        DEFAULT_REPETITION_PENALTY,
    );
    let min_p = errs.range_f64("min_p", req.min_p, 1.0, DEFAULT_MIN_P);
    let bias_fields = bias::BiasFields {
        presence: req.presence_penalty,
        frequency: req.frequency_penalty,
        logit_bias: req.logit_bias.take(),
    };
    let mut broken = bias::Broken::new();
    let bias = bias::check(&mut broken, bias_fields, limits.vocab_size);
    for (field, message) in broken {
        errs.add(field, message);
    }
    let top_k = match req.top_k {
        None => 0,
        Some(k) if k >= 0 && k as u64 <= limits.vocab_size as u64 => k as usize,
        Some(k) => {
            errs.add(
                "top_k",
                format!(
                    "must be between 0 and the vocabulary size {} (got {k})",
                    limits.vocab_size
                ),
            );
            0
        }
    };
    let seed = match req.seed {
        None => None,
        Some(s) if (0..=u64::MAX as i128).contains(&s) => Some(s as u64),
        Some(s) => {
            errs.add(
                "seed",
                format!("must be an integer between 0 and {} (got {s})", u64::MAX),
            );
            None
        }
    };
    let logprobs = match req.logprobs {
        None => 0,
        Some(n) if (0..=MAX_LOGPROBS as i64).contains(&n) => n as usize,
        Some(n) => {
            errs.add(
                "logprobs",
                format!("must be between 0 and {MAX_LOGPROBS} (got {n})"),
            );
            0
        }
    };
    let stop = req.stop.unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES {
        errs.add(
            "stop",
            format!(
                "at most {MAX_STOP_SEQUENCES} stop sequences (got {})",
                stop.len()
            ),
        );
    } else {
        for (i, s) in stop.iter().enumerate() {
            if s.is_empty() {
                errs.add("stop", format!("stop sequence {i} is empty"));
                continue;
            }
            match tokenizer.encode(s, false, false) {
                Ok(ids) if ids.len() <= MAX_STOP_TOKENS => {}
                Ok(ids) => errs.add(
                    "stop",
                    format!(
                        "stop sequence {i} is {} tokens long; at most {MAX_STOP_TOKENS}",
                        ids.len()
                    ),
                ),
                Err(e) => errs.add(
                    "stop",
                    format!("stop sequence {i} cannot be tokenized: {e}"),
                ),
            }
        }
    }

    match input {
        Some((field, text)) if errs.0.is_empty() => Ok(CheckedRequest {
            job_id,
            field,
            text,
            prompt_ids: None,
            max_tokens,
            max_tokens_cap,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
            stop,
            logprobs,
            ignore_eos: req.ignore_eos,
            constraint,
            bias,
        }),
        _ => Err(ValidationErrors(errs.0)),
    }
}

impl CheckedRequest {
    /// The rest of [`validate`]: tokenizes the input and checks its length
    /// against `--max-tokens-in`, the context and `max_tokens`.
    pub fn tokenize(
        mut self,
        limits: &Limits,
        tokenizer: &Tokenizer,
        pick_seed: impl FnOnce() -> u64,
    ) -> Result<ValidExecuteRequest, ValidationErrors> {
        let mut errs = Collector(Vec::new());
        let field = self.field;
        let encoded = match self.prompt_ids.take() {
            Some(ids) => check_ids(ids, limits.vocab_size),
            None => tokenizer
                .encode(&self.text, true, true)
                .map_err(|e| e.to_string()),
        };
        let prompt_tokens = match encoded {
            Err(e) => {
                errs.add(field, format!("cannot be tokenized: {e}"));
                Vec::new()
            }
            Ok(ids) if ids.is_empty() => {
                errs.add(field, "encodes to no tokens");
                ids
            }
            Ok(ids) if ids.len() > limits.max_tokens_in => {
                errs.add(
                    field,
                    format!(
                        "is {} tokens long; the limit (--max-tokens-in) is {}",
                        ids.len(),
                        limits.max_tokens_in
                    ),
                );
                Vec::new()
            }
            Ok(ids) if ids.len() >= limits.context_length => {
                errs.add(
                    field,
                    format!(
                        "is {} tokens long; the context length is {}, leaving no room to generate",
                        ids.len(),
                        limits.context_length
                    ),
                );
                Vec::new()
            }
            Ok(ids) => ids,
        };

        // Prompt plus output must fit the context: an explicit max_tokens that
        // does not is refused; the default shrinks to fit.
        let room = limits.context_length.saturating_sub(prompt_tokens.len());
        let max_tokens = match self.max_tokens {
            Some(n) if !prompt_tokens.is_empty() && n > room => {
                errs.add(
                    "max_tokens",
                    format!(
                        "the prompt ({} tokens) plus max_tokens ({n}) exceeds the context length ({})",
                        prompt_tokens.len(),
                        limits.context_length
                    ),
                );
                n
            }
            Some(n) => n,
            None => self.max_tokens_cap.min(room.max(1)),
        };
        if !errs.0.is_empty() {
            return Err(ValidationErrors(errs.0));
        }
        Ok(ValidExecuteRequest {
            job_id: self.job_id,
            prompt_sha256: sha256_hex(&self.text),
            prompt_chars: self.text.chars().count(),
            prompt_tokens,
            max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                seed: self.seed.unwrap_or_else(pick_seed),
            },
            seed_given: self.seed.is_some(),
            stop: self.stop,
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            constraint: self.constraint,
            grammar: None,
            bias: self.bias,
        })
    }
}

impl ValidExecuteRequest {
    /// Compiles the request's constraint with `compiler` (the model's; an
    /// error where the model has none), refusing it with the compiler's
    /// reason under the field that carried it.
    pub fn compile_constraint(
        &mut self,
        compiler: &OnceLock<Result<Arc<Compiler>, String>>,
    ) -> Result<(), ValidationErrors> {
        let Some(spec) = &self.constraint else {
            return Ok(());
        };
        // Built at start-up beside serving: only the first constrained
        // requests of a worker can wait for it, for well under a second.
        let compiled = match compiler.wait() {
            Ok(c) => c.compile(spec).map_err(|e| e.to_string()),
            Err(why) => Err(format!("cannot be enforced on this model: {why}")),
        };
        match compiled {
            Ok(grammar) => {
                self.grammar = Some(grammar);
                Ok(())
            }
            Err(message) => Err(ValidationErrors(vec![FieldError {
                field: spec.field(),
                message,
            }])),
        }
    }
}

/// `json_schema`, `regex` and `grammar` (taken out of `req`): at most one,
/// and one the job can keep to (compiling it is the caller's, after
/// validation).
fn check_constraint(
    errs: &mut Collector,
    req: &mut ExecuteRequest,
    tokenizer: &Tokenizer,
) -> Option<Spec> {
    let mut given = Vec::new();
    if let Some(schema) = req.json_schema.take() {
        if schema.is_object() || schema.is_boolean() {
            given.push(Spec::JsonSchema(schema));
        } else {
            errs.add("json_schema", "must be a JSON Schema (an object)");
        }
    }
    given.extend(req.regex.take().map(Spec::Regex));
    given.extend(req.grammar.take().map(Spec::Lark));
    if given.len() > 1 {
        errs.add(
            given[1].field(),
            "give at most one of json_schema, regex and grammar",
        );
        return None;
    }
    let spec = given.pop()?;
    if req.ignore_eos {
        errs.add(
            spec.field(),
            "cannot be combined with ignore_eos: the job ends where the output is complete",
        );
    }
    let whole_output = matches!(spec, Spec::JsonSchema(_) | Spec::Regex(_));
    if whole_output && req.messages.is_some() && tokenizer.harmony().is_some() {
        // Harmony answers in channels (analysis, then final) that a schema
        // or regex over the whole output would forbid; a grammar can name
        // them (the tool-call grammars do).
        errs.add(
            spec.field(),
            "is not served with messages on this model (its chat format writes channels before the answer); send a prompt",
        );
    }
    Some(spec)
}

/// Token ids sent as the prompt must be in the vocabulary.
fn check_ids(ids: Vec<u32>, vocab_size: usize) -> Result<Vec<u32>, String> {
    match ids.iter().position(|&id| id as usize >= vocab_size) {
        Some(i) => Err(format!(
            "token id {} at index {i} is outside the vocabulary (0..{vocab_size})",
            ids[i]
        )),
        None => Ok(ids),
    }
}

#[cfg(test)]
mod tests;

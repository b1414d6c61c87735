//! OpenAI request → the worker's own [`ExecuteRequest`]: the fields both APIs
//! share are copied as they are, so `/execute`'s validation judges them and
//! names them in its errors; what only the OpenAI API has (`n`, `stream`,
//! chat `logprobs`, unknown fields) is judged here.

use serde_json::{Map, Value};

use super::error::OpenAiError;
use super::tools::format::ToolFormat;
use super::tools::parse::ToolReply;
use super::tools::spec;
use super::types::{
    ChatCompletionRequest, ChatMessageIn, CompletionRequest, MessageContent, PromptField,
    ResponseFormat, SamplingFields, StopField,
};
use crate::server::validation::{Door, ExecuteRequest, MessageIn, MAX_LOGPROBS};

/// `max_tokens` of `/v1/completions` when none is given (OpenAI's default).
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: i64 = 16;

/// Fields accepted and ignored because they do not change the answer, when
/// they hold these values (`null` is always accepted).
fn harmless(field: &str, value: &Value) -> bool {
    match field {
        "user" | "metadata" | "service_tier" | "store" => !matches!(value, Value::Bool(true)),
        _ => false,
    }
}

/// Refuses the first field the worker does not serve, by name.
fn refuse_unserved(other: &Map<String, Value>) -> Result<(), OpenAiError> {
    match other.iter().find(|(k, v)| !v.is_null() && !harmless(k, v)) {
        Some((field, _)) => Err(OpenAiError::invalid(
            field,
            format!("{field}: is not supported by this server"),
        )),
        None => Ok(()),
    }
}

/// What the answer's shape depends on, beyond the job itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyShape {
    pub stream: bool,
    pub include_usage: bool,
    /// Every chunk carries the usage so far (needs `include_usage`).
    pub continuous_usage: bool,
    /// Chat: whether to report log-probabilities; completions: `logprobs` given.
    pub logprobs: bool,
    /// How many of the most likely tokens to list at each position.
    pub top_logprobs: usize,
    /// Choices asked for (`n`; 1 where a route has no `n`).
    pub choices: usize,
}

/// A request mapped onto the worker's own, ready for validation.
#[derive(Clone, Debug)]
pub struct Mapped {
    pub execute: ExecuteRequest,
    /// The prompt's token ids, when the client sent ids.
    pub prompt_ids: Option<Vec<u32>>,
    pub shape: ReplyShape,
    /// How to read calls from the answer; none without tools or with
    /// `tool_choice: "none"`.
    pub tools: Option<ToolReply>,
}

/// Most choices one request may ask for (`n`). Each is a job of its own,
/// queued with the others or not at all, so the worker's queue must hold
/// them too (see `handle::open`).
pub const MAX_CHOICES: i64 = 16;

/// Checks `model`, `n`, `stream_options` and copies the shared fields; the
/// reply's shape without its log-probabilities, which each route sets.
fn map_sampling(
    s: SamplingFields,
    job_id: &str,
    served: &[&str],
) -> Result<(ExecuteRequest, ReplyShape), OpenAiError> {
    if !served.contains(&s.model.as_str()) {
        return Err(OpenAiError::model_not_found(&s.model, served[0]));
    }
    let choices = s.n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&choices) {
        return Err(OpenAiError::invalid(
            "n",
            format!("n: must be 1 to {MAX_CHOICES} (got {choices})"),
        ));
    }
    if s.stream_options.is_some() && !s.stream {
        return Err(OpenAiError::invalid(
            "stream_options",
            "stream_options: only allowed with stream: true",
        ));
    }
    let options = s.stream_options.unwrap_or_default();
    let shape = ReplyShape {
        stream: s.stream,
        include_usage: options.include_usage,
        continuous_usage: options.include_usage && options.continuous_usage_stats,
        logprobs: false,
        top_logprobs: 0,
        choices: choices as usize,
    };
    let seed = match s.seed {
        None => None,
        Some(n) => match n.as_u64().map(i128::from).or(n.as_i64().map(i128::from)) {
            Some(seed) => Some(seed),
            None => {
                return Err(OpenAiError::invalid(
                    "seed",
                    format!("seed: must be an integer (got {n})"),
                ))
            }
        },
    };
    let execute = ExecuteRequest {
        job_id: Some(job_id.to_string()),
        max_tokens: s.max_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        repetition_penalty: s.repetition_penalty,
        min_p: s.min_p,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        logit_bias: s.logit_bias,
        stop: s.stop.map(|stop| match stop {
            StopField::One(one) => vec![one],
            StopField::Many(many) => many,
        }),
        seed,
        ignore_eos: s.ignore_eos.unwrap_or(false),
        json_schema: s.response_format.and_then(ResponseFormat::schema),
        door: Door::V1,
        ..ExecuteRequest::default()
    };
    Ok((execute, shape))
}

/// A `top_logprobs` or `logprobs` count, checked against what the engine lists.
fn logprob_count(field: &'static str, n: Option<i64>) -> Result<usize, OpenAiError> {
    match n {
        None => Ok(0),
        Some(n) if (0..=MAX_LOGPROBS as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(OpenAiError::invalid(
            field,
            format!("{field}: must be between 0 and {MAX_LOGPROBS} (got {n})"),
        )),
    }
}

/// `POST /v1/chat/completions` → `/execute` with `messages` (and the
/// tools, for the template; for `tool_choice` `required` or a named
/// function, the grammar of the calls in `format`, the model's).
pub fn map_chat(
    req: ChatCompletionRequest,
    job_id: &str,
    served: &[&str],
    format: ToolFormat,
) -> Result<Mapped, OpenAiError> {
    refuse_unserved(&req.other)?;
    let tools = spec::check(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let (mut execute, shape) = map_sampling(req.sampling, job_id, served)?;
    execute.max_tokens = execute.max_tokens.or(req.max_completion_tokens);
    let top_logprobs = logprob_count("top_logprobs", req.top_logprobs)?;
    if top_logprobs > 0 && !req.logprobs {
        return Err(OpenAiError::invalid(
            "top_logprobs",
            "top_logprobs: needs logprobs: true",
        ));
    }
    execute.logprobs = engine_logprobs(req.logprobs);
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    execute.messages = Some(messages);
    execute.reasoning_effort = req.reasoning_effort;
    execute.chat_template_kwargs = req.chat_template_kwargs;
    let reply = tools
        .as_ref()
        .and_then(|t| super::tools::apply(t, format, &mut execute));
    Ok(Mapped {
        execute,
        prompt_ids: None,
        shape: ReplyShape {
            logprobs: req.logprobs,
            top_logprobs,
            ..shape
        },
        tools: reply,
    })
}

/// The engine reports the chosen token's log-probability only when it is
/// among the listed most likely ones, so log-probability requests ask for
/// the longest list and the answer trims it to what the client asked.
fn engine_logprobs(wanted: bool) -> Option<i64> {
    wanted.then_some(MAX_LOGPROBS as i64)
}

/// One chat message: `developer` is OpenAI's newer name for `system`; content
/// parts are joined when all are text; tool calls and results go as they are
/// (validation judges them).
fn message(i: usize, m: ChatMessageIn) -> Result<MessageIn, OpenAiError> {
    let role = match m.role.as_str() {
        "developer" => "system".to_string(),
        _ => m.role,
    };
    let content = match m.content {
        None => None,
        Some(MessageContent::Text(text)) => Some(text),
        Some(MessageContent::Parts(parts)) => Some(
            joined_text(parts.into_iter().map(|p| (p.kind, p.text)), &["text"]).map_err(|kind| {
                OpenAiError::invalid(
                    "messages",
                    format!("messages: message {i} has a content part of type {kind:?}; only text is served"),
                )
            })?,
        ),
    };
    Ok(MessageIn {
        role,
        content,
        tool_calls: m.tool_calls,
        tool_call_id: m.tool_call_id,
        reasoning_content: m.reasoning_content,
    })
}

/// The text of a message's content parts, each `(type, text)`: the texts of
/// the parts whose type is one of `text_types`, joined in order. The first
/// other part, or a text part without text, is given back by its type for
/// the caller to refuse in its own API's words (every front door that takes
/// content parts reads them here).
pub fn joined_text(
    parts: impl IntoIterator<Item = (String, Option<String>)>,
    text_types: &[&str],
) -> Result<String, String> {
    let mut text = String::new();
    for (kind, part) in parts {
        match part {
            Some(t) if text_types.contains(&kind.as_str()) => text.push_str(&t),
            _ => return Err(kind),
        }
    }
    Ok(text)
}

/// `POST /v1/completions` → `/execute` with `prompt` (text, or token ids
/// whose text `decode` gives for the field rules).
pub fn map_completion(
    req: CompletionRequest,
    job_id: &str,
    served: &[&str],
    decode: impl FnOnce(&[u32]) -> Option<String>,
) -> Result<Mapped, OpenAiError> {
    refuse_unserved(&req.other)?;
    let (mut execute, shape) = map_sampling(req.sampling, job_id, served)?;
    execute.max_tokens = execute.max_tokens.or(Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
    let top_logprobs = logprob_count("logprobs", req.logprobs)?;
    execute.logprobs = engine_logprobs(req.logprobs.is_some());
    let (text, prompt_ids) = match one_prompt(req.prompt)? {
        OnePrompt::Text(text) => (text, None),
        OnePrompt::Ids(ids) => {
            // Out-of-vocabulary ids are named by validation; their text is
            // only needed for the rules on length and emptiness.
            let text = decode(&ids).unwrap_or_else(|| "?".repeat(ids.len()));
            (text, Some(ids))
        }
    };
    execute.prompt = Some(text);
    Ok(Mapped {
        execute,
        prompt_ids,
        shape: ReplyShape {
            logprobs: req.logprobs.is_some(),
            top_logprobs,
            ..shape
        },
        tools: None,
    })
}

/// The one prompt of a completions request.
enum OnePrompt {
    Text(String),
    Ids(Vec<u32>),
}

/// A list of prompts is served when it holds exactly one.
fn one_prompt(prompt: PromptField) -> Result<OnePrompt, OpenAiError> {
    let many = |n: usize| {
        OpenAiError::invalid(
            "prompt",
            format!("prompt: exactly one prompt per request is served (got {n})"),
        )
    };
    match prompt {
        PromptField::Text(text) => Ok(OnePrompt::Text(text)),
        PromptField::Tokens(ids) => Ok(OnePrompt::Ids(ids)),
        PromptField::Texts(mut list) if list.len() == 1 => Ok(OnePrompt::Text(list.remove(0))),
        PromptField::TokenLists(mut list) if list.len() == 1 => Ok(OnePrompt::Ids(list.remove(0))),
        PromptField::Texts(list) => Err(many(list.len())),
        PromptField::TokenLists(list) => Err(many(list.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SERVED: [&str; 2] = ["smol", "SmolLM2"];

    fn chat(body: Value) -> Result<Mapped, OpenAiError> {
        map_chat(
            serde_json::from_value(body).unwrap(),
            "chatcmpl-1",
            &SERVED,
            ToolFormat::Hermes,
        )
    }

    fn completion(body: Value) -> Result<Mapped, OpenAiError> {
        let req = serde_json::from_value(body).unwrap();
        map_completion(req, "cmpl-1", &SERVED, |ids| {
            Some(format!("<{} ids>", ids.len()))
        })
    }

    #[test]
    fn chat_fields_map_onto_execute_fields() {
        let m = chat(json!({
            "model": "smol", "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
                {"role": "user", "content": "Bye"}
            ],
            "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 18446744073709551615u64,
            "stop": "\n", "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "n": 1,
            "logprobs": true, "top_logprobs": 3, "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true},
            "user": "u-1", "frequency_penalty": 0.25, "presence_penalty": -1,
            "logit_bias": {"42": 5}, "ignore_eos": false,
            "chat_template_kwargs": {"enable_thinking": false}
        }))
        .unwrap();
        let e = &m.execute;
        assert_eq!(e.job_id.as_deref(), Some("chatcmpl-1"));
        let msgs = e.messages.as_ref().unwrap();
        assert_eq!(
            (msgs[0].role.as_str(), msgs[0].content.as_deref()),
            ("system", Some("Be brief."))
        );
        assert_eq!(msgs[1].content.as_deref(), Some("Hi there"));
        assert_eq!(msgs[2].reasoning_content.as_deref(), Some("Greet back."));
        assert_eq!(e.max_tokens, Some(7));
        assert_eq!(
            (e.temperature, e.top_p, e.min_p),
            (Some(0.5), Some(0.9), Some(0.05))
        );
        assert_eq!((e.top_k, e.repetition_penalty), (Some(40), Some(1.1)));
        assert_eq!(
            (e.frequency_penalty, e.presence_penalty),
            (Some(0.25), Some(-1.0))
        );
        let bias = e.logit_bias.as_ref().unwrap();
        assert_eq!(bias.get("42"), Some(&5.0));
        assert_eq!(e.seed, Some(u64::MAX as i128));
        assert_eq!(e.stop, Some(vec!["\n".to_string()]));
        assert_eq!(e.logprobs, Some(MAX_LOGPROBS as i64));
        assert!(!e.ignore_eos);
        assert_eq!(
            e.chat_template_kwargs,
            Some(json!({"enable_thinking": false}))
        );
        assert!(e.prompt.is_none());
        let want = ReplyShape {
            stream: true,
            include_usage: true,
            continuous_usage: true,
            logprobs: true,
            top_logprobs: 3,
            choices: 1,
        };
        assert_eq!(m.shape, want);
    }

    #[test]
    fn max_tokens_wins_over_max_completion_tokens_and_logprobs_off_asks_for_none() {
        let m = chat(
            json!({"model": "SmolLM2", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3, "max_completion_tokens": 9}),
        )
        .unwrap();
        assert_eq!(m.execute.max_tokens, Some(3));
        assert_eq!(m.execute.logprobs, None);
        assert!(!m.shape.stream && !m.shape.logprobs);
    }

    #[test]
    fn response_formats_become_the_schema_execute_enforces() {
        let with = |format: Value| {
            let body = json!({"model": "smol", "messages": [{"role": "user", "content": "x"}],
                              "response_format": format});
            chat(body).unwrap().execute.json_schema
        };
        assert_eq!(with(json!({"type": "text"})), None);
        assert_eq!(
            with(json!({"type": "json_object"})),
            Some(json!({"type": "object"}))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = json!({"type": "json_schema",
                            "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert_eq!(with(format), Some(schema));
        let m = completion(json!({"model": "smol", "prompt": "x",
                                  "response_format": {"type": "json_object"}}))
        .unwrap();
        assert_eq!(m.execute.json_schema, Some(json!({"type": "object"})));
    }

    #[test]
    fn refusals_name_their_field() {
        let base = json!({"model": "smol", "messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            chat(b).unwrap_err()
        };
        for (field, value) in [
            ("tools", json!({"type": "function"})),
            ("tool_choice", json!("required")),
            ("n", json!(0)),
            ("n", json!(MAX_CHOICES + 1)),
            ("top_logprobs", json!(2)),
            ("stream_options", json!({"include_usage": true})),
            ("seed", json!(1.5)),
        ] {
            let e = with(field, value);
            assert_eq!(e.status.as_u16(), 400, "{field}");
            assert_eq!(e.body.error.param.as_deref(), Some(field), "{field}");
            assert!(
                e.body.error.message.contains(field),
                "{field}: {}",
                e.body.error.message
            );
        }
        let e = with("top_logprobs", json!(21));
        assert!(e.body.error.message.contains("between 0 and 20"));
        let e = with("model", json!("gpt-4o"));
        assert_eq!(e.status.as_u16(), 404);
        assert_eq!(e.body.error.code.as_deref(), Some("model_not_found"));
        let e = with(
            "messages",
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
        );
        assert_eq!(e.body.error.param.as_deref(), Some("messages"));
    }

    #[test]
    fn ignore_eos_reaches_the_job_on_both_routes() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        for (value, want) in [
            (json!(true), true),
            (json!(false), false),
            (Value::Null, false),
        ] {
            let m = chat(json!({"model": "smol", "messages": msgs, "ignore_eos": value})).unwrap();
            assert_eq!(m.execute.ignore_eos, want, "chat {value}");
            let m =
                completion(json!({"model": "smol", "prompt": "x", "ignore_eos": value})).unwrap();
            assert_eq!(m.execute.ignore_eos, want, "completions {value}");
        }
        // What guidellm sends for a fixed output length.
        let m = chat(
            json!({"model": "smol", "messages": msgs, "max_completion_tokens": 64,
            "stop": null, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        )
        .unwrap();
        assert!(m.execute.ignore_eos && m.execute.stop.is_none());
        assert_eq!(m.execute.max_tokens, Some(64));
        let body = json!({"model": "smol", "messages": msgs, "ignore_eos": "yes"});
        assert!(serde_json::from_value::<ChatCompletionRequest>(body).is_err());
    }

    #[test]
    fn tools_reach_the_template_and_required_choices_get_a_grammar() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let msgs = json!([
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ]);
        let m = chat(json!({"model": "smol", "messages": msgs, "tools": tools,
            "parallel_tool_calls": false}))
        .unwrap();
        assert_eq!(
            m.execute.tools.as_deref(),
            tools.as_array().map(Vec::as_slice)
        );
        assert_eq!(m.execute.grammar, None, "auto enforces nothing");
        let reply = m.tools.unwrap();
        assert_eq!((reply.format, reply.parallel), (ToolFormat::Hermes, false));
        assert_eq!(reply.names, ["get_weather"]);
        let sent = m.execute.messages.unwrap();
        assert_eq!(sent[1].content, None);
        assert_eq!(
            sent[1].tool_calls.as_ref().unwrap()[0].function.name,
            "get_weather"
        );
        assert_eq!(sent[2].tool_call_id.as_deref(), Some("c1"));

        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        for choice in [json!("required"), named] {
            let m = chat(
                json!({"model": "smol", "messages": msgs, "tools": tools, "tool_choice": choice}),
            )
            .unwrap();
            let grammar = m.execute.grammar.unwrap();
            assert!(
                grammar.contains("get_weather") && grammar.contains("<tool_call>"),
                "{grammar}"
            );
        }
        // `none`: the tools are described, no call is read.
        let m =
            chat(json!({"model": "smol", "messages": msgs, "tools": tools, "tool_choice": "none"}))
                .unwrap();
        assert!(m.execute.tools.is_some() && m.tools.is_none() && m.execute.grammar.is_none());
    }

    #[test]
    fn unknown_message_fields_do_not_parse() {
        let body =
            json!({"model": "smol", "messages": [{"role": "user", "content": "x", "name": "bob"}]});
        let err = serde_json::from_value::<ChatCompletionRequest>(body).unwrap_err();
        assert!(err.to_string().contains("name"), "{err}");
    }

    #[test]
    fn completion_prompts_text_ids_and_lists_of_one() {
        let m = completion(json!({"model": "smol", "prompt": "The sky", "logprobs": 2})).unwrap();
        assert_eq!(m.execute.prompt.as_deref(), Some("The sky"));
        assert_eq!(m.execute.max_tokens, Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        assert!(m.prompt_ids.is_none());
        assert_eq!((m.shape.logprobs, m.shape.top_logprobs), (true, 2));

        let m =
            completion(json!({"model": "smol", "prompt": [[1, 2, 3]], "max_tokens": 4})).unwrap();
        assert_eq!(m.prompt_ids, Some(vec![1, 2, 3]));
        assert_eq!(m.execute.prompt.as_deref(), Some("<3 ids>"));
        assert_eq!(m.execute.max_tokens, Some(4));
        assert_eq!(m.execute.logprobs, None);

        let m = completion(json!({"model": "smol", "prompt": ["one"], "logprobs": 0})).unwrap();
        assert_eq!(m.execute.prompt.as_deref(), Some("one"));
        assert!(m.shape.logprobs);

        let e = completion(json!({"model": "smol", "prompt": ["a", "b"]})).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("prompt"));
        let e = completion(json!({"model": "smol", "prompt": "a", "echo": true})).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("echo"));
    }
}

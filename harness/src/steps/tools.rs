//! OpenAI tool calls (issue 43) driven by the `async-openai` client: each
//! answer is read by the client's own types, whole and streamed, then
//! looked at as JSON: its calls, their arguments checked against the tool's
//! `parameters`, the stream's calls put together from their deltas.
//!
//! A docstring is the request as JSON; `model` is filled in from
//! `GET /v1/models`, `seed` from the step.

use anyhow::{anyhow, Context};
use async_openai::types::chat::CreateChatCompletionRequest;
use cucumber::gherkin::Step;
use cucumber::{then, when};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::check;
use crate::steps::openai::{client, request};
use crate::steps::StepResult;
use crate::world::{TestWorld, ToolRun, JOB_TIMEOUT};

/// One seed's answer whole, and streamed (its deltas put together).
async fn run(w: &TestWorld, body: &Value, seed: u64) -> anyhow::Result<ToolRun> {
    let c = client(w)?;
    let mut body = body.clone();
    body["seed"] = json!(seed);
    let whole: CreateChatCompletionRequest = serde_json::from_value(body.clone())?;
    let whole = serde_json::to_value(c.chat().create(whole).await?)?;
    let mut streamed: CreateChatCompletionRequest = serde_json::from_value(body)?;
    streamed.stream = Some(true);
    let mut stream = c.chat().create_stream(streamed).await?;
    let (mut content, mut finish, mut calls) = (String::new(), Value::Null, Vec::<Value>::new());
    while let Some(chunk) = tokio::time::timeout(JOB_TIMEOUT, stream.next()).await? {
        let chunk = serde_json::to_value(chunk?)?;
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = d["index"]
                .as_u64()
                .context("a tool call delta without index")? as usize;
            if index == calls.len() {
                calls.push(json!({"name": "", "arguments": ""}));
            }
            let call = calls
                .get_mut(index)
                .context("a tool call delta out of order")?;
            for key in ["name", "arguments"] {
                let piece = d["function"][key].as_str().unwrap_or_default();
                call[key] = json!(format!("{}{piece}", call[key].as_str().unwrap_or_default()));
            }
        }
    }
    Ok(ToolRun {
        seed,
        whole: whole["choices"][0].clone(),
        streamed: json!({"content": content, "tool_calls": calls, "finish_reason": finish}),
    })
}

#[when(
    expr = "the async-openai client runs this chat with tools whole and streamed, seeds {string}:"
)]
async fn run_tools(w: &mut TestWorld, seeds: String, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    w.openai.tool_runs.clear();
    for seed in seeds.split(", ") {
        let seed = seed.parse().with_context(|| format!("seed {seed:?}"))?;
        let r = run(w, &body, seed).await?;
        w.openai.tool_runs.push(r);
    }
    w.openai.tool_request = Some(body);
    Ok(())
}

/// The whole answer's calls as `(name, arguments)`.
fn whole_calls(choice: &Value) -> Vec<(String, String)> {
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            (
                f["name"].as_str().unwrap_or_default().into(),
                f["arguments"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

/// Whole and streamed give the same answer (the same seed, the same tokens).
fn agree(r: &ToolRun) -> anyhow::Result<()> {
    let streamed: Vec<(String, String)> = r.streamed["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().into(),
                c["arguments"].as_str().unwrap_or_default().into(),
            )
        })
        .collect();
    let seed = r.seed;
    check!(
        streamed == whole_calls(&r.whole),
        "seed {seed}: streamed calls {streamed:?}, whole {}",
        r.whole
    );
    let text = r.whole["message"]["content"].as_str().unwrap_or_default();
    check!(
        r.streamed["content"] == text,
        "seed {seed}: streamed text {}, whole {text:?}",
        r.streamed["content"]
    );
    check!(
        r.streamed["finish_reason"] == r.whole["finish_reason"],
        "seed {seed}: finish reasons differ"
    );
    Ok(())
}

#[then(expr = "every answer is text or calls that parse, whole and streamed alike")]
async fn text_or_calls(w: &mut TestWorld) -> StepResult {
    check!(!w.openai.tool_runs.is_empty(), "no runs");
    for r in &w.openai.tool_runs {
        agree(r)?;
        let finish = r.whole["finish_reason"].as_str().unwrap_or_default();
        check!(
            ["stop", "length", "tool_calls"].contains(&finish),
            "finish_reason {finish}"
        );
        let calls = whole_calls(&r.whole);
        check!(
            (finish == "tool_calls") != calls.is_empty(),
            "finish_reason {finish} with calls {calls:?}"
        );
        for (name, args) in calls {
            serde_json::from_str::<Value>(&args)
                .with_context(|| format!("{name}'s arguments {args:?}"))?;
        }
    }
    Ok(())
}

#[then(
    expr = "every answer calls {string} with arguments valid under its parameters, whole and streamed alike"
)]
async fn valid_calls(w: &mut TestWorld, allowed: String) -> StepResult {
    let allowed: Vec<&str> = allowed.split(", ").collect();
    let req = tool_request(w)?;
    check!(!w.openai.tool_runs.is_empty(), "no runs");
    for r in &w.openai.tool_runs {
        agree(r)?;
        let seed = r.seed;
        check!(
            r.whole["finish_reason"] == "tool_calls",
            "seed {seed}: {}",
            r.whole
        );
        check!(
            r.whole["message"]["content"].is_null(),
            "seed {seed}: content beside the calls"
        );
        let calls = whole_calls(&r.whole);
        check!(!calls.is_empty(), "seed {seed}: no calls");
        for (name, args) in calls {
            check!(
                allowed.contains(&name.as_str()),
                "seed {seed}: calls {name}"
            );
            let tool = req["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["function"]["name"] == name.as_str());
            let schema = &tool.ok_or_else(|| anyhow!("no tool {name}"))?["function"]["parameters"];
            let args: Value =
                serde_json::from_str(&args).with_context(|| format!("seed {seed}: {args:?}"))?;
            conforms(&args, schema).map_err(|e| anyhow!("seed {seed}: {name}({args}): {e}"))?;
        }
    }
    Ok(())
}

/// The request the last runs with tools were made of.
pub(crate) fn tool_request(w: &TestWorld) -> anyhow::Result<&Value> {
    w.openai
        .tool_request
        .as_ref()
        .ok_or_else(|| anyhow!("no request"))
}

/// Whether `v` follows `schema`, for the keywords the scenarios' schemas use
/// (`type`, `properties`, `required`, `additionalProperties: false`, `enum`,
/// `minLength`, `maxLength`); any other keyword fails, so that a schema
/// outside them is never passed unchecked.
pub(crate) fn conforms(v: &Value, schema: &Value) -> Result<(), String> {
    let s = schema.as_object().ok_or("a schema that is not an object")?;
    for (key, rule) in s {
        let ok = match key.as_str() {
            "type" => match rule.as_str() {
                Some("object") => v.is_object(),
                Some("string") => v.is_string(),
                Some("integer") => v.is_i64() || v.is_u64(),
                Some("number") => v.is_number(),
                Some("boolean") => v.is_boolean(),
                Some("array") => v.is_array(),
                other => return Err(format!("type {other:?} is not checked here")),
            },
            "enum" => rule.as_array().is_some_and(|e| e.contains(v)),
            "minLength" => v
                .as_str()
                .is_some_and(|t| t.chars().count() as u64 >= rule.as_u64().unwrap_or(0)),
            "maxLength" => v
                .as_str()
                .is_some_and(|t| t.chars().count() as u64 <= rule.as_u64().unwrap_or(0)),
            "required" => rule
                .as_array()
                .into_iter()
                .flatten()
                .all(|k| k.as_str().is_some_and(|k| v.get(k).is_some())),
            "additionalProperties" if rule == &json!(false) => {
                let known = s.get("properties").and_then(Value::as_object);
                v.as_object()
                    .is_some_and(|o| o.keys().all(|k| known.is_some_and(|p| p.contains_key(k))))
            }
            "properties" => {
                for (name, sub) in rule.as_object().into_iter().flatten() {
                    if let Some(value) = v.get(name) {
                        conforms(value, sub).map_err(|e| format!("{name}: {e}"))?;
                    }
                }
                true
            }
            "description" => true,
            other => return Err(format!("keyword {other} is not checked here")),
        };
        if !ok {
            return Err(format!("{v} breaks {key}: {rule}"));
        }
    }
    Ok(())
}

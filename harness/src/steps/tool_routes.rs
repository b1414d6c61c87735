//! Tool use on `/v1/messages` and `/v1/responses` (issue 43) over plain
//! HTTP, as their clients speak them: each answer, whole and streamed (the
//! stream's named events put together as the official clients do, their
//! order checked on the way), is read into one form,
//! `{"content", "calls": [{"name", "input"}], "stop"}`, so that the two
//! can be compared and the calls checked against their tools' schemas.
//!
//! A docstring is the request as JSON; `model` is filled in from
//! `GET /v1/models`, `seed` from the step.

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::steps::anthropic::{events, post, request};
use crate::steps::tools::{conforms, tool_request};
use crate::steps::StepResult;
use crate::world::{TestWorld, ToolRun};

/// `/v1/messages`' whole answer in the common form.
fn message_form(m: &Value) -> Value {
    let blocks = m["content"].as_array().cloned().unwrap_or_default();
    let content: String = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
    let calls: Vec<Value> = blocks
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| json!({"name": b["name"], "input": b["input"]}))
        .collect();
    json!({"content": content, "calls": calls, "stop": m["stop_reason"]})
}

/// `/v1/messages`' events in the common form: blocks start at the next
/// index, each delta is for the open block and of its kind, a `tool_use`
/// block's input is its `input_json_delta`s put together.
fn message_events_form(ev: &[(String, Value)]) -> anyhow::Result<Value> {
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    check!(
        names.first() == Some(&"message_start") && names.last() == Some(&"message_stop"),
        "events {names:?}"
    );
    let (mut content, mut calls, mut stop) = (String::new(), Vec::new(), Value::Null);
    let mut open: Option<(u64, Value, String)> = None;
    let mut started = 0;
    for (name, data) in ev {
        check!(
            data["type"] == name.as_str(),
            "{name} carries {}",
            data["type"]
        );
        let index = data["index"].as_u64();
        match name.as_str() {
            "content_block_start" => {
                check!(open.is_none() && index == Some(started), "{name} {data}");
                started += 1;
                open = Some((started - 1, data["content_block"].clone(), String::new()));
            }
            "content_block_delta" => {
                let (at, block, json_buf) = open
                    .as_mut()
                    .ok_or_else(|| anyhow!("{data} outside a block"))?;
                check!(
                    index == Some(*at),
                    "a delta for block {index:?} in block {at}"
                );
                match (block["type"].as_str(), data["delta"]["type"].as_str()) {
                    (Some("text"), Some("text_delta")) => {
                        content.push_str(data["delta"]["text"].as_str().unwrap_or_default())
                    }
                    (Some("tool_use"), Some("input_json_delta")) => json_buf
                        .push_str(data["delta"]["partial_json"].as_str().unwrap_or_default()),
                    kinds => return Err(anyhow!("delta {kinds:?} in {block}")),
                }
            }
            "content_block_stop" => {
                let (at, block, json_buf) = open
                    .take()
                    .ok_or_else(|| anyhow!("a stop outside a block"))?;
                check!(index == Some(at), "{name} {data}");
                if block["type"] == "tool_use" {
                    let input: Value = serde_json::from_str(&json_buf)
                        .with_context(|| format!("{}'s input {json_buf:?}", block["name"]))?;
                    calls.push(json!({"name": block["name"], "input": input}));
                }
            }
            "message_delta" => stop = data["delta"]["stop_reason"].clone(),
            _ => {}
        }
    }
    Ok(json!({"content": content, "calls": calls, "stop": stop}))
}

/// `/v1/responses`' whole answer in the common form (arguments parsed).
fn response_form(r: &Value) -> anyhow::Result<Value> {
    let items = r["output"].as_array().cloned().unwrap_or_default();
    let mut content = String::new();
    let mut calls = Vec::new();
    for item in &items {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    content.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            Some("function_call") => {
                let args = item["arguments"].as_str().unwrap_or_default();
                let input: Value = serde_json::from_str(args)
                    .with_context(|| format!("{}'s arguments {args:?}", item["name"]))?;
                check!(
                    item["call_id"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("call_")),
                    "{item}"
                );
                calls.push(json!({"name": item["name"], "input": input}));
            }
            _ => return Err(anyhow!("output item {item}")),
        }
    }
    Ok(json!({"content": content, "calls": calls, "stop": r["status"]}))
}

/// `/v1/responses`' events in the common form: numbered in order; each
/// call's arguments are its deltas put together, as `.done` and the final
/// response say; the final response is the stream's answer.
fn response_events_form(ev: &[(String, Value)]) -> anyhow::Result<Value> {
    let mut args: Vec<(Value, String)> = Vec::new();
    let mut text = String::new();
    for (i, (name, data)) in ev.iter().enumerate() {
        check!(
            data["type"] == name.as_str() && data["sequence_number"] == i,
            "event {i}: {name} {data}"
        );
        match name.as_str() {
            "response.output_item.added" if data["item"]["type"] == "function_call" => {
                check!(data["item"]["arguments"] == "", "{data}");
                args.push((data["item"]["id"].clone(), String::new()));
            }
            "response.function_call_arguments.delta" => {
                let (id, so_far) = args
                    .last_mut()
                    .ok_or_else(|| anyhow!("{data} before its item"))?;
                check!(data["item_id"] == *id, "{data} for another item");
                so_far.push_str(data["delta"].as_str().unwrap_or_default());
            }
            "response.function_call_arguments.done" => {
                let (_, so_far) = args
                    .last()
                    .ok_or_else(|| anyhow!("{data} before its item"))?;
                check!(
                    data["arguments"] == so_far.as_str(),
                    "{data}: deltas {so_far:?}"
                );
            }
            "response.output_text.delta" => {
                text.push_str(data["delta"].as_str().unwrap_or_default())
            }
            _ => {}
        }
    }
    let (last, data) = ev.last().ok_or_else(|| anyhow!("no events"))?;
    check!(
        last == "response.completed" || last == "response.incomplete",
        "the stream ends with {last}"
    );
    let form = response_form(&data["response"])?;
    check!(
        form["content"] == text.as_str(),
        "deltas {text:?}, final {form}"
    );
    let streamed: Vec<Value> = args
        .iter()
        .map(|(_, a)| serde_json::from_str(a).unwrap_or(Value::Null))
        .collect();
    let finals: Vec<Value> = form["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["input"].clone())
        .collect();
    check!(
        streamed == finals,
        "streamed arguments {streamed:?}, final {finals:?}"
    );
    Ok(form)
}

/// One seed's answer whole and streamed, both in the common form.
async fn run(w: &TestWorld, path: &str, body: &Value, seed: u64) -> anyhow::Result<ToolRun> {
    let mut body = body.clone();
    body["seed"] = json!(seed);
    let (status, text) = post(w, path, &body).await?;
    check!(status == 200, "seed {seed}: status {status}: {text}");
    let whole: Value = serde_json::from_str(&text)?;
    body["stream"] = json!(true);
    let (status, text) = post(w, path, &body).await?;
    check!(
        status == 200,
        "seed {seed} streamed: status {status}: {text}"
    );
    let ev = events(&text)?;
    let (whole, streamed) = if path == "/v1/messages" {
        (message_form(&whole), message_events_form(&ev)?)
    } else {
        (response_form(&whole)?, response_events_form(&ev)?)
    };
    Ok(ToolRun {
        seed,
        whole,
        streamed,
    })
}

#[when(expr = "I post this with tools to {word} whole and streamed, seeds {string}:")]
async fn run_tools(w: &mut TestWorld, path: String, seeds: String, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    w.openai.tool_runs.clear();
    for seed in seeds.split(", ") {
        let seed = seed.parse().with_context(|| format!("seed {seed:?}"))?;
        let r = run(w, &path, &body, seed).await?;
        w.openai.tool_runs.push(r);
    }
    w.openai.tool_request = Some(body);
    Ok(())
}

/// The runs, each streamed as it was whole (the same seed, the same tokens).
fn alike(w: &TestWorld) -> anyhow::Result<&[ToolRun]> {
    let runs = &w.openai.tool_runs;
    check!(!runs.is_empty(), "no runs");
    for r in runs {
        check!(
            r.whole == r.streamed,
            "seed {}: whole {}, streamed {}",
            r.seed,
            r.whole,
            r.streamed
        );
    }
    Ok(runs)
}

#[then(expr = "every answer is text or tool uses that parse, whole and streamed alike")]
async fn text_or_uses(w: &mut TestWorld) -> StepResult {
    for r in alike(w)? {
        let called = !r.whole["calls"].as_array().is_none_or(Vec::is_empty);
        let stop = r.whole["stop"].as_str().unwrap_or_default();
        let said = [
            "tool_use",
            "completed",
            "incomplete",
            "end_turn",
            "max_tokens",
        ];
        check!(said.contains(&stop), "seed {}: stop {stop}", r.seed);
        check!(
            called == (stop == "tool_use") || stop == "completed",
            "seed {}: stop {stop} with calls {}",
            r.seed,
            r.whole["calls"]
        );
    }
    Ok(())
}

/// A tool's schema in the request: Anthropic's `input_schema` or the
/// Responses API's `parameters`.
fn schema_of<'a>(req: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    let tool = req["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == name)
        .ok_or_else(|| anyhow!("no tool {name}"))?;
    Ok(tool.get("input_schema").unwrap_or(&tool["parameters"]))
}

#[then(
    expr = "every answer uses {string} with input valid under its schema and stops with {string}, whole and streamed alike"
)]
async fn valid_uses(w: &mut TestWorld, allowed: String, stop: String) -> StepResult {
    let allowed: Vec<&str> = allowed.split(", ").collect();
    let req = tool_request(w)?;
    for r in alike(w)? {
        let seed = r.seed;
        check!(r.whole["stop"] == stop.as_str(), "seed {seed}: {}", r.whole);
        check!(
            r.whole["content"] == "",
            "seed {seed}: text beside the calls: {}",
            r.whole
        );
        let calls = r.whole["calls"].as_array().cloned().unwrap_or_default();
        check!(!calls.is_empty(), "seed {seed}: no calls");
        for c in calls {
            let name = c["name"].as_str().unwrap_or_default();
            check!(allowed.contains(&name), "seed {seed}: uses {name}");
            conforms(&c["input"], schema_of(req, name)?)
                .map_err(|e| anyhow!("seed {seed}: {name}({}): {e}", c["input"]))?;
        }
    }
    Ok(())
}

#[then(expr = "\\/v1\\/responses answers 400 naming {string} for:")]
async fn responses_refuses(w: &mut TestWorld, param: String, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    let (status, text) = post(w, "/v1/responses", &body).await?;
    let e: Value = serde_json::from_str(&text).with_context(|| format!("body {text:?}"))?;
    check!(status == 400, "status {status}: {text}");
    let error = &e["error"];
    check!(
        error["type"] == "invalid_request_error" && error["param"] == param.as_str(),
        "error {e}"
    );
    let message = error["message"].as_str().unwrap_or_default();
    check!(
        message.starts_with(&format!("{param}: ")),
        "message {message:?}"
    );
    Ok(())
}

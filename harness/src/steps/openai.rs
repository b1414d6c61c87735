//! The OpenAI-compatible routes driven by a real client, the `async-openai`
//! crate (issue 16): both endpoints whole and streamed, greedy agreement with
//! `/execute`, refusals as the client's typed errors, and `/openapi.json`.
//!
//! A docstring is the request as JSON, read into async-openai's own request
//! type (so a field the client cannot express fails the step); `model` is
//! filled in from the client's `GET /v1/models`.

use anyhow::anyhow;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{CreateChatCompletionRequest, CreateChatCompletionResponse};
use async_openai::types::completions::{CreateCompletionRequest, CreateCompletionResponse};
use async_openai::Client;
use cucumber::gherkin::Step;
use cucumber::{then, when};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::check;
use crate::steps::{json_docstring, StepResult};
use crate::world::{Answer, TestWorld, JOB_TIMEOUT};

pub(super) fn client(w: &TestWorld) -> anyhow::Result<Client<OpenAIConfig>> {
    let base = format!("{}/v1", w.client()?.base());
    Ok(Client::with_config(
        OpenAIConfig::new()
            .with_api_base(base)
            .with_api_key("unused"),
    ))
}

/// The docstring as JSON with `model` set to the served model's id.
pub(super) async fn request(w: &mut TestWorld, step: &Step) -> anyhow::Result<Value> {
    let mut body = json_docstring(w, step)?;
    let models = client(w)?.models().list().await?;
    let id = models
        .data
        .first()
        .ok_or_else(|| anyhow!("GET /v1/models lists no model"))?
        .id
        .clone();
    body["model"] = json!(id);
    Ok(body)
}

fn name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn chat_answer(r: &CreateChatCompletionResponse) -> anyhow::Result<Answer> {
    let c = r.choices.first().ok_or_else(|| anyhow!("no choice"))?;
    let logprobs = c
        .logprobs
        .as_ref()
        .and_then(|l| l.content.clone())
        .unwrap_or_default();
    Ok(Answer {
        text: c.message.content.clone().unwrap_or_default(),
        finish_reason: c.finish_reason.as_ref().map(name).unwrap_or_default(),
        completion_tokens: r.usage.as_ref().map(|u| u.completion_tokens),
        logprobs: logprobs
            .iter()
            .map(|t| (t.token.clone(), f64::from(t.logprob)))
            .collect(),
    })
}

fn completion_answer(r: &CreateCompletionResponse) -> anyhow::Result<Answer> {
    let c = r.choices.first().ok_or_else(|| anyhow!("no choice"))?;
    let lp = c.logprobs.as_ref();
    let tokens = lp.map(|l| l.tokens.clone()).unwrap_or_default();
    let values = lp.map(|l| l.token_logprobs.clone()).unwrap_or_default();
    Ok(Answer {
        text: c.text.clone(),
        finish_reason: c.finish_reason.as_ref().map(name).unwrap_or_default(),
        completion_tokens: r.usage.as_ref().map(|u| u.completion_tokens),
        logprobs: tokens
            .into_iter()
            .zip(values)
            .map(|(t, v)| (t, v.map_or(f64::NAN, f64::from)))
            .collect(),
    })
}

async fn chat_both(w: &mut TestWorld, body: Value) -> anyhow::Result<()> {
    let c = client(w)?;
    let whole: CreateChatCompletionRequest = serde_json::from_value(body.clone())?;
    let whole = chat_answer(&c.chat().create(whole).await?)?;
    let mut streamed: CreateChatCompletionRequest = serde_json::from_value(body)?;
    streamed.stream = Some(true);
    streamed.stream_options = serde_json::from_value(json!({"include_usage": true}))?;
    let mut stream = c.chat().create_stream(streamed).await?;
    let mut answer = Answer::default();
    while let Some(chunk) = tokio::time::timeout(JOB_TIMEOUT, stream.next()).await? {
        let chunk = chunk?;
        if let Some(u) = chunk.usage {
            answer.completion_tokens = Some(u.completion_tokens);
        }
        for choice in chunk.choices {
            answer
                .text
                .push_str(choice.delta.content.as_deref().unwrap_or_default());
            if let Some(f) = choice.finish_reason {
                answer.finish_reason = name(&f);
            }
            let lps = choice.logprobs.and_then(|l| l.content).unwrap_or_default();
            answer
                .logprobs
                .extend(lps.iter().map(|t| (t.token.clone(), f64::from(t.logprob))));
        }
    }
    w.openai.whole = Some(whole);
    w.openai.streamed = Some(answer);
    Ok(())
}

async fn completion_both(w: &mut TestWorld, body: Value) -> anyhow::Result<()> {
    let c = client(w)?;
    let whole: CreateCompletionRequest = serde_json::from_value(body.clone())?;
    let whole = completion_answer(&c.completions().create(whole).await?)?;
    let mut streamed: CreateCompletionRequest = serde_json::from_value(body)?;
    streamed.stream = Some(true);
    streamed.stream_options = serde_json::from_value(json!({"include_usage": true}))?;
    let mut stream = c.completions().create_stream(streamed).await?;
    let mut answer = Answer::default();
    while let Some(chunk) = tokio::time::timeout(JOB_TIMEOUT, stream.next()).await? {
        let chunk = chunk?;
        if let Some(u) = &chunk.usage {
            answer.completion_tokens = Some(u.completion_tokens);
        }
        if chunk.choices.is_empty() {
            continue;
        }
        let part = completion_answer(&chunk)?;
        answer.text.push_str(&part.text);
        answer.logprobs.extend(part.logprobs);
        if !part.finish_reason.is_empty() {
            answer.finish_reason = part.finish_reason;
        }
    }
    w.openai.whole = Some(whole);
    w.openai.streamed = Some(answer);
    Ok(())
}

#[when(expr = "the async-openai client runs this chat completion whole and streamed:")]
async fn run_chat(w: &mut TestWorld, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    chat_both(w, body).await?;
    Ok(())
}

#[when(expr = "the async-openai client runs this text completion whole and streamed:")]
async fn run_completion(w: &mut TestWorld, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    completion_both(w, body).await?;
    Ok(())
}

#[then(expr = "both answers are the same {int} tokens, finished with {string}")]
async fn both_same_n(w: &mut TestWorld, n: u32, finish: String) -> StepResult {
    both_same(w, Some(n), finish)
}

#[then(expr = "both answers are the same, finished with {string}")]
async fn both_same_any(w: &mut TestWorld, finish: String) -> StepResult {
    both_same(w, None, finish)
}

/// The whole and streamed answers agree, with `n` tokens where given.
fn both_same(w: &TestWorld, n: Option<u32>, finish: String) -> StepResult {
    let (whole, streamed) = (w.openai.whole.as_ref(), w.openai.streamed.as_ref());
    let (whole, streamed) = whole
        .zip(streamed)
        .ok_or_else(|| anyhow!("no OpenAI answers"))?;
    check!(
        whole == streamed,
        "whole {whole:?} and streamed {streamed:?} differ"
    );
    check!(
        n.is_none() || whole.completion_tokens == n,
        "usage says {:?} tokens, not {n:?}",
        whole.completion_tokens
    );
    check!(
        whole.finish_reason == finish,
        "finish reason {:?}, not {finish:?}",
        whole.finish_reason
    );
    check!(!whole.text.is_empty(), "empty text");
    Ok(())
}

#[then(expr = "every token has a log-probability")]
async fn every_token_logprob(w: &mut TestWorld) -> StepResult {
    let whole = w
        .openai
        .whole
        .as_ref()
        .ok_or_else(|| anyhow!("no OpenAI answer"))?;
    let n = whole.completion_tokens.unwrap_or_default() as usize;
    check!(
        whole.logprobs.len() == n,
        "{} log-probabilities for {n} tokens",
        whole.logprobs.len()
    );
    check!(
        whole.logprobs.iter().all(|(_, lp)| *lp <= 0.0),
        "a log-probability above 0: {:?}",
        whole.logprobs
    );
    Ok(())
}

#[then(expr = "the text does not contain {string}")]
async fn text_lacks(w: &mut TestWorld, stop: String) -> StepResult {
    let stop = stop.replace("\\n", "\n");
    let whole = w
        .openai
        .whole
        .as_ref()
        .ok_or_else(|| anyhow!("no OpenAI answer"))?;
    check!(
        !whole.text.contains(&stop),
        "{:?} contains {stop:?}",
        whole.text
    );
    Ok(())
}

#[when(expr = "I run this greedy chat through \\/execute and the async-openai client:")]
async fn greedy_both(w: &mut TestWorld, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    let mut execute = json!({"job_id": "ext016-greedy", "messages": body["messages"],
        "max_tokens": body["max_tokens"], "temperature": 0, "logprobs": 1});
    execute["job_id"] = json!(format!("ext016-greedy-{}", crate::world::uuid_v4()));
    let t = w.run_job(execute).await?;
    let mut tokens = Vec::new();
    for e in t.tokens() {
        let top = &e.data["logprobs"][0];
        let text = top["t"]
            .as_str()
            .ok_or_else(|| anyhow!("a token without logprobs: {:?}", e.data))?;
        check!(
            top["id"] == e.data["id"],
            "greedy chose {} over the top-1 {}",
            e.data["id"],
            top["id"]
        );
        tokens.push((
            text.to_string(),
            top["logprob"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    w.openai.execute = tokens;
    let mut chat = body;
    chat["temperature"] = json!(0);
    chat["logprobs"] = json!(true);
    chat_both(w, chat).await?;
    Ok(())
}

#[then(expr = "both front doors gave the same tokens with the same log-probabilities")]
async fn same_tokens(w: &mut TestWorld) -> StepResult {
    let whole = w
        .openai
        .whole
        .as_ref()
        .ok_or_else(|| anyhow!("no OpenAI answer"))?;
    let execute = &w.openai.execute;
    check!(!execute.is_empty(), "/execute gave no tokens");
    check!(
        whole.logprobs.len() == execute.len(),
        "{} tokens through /v1, {} through /execute",
        whole.logprobs.len(),
        execute.len()
    );
    for (i, ((a, la), (b, lb))) in whole.logprobs.iter().zip(execute).enumerate() {
        check!(
            a == b && (la - lb).abs() < 1e-6,
            "token {i}: /v1 {a:?} {la}, /execute {b:?} {lb}"
        );
    }
    Ok(())
}

/// The client's error for a refused request: (HTTP status, `param`).
async fn refusal(w: &mut TestWorld, body: Value) -> anyhow::Result<(u16, Option<String>)> {
    let req: CreateChatCompletionRequest = serde_json::from_value(body)?;
    match client(w)?.chat().create(req).await {
        Err(OpenAIError::ApiError(e)) => Ok((e.status_code.as_u16(), e.api_error.param)),
        Err(other) => Err(anyhow!("not an API error: {other}")),
        Ok(r) => Err(anyhow!("accepted: {r:?}")),
    }
}

#[then(expr = "the async-openai client gets {int} naming {string} for:")]
async fn refused_naming(w: &mut TestWorld, status: u16, param: String, step: &Step) -> StepResult {
    let body = request(w, step).await?;
    let (got, named) = refusal(w, body).await?;
    check!(got == status, "status {got}, not {status}");
    check!(
        named.as_deref() == Some(param.as_str()),
        "param {named:?}, not {param:?}"
    );
    Ok(())
}

#[then(expr = "the async-openai client gets {int} for model {string}")]
async fn wrong_model(w: &mut TestWorld, status: u16, model: String) -> StepResult {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let (got, _) = refusal(w, body).await?;
    check!(got == status, "status {got}, not {status}");
    Ok(())
}

#[then(expr = "\\/openapi.json documents {string}")]
async fn openapi_documents(w: &mut TestWorld, paths: String) -> StepResult {
    let url = format!("{}/openapi.json", w.client()?.base());
    let doc: Value = reqwest::get(url).await?.json().await?;
    for path in paths.split(", ") {
        check!(doc["paths"].get(path).is_some(), "{path} is not documented");
    }
    for schema in [
        "ExecuteRequest",
        "ChatCompletionRequest",
        "CompletionRequest",
        "ErrorResponse",
    ] {
        check!(
            doc["components"]["schemas"].get(schema).is_some(),
            "no schema {schema}"
        );
    }
    Ok(())
}

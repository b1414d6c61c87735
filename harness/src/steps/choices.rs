//! Several choices of one request (OpenAI's `n`, issue 43) through the
//! `async-openai` client: the whole answer, the stream's chunks sorted by
//! their choice's `index`, and one-choice requests with each choice's seed
//! (`seed + index`) to compare with.

use anyhow::{anyhow, Context};
use async_openai::types::chat::CreateChatCompletionRequest;
use cucumber::gherkin::Step;
use cucumber::{then, when};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::check;
use crate::steps::openai::{client, request};
use crate::steps::StepResult;
use crate::world::{Choices, TestWorld, JOB_TIMEOUT};

/// The whole answer of `body`, as JSON.
async fn whole(w: &TestWorld, body: &Value) -> anyhow::Result<Value> {
    let req: CreateChatCompletionRequest = serde_json::from_value(body.clone())?;
    Ok(serde_json::to_value(client(w)?.chat().create(req).await?)?)
}

/// The streamed answer of `body`: each choice's `{content, finish_reason}`
/// put together by `index`, and every chunk that carried a usage.
async fn streamed(
    w: &TestWorld,
    body: &Value,
    n: usize,
) -> anyhow::Result<(Vec<Value>, Vec<Value>)> {
    let mut req: CreateChatCompletionRequest = serde_json::from_value(body.clone())?;
    req.stream = Some(true);
    req.stream_options = serde_json::from_value(json!({"include_usage": true}))?;
    let mut stream = client(w)?.chat().create_stream(req).await?;
    let mut choices = vec![json!({"content": "", "finish_reason": null}); n];
    let mut usage = Vec::new();
    while let Some(chunk) = tokio::time::timeout(JOB_TIMEOUT, stream.next()).await? {
        let chunk = serde_json::to_value(chunk?)?;
        if chunk["usage"].is_object() {
            usage.push(chunk.clone());
        }
        for c in chunk["choices"].as_array().into_iter().flatten() {
            let i = c["index"]
                .as_u64()
                .context("a chunk's choice without index")? as usize;
            let choice = choices
                .get_mut(i)
                .ok_or_else(|| anyhow!("a chunk of choice {i} of {n}"))?;
            let piece = c["delta"]["content"].as_str().unwrap_or_default();
            choice["content"] = json!(format!(
                "{}{piece}",
                choice["content"].as_str().unwrap_or_default()
            ));
            if !c["finish_reason"].is_null() {
                check!(
                    choice["finish_reason"].is_null(),
                    "choice {i} finished twice"
                );
                choice["finish_reason"] = c["finish_reason"].clone();
            }
        }
    }
    Ok((choices, usage))
}

/// A counter of `/metrics`.
async fn counter(w: &TestWorld, name: &str) -> anyhow::Result<u64> {
    let text = w.client()?.metrics().await?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|v| v as u64)
        .ok_or_else(|| anyhow!("/metrics has no {name}"))
}

#[when(expr = "the async-openai client asks for {int} choices of this chat whole and streamed:")]
async fn ask_choices(w: &mut TestWorld, n: usize, step: &Step) -> StepResult {
    let mut body = request(w, step).await?;
    let seed = body["seed"].as_u64().context("the chat needs a seed")?;
    body["n"] = json!(n);
    let before = (
        counter(w, "worker_prefix_cache_hit_tokens_total").await?,
        counter(w, "worker_prefix_cache_miss_tokens_total").await?,
    );
    let answer = whole(w, &body).await?;
    let after = (
        counter(w, "worker_prefix_cache_hit_tokens_total").await?,
        counter(w, "worker_prefix_cache_miss_tokens_total").await?,
    );
    let (stream, usage_chunks) = streamed(w, &body, n).await?;
    let mut singles = Vec::new();
    for i in 0..n {
        let mut one = body.clone();
        one.as_object_mut().expect("a JSON object").remove("n");
        one["seed"] = json!(seed + i as u64);
        singles.push(whole(w, &one).await?);
    }
    w.openai.choices = Some(Choices {
        whole: answer,
        streamed: stream,
        usage_chunks,
        singles,
        cache_counts: (after.0 - before.0, after.1 - before.1),
    });
    Ok(())
}

fn choices(w: &TestWorld) -> anyhow::Result<&Choices> {
    w.openai
        .choices
        .as_ref()
        .ok_or_else(|| anyhow!("no choices were asked for"))
}

#[then(expr = "choice i is the one-choice answer with seed plus i, whole and streamed alike")]
async fn each_choice(w: &mut TestWorld) -> StepResult {
    let c = choices(w)?;
    let whole = c.whole["choices"].as_array().context("no choices")?;
    check!(
        whole.len() == c.singles.len(),
        "{} choices, {} asked for",
        whole.len(),
        c.singles.len()
    );
    for (i, ((got, single), streamed)) in whole.iter().zip(&c.singles).zip(&c.streamed).enumerate()
    {
        let single = &single["choices"][0];
        check!(got["index"] == i, "choice {i} has index {}", got["index"]);
        let text = &got["message"]["content"];
        check!(
            *text == single["message"]["content"]
                && got["finish_reason"] == single["finish_reason"],
            "choice {i}: {text} ({}), with seed + {i} alone: {} ({})",
            got["finish_reason"],
            single["message"]["content"],
            single["finish_reason"]
        );
        check!(
            *text == streamed["content"] && got["finish_reason"] == streamed["finish_reason"],
            "choice {i} whole {text} ({}), streamed {streamed}",
            got["finish_reason"]
        );
    }
    let texts: Vec<&Value> = whole.iter().map(|c| &c["message"]["content"]).collect();
    check!(
        texts.iter().skip(1).any(|t| *t != texts[0]),
        "every choice is the same text at temperature 1: {texts:?}"
    );
    Ok(())
}

#[then(expr = "the usage counts the prompt once and every choice's tokens, whole and streamed")]
async fn usage_sums(w: &mut TestWorld) -> StepResult {
    let c = choices(w)?;
    let prompt = c.singles[0]["usage"]["prompt_tokens"].clone();
    let sum: u64 = c
        .singles
        .iter()
        .map(|s| s["usage"]["completion_tokens"].as_u64().unwrap_or(0))
        .sum();
    let whole = &c.whole["usage"];
    check!(
        whole["prompt_tokens"] == prompt && whole["completion_tokens"] == sum,
        "whole usage {whole}; the prompt is {prompt} tokens and the choices {sum}"
    );
    check!(
        c.usage_chunks.len() == 1,
        "{} chunks carried a usage",
        c.usage_chunks.len()
    );
    let streamed = &c.usage_chunks[0]["usage"];
    check!(
        streamed["prompt_tokens"] == prompt && streamed["completion_tokens"] == sum,
        "streamed usage {streamed}; the prompt is {prompt} tokens and the choices {sum}"
    );
    Ok(())
}

#[then(
    expr = "\\/metrics counted the first request's prompt computed once and attached by its other choices"
)]
async fn computed_once(w: &mut TestWorld) -> StepResult {
    let c = choices(w)?;
    let prompt = c.whole["usage"]["prompt_tokens"]
        .as_u64()
        .context("no prompt_tokens")?;
    let others = c.singles.len() as u64 - 1;
    check!(
        c.cache_counts == (others * prompt, prompt),
        "the request moved the prefix cache's hit and miss counts by {:?}; its prompt is {prompt} tokens and {others} choices could attach it",
        c.cache_counts
    );
    Ok(())
}

//! Prompt reuse (issue 42): jobs whose prompts share a long prefix, run on a
//! worker with the prefix cache and on a reference worker without it, and
//! what each reports cached.
//!
//! Job ids are `{tag}-{i}`: the `i`-th prompt (a shared prefix, then a line
//! of its own), run under `tag`.

use anyhow::{anyhow, Context};
use cucumber::{given, then, when};
use futures::future::join_all;
use serde_json::{json, Value};

use crate::check;
use crate::client::{Client, Transcript};
use crate::steps::params::Flags;
use crate::steps::StepResult;
use crate::world::{TestWorld, JOB_TIMEOUT};

/// A text of at least `tokens` tokens on `client`'s tokenizer.
async fn shared_prefix(client: &Client, tokens: usize) -> anyhow::Result<String> {
    let mut text = String::from("You are a careful assistant. Read the log below.\n");
    let mut line = 0;
    loop {
        for _ in 0..32 {
            line += 1;
            text += &format!(
                "Entry {line}: sensor {} read {} at step {}.\n",
                line % 7,
                line * 13 % 101,
                line
            );
        }
        if client.tokenize(&text, false, false).await?.len() >= tokens {
            return Ok(text);
        }
    }
}

/// Job `i`'s body: the prefix, a question of its own, seeded sampling with
/// log-probabilities.
fn job_body(tag: &str, i: usize, prefix: &str) -> Value {
    json!({
        "job_id": format!("{tag}-{i}"),
        "prompt": format!("{prefix}Question {i}: which sensor read the most at step {}?", 3 + i),
        "temperature": 0.8,
        "seed": 100 + i,
        "max_tokens": 8,
        "logprobs": 3,
    })
}

/// Posts `bodies` at once to `client` and files every job's transcript.
async fn run_at_once(w: &mut TestWorld, client: &Client, bodies: Vec<Value>) -> StepResult {
    let outcomes = join_all(bodies.iter().map(|b| client.execute(b))).await;
    let mut ids = Vec::new();
    for (body, outcome) in bodies.into_iter().zip(outcomes) {
        ids.push(crate::world::job_id(&body));
        w.stream.file(&w.scenario, body, outcome?);
    }
    for id in ids {
        w.finish_job(&id, JOB_TIMEOUT).await?;
    }
    Ok(())
}

/// The scenario's shared prefix and number of jobs.
fn prompts(w: &TestWorld) -> anyhow::Result<(String, usize)> {
    w.shared_prefix
        .clone()
        .context("no prompts were made: run the reference jobs first")
}

#[given(expr = "a reference worker on the reference model{flags}")]
async fn reference_worker(w: &mut TestWorld, flags: Flags) -> StepResult {
    let mut l = w.launch(&w.cfg.model.clone())?;
    if let Flags::With(f) = &flags {
        l.apply(&w.expand(f)?)?;
    }
    let mut second = crate::process::Worker::spawn(l)?;
    second.wait_healthy(w.cfg.start_timeout).await?;
    w.process.second = Some(second);
    Ok(())
}

#[when(
    expr = "the reference worker runs {int} jobs sharing a {int}-token prefix as {string}, one after another"
)]
async fn reference_jobs(w: &mut TestWorld, n: usize, tokens: usize, tag: String) -> StepResult {
    let client = w.process.second()?.client();
    let prefix = shared_prefix(&client, tokens).await?;
    w.shared_prefix = Some((prefix.clone(), n));
    for i in 0..n {
        run_at_once(w, &client, vec![job_body(&tag, i, &prefix)]).await?;
    }
    Ok(())
}

#[when(expr = "the worker runs them as {string}: the first alone, then the rest at once")]
async fn first_then_rest(w: &mut TestWorld, tag: String) -> StepResult {
    let (prefix, n) = prompts(w)?;
    let client = w.client()?;
    run_at_once(w, &client, vec![job_body(&tag, 0, &prefix)]).await?;
    let rest = (1..n).map(|i| job_body(&tag, i, &prefix)).collect();
    run_at_once(w, &client, rest).await
}

#[when(expr = "the worker runs them as {string}, all at once")]
async fn all_at_once(w: &mut TestWorld, tag: String) -> StepResult {
    let (prefix, n) = prompts(w)?;
    let client = w.client()?;
    let all = (0..n).map(|i| job_body(&tag, i, &prefix)).collect();
    run_at_once(w, &client, all).await
}

/// Each token's id and its log-probabilities, from a job's token events.
fn tokens_and_logprobs(t: &Transcript) -> Vec<Value> {
    t.tokens()
        .map(|e| json!([e.data.get("id"), e.data.get("logprobs")]))
        .collect()
}

fn end_of(t: &Transcript) -> anyhow::Result<&Value> {
    t.first("end")
        .map(|e| &e.data)
        .ok_or_else(|| anyhow!("job {} has no end event: {:?}", t.job_id, t.terminal()))
}

#[then(expr = "jobs {string} streamed the same tokens and log-probabilities as jobs {string}")]
async fn same_tokens(w: &mut TestWorld, got: String, want: String) -> StepResult {
    let (_, n) = prompts(w)?;
    for i in 0..n {
        let a = tokens_and_logprobs(w.settle(&format!("{got}-{i}")).await?);
        let b = tokens_and_logprobs(w.settle(&format!("{want}-{i}")).await?);
        check!(!b.is_empty(), "job {want}-{i} streamed no token");
        check!(
            a == b,
            "job {got}-{i} streamed {a:?}\n  job {want}-{i} {b:?}"
        );
    }
    Ok(())
}

/// `(prompt tokens, tokens its cached prefix could hold)` of job `i`: every
/// whole chunk that `shared` tokens cover, leaving the prompt's last token.
async fn cachable(
    w: &mut TestWorld,
    i: usize,
    shared_with_first: bool,
) -> anyhow::Result<(usize, usize)> {
    let (prefix, _) = prompts(w)?;
    let client = w.client()?;
    let chunk = client.health().await?["prefix_cache"]["chunk_tokens"]
        .as_u64()
        .ok_or_else(|| anyhow!("/health shows no prefix_cache.chunk_tokens"))?
        as usize;
    let mine = client
        .tokenize(
            job_body("", i, &prefix)["prompt"]
                .as_str()
                .unwrap_or_default(),
            true,
            false,
        )
        .await?;
    let shared = if shared_with_first {
        let first = client
            .tokenize(
                job_body("", 0, &prefix)["prompt"]
                    .as_str()
                    .unwrap_or_default(),
                true,
                false,
            )
            .await?;
        mine.iter().zip(&first).take_while(|(a, b)| a == b).count()
    } else {
        mine.len()
    };
    let usable = shared.min(mine.len() - 1);
    Ok((mine.len(), usable / chunk * chunk))
}

#[then(expr = "jobs {string} report tokens_cached 0")]
async fn none_cached(w: &mut TestWorld, tag: String) -> StepResult {
    let (_, n) = prompts(w)?;
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let end = end_of(w.settle(&id).await?)?.clone();
        check!(
            end["tokens_cached"] == json!(0),
            "job {id} ended with {end}"
        );
    }
    Ok(())
}

#[then(
    expr = "job {string} reports tokens_cached 0 and the others their prefix's whole chunks shared with it"
)]
async fn first_none_rest_shared(w: &mut TestWorld, tag: String) -> StepResult {
    let (_, n) = prompts(w)?;
    for i in 0..n {
        let want = if i == 0 {
            0
        } else {
            cachable(w, i, true).await?.1
        };
        let id = format!("{tag}-{i}");
        let end = end_of(w.settle(&id).await?)?.clone();
        check!(
            end["tokens_cached"] == json!(want),
            "job {id}: {want} cached tokens expected, its end event {end}"
        );
        if i > 0 {
            check!(
                want > 0,
                "job {id}'s prompt shares no whole chunk: make the prefix longer"
            );
        }
    }
    Ok(())
}

#[then(
    expr = "one job {string} computed the shared prefix and every other attached its whole chunks"
)]
async fn burst_shared(w: &mut TestWorld, tag: String) -> StepResult {
    let (_, n) = prompts(w)?;
    // The whole chunks of the start all prompts have in common.
    let mut common = usize::MAX;
    for i in 1..n {
        let (tokens, shared) = cachable(w, i, true).await?;
        common = common.min(shared).min(tokens - 1);
    }
    check!(
        common > 0,
        "the prompts share no whole chunk: make the prefix longer"
    );
    let mut computed = Vec::new();
    for i in 0..n {
        let (tokens, most) = cachable(w, i, false).await?;
        let id = format!("{tag}-{i}");
        let end = end_of(w.settle(&id).await?)?.clone();
        let cached = end["tokens_cached"]
            .as_u64()
            .with_context(|| format!("job {id}'s end event has no tokens_cached: {end}"))?
            as usize;
        if cached == 0 {
            computed.push(id);
            continue;
        }
        check!(
            (common..=most).contains(&cached),
            "job {id} ({tokens} prompt tokens): {cached} cached tokens, not within {common}..={most}"
        );
    }
    check!(
        computed.len() == 1,
        "one job should have computed the shared prefix, these did: {computed:?}"
    );
    Ok(())
}

#[then(expr = "jobs {string} report their whole prompts cached")]
async fn all_cached(w: &mut TestWorld, tag: String) -> StepResult {
    let (_, n) = prompts(w)?;
    for i in 0..n {
        let (tokens, _) = cachable(w, i, false).await?;
        let id = format!("{tag}-{i}");
        let end = end_of(w.settle(&id).await?)?.clone();
        check!(
            end["tokens_cached"] == json!(tokens),
            "job {id}: its {tokens} prompt tokens cached expected, its end event {end}"
        );
    }
    Ok(())
}

#[then(expr = "\\/metrics counts the cached and the computed prompt tokens of jobs {string}")]
async fn metrics_count(w: &mut TestWorld, tags: String) -> StepResult {
    let (_, n) = prompts(w)?;
    let (mut hit, mut all) = (0u64, 0u64);
    for tag in tags.split(',').map(str::trim) {
        for i in 0..n {
            let end = end_of(w.settle(&format!("{tag}-{i}")).await?)?.clone();
            hit += end["tokens_cached"].as_u64().unwrap_or(0);
            all += cachable(w, i, false).await?.0 as u64;
        }
    }
    let text = w.client()?.metrics().await?;
    let value = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .map(|v| v as u64)
            .ok_or_else(|| anyhow!("/metrics has no {name}"))
    };
    let got_hit = value("worker_prefix_cache_hit_tokens_total ")?;
    let got_miss = value("worker_prefix_cache_miss_tokens_total ")?;
    check!(
        (got_hit, got_miss) == (hit, all - hit),
        "/metrics counts {got_hit} hit and {got_miss} missed prompt tokens; the jobs' end events {hit} of {all}"
    );
    let health = w.client()?.health().await?;
    check!(
        health["prefix_cache"]["entries"]
            .as_u64()
            .is_some_and(|e| e > 0),
        "/health shows no cached entries: {}",
        health["prefix_cache"]
    );
    Ok(())
}

/// A chat whose system prompt is a shared prefix of at least `tokens`.
async fn chat_body(client: &Client, tokens: usize) -> anyhow::Result<Value> {
    let system = shared_prefix(client, tokens).await?;
    Ok(json!({
        "model": client.served_model().await?,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Which sensor read the most?"}
        ],
        "max_tokens": 4,
        "temperature": 0,
    }))
}

/// `usage.prompt_tokens_details.cached_tokens` of a chat answer, and its prompt tokens.
async fn chat_cached(client: &Client, body: &Value) -> anyhow::Result<(u64, u64)> {
    let r = client.post_json("/v1/chat/completions", body).await?;
    let v = r.json()?;
    check!(
        r.status == 200,
        "/v1/chat/completions answered {}: {}",
        r.status,
        r.body
    );
    let usage = &v["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .ok_or_else(|| anyhow!("no usage.prompt_tokens_details.cached_tokens: {usage}"))?;
    Ok((cached, usage["prompt_tokens"].as_u64().unwrap_or(0)))
}

#[then(
    expr = "a chat with a {int}-token system prompt sent twice reports no cached tokens, then all of them, and another question after it whole chunks"
)]
async fn chat_twice_cached(w: &mut TestWorld, tokens: usize) -> StepResult {
    let client = w.client()?;
    let chunk = client.health().await?["prefix_cache"]["chunk_tokens"]
        .as_u64()
        .ok_or_else(|| anyhow!("/health shows no prefix_cache.chunk_tokens"))?;
    let mut body = chat_body(&client, tokens).await?;
    let (first, n) = chat_cached(&client, &body).await?;
    let (second, _) = chat_cached(&client, &body).await?;
    check!(
        (first, second) == (0, n),
        "cached_tokens {first} then {second} of {n} prompt tokens; 0 then {n} expected"
    );
    body["messages"][1]["content"] = json!("And which sensor read the least, at which step?");
    let (other, m) = chat_cached(&client, &body).await?;
    check!(
        other > 0 && other < m && other % chunk == 0,
        "another question: {other} of {m} prompt tokens cached; whole chunks of {chunk} expected"
    );
    Ok(())
}

#[then(
    expr = "on the reference worker the same chat sent twice reports no cached tokens and \\/health no prefix cache"
)]
async fn chat_twice_uncached(w: &mut TestWorld) -> StepResult {
    let client = w.process.second()?.client();
    let body = chat_body(&client, 600).await?;
    for _ in 0..2 {
        let (cached, _) = chat_cached(&client, &body).await?;
        check!(
            cached == 0,
            "{cached} cached tokens with the prefix cache off"
        );
    }
    let health = client.health().await?;
    check!(
        health.get("prefix_cache").is_none(),
        "/health shows a prefix cache: {}",
        health["prefix_cache"]
    );
    Ok(())
}

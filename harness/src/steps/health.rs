//! `GET /health`: status, typed fields, residency and memory accounting.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::Value;

use super::StepResult;
use crate::check;
use crate::gguf::Gguf;
use crate::world::TestWorld;

async fn health(w: &TestWorld) -> anyhow::Result<Value> {
    w.client()?.health().await
}

fn field<'a>(h: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    h.get(name)
        .ok_or_else(|| anyhow!("/health has no {name}: {h}"))
}

#[then(regex = r#"^/health says "([^"]+)"$"#)]
async fn says(w: &mut TestWorld, status: String) -> StepResult {
    let h = health(w).await?;
    check!(
        field(&h, "status")?.as_str() == Some(status.as_str()),
        "/health: {h}"
    );
    Ok(())
}

#[then(regex = r#"^within (\d+) s /health says "([^"]+)"$"#)]
async fn says_within(w: &mut TestWorld, secs: u64, status: String) -> StepResult {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(h) = health(w).await {
            if h.get("status").and_then(Value::as_str) == Some(status.as_str()) {
                return Ok(());
            }
            last = h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow!("/health did not say {status} within {secs} s; last: {last}").into())
}

#[when(regex = r"^I remember /health$")]
async fn remember(w: &mut TestWorld) -> StepResult {
    w.remembered_health = Some(health(w).await?);
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" is unchanged$"#)]
async fn unchanged(w: &mut TestWorld, name: String) -> StepResult {
    let before = w
        .remembered_health
        .clone()
        .ok_or_else(|| anyhow!("nothing remembered"))?;
    let now = health(w).await?;
    check!(
        field(&before, &name)? == field(&now, &name)?,
        "/health {name} was {} and is now {}",
        before[&name],
        now[&name]
    );
    Ok(())
}

#[then(regex = r#"^on cuda /health field "([^"]+)" is unchanged$"#)]
async fn unchanged_on_cuda(w: &mut TestWorld, name: String) -> StepResult {
    if w.cfg.backend == "cuda" {
        unchanged(w, name).await?;
    }
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" is "([^"]*)"$"#)]
async fn is_string(w: &mut TestWorld, name: String, want: String) -> StepResult {
    let h = health(w).await?;
    check!(
        field(&h, &name)?.as_str() == Some(want.as_str()),
        "/health {name} is {}, want {want:?}",
        h[&name]
    );
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" is (true|false)$"#)]
async fn is_bool(w: &mut TestWorld, name: String, want: bool) -> StepResult {
    let h = health(w).await?;
    check!(
        field(&h, &name)?.as_bool() == Some(want),
        "/health {name} is {}, want {want}",
        h[&name]
    );
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" is (\d+)$"#)]
async fn is_number(w: &mut TestWorld, name: String, want: u64) -> StepResult {
    let h = health(w).await?;
    check!(
        field(&h, &name)?.as_u64() == Some(want),
        "/health {name} is {}, want {want}",
        h[&name]
    );
    Ok(())
}

#[then(regex = r#"^/health field "backend" is the launched backend$"#)]
async fn launched_backend(w: &mut TestWorld) -> StepResult {
    let want = w
        .worker()?
        .launch
        .get("--backend")
        .unwrap_or("cuda")
        .to_owned();
    is_string(w, "backend".into(), want).await
}

/// `resident` is true on cuda and false (ignored) on cpu.
#[then(regex = r"^/health reports the residency of the launched backend$")]
async fn residency(w: &mut TestWorld) -> StepResult {
    let cuda = w.worker()?.launch.get("--backend").unwrap_or("cuda") == "cuda";
    let h = health(w).await?;
    check!(
        field(&h, "resident")?.as_bool() == Some(cuda),
        "/health resident is {} on backend {}",
        h["resident"],
        if cuda { "cuda" } else { "cpu" }
    );
    if !cuda {
        check!(
            h.get("vram_bytes_used").and_then(Value::as_u64) == Some(0),
            "vram_bytes_used is {} on cpu, want 0",
            h["vram_bytes_used"]
        );
    }
    Ok(())
}

#[then(regex = r"^on cuda the weights are still resident$")]
async fn still_resident(w: &mut TestWorld) -> StepResult {
    residency(w).await
}

#[then(regex = r"^/health has the typed fields of REQUIREMENTS.md$")]
async fn typed(w: &mut TestWorld) -> StepResult {
    let h = health(w).await?;
    let mut bad = Vec::new();
    type Check = fn(&Value) -> bool;
    let want: [(&str, Check); 10] = [
        ("status", |v| {
            matches!(v.as_str(), Some("healthy" | "unhealthy"))
        }),
        ("model", Value::is_string),
        ("resident", Value::is_boolean),
        ("quant_kind", Value::is_string),
        ("vram_bytes_used", |v| v.as_u64().is_some()),
        ("tokenizer_kind", |v| {
            matches!(v.as_str(), Some("gguf-bpe" | "gguf-spm" | "hf-json"))
        }),
        ("vocab_size", |v| v.as_u64().is_some()),
        ("context_length", |v| v.is_null() || v.as_u64().is_some()),
        ("uptime_seconds", Value::is_number),
        ("backend", |v| matches!(v.as_str(), Some("cuda" | "cpu"))),
    ];
    for (name, ok) in want {
        match h.get(name) {
            None => bad.push(format!("{name} missing")),
            Some(v) if !ok(v) => bad.push(format!("{name} = {v} has the wrong type or value")),
            _ => {}
        }
    }
    if let Some(sm) = h.get("sm") {
        if !(sm.is_string() || sm.is_number() || sm.is_null()) {
            bad.push(format!("sm = {sm}"));
        }
    }
    check!(bad.is_empty(), "/health {h}: {}", bad.join("; "));
    Ok(())
}

fn tensor_bytes(w: &mut TestWorld) -> anyhow::Result<u64> {
    let path = w
        .worker()?
        .model_path()
        .ok_or_else(|| anyhow!("no --model"))?
        .to_path_buf();
    Gguf::read_header(&path)?.total_tensor_bytes()
}

#[then(regex = r#"^/health field "vram_bytes_used" is at least the model's tensor bytes$"#)]
async fn vram_covers(w: &mut TestWorld) -> StepResult {
    let need = tensor_bytes(w)?;
    let h = health(w).await?;
    let used = field(&h, "vram_bytes_used")?
        .as_u64()
        .ok_or_else(|| anyhow!("vram_bytes_used is not a number"))?;
    check!(used >= need, "vram_bytes_used {used} < tensor bytes {need}");
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" is within (\d+)% of the model's tensor bytes$"#)]
async fn within_pct(w: &mut TestWorld, name: String, pct: f64) -> StepResult {
    let need = tensor_bytes(w)? as f64;
    let h = health(w).await?;
    let used = field(&h, &name)?
        .as_f64()
        .ok_or_else(|| anyhow!("{name} is not a number"))?;
    check!(
        (used - need).abs() <= need * pct / 100.0,
        "{name} {used} is not within {pct}% of {need}"
    );
    Ok(())
}

#[then(regex = r#"^/health field "([^"]+)" equals the model file's vocabulary size$"#)]
async fn vocab_of_file(w: &mut TestWorld, name: String) -> StepResult {
    let path = w
        .worker()?
        .model_path()
        .ok_or_else(|| anyhow!("no --model"))?
        .to_path_buf();
    let g = Gguf::read_header(&path)?;
    let n = g
        .array_len("tokenizer.ggml.tokens")
        .ok_or_else(|| anyhow!("the model file has no tokenizer.ggml.tokens"))?;
    is_number(w, name, n).await
}

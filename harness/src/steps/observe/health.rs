//! `GET /health`: status, typed fields, residency and memory accounting.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::Value;

use crate::check;
use crate::gguf::Gguf;
use crate::steps::params::{Json, OnCuda, Within};
use crate::steps::StepResult;
use crate::world::TestWorld;

async fn health(w: &TestWorld) -> anyhow::Result<Value> {
    w.client()?.health().await
}

/// Field `name` of /health; `a.b` is field `b` of object `a`.
fn field<'a>(h: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    h.pointer(&format!("/{}", name.replace('.', "/")))
        .ok_or_else(|| anyhow!("/health has no {name}: {h}"))
}

#[then(expr = "{within}\\/health says {string}")]
async fn says(w: &mut TestWorld, within: Within, status: String) -> StepResult {
    let Some(secs) = within.0 else {
        let h = health(w).await?;
        check!(
            field(&h, "status")?.as_str() == Some(status.as_str()),
            "/health: {h}"
        );
        return Ok(());
    };
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

#[when(expr = "I remember \\/health")]
async fn remember(w: &mut TestWorld) -> StepResult {
    w.probes.remembered_health = Some(health(w).await?);
    Ok(())
}

#[then(expr = "{on_cuda}\\/health field {string} is unchanged")]
async fn unchanged(w: &mut TestWorld, on_cuda: OnCuda, name: String) -> StepResult {
    if on_cuda.0 && w.cfg.backend != "cuda" {
        return Ok(());
    }
    let before = w.probes.remembered()?.clone();
    let now = health(w).await?;
    check!(
        field(&before, &name)? == field(&now, &name)?,
        "/health {name} was {} and is now {}",
        field(&before, &name)?,
        field(&now, &name)?
    );
    Ok(())
}

/// A string, boolean or whole number field, compared as JSON.
#[then(expr = "\\/health field {string} is {json}")]
async fn is_value(w: &mut TestWorld, name: String, want: Json) -> StepResult {
    let h = health(w).await?;
    let got = field(&h, &name)?;
    check!(*got == want.0, "/health {name} is {got}, want {}", want.0);
    Ok(())
}

/// A number field against the remembered /health's (`I remember /health`).
#[then(expr = "{on_cuda}\\/health field {string} is at most {float} times the remembered one")]
async fn at_most_times(w: &mut TestWorld, on_cuda: OnCuda, name: String, share: f64) -> StepResult {
    if on_cuda.0 && w.cfg.backend != "cuda" {
        return Ok(());
    }
    let before = field(w.probes.remembered()?, &name)?.as_f64();
    let now = field(&health(w).await?, &name)?.as_f64();
    let (Some(before), Some(now)) = (before, now) else {
        return Err(anyhow!("/health {name} is not a number").into());
    };
    check!(
        now <= share * before,
        "/health {name} is {now}, more than {share} times {before}"
    );
    Ok(())
}

#[then(expr = "\\/health field \"backend\" is the launched backend")]
async fn launched_backend(w: &mut TestWorld) -> StepResult {
    let want = w.process.backend()?;
    is_value(w, "backend".into(), Json(Value::String(want))).await
}

/// `resident` is true on cuda and false (ignored) on cpu.
#[then(expr = "\\/health reports the residency of the launched backend")]
async fn residency(w: &mut TestWorld) -> StepResult {
    let cuda = w.process.backend()? == "cuda";
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

#[then(expr = "\\/health has the typed fields of REQUIREMENTS.md")]
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

/// The worker's model file's header.
fn model_header(w: &mut TestWorld) -> anyhow::Result<Gguf> {
    let path = w
        .process
        .worker()?
        .model_path()
        .ok_or_else(|| anyhow!("no --model"))?
        .to_path_buf();
    Gguf::read_header(&path)
}

#[then(expr = "\\/health field \"vram_bytes_used\" is at least the model's tensor bytes")]
async fn vram_covers(w: &mut TestWorld) -> StepResult {
    let need = model_header(w)?.total_tensor_bytes()?;
    let h = health(w).await?;
    let used = field(&h, "vram_bytes_used")?
        .as_u64()
        .ok_or_else(|| anyhow!("vram_bytes_used is not a number"))?;
    check!(used >= need, "vram_bytes_used {used} < tensor bytes {need}");
    Ok(())
}

#[then(expr = "\\/health field {string} is within {int}% of the model's tensor bytes")]
async fn within_pct(w: &mut TestWorld, name: String, pct: u32) -> StepResult {
    let need = model_header(w)?.total_tensor_bytes()? as f64;
    let pct = f64::from(pct);
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

#[then(expr = "\\/health field {string} equals the model file's vocabulary size")]
async fn vocab_of_file(w: &mut TestWorld, name: String) -> StepResult {
    let n = model_header(w)?
        .array_len("tokenizer.ggml.tokens")
        .ok_or_else(|| anyhow!("the model file has no tokenizer.ggml.tokens"))?;
    is_value(w, name, Json(n.into())).await
}

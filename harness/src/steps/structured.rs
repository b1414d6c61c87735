//! Structured output (issue 43): seeded jobs under a JSON Schema or a regex
//! on `/execute`, and chats under a `response_format`, each output checked by
//! validators independent of the worker's (the `jsonschema` and `regex`
//! crates).

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::steps::{json_docstring, StepResult};
use crate::world::{job_id, TestWorld};

/// `text` as JSON, and every way `schema` finds it invalid (none: valid).
fn schema_errors(schema: &Value, text: &str) -> anyhow::Result<Vec<String>> {
    let value: Value = serde_json::from_str(text).with_context(|| format!("not JSON: {text:?}"))?;
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| anyhow!("the scenario's schema does not compile: {e}"))?;
    Ok(validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect())
}

/// Runs the job once per seed; the runs stand for the `every run's` steps
/// that follow (the runs of an earlier such step are forgotten).
#[when(expr = "I run this job with seeds {int} to {int}:")]
async fn run_seeds(w: &mut TestWorld, from: u64, to: u64, step: &Step) -> StepResult {
    let b = json_docstring(w, step)?;
    let base = job_id(&b);
    w.stream.repeat_ids.clear();
    for seed in from..=to {
        let mut bk = b.clone();
        let id = format!("{base}-{seed}");
        bk["job_id"] = json!(id);
        bk["seed"] = json!(seed);
        w.run_job(bk).await?;
        w.stream.repeat_ids.push(id);
    }
    Ok(())
}

/// Each run's text and the request it answered, once it ended at its
/// end-of-generation token (the output is complete, not cut off).
async fn completed_runs(w: &mut TestWorld) -> anyhow::Result<Vec<(String, String, Value)>> {
    let ids = w.stream.repeat_ids.clone();
    check!(!ids.is_empty(), "no runs were made");
    let mut runs = Vec::new();
    for id in ids {
        let t = w.settle(&id).await?;
        let text = t.text();
        let reason = t.first("end").map(|e| e.data["stop_reason"].clone());
        check!(
            reason == Some(json!("eos")),
            "job {id} ended with {reason:?}, not at its end-of-generation token: {text:?}"
        );
        let request = w.stream.requests.get(&id).cloned().unwrap_or(Value::Null);
        runs.push((id, text, request));
    }
    Ok(runs)
}

#[then(expr = "every run's text is JSON that its json_schema validates")]
async fn runs_validate(w: &mut TestWorld) -> StepResult {
    for (id, text, request) in completed_runs(w).await? {
        let errors = schema_errors(&request["json_schema"], &text)?;
        check!(errors.is_empty(), "job {id} gave {text:?}: {errors:?}");
    }
    Ok(())
}

#[then(expr = "every run's text matches its regex in whole")]
async fn runs_match(w: &mut TestWorld) -> StepResult {
    for (id, text, request) in completed_runs(w).await? {
        let rx = request["regex"]
            .as_str()
            .ok_or_else(|| anyhow!("job {id} has no regex"))?;
        let whole = regex::Regex::new(&format!("^(?:{rx})$"))?;
        check!(
            whole.is_match(&text),
            "job {id} gave {text:?}, outside {rx:?}"
        );
    }
    Ok(())
}

#[then(
    expr = "a chat under this response_format gives JSON its schema validates with seeds {int} to {int}:"
)]
async fn chat_response_format(w: &mut TestWorld, from: u64, to: u64, step: &Step) -> StepResult {
    let mut b = super::openai::request(w, step).await?;
    let schema = b["response_format"]["json_schema"]["schema"].clone();
    let url = format!("{}/v1/chat/completions", w.client()?.base());
    for seed in from..=to {
        b["seed"] = json!(seed);
        let reply: Value = reqwest::Client::new()
            .post(&url)
            .json(&b)
            .send()
            .await?
            .json()
            .await?;
        let choice = &reply["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap_or_default();
        check!(
            choice["finish_reason"] == "stop",
            "seed {seed}: finish_reason {} for {text:?}",
            choice["finish_reason"]
        );
        let errors = schema_errors(&schema, text)?;
        check!(errors.is_empty(), "seed {seed} gave {text:?}: {errors:?}");
    }
    Ok(())
}

//! Golden comparisons: llama.cpp's greedy ids and top-10 log-probabilities
//! (testdata/golden/greedy.json, M0-W-1214, M0-W-1422) and CUDA-vs-CPU
//! comparisons through the API.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::{then, when};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::check;
use crate::client::Transcript;
use crate::proof::Recorder;
use crate::steps::params::Model;
use crate::steps::StepResult;
use crate::world::{read_json, SuiteConfig, TestWorld, JOB_TIMEOUT};

#[derive(Debug, Clone, Deserialize)]
pub struct TopEntry {
    pub id: i64,
    pub logprob: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Position {
    pub id: i64,
    pub top_logprobs: Vec<TopEntry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GreedyCase {
    pub user_message: String,
    pub prompt: String,
    pub generated_token_ids: Vec<i64>,
    pub generated_text: String,
    pub top10_logprobs_first8: Vec<Position>,
}

pub fn greedy_cases(cfg: &SuiteConfig) -> anyhow::Result<Vec<GreedyCase>> {
    cases_in(&cfg.golden_dir.join("greedy.json"))
}

/// The cases of the golden set this scenario ran (the reference model's by default).
fn run_cases(w: &TestWorld) -> anyhow::Result<Vec<GreedyCase>> {
    match &w.parity.golden_file {
        Some(path) => cases_in(path),
        None => greedy_cases(&w.cfg),
    }
}

fn cases_in(path: &Path) -> anyhow::Result<Vec<GreedyCase>> {
    let v = read_json(path)?;
    serde_json::from_value(
        v.get("cases")
            .cloned()
            .ok_or_else(|| anyhow!("greedy.json has no cases"))?,
    )
    .context("parsing greedy.json cases")
}

pub fn greedy_case(cfg: &SuiteConfig, index: usize) -> anyhow::Result<GreedyCase> {
    greedy_cases(cfg)?
        .into_iter()
        .nth(index)
        .ok_or_else(|| anyhow!("no golden case {index}"))
}

/// `(id, logprob)` lists of a token event's `logprobs`.
pub fn logprobs_of(token: &Value) -> Vec<(i64, f64)> {
    token
        .get("logprobs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| Some((x.get("id")?.as_i64()?, x.get("logprob")?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Compares a worker's top-k with a reference's at one position. A reference token the
/// worker did not list must be at most `tol` above the worker's smallest listed logprob.
pub fn compare_top(worker: &[(i64, f64)], reference: &[(i64, f64)], tol: f64) -> Vec<String> {
    let mut bad = Vec::new();
    let floor = worker.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    for (id, r) in reference {
        match worker.iter().find(|(j, _)| j == id) {
            Some((_, x)) if (x - r).abs() <= tol => {}
            Some((_, x)) => bad.push(format!(
                "token {id}: {x:.4} vs {r:.4} (|diff| {:.4} > {tol})",
                (x - r).abs()
            )),
            None if *r <= floor + tol => {}
            None => bad.push(format!(
                "token {id} ({r:.4}) is missing from the worker's list, whose lowest is {floor:.4}"
            )),
        }
    }
    bad
}

/// Two tokens whose llama.cpp log-probabilities are closer than this are a
/// near tie. llama.cpp rounds activations to 8 bits inside its dot products,
/// which moves this model's log-probabilities by up to ~0.2 nats (an exact
/// float64 forward pass agrees with the CPU backend to 0.003 nats but not
/// with llama.cpp): at a near tie either side is a correct greedy choice.
/// The same rule as `worker/tests/golden_cpu.rs`.
pub const NEAR_TIE_NATS: f64 = 0.25;

/// Largest |ours − llama.cpp| log-probability accepted for llama.cpp's listed
/// tokens (measured on the CPU backend: max 0.578, mean 0.108 nats).
pub const LLAMA_CPP_LOGPROB_TOL: f64 = 0.6;

/// Whether llama.cpp's top two candidates at a golden position are a near tie.
fn is_near_tie(pos: &Position) -> bool {
    match pos.top_logprobs.as_slice() {
        [a, b, ..] => (a.logprob - b.logprob).abs() < NEAR_TIE_NATS,
        _ => false,
    }
}

/// A model's golden set (`testdata/<set>/greedy.json`), each case sent as
/// one user message through the worker's chat template, so the prompt is
/// rendered and tokenized by the worker (llama.cpp's ids are the golden's).
#[when(
    expr = "I run every golden greedy case of {string} as chat messages with logprobs {int} and max_tokens {int}"
)]
async fn run_golden_chat(
    w: &mut TestWorld,
    set: String,
    logprobs: u64,
    max_tokens: u64,
) -> StepResult {
    let testdata = w
        .cfg
        .golden_dir
        .parent()
        .context("golden_dir has no parent")?;
    let path = testdata.join(&set).join("greedy.json");
    for (k, case) in cases_in(&path)?.into_iter().enumerate() {
        let id = format!("golden-{set}-{}", k + 1);
        let messages = json!([{"role": "user", "content": case.user_message}]);
        w.post_job(json!({"job_id": id, "messages": messages, "temperature": 0, "logprobs": logprobs, "max_tokens": max_tokens}), &[]).await?;
        let t = w.finish_job(&id, JOB_TIMEOUT).await?.clone();
        w.parity.golden_runs.push((k, t));
    }
    w.parity.golden_file = Some(path);
    Ok(())
}

#[then(expr = "every golden case has llama.cpp's top-1 token at each of the first {int} positions")]
async fn golden_top1(w: &mut TestWorld, n: usize) -> StepResult {
    let cases = run_cases(w)?;
    let mut bad = Vec::new();
    for (k, t) in &w.parity.golden_runs {
        let got = t.token_ids();
        let golden = &cases[*k].top10_logprobs_first8;
        // Position by position until the first difference (a token of ours
        // that differs, or our end of generation where llama.cpp went on),
        // which must be a near tie in llama.cpp's own numbers; past it the
        // contexts differ.
        let limit = n.min(golden.len());
        if let Some(pos) = (0..limit).find(|&i| got.get(i) != Some(&golden[i].id)) {
            if !is_near_tie(&golden[pos]) {
                bad.push(format!(
                    "case {} ({:?}) position {pos}: got {:?}, llama.cpp {} (no near tie): got {got:?}",
                    k + 1,
                    cases[*k].user_message,
                    got.get(pos),
                    golden[pos].id
                ));
            }
        }
    }
    check!(!w.parity.golden_runs.is_empty(), "no golden case ran");
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(
    expr = "every golden case's top-10 log-probabilities are within {float} nats of llama.cpp's"
)]
async fn golden_logprobs(w: &mut TestWorld, tol: f64) -> StepResult {
    let cases = run_cases(w)?;
    let mut bad = Vec::new();
    let mut worst: f64 = 0.0;
    for (k, t) in &w.parity.golden_runs {
        for (pos, (tok, gold)) in t.tokens().zip(&cases[*k].top10_logprobs_first8).enumerate() {
            if tok.data.get("id").and_then(Value::as_i64) != Some(gold.id) {
                break; // past a different token the contexts differ; top-1 reports it
            }
            let ours = logprobs_of(&tok.data);
            if ours.is_empty() {
                bad.push(format!(
                    "case {} position {pos}: no logprobs in the token event",
                    k + 1
                ));
                continue;
            }
            let reference: Vec<(i64, f64)> = gold
                .top_logprobs
                .iter()
                .map(|e| (e.id, e.logprob))
                .collect();
            for (id, r) in &reference {
                if let Some((_, x)) = ours.iter().find(|(j, _)| j == id) {
                    worst = worst.max((x - r).abs());
                }
            }
            bad.extend(
                compare_top(&ours, &reference, tol)
                    .into_iter()
                    .map(|m| format!("case {} position {pos}: {m}", k + 1)),
            );
        }
    }
    Recorder::note(
        "golden",
        json!({"scenario": w.scenario, "max_abs_logprob_diff": worst, "tolerance": tol}),
    );
    check!(
        bad.is_empty(),
        "largest |diff| {worst:.4}\n{}",
        bad.join("\n")
    );
    Ok(())
}

#[when(
    expr = "I run golden case {int} with stop {string}, temperature 0 and max_tokens {int} as job {string}"
)]
async fn golden_with_stop(
    w: &mut TestWorld,
    case: usize,
    stop: String,
    max_tokens: u64,
    id: String,
) -> StepResult {
    let c = greedy_case(&w.cfg, case - 1)?;
    check!(
        c.generated_text.contains(&stop),
        "the golden text {:?} does not contain {stop:?}",
        c.generated_text
    );
    w.post_job(json!({"job_id": id, "prompt": c.prompt, "temperature": 0, "max_tokens": max_tokens, "stop": [stop]}), &[]).await?;
    w.finish_job(&id, JOB_TIMEOUT).await?;
    Ok(())
}

// ---- cross-backend ----

/// Runs `request` on a fresh CPU-backend worker on `model` and returns its transcript.
pub async fn on_cpu(
    w: &mut TestWorld,
    model: &Path,
    request: &Value,
) -> anyhow::Result<Transcript> {
    let mut cpu = w.start_other(model, "cpu").await?;
    let t = cpu.client().run(request, JOB_TIMEOUT).await;
    cpu.stop(Duration::from_secs(10)).await;
    let t = t?;
    Recorder::transcript(&w.scenario, request, &t);
    Ok(t)
}

/// Position-by-position comparison until the chosen ids differ; at least `steps` positions must agree.
pub fn compare_runs(
    a: &Transcript,
    b: &Transcript,
    steps: usize,
    tol: f64,
    same_argmax: bool,
) -> Vec<String> {
    let mut bad = Vec::new();
    let (ta, tb): (Vec<_>, Vec<_>) = (a.tokens().collect(), b.tokens().collect());
    if ta.len() < steps || tb.len() < steps {
        bad.push(format!(
            "want {steps} tokens from each backend, got {} and {}",
            ta.len(),
            tb.len()
        ));
    }
    for (pos, (x, y)) in ta.iter().zip(&tb).take(steps).enumerate() {
        let (lx, ly) = (logprobs_of(&x.data), logprobs_of(&y.data));
        if lx.is_empty() || ly.is_empty() {
            bad.push(format!("position {pos}: no logprobs"));
            break;
        }
        bad.extend(
            compare_top(&lx, &ly, tol)
                .into_iter()
                .map(|m| format!("position {pos}: {m}")),
        );
        let (ix, iy) = (x.data.get("id"), y.data.get("id"));
        if same_argmax && lx[0].0 != ly[0].0 {
            bad.push(format!("position {pos}: argmax {} vs {}", lx[0].0, ly[0].0));
        }
        if ix != iy {
            if same_argmax {
                bad.push(format!(
                    "position {pos}: chosen ids differ ({ix:?} vs {iy:?})"
                ));
            }
            break; // different contexts from here on
        }
    }
    bad
}

#[then(expr = "the first-step logits match the CPU reference on the {model} model")]
async fn first_step(w: &mut TestWorld, model: Model) -> StepResult {
    let model = model.0;
    let case = greedy_case(&w.cfg, 0)?;
    let req = json!({"job_id": "first-step", "prompt": case.prompt, "temperature": 0, "logprobs": 10, "max_tokens": 1});
    w.post_job(req.clone(), &[]).await?;
    let ours = w.finish_job("first-step", JOB_TIMEOUT).await?.clone();
    let tok = ours.tokens().next().ok_or_else(|| anyhow!("no token"))?;
    let bad = if model == "reference" && w.cfg.backend == "cpu" {
        // The CPU reference itself: compared with the outside reference,
        // llama.cpp, within the golden tolerance (see NEAR_TIE_NATS).
        let first = &case.top10_logprobs_first8[0];
        let gold: Vec<(i64, f64)> = first
            .top_logprobs
            .iter()
            .map(|e| (e.id, e.logprob))
            .collect();
        let mut b = compare_top(&logprobs_of(&tok.data), &gold, LLAMA_CPP_LOGPROB_TOL);
        if tok.data.get("id").and_then(Value::as_i64) != Some(first.id) && !is_near_tie(first) {
            b.push(format!(
                "first token {} is not llama.cpp's {} (no near tie)",
                tok.data["id"], first.id
            ));
        }
        b
    } else {
        // Any other backend or model: the CPU backend is the reference.
        let path = w.fixture(&model)?;
        let cpu = on_cpu(w, &path, &req).await?;
        compare_runs(&ours, &cpu, 1, 0.1, true)
    };
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(
    expr = "{int} greedy steps on the {model} model match the CPU backend within {float} nats with the same argmax"
)]
async fn greedy_vs_cpu(w: &mut TestWorld, steps: usize, model: Model, tol: f64) -> StepResult {
    let model = model.0;
    let case = greedy_case(&w.cfg, 0)?;
    let req = json!({"job_id": "vs-cpu", "prompt": case.prompt, "temperature": 0, "logprobs": 10, "max_tokens": steps});
    w.post_job(req.clone(), &[]).await?;
    let ours = w.finish_job("vs-cpu", JOB_TIMEOUT).await?.clone();
    let path = w.fixture(&model)?;
    let cpu = on_cpu(w, &path, &req).await?;
    let bad = compare_runs(&ours, &cpu, steps, tol, true);
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_lists_compare_with_tolerance_and_tail_bound() {
        let ours = [(1, -0.5), (2, -1.0), (3, -3.0)];
        assert!(compare_top(&ours, &[(1, -0.45), (2, -1.09)], 0.1).is_empty());
        assert_eq!(compare_top(&ours, &[(1, -0.7)], 0.1).len(), 1);
        assert!(
            compare_top(&ours, &[(9, -3.05)], 0.1).is_empty(),
            "an unlisted token below our floor is consistent"
        );
        assert_eq!(compare_top(&ours, &[(9, -2.0)], 0.1).len(), 1);
    }

    #[test]
    fn the_golden_cases_parse() {
        let cfg_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/golden/greedy.json");
        let v = read_json(&cfg_dir).unwrap();
        let cases: Vec<GreedyCase> = serde_json::from_value(v["cases"].clone()).unwrap();
        assert_eq!(cases.len(), 4);
        assert!(cases.iter().all(|c| c.top10_logprobs_first8.len() == 8
            && c.top10_logprobs_first8[0].top_logprobs.len() == 10));
        assert!(cases[0].generated_text.starts_with("In the depths"));
    }
}

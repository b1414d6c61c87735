//! Golden comparisons: llama.cpp's greedy ids and top-10 log-probabilities
//! (testdata/golden/greedy.json, M0-W-1214, M0-W-1422), the anti-cheat haiku
//! (M0-W-1800, EXT-005) and CUDA-vs-CPU comparisons through the API.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::{then, when};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::execute::JOB_TIMEOUT;
use super::StepResult;
use crate::check;
use crate::client::Transcript;
use crate::process::Worker;
use crate::proof::Recorder;
use crate::world::{read_json, SuiteConfig, TestWorld};

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
    let v = read_json(&cfg.golden_dir.join("greedy.json"))?;
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

#[when(regex = r"^I run every golden greedy case with logprobs (\d+) and max_tokens (\d+)$")]
async fn run_golden(w: &mut TestWorld, logprobs: u64, max_tokens: u64) -> StepResult {
    for (k, case) in greedy_cases(&w.cfg)?.into_iter().enumerate() {
        let id = format!("golden-{}", k + 1);
        w.post_job(json!({"job_id": id, "prompt": case.prompt, "temperature": 0, "logprobs": logprobs, "max_tokens": max_tokens}), &[]).await?;
        let t = w.finish_job(&id, JOB_TIMEOUT).await?.clone();
        w.golden_runs.push((k, t));
    }
    Ok(())
}

#[then(
    regex = r"^every golden case has llama.cpp's top-1 token at each of the first (\d+) positions$"
)]
async fn golden_top1(w: &mut TestWorld, n: usize) -> StepResult {
    let cases = greedy_cases(&w.cfg)?;
    let mut bad = Vec::new();
    for (k, t) in &w.golden_runs {
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
    check!(!w.golden_runs.is_empty(), "no golden case ran");
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(
    regex = r"^every golden case's top-10 log-probabilities are within ([\d.]+) nats of llama.cpp's$"
)]
async fn golden_logprobs(w: &mut TestWorld, tol: f64) -> StepResult {
    let cases = greedy_cases(&w.cfg)?;
    let mut bad = Vec::new();
    let mut worst: f64 = 0.0;
    for (k, t) in &w.golden_runs {
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
    regex = r#"^I run golden case (\d+) with stop "([^"]+)", temperature 0 and max_tokens (\d+) as job "([^"]+)"$"#
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
    let launch = w.launch_for(model, "cpu")?;
    let mut cpu = Worker::spawn(launch)?;
    cpu.wait_healthy(w.cfg.start_timeout).await?;
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

#[then(regex = r#"^the first-step logits match the CPU reference on the "([^"]+)" model$"#)]
async fn first_step(w: &mut TestWorld, model: String) -> StepResult {
    let case = greedy_case(&w.cfg, 0)?;
    let req = json!({"job_id": "first-step", "prompt": case.prompt, "temperature": 0, "logprobs": 10, "max_tokens": 1});
    w.post_job(req.clone(), &[]).await?;
    let ours = w.finish_job("first-step", JOB_TIMEOUT).await?.clone();
    let tok = ours.tokens().next().ok_or_else(|| anyhow!("no token"))?;
    let bad = if model == "reference" && w.cfg.backend == "cpu" {
        // The CPU reference itself: compared with the outside reference,
        // llama.cpp, within the golden tolerance (see NEAR_TIE_NATS).
        let first = &case.top10_logprobs_first8[0];
        let gold: Vec<(i64, f64)> = first.top_logprobs.iter().map(|e| (e.id, e.logprob)).collect();
        let mut b = compare_top(&logprobs_of(&tok.data), &gold, LLAMA_CPP_LOGPROB_TOL);
        if tok.data.get("id").and_then(Value::as_i64) != Some(first.id) && !is_near_tie(first) {
            b.push(format!("first token {} is not llama.cpp's {} (no near tie)", tok.data["id"], first.id));
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
    regex = r#"^(\d+) greedy steps on the "([^"]+)" model match the CPU backend within ([\d.]+) nats with the same argmax$"#
)]
async fn greedy_vs_cpu(w: &mut TestWorld, steps: usize, model: String, tol: f64) -> StepResult {
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

// ---- the haiku ----

#[derive(Debug, Clone, Serialize)]
pub struct Haiku {
    pub minute: u32,
    pub minute_words: String,
    pub nonce: String,
    pub request: Value,
    pub text: String,
    pub ids: Vec<i64>,
    pub minute_word_appears: bool,
    pub repeat_identical: Option<bool>,
    pub other_minute_ids_differ: Option<bool>,
    pub cpu_comparison: Option<Vec<String>>,
}

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 6] = ["", "", "twenty", "thirty", "forty", "fifty"];

/// 0..=59 in English words ("forty-two").
pub fn minute_words(m: u32) -> String {
    match m {
        0..=19 => ONES[m as usize].to_owned(),
        _ if m.is_multiple_of(10) => TENS[(m / 10) as usize].to_owned(),
        _ => format!("{}-{}", TENS[(m / 10) as usize], ONES[(m % 10) as usize]),
    }
}

fn haiku_request(
    job: &str,
    words: &str,
    nonce: &str,
    temperature: f64,
    seed: u64,
    max_tokens: u64,
) -> Value {
    let content = format!(
        "Write a haiku about the minute {words}. Use the word \"{words}\" in it. (nonce {nonce})"
    );
    json!({"job_id": job, "messages": [{"role": "user", "content": content}], "temperature": temperature, "seed": seed, "max_tokens": max_tokens, "logprobs": 5})
}

#[when(
    regex = r"^I ask for a haiku about the current minute with a fresh nonce, temperature ([\d.]+), seed (\d+) and (\d+) tokens$"
)]
async fn ask_haiku(w: &mut TestWorld, temperature: f64, seed: u64, max_tokens: u64) -> StepResult {
    use chrono::Timelike;
    let minute = chrono::Local::now().minute();
    let words = minute_words(minute);
    let nonce = format!("{:016x}", rand::random::<u64>());
    let req = haiku_request("haiku-a", &words, &nonce, temperature, seed, max_tokens);
    w.post_job(req.clone(), &[]).await?;
    let t = w.finish_job("haiku-a", JOB_TIMEOUT).await?.clone();
    let text = t.text();
    let appears = text.to_lowercase().contains(&words.replace('-', " "))
        || text.to_lowercase().contains(&words);
    w.haiku = Some(Haiku {
        minute,
        minute_words: words,
        nonce,
        request: req,
        ids: t.token_ids(),
        text,
        minute_word_appears: appears,
        repeat_identical: None,
        other_minute_ids_differ: None,
        cpu_comparison: None,
    });
    Ok(())
}

fn haiku(w: &mut TestWorld) -> anyhow::Result<&mut Haiku> {
    w.haiku
        .as_mut()
        .ok_or_else(|| anyhow!("no haiku asked in this scenario"))
}

#[then(regex = r"^the haiku streamed started, at least 1 token and end with no U\+FFFD$")]
async fn haiku_streamed(w: &mut TestWorld) -> StepResult {
    let t = w.transcript("haiku-a")?;
    let bad = crate::events::check_order(&t.events);
    check!(bad.is_empty(), "{}", bad.join("; "));
    check!(
        t.tokens().count() >= 1 && t.events.last().is_some_and(|e| e.kind == "end"),
        "the haiku did not stream tokens and end: {:?}",
        t.terminal().map(|e| &e.raw_data)
    );
    check!(
        !t.text().contains('\u{FFFD}'),
        "the haiku contains U+FFFD: {:?}",
        t.text()
    );
    Ok(())
}

#[then(regex = r"^the same haiku request with the same seed gives the same token ids$")]
async fn haiku_repeat(w: &mut TestWorld) -> StepResult {
    let mut req = haiku(w)?.request.clone();
    req["job_id"] = json!("haiku-b");
    w.post_job(req, &[]).await?;
    let ids = w.finish_job("haiku-b", JOB_TIMEOUT).await?.token_ids();
    let h = haiku(w)?;
    h.repeat_identical = Some(ids == h.ids);
    check!(
        ids == h.ids,
        "the repeat gave {ids:?}, the first run {:?}",
        h.ids
    );
    Ok(())
}

#[then(regex = r"^the haiku request for another minute gives other token ids$")]
async fn haiku_other_minute(w: &mut TestWorld) -> StepResult {
    let h = haiku(w)?.clone();
    let t = h.request["temperature"].as_f64().unwrap_or(0.7);
    let seed = h.request["seed"].as_u64().unwrap_or(42);
    let max = h.request["max_tokens"].as_u64().unwrap_or(50);
    let req = haiku_request(
        "haiku-c",
        &minute_words((h.minute + 1) % 60),
        &h.nonce,
        t,
        seed,
        max,
    );
    w.post_job(req, &[]).await?;
    let ids = w.finish_job("haiku-c", JOB_TIMEOUT).await?.token_ids();
    let differ = ids != h.ids;
    haiku(w)?.other_minute_ids_differ = Some(differ);
    check!(
        differ,
        "another minute word gave the same ids {ids:?}: the output does not depend on the prompt"
    );
    Ok(())
}

#[then(
    regex = r"^the haiku's top-5 log-probabilities over the first (\d+) steps agree with the CPU backend within ([\d.]+) nats$"
)]
async fn haiku_vs_cpu(w: &mut TestWorld, steps: usize, tol: f64) -> StepResult {
    let ours = w.transcript("haiku-a")?.clone();
    let req = haiku(w)?.request.clone();
    let model = w.cfg.model.clone();
    let cpu = on_cpu(w, &model, &req).await?;
    // Sampling at 0.7 draws from the host PRNG on both backends; compare until the ids part.
    let bad = compare_runs(&ours, &cpu, steps.min(ours.tokens().count()), tol, false);
    haiku(w)?.cpu_comparison = Some(bad.clone());
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(
    regex = r"^the haiku, its prompt, nonce and whether the minute word appears are in the proof bundle$"
)]
async fn haiku_recorded(w: &mut TestWorld) -> StepResult {
    let h = haiku(w)?.clone();
    let record = json!({"scenario": w.scenario, "backend": w.cfg.backend, "haiku": h});
    let path = Recorder::note("haiku", record).ok_or_else(|| anyhow!("no proof bundle is open"))?;
    let written = read_json(&path)?;
    check!(
        written
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r["haiku"]["nonce"] == json!(h.nonce))),
        "{} does not hold the haiku",
        path.display()
    );
    println!(
        "haiku (minute {} = {}, nonce {}, minute word appears: {}):\n{}",
        h.minute, h.minute_words, h.nonce, h.minute_word_appears, h.text
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_in_words() {
        assert_eq!(minute_words(0), "zero");
        assert_eq!(minute_words(13), "thirteen");
        assert_eq!(minute_words(40), "forty");
        assert_eq!(minute_words(59), "fifty-nine");
    }

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

//! The anti-cheat haiku (M0-W-1800, EXT-005): a prompt that names the current
//! minute and a fresh nonce, so no stored answer can pass; it must reproduce with
//! its seed, change with the minute, and (on cuda) agree with the CPU backend.

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::{json, Value};

use super::golden::{compare_runs, on_cpu};
use crate::check;
use crate::proof::Recorder;
use crate::steps::StepResult;
use crate::world::{read_json, Haiku, TestWorld, JOB_TIMEOUT};

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
    expr = "I ask for a haiku about the current minute with a fresh nonce, temperature {float}, seed {int} and {int} tokens"
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
    w.parity.haiku = Some(Haiku {
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

#[then(expr = "the haiku streamed started, at least 1 token and end with no U+FFFD")]
async fn haiku_streamed(w: &mut TestWorld) -> StepResult {
    let t = w.stream.transcript("haiku-a")?;
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

#[then(expr = "the same haiku request with the same seed gives the same token ids")]
async fn haiku_repeat(w: &mut TestWorld) -> StepResult {
    let mut req = w.parity.haiku()?.request.clone();
    req["job_id"] = json!("haiku-b");
    w.post_job(req, &[]).await?;
    let ids = w.finish_job("haiku-b", JOB_TIMEOUT).await?.token_ids();
    let h = w.parity.haiku()?;
    h.repeat_identical = Some(ids == h.ids);
    check!(
        ids == h.ids,
        "the repeat gave {ids:?}, the first run {:?}",
        h.ids
    );
    Ok(())
}

#[then(expr = "the haiku request for another minute gives other token ids")]
async fn haiku_other_minute(w: &mut TestWorld) -> StepResult {
    let h = w.parity.haiku()?.clone();
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
    w.parity.haiku()?.other_minute_ids_differ = Some(differ);
    check!(
        differ,
        "another minute word gave the same ids {ids:?}: the output does not depend on the prompt"
    );
    Ok(())
}

#[then(
    expr = "the haiku's top-5 log-probabilities over the first {int} steps agree with the CPU backend within {float} nats"
)]
async fn haiku_vs_cpu(w: &mut TestWorld, steps: usize, tol: f64) -> StepResult {
    let ours = w.stream.transcript("haiku-a")?.clone();
    let req = w.parity.haiku()?.request.clone();
    let model = w.cfg.model.clone();
    let cpu = on_cpu(w, &model, &req).await?;
    // Sampling at 0.7 draws from the host PRNG on both backends; compare until the ids part.
    let bad = compare_runs(&ours, &cpu, steps.min(ours.tokens().count()), tol, false);
    w.parity.haiku()?.cpu_comparison = Some(bad.clone());
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(
    expr = "the haiku, its prompt, nonce and whether the minute word appears are in the proof bundle"
)]
async fn haiku_recorded(w: &mut TestWorld) -> StepResult {
    let h = w.parity.haiku()?.clone();
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
    use super::minute_words;

    #[test]
    fn minutes_in_words() {
        assert_eq!(minute_words(0), "zero");
        assert_eq!(minute_words(13), "thirteen");
        assert_eq!(minute_words(40), "forty");
        assert_eq!(minute_words(59), "fifty-nine");
    }
}

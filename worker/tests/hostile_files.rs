//! Issue #15, hostile files: every case of the corpus in `hostile/` (derived
//! from the reference model) either loads or fails with a typed error: no
//! abort, no panic, no hang. The whole corpus runs through the library's
//! loader; a sample of it, and the block counts that used to abort the
//! process, run through the real binary.

mod common;
mod hostile;

use std::io::{BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hostile::{Case, Recipe};
use rayon::prelude::*;
use worker_orcd::backend::{Logits, SampleRequest};
use worker_orcd::gguf::{GgufError, GgufFile, MetaValue};
use worker_orcd::load::{load_file, LoadOptions, LoadedModel};
use worker_orcd::sampling::SamplingParams;

/// What loading one case did.
#[derive(Debug)]
enum Outcome {
    Loaded,
    Error(String),
    Panicked(String),
}

/// One greedy step on a model that loaded, so hostile weights (NaN, Inf)
/// reach the forward pass and the sampler too. An error is a fine answer.
fn one_step(model: &mut LoadedModel) {
    let Ok(seq) = model.backend.open(4) else {
        return;
    };
    let mut out = Vec::new();
    if model
        .backend
        .forward(seq, &[1], Logits::Last, &mut out, None)
        .is_ok()
    {
        let params = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let req = SampleRequest {
            params: &params,
            generated: &[],
            uniform: None,
            logprobs: 3,
            mask: None,
            bias: &[],
        };
        let _ = model.backend.sample(&[(seq, req)]);
    }
    model.backend.close(seq);
}

fn load(parsed: impl FnOnce() -> Result<GgufFile, GgufError>) -> Outcome {
    let run = || match parsed() {
        Err(e) => Outcome::Error(e.to_string()),
        Ok(file) => match load_file(Arc::new(file), &LoadOptions::default(), &mut |_| {}) {
            Err(e) => Outcome::Error(e.to_string()),
            Ok(mut model) => {
                one_step(&mut model);
                Outcome::Loaded
            }
        },
    };
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome::Panicked(msg)
    })
}

fn reference_bytes() -> Option<Vec<u8>> {
    Some(std::fs::read(reference_model()?).unwrap())
}

#[test]
fn every_hostile_file_loads_or_fails_with_an_error() {
    let Some(path) = reference_model() else {
        return;
    };
    let base = std::fs::read(&path).unwrap();
    let cases = hostile::corpus(&base, 24);
    assert!(cases.len() >= 2000, "only {} cases", cases.len());
    let started = Instant::now();
    let results: Vec<(&Case, Outcome, Duration)> = cases
        .par_iter()
        .map(|case| {
            let t = Instant::now();
            let outcome = load(|| case.parse(&path, &base));
            (case, outcome, t.elapsed())
        })
        .collect();
    let loaded = results
        .iter()
        .filter(|r| matches!(r.1, Outcome::Loaded))
        .count();
    for r in results.iter().filter(|r| matches!(r.1, Outcome::Loaded)) {
        eprintln!("LOADED {:?} {}", r.2, r.0.name);
    }
    let slowest = results.iter().max_by_key(|r| r.2).unwrap();
    eprintln!(
        "{} hostile files in {:.1} s: {} loaded, {} refused; slowest {:?} ({})",
        results.len(),
        started.elapsed().as_secs_f64(),
        loaded,
        results.len() - loaded,
        slowest.2,
        slowest.0.name
    );
    let panics: Vec<String> = results
        .iter()
        .filter_map(|(c, o, _)| match o {
            Outcome::Panicked(m) => Some(format!("{}: {m}", c.name)),
            _ => None,
        })
        .collect();
    assert!(
        panics.is_empty(),
        "{} panics:\n{}",
        panics.len(),
        panics.join("\n")
    );
    for (case, outcome, took) in &results {
        if let Outcome::Error(msg) = outcome {
            assert!(msg.len() >= 10, "{}: unclear error {msg:?}", case.name);
        }
        assert!(
            *took < Duration::from_secs(30),
            "{} took {took:?}",
            case.name
        );
    }
    // The corpus must exercise both sides.
    assert!(loaded > 0 && loaded < results.len());
}

/// What the real binary did with one file.
#[derive(Debug, PartialEq)]
enum Exit {
    /// Exit 1 with exactly one ERROR record carrying MODEL_LOAD_FAILED.
    Refused(String),
    /// Became ready, then exited 0 on SIGTERM.
    Served,
}

/// Starts the worker on `model` and waits (at most 60 s) for it to exit or
/// become ready; a ready worker is sent SIGTERM and must exit 0.
fn run_binary(model: &std::path::Path) -> Exit {
    let mut child = cpu_worker(model, free_port())
        .args(["--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker-orcd");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    let mut ready = false;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(20)) {
            ready |= line.contains(r#""event":"ready""#);
            lines.push(line);
            if ready {
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                break;
            }
        }
    }
    let status = wait_exit(&mut child, Duration::from_secs(15));
    // The reader thread ends with stderr, after the process.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        lines.push(line);
    }
    let log = lines.join("\n");
    let status = status
        .unwrap_or_else(|| panic!("{} neither exited nor got ready:\n{log}", model.display()));
    if ready {
        assert_eq!(status.code(), Some(0), "{log}");
        return Exit::Served;
    }
    assert_eq!(
        status.code(),
        Some(1),
        "{status:?} (a signal is a crash):\n{log}"
    );
    let errors: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["level"] == "ERROR")
        .collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert_eq!(errors[0]["code"], "MODEL_LOAD_FAILED", "{log}");
    Exit::Refused(
        errors[0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn wait_exit(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// Issue #15, failure 1: these block counts aborted (SIGABRT) or panicked
/// ("capacity overflow"); now the start fails with exit 1 and one error
/// naming the key. Stored as u64, as a file may.
#[test]
fn absurd_block_counts_fail_the_start_cleanly() {
    let Some(base) = reference_bytes() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for n in hostile::ABSURD_BLOCK_COUNTS {
        let case = Case {
            name: format!("block_count {n}"),
            recipe: Recipe::Rewrite {
                key: "llama.block_count".into(),
                value: MetaValue::U64(n),
            },
        };
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, case.bytes(&base)).unwrap();
        match run_binary(&path) {
            Exit::Refused(msg) => assert!(msg.contains("block_count"), "{n}: {msg}"),
            Exit::Served => panic!("block_count {n} was served"),
        }
    }
}

/// A spread of the corpus through the real binary: each one exits 1 with
/// one MODEL_LOAD_FAILED record, or serves and exits 0 on SIGTERM.
#[test]
fn a_sample_of_hostile_files_through_the_real_binary() {
    let Some(base) = reference_bytes() else {
        return;
    };
    let cases = hostile::corpus(&base, 24);
    let dir = tempfile::tempdir().unwrap();
    let (mut refused, mut served) = (0, 0);
    let step = cases.len() / 24;
    let mut sample: Vec<&Case> = cases.iter().step_by(step).collect();
    // Make sure weights full of NaN get served too.
    sample.extend(
        cases
            .iter()
            .filter(|c| matches!(c.recipe, Recipe::Fill { .. }))
            .take(2),
    );
    for case in sample {
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, case.bytes(&base)).unwrap();
        match run_binary(&path) {
            Exit::Refused(_) => refused += 1,
            Exit::Served => served += 1,
        }
    }
    eprintln!("real binary: {refused} refused, {served} served");
    assert!(
        served >= 2 && refused >= 10,
        "{refused} refused, {served} served"
    );
}

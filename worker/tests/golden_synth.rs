//! llama.cpp on `harness synth-model`'s phi3, gpt2 and RoPE-factor files
//! (testdata/golden-synth, made by `make_goldens.py` there from llama-server
//! 0c1e57098): the CPU backend's log-probabilities at every prompt position
//! against llama.cpp's top-10 at that position. The tiny presets run in three
//! formats each; `WORKER_ORCD_SYNTH_FULL=1` adds the real shapes (Phi-3-mini
//! is a 2.2 GB file). The files are written here exactly as the goldens'
//! `synth_command` wrote them (same preset, format and seed: the bytes are a
//! function of those alone, and harness's own tests check their sha256).
//!
//! Agreement (issue #13): llama.cpp's top-1 is ours, except where llama.cpp
//! itself has a near tie (its top two within 0.25 nats, as the golden README
//! allows), and the mean |ours − llama.cpp| over its listed tokens is at most
//! 0.1 nats per file.

use std::path::{Path, PathBuf};

use harness::synth::{self, Format};
use serde::Deserialize;
use worker_orcd::backend::Logits;
use worker_orcd::load::{load_model, LoadOptions};

const NEAR_TIE_NATS: f64 = 0.25;
const MEAN_LOGPROB_DIFF: f64 = 0.1;

#[derive(Deserialize)]
struct Golden {
    preset: String,
    format: String,
    seed: u64,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    positions: Vec<Position>,
}

#[derive(Deserialize)]
struct Position {
    n_tokens: usize,
    top10: Vec<Candidate>,
}

#[derive(Deserialize)]
struct Candidate {
    id: u32,
    logprob: f64,
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

/// The file a golden was made on, written into `dir`; `None` (outside CI)
/// when a tokenizer source has not been fetched.
fn synthesize(g: &Golden, dir: &Path) -> Option<PathBuf> {
    let models = workspace().join(".models");
    let (reference, spm) = (
        models.join("smollm2-135m-instruct-q4_1.gguf"),
        models.join("gemma-3-270m-q4_k_m.gguf"),
    );
    let preset = synth::preset(&g.preset).unwrap();
    let source = synth::tokenizer_source(preset, &reference, &spm);
    if !source.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch {} (ci/fetch-model)",
            source.display()
        );
        eprintln!("skipping {}: {} is absent", g.preset, source.display());
        return None;
    }
    let opts = synth::Options {
        preset,
        format: Format::from_name(&g.format).unwrap(),
        seed: g.seed,
        threads: 2,
    };
    let out = dir.join(format!("{}-{}.gguf", g.preset, g.format));
    synth::write_file(&opts, source, &out).unwrap();
    Some(out)
}

/// Compares one golden file; returns (positions, top-1 agreements, mean |Δ|, max |Δ|).
fn compare(name: &str) -> Option<(usize, usize, f64, f64)> {
    let path = workspace().join("testdata/golden-synth").join(name);
    let g: Golden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = synthesize(&g, dir.path())?;
    let mut model = load_model(&file, &LoadOptions::default(), &mut |_| {}).unwrap();
    let vocab = model.info.vocab_size;
    let (mut positions, mut top1, mut total, mut count, mut worst) = (0, 0, 0.0, 0, 0.0f64);
    let mut failures = Vec::new();
    for case in &g.cases {
        let n = case.prompt_ids.len();
        model.backend.begin_sequence(n).unwrap();
        let mut logits = Vec::new();
        model
            .backend
            .forward(&case.prompt_ids, Logits::All, &mut logits, None)
            .unwrap();
        model.backend.end_sequence();
        for pos in &case.positions {
            let row = &logits[(pos.n_tokens - 1) * vocab..pos.n_tokens * vocab];
            let ours = log_softmax(row);
            let best = (0..vocab)
                .max_by(|&a, &b| ours[a].total_cmp(&ours[b]))
                .unwrap() as u32;
            let theirs = &pos.top10[0];
            positions += 1;
            if best == theirs.id {
                top1 += 1;
            } else {
                // A near tie in llama.cpp's own numbers: its log-probability of
                // our token (listed or below its tenth) within 0.25 nats of its top.
                let of_ours = pos.top10.iter().find(|c| c.id == best).map(|c| c.logprob);
                let gap = of_ours.map_or(f64::INFINITY, |l| theirs.logprob - l);
                if gap > NEAR_TIE_NATS {
                    failures.push(format!(
                        "{name}: {} tokens: top-1 {best}, llama.cpp {} (gap {gap:.3})",
                        pos.n_tokens, theirs.id
                    ));
                }
            }
            for c in &pos.top10 {
                let d = (ours[c.id as usize] - c.logprob).abs();
                worst = worst.max(d);
                total += d;
                count += 1;
            }
        }
    }
    let mean = total / count as f64;
    eprintln!("{name}: top-1 {top1}/{positions}; |log-prob difference| mean {mean:.4}, max {worst:.4} nats");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        mean <= MEAN_LOGPROB_DIFF,
        "{name}: mean {mean:.4} > {MEAN_LOGPROB_DIFF}"
    );
    Some((positions, top1, mean, worst))
}

fn run(names: &[&str]) {
    for name in names {
        compare(name);
    }
}

#[test]
fn tiny_phi3_agrees_with_llama_cpp() {
    run(&[
        "tiny-phi3-Q8_0.json",
        "tiny-phi3-Q4_K.json",
        "tiny-phi3-F16.json",
    ]);
}

#[test]
fn tiny_gpt2_agrees_with_llama_cpp() {
    run(&[
        "tiny-gpt2-Q8_0.json",
        "tiny-gpt2-Q4_K.json",
        "tiny-gpt2-F16.json",
    ]);
}

/// RoPE frequency factors: Phi-3 128k's LongRoPE (the long table, served
/// past the 1024 trained positions, and `rope.scaling.attn_factor`) and
/// Llama 3.1's `rope_freqs`.
#[test]
fn rope_factor_tables_agree_with_llama_cpp() {
    run(&["tiny-phi3-128k-Q8_0.json", "tiny-llama3.1-Q8_0.json"]);
}

/// The real shapes, when asked for (`WORKER_ORCD_SYNTH_FULL=1`): a 2.2 GB
/// Phi-3-mini file and GPT-2 124M.
#[test]
fn real_shapes_agree_with_llama_cpp() {
    if std::env::var_os("WORKER_ORCD_SYNTH_FULL").is_none() {
        eprintln!("skipping: set WORKER_ORCD_SYNTH_FULL=1 for the 2.2 GB Phi-3-mini shape");
        return;
    }
    run(&["gpt2-Q4_K.json", "phi3-Q4_K.json"]);
}

/// gpt-oss (issue 14): YaRN, a sink per head, a 128-position window on every
/// other layer, and four experts (two a token) in MXFP4 with biases, over
/// the o200k_harmony vocabulary.
#[test]
fn gpt_oss_agrees_with_llama_cpp() {
    run(&["gpt-oss-Q8_0.json"]);
}

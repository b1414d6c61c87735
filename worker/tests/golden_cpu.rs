//! The CPU backend against llama.cpp's golden data for the reference model
//! (testdata/golden, from `../shared/golden`) and Gemma 3 270M
//! (testdata/golden-gemma3, made the same way at 0c1e57098):
//! teacher-forced top-1 and top-10 log-probabilities at the first 8
//! generated positions of each case, and free-running greedy generation.
//!
//! How close we can be: an independent float64 NumPy forward pass of this
//! model agrees with this backend to 0.003 nats, while llama.cpp quantizes
//! activations to 8 bits inside its dot products, which moves listed
//! log-probabilities by up to ~0.2 nats (this small model amplifies rounding).
//! Emulating that rounding got closer to llama.cpp but made the function
//! discontinuous, so the CUDA backend could no longer agree with the CPU
//! reference to 1e-2; the reference stays exact f32. These tests therefore
//! assert what holds: top-1 agrees except at positions where llama.cpp itself
//! has a near tie, and log-probabilities stay within the measured bounds
//! below (a regression guard, reported in full).

use std::path::PathBuf;

use serde::Deserialize;
use worker_orcd::backend::{KvType, Logits};
use worker_orcd::engine::generate;
use worker_orcd::engine::generate::{
    AbortReason, GeneratedToken, GenerationObserver, GenerationRequest,
};
use worker_orcd::load::{load_model, LoadOptions, LoadedModel};
use worker_orcd::sampling::{top_logprobs, SamplingParams};

/// Two tokens whose llama.cpp log-probabilities are closer than this are a
/// near tie: rounding differences may legitimately swap them.
const NEAR_TIE_NATS: f64 = 0.25;
/// One model and llama.cpp's outputs for it, with the largest and mean
/// |ours − llama.cpp| allowed over all listed tokens.
struct GoldenSet {
    model: &'static str,
    greedy: &'static str,
    max_diff: f64,
    mean_diff: f64,
}

/// Measured: max 0.578, mean 0.108.
const SMOLLM2: GoldenSet = GoldenSet {
    model: ".models/smollm2-135m-instruct-q4_1.gguf",
    greedy: "testdata/golden/greedy.json",
    max_diff: 0.6,
    mean_diff: 0.12,
};

/// Measured: max 0.713, mean 0.122; the float64 NumPy reference of
/// `gemma3_matches_an_f64_reference` is as far from llama.cpp (0.713, 0.123):
/// the distance is llama.cpp's rounding (8-bit activations in the dot
/// products, GELU through an f16 table), not ours.
const GEMMA3: GoldenSet = GoldenSet {
    model: ".models/gemma-3-270m-q4_k_m.gguf",
    greedy: "testdata/golden-gemma3/greedy.json",
    max_diff: 0.75,
    mean_diff: 0.13,
};

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    user_message: String,
    prompt_token_ids: Vec<u32>,
    generated_token_ids: Vec<u32>,
    top10_logprobs_first8: Vec<Position>,
}

#[derive(Deserialize)]
struct Position {
    id: u32,
    top_logprobs: Vec<Candidate>,
}

#[derive(Deserialize)]
struct Candidate {
    id: u32,
    logprob: f32,
}

impl Position {
    /// Whether llama.cpp's top two candidates are within `NEAR_TIE_NATS`.
    fn is_near_tie(&self) -> bool {
        match self.top_logprobs.as_slice() {
            [a, b, ..] => ((a.logprob - b.logprob) as f64).abs() < NEAR_TIE_NATS,
            _ => false,
        }
    }
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden(set: &GoldenSet) -> Golden {
    let text = std::fs::read_to_string(workspace().join(set.greedy)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The set's model on the CPU, or `None` outside CI when it has not been fetched.
fn load(set: &GoldenSet) -> Option<LoadedModel> {
    let path = workspace().join(set.model);
    if !path.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch {} first (ci/fetch-model)",
            set.model
        );
        eprintln!("skipping: {} is absent; run ci/fetch-model", path.display());
        return None;
    }
    Some(load_model(&path, &LoadOptions::default(), &mut |_| {}).expect("the model loads"))
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

#[test]
fn teacher_forced_logprobs_match_llama_cpp() {
    teacher_forced(&SMOLLM2);
}

#[test]
fn gemma3_teacher_forced_logprobs_match_llama_cpp() {
    teacher_forced(&GEMMA3);
}

#[test]
fn free_running_greedy_matches_llama_cpp() {
    free_running(&SMOLLM2);
}

#[test]
fn gemma3_free_running_greedy_matches_llama_cpp() {
    free_running(&GEMMA3);
}

fn teacher_forced(set: &GoldenSet) {
    let Some(mut model) = load(set) else {
        return;
    };
    let vocab = model.info.vocab_size;
    let (mut worst, mut total, mut count) = (0.0f64, 0.0f64, 0usize);
    let (mut top1_ok, mut top1_all) = (0, 0);
    let mut failures = Vec::new();
    for case in golden(set).cases {
        let logits = forced_logits(&mut model, &case);

        let first = case.prompt_token_ids.len() - 1;
        for (i, pos) in case.top10_logprobs_first8.iter().enumerate() {
            let row = &logits[(first + i) * vocab..(first + i + 1) * vocab];
            let ours = log_softmax(row);
            let top1 = top_logprobs(row, 1)[0].id;
            top1_all += 1;
            if top1 == pos.id {
                top1_ok += 1;
            } else {
                eprintln!(
                    "{:?} position {i}: top-1 {top1}, llama.cpp {} (near tie: {})",
                    case.user_message,
                    pos.id,
                    pos.is_near_tie()
                );
                if !pos.is_near_tie() {
                    failures.push(format!(
                        "{:?} position {i}: top-1 {top1}, llama.cpp {}",
                        case.user_message, pos.id
                    ));
                }
            }
            for c in &pos.top_logprobs {
                let diff = (ours[c.id as usize] - c.logprob as f64).abs();
                worst = worst.max(diff);
                total += diff;
                count += 1;
            }
        }
    }
    let mean = total / count as f64;
    eprintln!(
        "{}: teacher forcing: top-1 {top1_ok}/{top1_all}; |log-prob difference| over {count} listed tokens: max {worst:.4} nats, mean {mean:.4} nats",
        set.model
    );
    assert!(
        failures.is_empty(),
        "top-1 differs where llama.cpp has no near tie:\n{}",
        failures.join("\n")
    );
    assert!(
        worst <= set.max_diff,
        "max log-prob difference {worst:.4} > {}",
        set.max_diff
    );
    assert!(
        mean <= set.mean_diff,
        "mean log-prob difference {mean:.4} > {}",
        set.mean_diff
    );
}

/// The logits at every position of `case`'s prompt and its first 7
/// generated tokens (teacher forcing), on `model`.
fn forced_logits(model: &mut LoadedModel, case: &Case) -> Vec<f32> {
    let mut tokens = case.prompt_token_ids.clone();
    tokens.extend_from_slice(&case.generated_token_ids[..7]);
    let seq = model.backend.open(tokens.len()).unwrap();
    let mut logits = Vec::new();
    model
        .backend
        .forward(seq, &tokens, Logits::All, &mut logits, None)
        .unwrap();
    model.backend.close(seq);
    assert_eq!(logits.len(), tokens.len() * model.info.vocab_size);
    logits
}

/// Log-probabilities of llama.cpp's listed candidates at the 8 teacher-forced
/// positions of every case, on `model`.
fn listed_logprobs(model: &mut LoadedModel, cases: &[Case]) -> Vec<f64> {
    let vocab = model.info.vocab_size;
    let mut out = Vec::new();
    for case in cases {
        let logits = forced_logits(model, case);
        let first = case.prompt_token_ids.len() - 1;
        for (i, pos) in case.top10_logprobs_first8.iter().enumerate() {
            let ours = log_softmax(&logits[(first + i) * vocab..(first + i + 1) * vocab]);
            out.extend(pos.top_logprobs.iter().map(|c| ours[c.id as usize]));
        }
    }
    out
}

/// Issue 45: a quantized KV cache (`--kv-type`) against the f16 one on the
/// reference model's golden prompts, over the same listed log-probabilities
/// as `teacher_forced` (320 of them). Measured: q8_0 mean 0.052 nats (max
/// 0.22), q4_0 mean 0.76 (max 5.6). The 0.02 for q8_0 is beyond the
/// format on this small model: llama.cpp 0c1e57098's own q8_0 cache (CPU,
/// `-fa on -ctk q8_0 -ctv q8_0`) is 0.112 nats (max 0.50) from its f16
/// cache over the same tokens, q4_0 0.477 (max 3.0). The bounds guard
/// against regressions.
#[test]
fn quantized_kv_caches_stay_near_the_f16_cache() {
    let path = workspace().join(SMOLLM2.model);
    if load(&SMOLLM2).is_none() {
        return;
    }
    let cases = golden(&SMOLLM2).cases;
    let with = |kv_type| {
        let opts = LoadOptions {
            kv_type,
            ..LoadOptions::default()
        };
        let mut model = load_model(&path, &opts, &mut |_| {}).expect("the model loads");
        assert_eq!(model.backend.kv_layout().kv_type, kv_type);
        listed_logprobs(&mut model, &cases)
    };
    let f16 = with(KvType::F16);
    for (kv_type, bound) in [(KvType::Q8_0, 0.07), (KvType::Q4_0, 0.9)] {
        let q = with(kv_type);
        let diffs: Vec<f64> = q.iter().zip(&f16).map(|(a, b)| (a - b).abs()).collect();
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        let max = diffs.iter().cloned().fold(0.0, f64::max);
        eprintln!(
            "KV {kv_type} against f16 over {} listed tokens: mean {mean:.4} nats, max {max:.4}",
            diffs.len()
        );
        assert!(mean <= bound, "KV {kv_type}: mean {mean:.4} nats > {bound}");
    }
}

struct Collect(Vec<u32>);

impl GenerationObserver for Collect {
    fn should_abort(&mut self) -> Option<AbortReason> {
        None
    }
    fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason> {
        self.0.push(token.id);
        None
    }
}

fn free_running(set: &GoldenSet) {
    let Some(mut model) = load(set) else {
        return;
    };
    for case in golden(set).cases {
        let want: Vec<u32> = case
            .generated_token_ids
            .iter()
            .copied()
            .take_while(|&id| !model.tokenizer.is_eog(id))
            .collect();
        let req = GenerationRequest {
            prompt_tokens: case.prompt_token_ids.clone(),
            max_tokens: want.len(),
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            logprobs: 0,
            ignore_eos: false,
            accepted_at: None,
            constraint: None,
            bias: Default::default(),
        };
        let mut got = Collect(Vec::new());
        generate(model.backend.as_mut(), &model.tokenizer, &req, &mut got).unwrap();
        let agree = got.0.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!(
            "{:?}: first {agree} of {} tokens agree",
            case.user_message,
            want.len()
        );
        if agree < 8 {
            // Diverging inside the first 8 is acceptable only at a near tie in llama.cpp's own numbers.
            let pos = &case.top10_logprobs_first8[agree];
            assert!(
                pos.is_near_tie(),
                "{:?}: diverges at {agree} without a near tie: {:?} vs {:?}",
                case.user_message,
                got.0,
                want
            );
        }
    }
}

/// Gemma 3 against an exact reference: `testdata/golden-gemma3/reference_f64.py`
/// runs the same graph in float64 NumPy on the file's dequantized weights
/// (no rounding of activations, GELU or the KV cache) and lists its top-20
/// log-probabilities at each of the 8 teacher-forced positions. Where the
/// engine's own error is judged: |ours − f64| over those tokens.
#[test]
fn gemma3_matches_an_f64_reference() {
    let Some(mut model) = load(&GEMMA3) else {
        return;
    };
    let path = workspace().join("testdata/golden-gemma3/f64_logprobs.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = model.info.vocab_size;
    let (mut worst, mut total, mut count) = (0.0f64, 0.0f64, 0usize);
    for (case, exact) in golden(&GEMMA3)
        .cases
        .iter()
        .zip(reference["cases"].as_array().unwrap())
    {
        let logits = forced_logits(&mut model, case);
        let first = case.prompt_token_ids.len() - 1;
        for (i, pos) in exact["positions"].as_array().unwrap().iter().enumerate() {
            let ours = log_softmax(&logits[(first + i) * vocab..(first + i + 1) * vocab]);
            for c in pos["top_logprobs"].as_array().unwrap() {
                let id = c["id"].as_u64().unwrap() as usize;
                let diff = (ours[id] - c["logprob"].as_f64().unwrap()).abs();
                worst = worst.max(diff);
                total += diff;
                count += 1;
            }
        }
    }
    let mean = total / count as f64;
    eprintln!("gemma3 vs f64 NumPy: |log-prob difference| over {count} tokens: max {worst:.4} nats, mean {mean:.4} nats");
    assert!(worst <= F64_MAX_DIFF, "max {worst:.4} > {F64_MAX_DIFF}");
}

/// The golden README's bound for an exact reference of our own.
const F64_MAX_DIFF: f64 = 0.01;

//! `worker-orcd bench`: llama-bench's figures for the worker, without HTTP.
//!
//! For a model file on either backend it measures the prefill of `p` tokens
//! (`ppP`) and the decode of `n` tokens one at a time (`tgN`), optionally after
//! `depth` tokens already in the KV cache (`ppP@dD`, `tgN@dD`), as llama-bench
//! (llama.cpp `tools/llama-bench`) does: random token ids below the vocabulary
//! size, one untimed warm-up run per test, then `r` timed repetitions, each in a
//! fresh sequence. Each test prints one JSON line with llama-bench's `-o jsonl`
//! field names (`n_prompt`, `n_gen`, `n_depth`, `avg_ts`, `stddev_ts`,
//! `samples_ts`, `samples_ns`) plus `median_ts`, `min_ts` and `max_ts`.
//!
//! The clock stops only after the device is done: every timed forward pass is
//! followed by a greedy `Backend::sample`, which waits for the pass (the CUDA
//! backend copies the chosen id back). Decode steps sample anyway, as the engine
//! does; llama-bench synchronises without sampling, so a decode step here also
//! pays one argmax over the vocabulary (microseconds).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::backend::{sample_one, Backend, BackendKind, Logits, SampleRequest, SeqId};
use crate::load::{load_model, LoadOptions};
use crate::sampling::SamplingParams;

/// Context tokens are prefilled in chunks of this many, so a deep context
/// needs no more activation memory than a 512-token prompt.
const DEPTH_CHUNK: usize = 512;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// GGUF model file.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Compute backend.
    #[arg(long, default_value = "cuda")]
    pub backend: BackendKind,
    /// GPU ordinal for the cuda backend.
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// Prompt lengths to prefill, comma-separated (0 or empty: no prefill test).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Numbers of tokens to decode, comma-separated (0 or empty: no decode test).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Tokens already in the context before each test, comma-separated.
    #[arg(
        short = 'd',
        long = "depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Untimed warm-up runs before each test's repetitions.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Seed of the random prompt tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// One test: prefill `n_prompt` tokens or decode `n_gen` tokens, after `n_depth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestCase {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
}

impl TestCase {
    /// llama-bench's test name: `pp512`, `tg128`, with `@d4096` for a depth.
    pub fn name(&self) -> String {
        let base = if self.n_prompt > 0 {
            format!("pp{}", self.n_prompt)
        } else {
            format!("tg{}", self.n_gen)
        };
        if self.n_depth > 0 {
            format!("{base}@d{}", self.n_depth)
        } else {
            base
        }
    }

    /// Tokens one timed run processes.
    pub fn timed_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// KV cache positions one run needs.
    pub fn capacity(&self) -> usize {
        self.n_depth + self.n_prompt + self.n_gen
    }
}

/// Every test the arguments ask for, in llama-bench's order: prefill tests,
/// then decode tests, each for every depth. Zero lengths are skipped.
pub fn test_cases(args: &BenchArgs) -> Vec<TestCase> {
    let depths: Vec<usize> = if args.depth.is_empty() {
        vec![0]
    } else {
        args.depth.clone()
    };
    let mut cases = Vec::new();
    for &n_prompt in args.n_prompt.iter().filter(|&&p| p > 0) {
        cases.extend(depths.iter().map(|&n_depth| TestCase {
            n_prompt,
            n_gen: 0,
            n_depth,
        }));
    }
    for &n_gen in args.n_gen.iter().filter(|&&n| n > 0) {
        cases.extend(depths.iter().map(|&n_depth| TestCase {
            n_prompt: 0,
            n_gen,
            n_depth,
        }));
    }
    cases
}

/// Median, extremes, mean and sample standard deviation of some samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
}

/// Summarises `samples`; `None` when there are none.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let mean = sorted.iter().sum::<f64>() / n as f64;
    let stddev = if n > 1 {
        (sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Some(Summary {
        median,
        min: sorted[0],
        max: sorted[n - 1],
        mean,
        stddev,
    })
}

/// One printed line: llama-bench's jsonl fields for one test, plus medians.
#[derive(Debug, Serialize)]
pub struct BenchLine {
    pub program: &'static str,
    pub test: String,
    pub model_filename: String,
    pub model_type: String,
    pub backends: String,
    pub gpu_info: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    pub repetitions: usize,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub median_ts: f64,
    pub min_ts: f64,
    pub max_ts: f64,
    pub samples_ts: Vec<f64>,
    pub samples_ns: Vec<u64>,
}

/// What a line says about the model and device, the same for every test.
#[derive(Clone, Debug)]
pub struct RunContext {
    pub model_filename: String,
    pub model_type: String,
    pub backend: BackendKind,
    pub gpu_info: String,
}

/// Builds the line of `case` from its timed runs.
pub fn bench_line(
    ctx: &RunContext,
    case: TestCase,
    times: &[Duration],
) -> anyhow::Result<BenchLine> {
    let tokens = case.timed_tokens() as f64;
    let samples_ts: Vec<f64> = times
        .iter()
        .map(|t| tokens / t.as_secs_f64().max(1e-12))
        .collect();
    let s = summarize(&samples_ts).context("a test without timed runs")?;
    Ok(BenchLine {
        program: "worker-orcd",
        test: case.name(),
        model_filename: ctx.model_filename.clone(),
        model_type: ctx.model_type.clone(),
        backends: ctx.backend.as_str().to_string(),
        gpu_info: ctx.gpu_info.clone(),
        n_prompt: case.n_prompt,
        n_gen: case.n_gen,
        n_depth: case.n_depth,
        repetitions: times.len(),
        avg_ts: s.mean,
        stddev_ts: s.stddev,
        median_ts: s.median,
        min_ts: s.min,
        max_ts: s.max,
        samples_ts,
        samples_ns: times.iter().map(|t| t.as_nanos() as u64).collect(),
    })
}

/// Random token ids below `vocab`, as llama-bench draws them.
pub fn random_tokens(rng: &mut ChaCha8Rng, vocab: usize, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// Waits for the latest forward pass by picking its greedy token.
fn finish(backend: &mut dyn Backend, seq: SeqId, greedy: &SamplingParams) -> anyhow::Result<u32> {
    let req = SampleRequest {
        params: greedy,
        generated: &[],
        uniform: None,
        logprobs: 0,
        mask: None,
        bias: &[],
    };
    Ok(sample_one(backend, seq, &req)?.id)
}

/// One run of `case` in a fresh sequence; returns the time of its timed part.
fn run_once(
    backend: &mut dyn Backend,
    case: TestCase,
    vocab: usize,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<Duration> {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut out = Vec::new();
    let seq = backend.open(case.capacity())?;
    for chunk in random_tokens(rng, vocab, case.n_depth).chunks(DEPTH_CHUNK) {
        backend.forward(seq, chunk, Logits::None, &mut out, None)?;
    }
    if case.n_depth > 0 {
        finish(backend, seq, &greedy)?;
    }
    let prompt = random_tokens(rng, vocab, case.n_prompt);
    let mut next = rng.random_range(0..vocab as u32);
    let started = Instant::now();
    if !prompt.is_empty() {
        backend.forward(seq, &prompt, Logits::None, &mut out, None)?;
        finish(backend, seq, &greedy)?;
    }
    for _ in 0..case.n_gen {
        backend.forward(seq, &[next], Logits::None, &mut out, None)?;
        next = finish(backend, seq, &greedy)?;
    }
    let elapsed = started.elapsed();
    backend.close(seq);
    Ok(elapsed)
}

/// Warm-up runs, then `repetitions` timed runs of `case`.
pub fn run_case(
    backend: &mut dyn Backend,
    case: TestCase,
    vocab: usize,
    warmup: usize,
    repetitions: usize,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<Vec<Duration>> {
    for _ in 0..warmup {
        run_once(backend, case, vocab, rng)
            .with_context(|| format!("warm-up of {}", case.name()))?;
    }
    (0..repetitions)
        .map(|i| {
            run_once(backend, case, vocab, rng).with_context(|| format!("{} run {i}", case.name()))
        })
        .collect()
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let cases = test_cases(&args);
    if cases.is_empty() {
        bail!("nothing to measure: give -p or -n lengths above 0");
    }
    let max_capacity = cases.iter().map(TestCase::capacity).max().unwrap_or(0);
    let opts = LoadOptions {
        backend: args.backend,
        gpu_device: args.gpu_device,
        ..LoadOptions::default()
    };
    let mut model = load_model(&args.model, &opts, &mut |_| {})
        .with_context(|| format!("loading {}", args.model.display()))?;
    if max_capacity > model.info.context_length {
        bail!(
            "a test needs {max_capacity} positions; the model's context is {}",
            model.info.context_length
        );
    }
    let ctx = RunContext {
        model_filename: args.model.display().to_string(),
        model_type: format!("{} {}", model.info.architecture, model.info.quant_kind),
        backend: args.backend,
        gpu_info: model.backend.device().name.clone(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let vocab = model.info.vocab_size;
    for case in cases {
        let times = run_case(
            model.backend.as_mut(),
            case,
            vocab,
            args.warmup,
            args.repetitions,
            &mut rng,
        )?;
        println!(
            "{}",
            serde_json::to_string(&bench_line(&ctx, case, &times)?)?
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(p: &[usize], n: &[usize], d: &[usize]) -> BenchArgs {
        BenchArgs {
            model: PathBuf::from("m.gguf"),
            backend: BackendKind::Cpu,
            gpu_device: 0,
            n_prompt: p.to_vec(),
            n_gen: n.to_vec(),
            depth: d.to_vec(),
            repetitions: 3,
            warmup: 1,
            seed: 0,
        }
    }

    #[test]
    fn test_cases_follow_llama_bench_order_and_names() {
        let cases = test_cases(&args(&[16, 0, 512], &[128], &[0, 4096]));
        let names: Vec<String> = cases.iter().map(TestCase::name).collect();
        assert_eq!(
            names,
            [
                "pp16",
                "pp16@d4096",
                "pp512",
                "pp512@d4096",
                "tg128",
                "tg128@d4096"
            ]
        );
        assert_eq!(cases[5].capacity(), 4096 + 128);
        assert!(test_cases(&args(&[], &[0], &[])).is_empty());
    }

    #[test]
    fn summary_of_odd_and_even_counts() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.mean), (2.0, 1.0, 3.0, 2.0));
        assert!((s.stddev - 1.0).abs() < 1e-12);
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(summarize(&[]).is_none());
    }

    #[test]
    fn line_turns_times_into_tokens_per_second() {
        let ctx = RunContext {
            model_filename: "m.gguf".into(),
            model_type: "llama Q4_1".into(),
            backend: BackendKind::Cpu,
            gpu_info: "cpu".into(),
        };
        let case = TestCase {
            n_prompt: 0,
            n_gen: 100,
            n_depth: 0,
        };
        let times = [
            Duration::from_millis(100),
            Duration::from_millis(200),
            Duration::from_millis(50),
        ];
        let line = bench_line(&ctx, case, &times).unwrap();
        assert_eq!(line.samples_ts, [1000.0, 500.0, 2000.0]);
        assert_eq!(
            (line.median_ts, line.min_ts, line.max_ts),
            (1000.0, 500.0, 2000.0)
        );
        assert_eq!(line.samples_ns[0], 100_000_000);
        assert_eq!(line.test, "tg100");
    }

    /// The whole loop on the CPU backend over a small synthetic model: every
    /// case gives one time per repetition and leaves no sequence open.
    #[test]
    fn runs_every_case_on_a_synthetic_model() {
        use crate::backend::cpu::CpuBackend;
        use crate::gguf::GgufFile;
        use crate::model::ModelConfig;

        let bytes = crate::model::synthetic::synthetic_llama("llama", 7, 256);
        let file = std::sync::Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let vocab = cfg.vocab_size;
        let mut backend = CpuBackend::load(cfg, file, &mut |_| {}).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for case in test_cases(&args(&[8], &[4], &[0, 20])) {
            let times = run_case(&mut backend, case, vocab, 1, 2, &mut rng).unwrap();
            assert_eq!(times.len(), 2, "{}", case.name());
            assert!(times.iter().all(|t| *t > Duration::ZERO));
            // One sequence at a time: a new one opens only if none was left.
            let seq = backend
                .open(1)
                .unwrap_or_else(|e| panic!("{}: sequence left open: {e}", case.name()));
            backend.close(seq);
        }
    }
}

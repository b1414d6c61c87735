//! Whole forward passes on the GPU through the `Backend` trait, for SmolLM2
//! (the reference model), the Qwen2.5-0.5B shape and the Llama-3-8B shape
//! (synthetic files from `harness synth-model`, named by `BENCH_MODEL_QWEN05B`
//! and `BENCH_MODEL_LLAMA8B`; `BENCH_MODEL_SMOLLM2` overrides the reference):
//!
//! - `decode/<shape>`: one decode step (a forward pass of one token and the
//!   greedy pick on the device) after a 16-token prompt; throughput in tokens.
//! - `prefill/<shape>/<n>`: the prefill of 16, 128 and 512 random tokens in a
//!   fresh sequence, then the greedy pick (which waits for the pass).
//!
//! Without a GPU or a file, prints `skipped: ...` and exits 0.
//! Run: `cargo bench -p worker-benches --bench gpu_model`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use worker_benches::{cuda_device_or_skip, LLAMA_8B, QWEN_05B, SMOLLM2};
use worker_orcd::backend::{sample_one, Backend, BackendKind, Logits, SampleRequest, SeqId};
use worker_orcd::load::{load_model, LoadOptions};
use worker_orcd::sampling::SamplingParams;

const GREEDY: SamplingParams = SamplingParams {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    repetition_penalty: 1.0,
    seed: 0,
};

/// Decode steps per sequence: the context grows to at most 16 + this.
const MAX_STEPS: usize = 256;

fn pick(backend: &mut dyn Backend, seq: SeqId) -> u32 {
    let req = SampleRequest {
        params: &GREEDY,
        generated: &[],
        uniform: None,
        logprobs: 0,
        mask: None,
        bias: &[],
    };
    sample_one(backend, seq, &req).expect("sample").id
}

/// Token ids spread over the vocabulary without a random number generator.
fn tokens(vocab: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn gpu_model(c: &mut Criterion) {
    if cuda_device_or_skip("gpu_model").is_none() {
        return;
    }
    for shape in [SMOLLM2, QWEN_05B, LLAMA_8B] {
        let Some(path) = shape.model_or_skip("gpu_model") else {
            continue;
        };
        let opts = LoadOptions {
            backend: BackendKind::Cuda,
            ..LoadOptions::default()
        };
        let mut model = load_model(&path, &opts, &mut |_| {}).expect("the model loads");
        let vocab = model.info.vocab_size;
        let backend = model.backend.as_mut();
        let mut out = Vec::new();

        let mut g = c.benchmark_group(format!("decode/{}", shape.name));
        g.sample_size(20).measurement_time(Duration::from_secs(3));
        g.throughput(Throughput::Elements(1));
        g.bench_function("step", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    // A fresh sequence per run of at most MAX_STEPS steps, so
                    // the context stays short and within the model's limit.
                    let steps = left.min(MAX_STEPS);
                    left -= steps;
                    let seq = backend.open(16 + steps).unwrap();
                    backend
                        .forward(seq, &tokens(vocab, 16), Logits::None, &mut out, None)
                        .unwrap();
                    let mut next = pick(backend, seq);
                    let t = Instant::now();
                    for _ in 0..steps {
                        backend
                            .forward(seq, &[next], Logits::None, &mut out, None)
                            .unwrap();
                        next = pick(backend, seq);
                    }
                    total += t.elapsed();
                    backend.close(seq);
                }
                total
            })
        });
        g.finish();

        let mut g = c.benchmark_group(format!("prefill/{}", shape.name));
        g.sample_size(20)
            .measurement_time(Duration::from_secs(3))
            .sampling_mode(SamplingMode::Flat);
        for n in [16usize, 128, 512] {
            let prompt = tokens(vocab, n);
            g.throughput(Throughput::Elements(n as u64));
            g.bench_function(n.to_string(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let seq = backend.open(n).unwrap();
                        let t = Instant::now();
                        backend
                            .forward(seq, &prompt, Logits::None, &mut out, None)
                            .unwrap();
                        pick(backend, seq);
                        total += t.elapsed();
                        backend.close(seq);
                    }
                    total
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, gpu_model);
criterion_main!(benches);

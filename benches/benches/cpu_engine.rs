//! CPU backend speed on the reference model (SmolLM2-135M-Instruct Q4_1):
//! prefill of a 64-token prompt and single-token decode at a short context.
//! Criterion reports elements/s, i.e. tokens/s.
//!
//! Run: `cargo bench -p worker-benches --bench cpu_engine`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use worker_orcd::backend::Logits;
use worker_orcd::load::{load_model, LoadOptions};

fn bench_cpu(c: &mut Criterion) {
    let path = worker_benches::reference_model();
    let mut model = load_model(&path, &LoadOptions::default(), &mut |_| {}).expect("model loads");
    // A fixed, realistic prompt: the first golden chat prompt, repeated to 64 tokens.
    let prompt = model
        .tokenizer
        .encode("<|im_start|>user\nWrite a haiku about GPU computing and the people who program them.<|im_end|>\n", true, true)
        .unwrap();
    let prompt: Vec<u32> = prompt.iter().copied().cycle().take(64).collect();
    let mut logits = Vec::new();

    let mut group = c.benchmark_group("smollm2_cpu");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));

    group.throughput(Throughput::Elements(prompt.len() as u64));
    group.bench_function("prefill_64", |b| {
        b.iter(|| {
            let seq = model.backend.open(prompt.len()).unwrap();
            model
                .backend
                .forward(seq, &prompt, Logits::Last, &mut logits, None)
                .unwrap();
            model.backend.close(seq);
        })
    });

    // Decode: 32 tokens after a 16-token prompt, so the context is short.
    let decode_steps = 32;
    group.throughput(Throughput::Elements(decode_steps as u64));
    group.bench_function("decode_32", |b| {
        // Only the decode steps are timed, not the short prefill before them.
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let seq = model.backend.open(16 + decode_steps).unwrap();
                model
                    .backend
                    .forward(seq, &prompt[..16], Logits::Last, &mut logits, None)
                    .unwrap();
                let mut next = prompt[16];
                let started = std::time::Instant::now();
                for _ in 0..decode_steps {
                    model
                        .backend
                        .forward(seq, &[next], Logits::Last, &mut logits, None)
                        .unwrap();
                    next = worker_orcd::sampling::argmax(&logits);
                }
                timed += started.elapsed();
                model.backend.close(seq);
            }
            timed
        })
    });
    group.finish();
}

criterion_group!(benches, bench_cpu);
criterion_main!(benches);

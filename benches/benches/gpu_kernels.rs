//! The CUDA backend's kernels at real model shapes, through the public `Ops`
//! of `backend::cuda::CudaOps` (the operations the llama graph calls):
//!
//! - `copy`: a 1 GiB device-to-device copy (`Ops::take_row` of a one-row
//!   matrix), bytes read plus written: the bandwidth ceiling of this GPU.
//! - `matvec/<shape>/<matrix>/<format>`: decode's matrix-vector product, one
//!   token; throughput is the weight's stored bytes, so criterion prints GB/s
//!   to compare with `copy`.
//! - `matmul512/...`: prefill's product over 512 tokens; throughput counts
//!   2 * rows * cols * 512 as elements, i.e. criterion's `elem/s` is FLOP/s.
//! - `attention/<shape>/ctx<N>`: one decode position over N cached positions
//!   (one layer); throughput is the K and V bytes read.
//! - `sample/<vocab>/<mode>`: the sampling kernels on device logits,
//!   greedy and with temperature, top-k, top-p and min-p.
//!
//! Each timed batch ends with a device synchronize. Without a GPU every bench
//! prints `skipped: no CUDA device (...)` and exits 0.
//!
//! Run: `cargo bench -p worker-benches --bench gpu_kernels [-- FILTER]`;
//! `BENCH_FORMATS=Q4_K,Q8_0` limits the formats.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use worker_benches::{cuda_device_or_skip, formats, skip, tiled_weight, Shape, LLAMA_8B, QWEN_05B};
use worker_orcd::backend::cuda::{CudaCache, CudaDevice, CudaOps, DeviceSampler};
use worker_orcd::backend::SampleRequest;
use worker_orcd::model::ops::{AttentionShape, Ops};
use worker_orcd::sampling::SamplingParams;

/// Runs `f` `iters` times and synchronizes once, so the clock covers the work.
fn timed(dev: &CudaDevice, iters: u64, mut f: impl FnMut()) -> Duration {
    dev.synchronize().expect("synchronize");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    dev.synchronize().expect("synchronize");
    t.elapsed()
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 97) as f32 - 48.0) / 97.0).collect()
}

fn bench_copy(c: &mut Criterion, dev: &Arc<CudaDevice>, ops: &mut CudaOps) {
    let n = 256 << 20; // f32 values: 1 GiB
    let src = ops.buf(1, n).expect("a 1 GiB buffer");
    let mut g = c.benchmark_group("copy");
    g.throughput(Throughput::Bytes(2 * 4 * n as u64));
    g.bench_function("d2d_1GiB", |b| {
        b.iter_custom(|iters| timed(dev, iters, || drop(ops.take_row(&src, 0).unwrap())))
    });
    g.finish();
}

fn bench_matmuls(
    c: &mut Criterion,
    dev: &Arc<CudaDevice>,
    ops: &mut CudaOps,
    shape: &Shape,
    tokens: usize,
) {
    let group = if tokens == 1 { "matvec" } else { "matmul512" };
    let mut g = c.benchmark_group(format!("{group}/{}", shape.name));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    // Flat sampling: the same number of iterations per sample, so a 50 ms
    // product takes about a second, not the 210 iterations of linear sampling.
    g.sampling_mode(SamplingMode::Flat);
    for (label, rows, cols) in shape.matrices() {
        let x = ops
            .upload(tokens, cols, &ramp(tokens * cols))
            .expect("activations");
        let mut out = ops.buf(tokens, rows).expect("output");
        for ty in formats() {
            if cols % ty.block_len() != 0 {
                let what = format!("{group}/{}/{label}/{ty}", shape.name);
                skip(&what, &format!("{cols} columns are not whole {ty} blocks"));
                continue;
            }
            let bytes = tiled_weight(ty, rows, cols);
            let w = ops
                .upload_weight(ty, rows, cols, &bytes)
                .expect("weight upload");
            g.throughput(if tokens == 1 {
                Throughput::Bytes(bytes.len() as u64)
            } else {
                Throughput::Elements(2 * (rows * cols * tokens) as u64)
            });
            let id = BenchmarkId::new(format!("{label}_{rows}x{cols}"), ty.name());
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    timed(dev, iters, || ops.matmul(&x, &w, None, &mut out).unwrap())
                })
            });
        }
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion, dev: &Arc<CudaDevice>, ops: &mut CudaOps, shape: &Shape) {
    let mut g = c.benchmark_group(format!("attention/{}", shape.name));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for ctx in [512usize, 4096, 16384] {
        let mut cache =
            CudaCache::new(dev, 1, shape.n_head_kv, shape.head_dim, ctx + 1).expect("KV cache");
        let q = ops
            .upload(
                1,
                shape.n_head * shape.head_dim,
                &ramp(shape.n_head * shape.head_dim),
            )
            .unwrap();
        let k = ops
            .upload(
                1,
                shape.n_head_kv * shape.head_dim,
                &ramp(shape.n_head_kv * shape.head_dim),
            )
            .unwrap();
        let v = ops
            .upload(
                1,
                shape.n_head_kv * shape.head_dim,
                &ramp(shape.n_head_kv * shape.head_dim),
            )
            .unwrap();
        let mut out = ops.buf(1, shape.n_head * shape.head_dim).unwrap();
        let at = AttentionShape {
            layer: 0,
            start_pos: ctx,
            n_tokens: 1,
            n_head: shape.n_head,
            n_head_kv: shape.n_head_kv,
            head_dim: shape.head_dim,
            window: None,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
        };
        g.throughput(Throughput::Bytes(CudaCache::bytes_for(
            1,
            shape.n_head_kv,
            shape.head_dim,
            ctx + 1,
        )));
        g.bench_function(format!("ctx{ctx}"), |b| {
            b.iter_custom(|iters| {
                timed(dev, iters, || {
                    ops.attention(&q, &k, &v, &mut cache, at, &mut out).unwrap()
                })
            })
        });
    }
    g.finish();
}

fn bench_sampling(c: &mut Criterion, dev: &Arc<CudaDevice>, vocab: usize) {
    let mut sampler = DeviceSampler::new(dev, vocab).expect("sampler");
    sampler
        .upload_logits(&ramp(vocab).iter().map(|x| x * 20.0).collect::<Vec<_>>())
        .unwrap();
    let mut g = c.benchmark_group(format!("sample/{vocab}"));
    g.throughput(Throughput::Elements(vocab as u64));
    let modes = [
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            None,
        ),
        (
            "temperature",
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::default()
            },
            Some(0.37),
        ),
        (
            "top_k_top_p_min_p",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                ..SamplingParams::default()
            },
            Some(0.37),
        ),
    ];
    for (name, params, uniform) in modes {
        let req = SampleRequest {
            params: &params,
            generated: &[],
            uniform,
            logprobs: 0,
            mask: None,
            bias: &[],
        };
        // `sample` returns after copying the id back: each call is synchronous.
        g.bench_function(name, |b| b.iter(|| sampler.sample(&req).unwrap().id));
    }
    g.finish();
}

fn gpu_kernels(c: &mut Criterion) {
    let Some(dev) = cuda_device_or_skip("gpu_kernels") else {
        return;
    };
    let mut ops = CudaOps::new(dev.clone());
    bench_copy(c, &dev, &mut ops);
    for shape in [LLAMA_8B, QWEN_05B] {
        bench_matmuls(c, &dev, &mut ops, &shape, 1);
        bench_matmuls(c, &dev, &mut ops, &shape, 512);
        bench_attention(c, &dev, &mut ops, &shape);
        bench_sampling(c, &dev, shape.vocab);
    }
}

criterion_group!(benches, gpu_kernels);
criterion_main!(benches);

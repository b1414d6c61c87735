//! RoPE in both styles, and the KV store with attention over prefill and
//! decode, against the CPU reference.

use super::matmul::restore_matmul_choice;
use super::*;
use crate::model::ops::{attend_in_steps, HeadNorms, Product, QkPrep};

/// `rope_qk` turns Q and K in one launch with the bits of two `rope`
/// launches; Q and K turned unalike (another position) take two.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rope_qk_matches_two_ropes_bit_for_bit() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_head, n_head_kv, head_dim, rows) in [(32, 8, 128, 1), (9, 3, 64, 70), (4, 1, 80, 5)]
        {
            let p = |n_head, start_pos| RopeParams {
                n_head,
                head_dim,
                n_rot: head_dim,
                start_pos,
                freq_base: 500_000.0,
                freq_scale: 1.0,
                style,
                freq_factors: None,
                mscale: 1.0,
            };
            let qv = random_vec(&mut rng, rows * n_head * head_dim, 2.0);
            let kv = random_vec(&mut rng, rows * n_head_kv * head_dim, 2.0);
            for k_pos in [37, 38] {
                let (mut q1, mut k1) = (
                    ops.upload(rows, n_head * head_dim, &qv).unwrap(),
                    ops.upload(rows, n_head_kv * head_dim, &kv).unwrap(),
                );
                ops.rope(&mut q1, p(n_head, 37)).unwrap();
                ops.rope(&mut k1, p(n_head_kv, k_pos)).unwrap();
                let (mut q2, mut k2) = (
                    ops.upload(rows, n_head * head_dim, &qv).unwrap(),
                    ops.upload(rows, n_head_kv * head_dim, &kv).unwrap(),
                );
                let before = dev().kernels.writes();
                ops.rope_qk(&mut q2, &mut k2, p(n_head, 37), p(n_head_kv, k_pos))
                    .unwrap();
                let launches = dev().kernels.writes() - before;
                assert_eq!(launches, if k_pos == 37 { 1 } else { 2 }, "K at {k_pos}");
                let what =
                    format!("{style:?} {n_head}/{n_head_kv}x{head_dim}, {rows} rows, K at {k_pos}");
                for (a, b, which) in [(&q1, &q2, "Q"), (&k1, &k2, "K")] {
                    let (a, b) = (host(&mut ops, a), host(&mut ops, b));
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}: {which} differs"
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rope_matches_cpu_in_both_styles() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut worst = 0f64;
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_head, head_dim, n_rot) in [(9, 64, 64), (3, 64, 64), (4, 128, 64), (2, 80, 80)] {
            for (rows, start_pos) in [(64, 0), (1, 64), (5, 8000), (3, 100_000)] {
                let p = RopeParams {
                    n_head,
                    head_dim,
                    n_rot,
                    start_pos,
                    freq_base: 100_000.0,
                    freq_scale: 1.0,
                    style,
                    freq_factors: None,
                    mscale: 1.0,
                };
                let xv = random_vec(&mut rng, rows * n_head * head_dim, 2.0);
                let mut cpu_x = cpu_buf(rows, n_head * head_dim, xv.clone());
                CpuOps.rope(&mut cpu_x, p).unwrap();
                for with_table in [false, true] {
                    let mut ops = gpu_ops();
                    if with_table {
                        ops.prepare_rope(p.freq_base, n_rot, None).unwrap();
                    }
                    let mut x = ops.upload(rows, n_head * head_dim, &xv).unwrap();
                    ops.rope(&mut x, p).unwrap();
                    let e = rel_err(&host(&mut ops, &x), &cpu_x.data);
                    assert!(e <= 1e-6, "rope {style:?} {n_head}x{head_dim} rot {n_rot} pos {start_pos} table {with_table}: {e:e}");
                    worst = worst.max(e);
                }
                assert_deterministic("rope", || {
                    let mut x = ops.upload(rows, n_head * head_dim, &xv).unwrap();
                    ops.rope(&mut x, p).unwrap();
                    host(&mut ops, &x)
                });
            }
        }
    }
    // Frequency factors (Llama 3.1's rope_freqs, Phi-3's LongRoPE tables)
    // and a magnitude factor, also at positions a decode graph would replay.
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_head, head_dim, n_rot) in [(4, 96, 96), (3, 128, 64)] {
            let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + 0.37 * i as f32).collect();
            for (rows, start_pos) in [(40, 0), (1, 3000)] {
                let p = RopeParams {
                    n_head,
                    head_dim,
                    n_rot,
                    start_pos,
                    freq_base: 10_000.0,
                    freq_scale: 1.0,
                    style,
                    freq_factors: Some(&factors),
                    mscale: 1.19,
                };
                let xv = random_vec(&mut rng, rows * n_head * head_dim, 2.0);
                let mut cpu_x = cpu_buf(rows, n_head * head_dim, xv.clone());
                CpuOps.rope(&mut cpu_x, p).unwrap();
                let mut ops = gpu_ops();
                let mut x = ops.upload(rows, n_head * head_dim, &xv).unwrap();
                ops.rope(&mut x, p).unwrap();
                let e = rel_err(&host(&mut ops, &x), &cpu_x.data);
                assert!(
                    e <= 1e-6,
                    "rope {style:?} with factors, pos {start_pos}: {e:e}"
                );
                worst = worst.max(e);
                let short = &factors[1..];
                let bad = RopeParams {
                    freq_factors: Some(short),
                    ..p
                };
                assert!(
                    ops.rope(&mut x, bad).is_err(),
                    "factors of the wrong length"
                );
            }
        }
    }
    // Position 0 is unchanged by either style; position 1 tells them apart.
    eprintln!("rope: max relative error {worst:.2e}");
}

/// Runs the same sequence of attention calls (prefill, then decode steps)
/// on both backends and compares every output: the second layer's with a
/// sink logit per head (`attention_sinks`, gpt-oss).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn attention_matches_cpu_over_prefill_and_decode() {
    let _gpu = shared_gpu();
    attention_against_cpu(&dev(), KvType::F16, &ATTENTION_CASES);
}

/// Issue 45: the same with a q8_0 and a q4_0 cache (heads of whole blocks),
/// each on a context built for it and the head size as `CudaBackend::load`
/// builds one: kv_put's blocks and every kernel's reads of them give the
/// CPU's values.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn attention_over_a_quantized_cache_matches_cpu() {
    let _gpu = shared_gpu();
    for kv_type in [KvType::Q8_0, KvType::Q4_0] {
        for hd in [64, 128, 256] {
            let set = KernelSet {
                formats: &[],
                layer_formats: &[],
                expert_formats: &[],
                head_dim: hd,
                group: 4,
                kv_type,
            };
            let dev = CudaDevice::with_cap(0, None, Some(set)).expect("GPU 0 initialises");
            let cases: Vec<AttentionCase> = ATTENTION_CASES
                .iter()
                .copied()
                .filter(|c| c.2 == hd)
                .collect();
            attention_against_cpu(&dev, kv_type, &cases);
        }
    }
}

/// (n_head, n_head_kv, head_dim, capacity, steps as token counts, sliding window)
type AttentionCase = (usize, usize, usize, usize, &'static [usize], Option<usize>);

const ATTENTION_CASES: [AttentionCase; 10] = [
    (9, 3, 64, 200, &[64, 1, 1, 5, 1], None),
    (9, 3, 64, 1100, &[300, 1, 700, 1], None),
    (4, 4, 128, 40, &[1, 1, 17, 1], None),
    (8, 2, 128, 700, &[130, 2, 1, 520, 1], None),
    (8, 2, 256, 20, &[9, 1], None),
    (6, 1, 80, 33, &[32, 1], None),
    (2, 1, 36, 150, &[140, 1, 2], None),
    // Windows narrower than a prefill pass, wider, and as wide as the cache.
    (4, 1, 256, 700, &[300, 1, 250, 1, 1], Some(128)),
    (8, 2, 128, 700, &[130, 2, 1, 520, 1], Some(200)),
    (9, 3, 64, 150, &[100, 1, 40, 1], Some(150)),
];

/// Runs each case's attention calls on `dev` (its kernels built for caches
/// of `kv_type`) and on the CPU with a cache of that type, comparing every
/// output.
fn attention_against_cpu(dev: &Arc<CudaDevice>, kv_type: KvType, cases: &[AttentionCase]) {
    let mut ops = CudaOps::new(dev.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut worst = 0f64;
    // Each case with prefill on attention_tc (heads of 64 and 128) and
    // decode on one block per head, then with every decode step's
    // attention split over the context (attention_split + combine), then
    // with prefill on one block per (row, head) too.
    let configs = [
        (usize::MAX, kernels::ATC_MIN_ROWS),
        (0, kernels::ATC_MIN_ROWS),
        (usize::MAX, usize::MAX),
    ];
    for (&(n_head, n_kv, hd, capacity, steps, window), (split_from, tc_from)) in
        cases.iter().flat_map(|c| configs.map(|k| (c, k)))
    {
        if quick() && capacity > 1000 {
            continue;
        }
        dev.kernels.set_split_min_context(split_from);
        dev.kernels.set_attention_tc_min_rows(tc_from);
        let n_layer = 2;
        // Layer 1 with a sink logit per head (gpt-oss): some above every
        // score, some below, some near.
        let sinks: Vec<f32> = (0..n_head)
            .map(|_| rng.random_range(-3.0f32..6.0))
            .collect();
        let sinks = test_weight(&mut ops, GgmlType::F32, 1, n_head, &sinks);
        let mut cpu_cache = CpuCache::of_type(kv_type, n_layer, capacity, n_kv * hd);
        let mut gpu_cache =
            CudaCache::new_in(dev, None, kv_type, n_layer, n_kv, hd, capacity).unwrap();
        let mut pos = 0;
        for &n in steps {
            for layer in 0..n_layer {
                let s = AttentionShape {
                    layer,
                    start_pos: pos,
                    n_tokens: n,
                    n_head,
                    n_head_kv: n_kv,
                    head_dim: hd,
                    window,
                    // Another factor than the usual one where there is a window.
                    scale: if window.is_some() {
                        0.3
                    } else {
                        1.0 / (hd as f32).sqrt()
                    },
                };
                let qv = random_vec(&mut rng, n * n_head * hd, 2.0);
                let kv = random_vec(&mut rng, n * n_kv * hd, 2.0);
                let vv = random_vec(&mut rng, n * n_kv * hd, 2.0);
                let mut cpu_out = cpu_buf(n, n_head * hd, vec![0.0; n * n_head * hd]);
                let (cq, ck, cv) = (
                    cpu_buf(n, n_head * hd, qv.clone()),
                    cpu_buf(n, n_kv * hd, kv.clone()),
                    cpu_buf(n, n_kv * hd, vv.clone()),
                );
                let with_sinks = layer == 1;
                if with_sinks {
                    CpuOps
                        .attention_sinks(&cq, &ck, &cv, &mut cpu_cache, s, &sinks.cpu, &mut cpu_out)
                        .unwrap();
                } else {
                    CpuOps
                        .attention(&cq, &ck, &cv, &mut cpu_cache, s, &mut cpu_out)
                        .unwrap();
                }
                let (q, k, v) = (
                    ops.upload(n, n_head * hd, &qv).unwrap(),
                    ops.upload(n, n_kv * hd, &kv).unwrap(),
                    ops.upload(n, n_kv * hd, &vv).unwrap(),
                );
                let mut out = ops.buf(n, n_head * hd).unwrap();
                let run = |ops: &mut CudaOps, cache: &mut CudaCache, out: &mut CudaBuf| {
                    if with_sinks {
                        ops.attention_sinks(&q, &k, &v, cache, s, &sinks.gpu, out)
                    } else {
                        ops.attention(&q, &k, &v, cache, s, out)
                    }
                    .unwrap()
                };
                run(&mut ops, &mut gpu_cache, &mut out);
                let g = host(&mut ops, &out);
                let e = rel_err(&g, &cpu_out.data);
                assert!(
                    e <= 1e-2,
                    "attention {n_head}/{n_kv}x{hd} {kv_type} pos {pos} n {n} window {window:?} sinks {with_sinks} split from {split_from} tc from {tc_from}: {e:e}"
                );
                worst = worst.max(e);
                assert_deterministic("attention", || {
                    run(&mut ops, &mut gpu_cache, &mut out);
                    host(&mut ops, &out)
                });
                if kv_type != KvType::F16 {
                    continue;
                }
                // The current positions' K/V are in the cache, rounded to f16.
                let last = pos + n - 1;
                let (kc, _) = gpu_cache.read_entry(dev, layer, n_kv - 1, last).unwrap();
                let want: Vec<u16> = kv[(n - 1) * n_kv * hd + (n_kv - 1) * hd..][..hd]
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect();
                assert_eq!(kc, want, "K of the last position is stored as f16");
            }
            pos += n;
        }
        // Overflowing the cache is refused before launch.
        let s = AttentionShape {
            layer: 0,
            start_pos: capacity,
            n_tokens: 1,
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
            window,
            scale: 1.0,
        };
        let q = ops.buf(1, n_head * hd).unwrap();
        let k = ops.buf(1, n_kv * hd).unwrap();
        let mut out = ops.buf(1, n_head * hd).unwrap();
        assert!(ops
            .attention(&q, &k, &k, &mut gpu_cache, s, &mut out)
            .is_err());
    }
    dev.kernels
        .set_split_min_context(kernels::SPLIT_MIN_CONTEXT);
    dev.kernels.set_attention_tc_min_rows(kernels::ATC_MIN_ROWS);
    eprintln!("attention ({kv_type} KV; layer 1 with sinks): max relative error {worst:.2e}");
}

/// `attend` normalises and turns Q and K and stores K and V in one
/// `qk_rope_store` launch, with the bits of the same steps one by one
/// (`attend_in_steps`: norms, `rope_qk`, `attention`): Q and K after it,
/// every cached position, the output; a decode row's output also split
/// for the next mat-vec as `quantize_x8` splits it (the product after it
/// launches no `quantize_x8` and has the bits of one after a fresh split).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn attend_fuses_norms_rope_and_store_bit_for_bit() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    restore_matmul_choice();
    // (n_head, n_head_kv, head_dim, head norms, style, frequency factors):
    // Gemma 3 270M, SmolLM2, Llama 3.1, Phi-3 (heads of 96), a head of 80.
    let cases = [
        (4, 1, 256, true, RopeStyle::Neox, false),
        (9, 3, 64, false, RopeStyle::Normal, false),
        (32, 8, 128, false, RopeStyle::Normal, true),
        (32, 32, 96, false, RopeStyle::Neox, false),
        (6, 2, 80, true, RopeStyle::Normal, false),
    ];
    for (n_head, n_kv, hd, with_norms, style, with_factors) in cases {
        let (qd, kvd) = (n_head * hd, n_kv * hd);
        let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + 0.21 * i as f32).collect();
        let norm_w = |rng: &mut ChaCha8Rng| -> Vec<f32> {
            (0..hd)
                .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
                .collect()
        };
        let (qw, kw) = (norm_w(&mut rng), norm_w(&mut rng));
        let qw = test_weight(&mut ops, GgmlType::F32, 1, hd, &qw);
        let kw = test_weight(&mut ops, GgmlType::F32, 1, hd, &kw);
        let wo = test_weight(
            &mut ops,
            GgmlType::Q8_0,
            64,
            qd,
            &random_vec(&mut rng, 64 * qd, 1.0),
        );
        for split_from in [usize::MAX, 0] {
            dev().kernels.set_split_min_context(split_from);
            let capacity = 64;
            let mut fused_cache = CudaCache::new(&dev(), 1, n_kv, hd, capacity).unwrap();
            let mut steps_cache = CudaCache::new(&dev(), 1, n_kv, hd, capacity).unwrap();
            let mut pos = 0;
            for n in [7, 1, 1] {
                let what = format!(
                    "{n_head}/{n_kv}x{hd} {style:?} at {pos}, {n} rows, split from {split_from}"
                );
                let p = |n_head| RopeParams {
                    n_head,
                    head_dim: hd,
                    n_rot: hd,
                    start_pos: pos,
                    freq_base: 10_000.0,
                    freq_scale: 0.5,
                    style,
                    freq_factors: with_factors.then_some(&factors[..]),
                    mscale: 1.1,
                };
                let prep = || QkPrep {
                    norms: with_norms.then_some(HeadNorms {
                        q: &qw.gpu,
                        k: &kw.gpu,
                        eps: 1e-6,
                    }),
                    rope: Some((p(n_head), p(n_kv))),
                };
                let s = AttentionShape {
                    layer: 0,
                    start_pos: pos,
                    n_tokens: n,
                    n_head,
                    n_head_kv: n_kv,
                    head_dim: hd,
                    window: None,
                    scale: 1.0 / (hd as f32).sqrt(),
                };
                let (qv, kv, vv) = (
                    random_vec(&mut rng, n * qd, 2.0),
                    random_vec(&mut rng, n * kvd, 2.0),
                    random_vec(&mut rng, n * kvd, 2.0),
                );
                let v = ops.upload(n, kvd, &vv).unwrap();
                let run = |ops: &mut CudaOps, fused: bool, cache: &mut CudaCache| {
                    let mut q = ops.upload(n, qd, &qv).unwrap();
                    let mut k = ops.upload(n, kvd, &kv).unwrap();
                    let mut out = ops.buf(n, qd).unwrap();
                    let before = dev().kernels.writes();
                    if fused {
                        ops.attend(&mut q, &mut k, &v, prep(), cache, s, &mut out)
                            .unwrap();
                    } else {
                        attend_in_steps(ops, &mut q, &mut k, &v, prep(), cache, s, &mut out)
                            .unwrap();
                    }
                    let launches = dev().kernels.writes() - before;
                    // The output projection right after it (decode: from
                    // attention's own split of its output).
                    let mut proj = ops.buf(n, 64).unwrap();
                    let before = dev().kernels.writes();
                    ops.matmul(&out, &wo.gpu, None, &mut proj).unwrap();
                    let proj_launches = dev().kernels.writes() - before;
                    let got = [&q, &k, &out, &proj].map(|b| bits(&host(ops, b)));
                    (got, launches, proj_launches)
                };
                let (fused, launches, proj_launches) = run(&mut ops, true, &mut fused_cache);
                let (steps, ..) = run(&mut ops, false, &mut steps_cache);
                for (i, which) in ["Q", "K", "attention", "its projection"].iter().enumerate() {
                    assert!(fused[i] == steps[i], "{what}: {which} differs");
                }
                for p in 0..pos + n {
                    for h in 0..n_kv {
                        let a = fused_cache.read_entry(&dev(), 0, h, p).unwrap();
                        let b = steps_cache.read_entry(&dev(), 0, h, p).unwrap();
                        assert!(a == b, "{what}: cached position {p}, head {h}");
                    }
                }
                if n == 1 && split_from == usize::MAX {
                    assert_eq!(launches, 2, "{what}: qk_rope_store and attention");
                    let want = if hd % 32 == 0 { 1 } else { 2 };
                    assert_eq!(proj_launches, want, "{what}: the projection's launches");
                }
                pos += n;
            }
        }
    }
    dev()
        .kernels
        .set_split_min_context(kernels::SPLIT_MIN_CONTEXT);
    restore_matmul_choice();
}

/// A decode step's Q, K and V products with Q's and K's rotations and the
/// KV store in one `mv8q_*` launch (`Ops::project_attend`) give the bits of
/// the products' `mv8m_*` launch and `qk_rope_store` apart: Q, K, V, the
/// attention, and every cached position, over a prefill and three decode
/// steps, with attention whole and split, in each `mv8_*` format, with and
/// without biases and frequency factors, at any grid size (the worker fuses
/// only one-wave launches); NEOX pairs keep the launches apart.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn qkv_products_turn_and_store_in_one_launch_bit_for_bit() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    restore_matmul_choice();
    // (format, columns of x, heads, KV heads, head size, biases, pairs,
    // frequency factors): the 8B shape in Q8_0 and Q4_K, SmolLM2's, a
    // Qwen-like one with biases, a Q6_K one, and NEOX pairs (not fused).
    let cases = [
        (
            GgmlType::Q8_0,
            4096,
            32,
            8,
            128,
            false,
            RopeStyle::Normal,
            true,
        ),
        (
            GgmlType::Q4K,
            4096,
            32,
            8,
            128,
            false,
            RopeStyle::Normal,
            false,
        ),
        (
            GgmlType::Q4_1,
            576,
            9,
            3,
            64,
            false,
            RopeStyle::Normal,
            false,
        ),
        (
            GgmlType::Q8_0,
            896,
            14,
            2,
            64,
            true,
            RopeStyle::Normal,
            false,
        ),
        (
            GgmlType::Q6K,
            2048,
            16,
            4,
            128,
            false,
            RopeStyle::Normal,
            false,
        ),
        (GgmlType::Q4_0, 576, 9, 3, 64, false, RopeStyle::Neox, false),
    ];
    for (ty, cols, n_head, n_kv, hd, with_bias, style, with_factors) in cases {
        let (qd, kvd) = (n_head * hd, n_kv * hd);
        let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + 0.13 * i as f32).collect();
        let mut weight = |rows: usize| {
            test_weight(
                &mut ops,
                ty,
                rows,
                cols,
                &random_vec(&mut rng, rows * cols, 1.0),
            )
        };
        let (wq, wk, wv) = (weight(qd), weight(kvd), weight(kvd));
        let mut bias = |rows: usize| {
            with_bias.then(|| {
                test_weight(
                    &mut ops,
                    GgmlType::F32,
                    1,
                    rows,
                    &random_vec(&mut rng, rows, 0.5),
                )
            })
        };
        let (bq, bk, bv) = (bias(qd), bias(kvd), bias(kvd));
        for split_from in [usize::MAX, 0] {
            dev().kernels.set_split_min_context(split_from);
            let capacity = 64;
            let mut caches = [
                CudaCache::new(&dev(), 1, n_kv, hd, capacity).unwrap(),
                CudaCache::new(&dev(), 1, n_kv, hd, capacity).unwrap(),
            ];
            let mut pos = 0;
            for n in [5, 1, 1, 1] {
                let what = format!("{ty} {n_head}/{n_kv}x{hd} {style:?} at {pos}, {n} rows, split from {split_from}");
                let p = |n_head| RopeParams {
                    n_head,
                    head_dim: hd,
                    n_rot: hd,
                    start_pos: pos,
                    freq_base: 500_000.0,
                    freq_scale: 1.0,
                    style,
                    freq_factors: with_factors.then_some(&factors[..]),
                    mscale: 1.0,
                };
                let s = AttentionShape {
                    layer: 0,
                    start_pos: pos,
                    n_tokens: n,
                    n_head,
                    n_head_kv: n_kv,
                    head_dim: hd,
                    window: None,
                    scale: 1.0 / (hd as f32).sqrt(),
                };
                let xv = random_vec(&mut rng, n * cols, 2.0);
                let run = |ops: &mut CudaOps, one: bool, cache: &mut CudaCache| {
                    dev()
                        .kernels
                        .set_qkv_rope(Some(if one { usize::MAX } else { 0 }));
                    let x = ops.upload(n, cols, &xv).unwrap();
                    let (mut q, mut k, mut v) = (
                        ops.buf(n, qd).unwrap(),
                        ops.buf(n, kvd).unwrap(),
                        ops.buf(n, kvd).unwrap(),
                    );
                    let mut out = ops.buf(n, qd).unwrap();
                    let qkv = [
                        Product {
                            w: &wq.gpu,
                            bias: bq.as_ref().map(|b| &b.gpu),
                            out: &mut q,
                        },
                        Product {
                            w: &wk.gpu,
                            bias: bk.as_ref().map(|b| &b.gpu),
                            out: &mut k,
                        },
                        Product {
                            w: &wv.gpu,
                            bias: bv.as_ref().map(|b| &b.gpu),
                            out: &mut v,
                        },
                    ];
                    let prep = QkPrep {
                        norms: None,
                        rope: Some((p(n_head), p(n_kv))),
                    };
                    let before = dev().kernels.writes();
                    ops.project_attend(&x, qkv, prep, cache, s, &mut out)
                        .unwrap();
                    let launches = dev().kernels.writes() - before;
                    let got = [&q, &k, &v, &out].map(|b| bits(&host(ops, b)));
                    (got, launches)
                };
                let [one_cache, apart_cache] = &mut caches;
                let (one, one_launches) = run(&mut ops, true, one_cache);
                let (apart, apart_launches) = run(&mut ops, false, apart_cache);
                for (i, which) in ["Q", "K", "V", "attention"].iter().enumerate() {
                    assert!(one[i] == apart[i], "{what}: {which} differs");
                }
                for p in 0..pos + n {
                    for h in 0..n_kv {
                        let a = caches[0].read_entry(&dev(), 0, h, p).unwrap();
                        let b = caches[1].read_entry(&dev(), 0, h, p).unwrap();
                        assert!(a == b, "{what}: cached position {p}, head {h}");
                    }
                }
                let fused = n == 1 && style == RopeStyle::Normal;
                let saved = usize::from(fused) as u64;
                assert_eq!(one_launches + saved, apart_launches, "{what}: launches");
                pos += n;
            }
        }
    }
    dev().kernels.set_qkv_rope(None);
    dev()
        .kernels
        .set_split_min_context(kernels::SPLIT_MIN_CONTEXT);
    restore_matmul_choice();
}

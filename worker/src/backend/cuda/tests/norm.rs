//! RMSNorm, and GPT-2's LayerNorm (M0-W-1432), against the CPU reference.

use super::*;

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rms_norm_matches_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut worst = 0f64;
    for (rows, cols) in [(1, 576), (64, 576), (7, 1536), (3, 577), (2, 4096), (5, 33)] {
        let wv: Vec<f32> = (0..cols)
            .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
            .collect();
        let w = test_weight(&mut ops, GgmlType::F32, 1, cols, &wv);
        let xv = random_vec(&mut rng, rows * cols, 3.0);
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
        CpuOps
            .rms_norm(&cpu_buf(rows, cols, xv.clone()), &w.cpu, 1e-5, &mut cpu_out)
            .unwrap();
        let x = ops.upload(rows, cols, &xv).unwrap();
        let mut out = ops.buf(rows, cols).unwrap();
        ops.rms_norm(&x, &w.gpu, 1e-5, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-5, "rms_norm {rows}x{cols}: {e:e}");
        worst = worst.max(e);
        assert_deterministic("rms_norm", || {
            ops.rms_norm(&x, &w.gpu, 1e-5, &mut out).unwrap();
            host(&mut ops, &out)
        });
        // The residual add and the norm in one launch: the sum rounded as
        // add_assign rounds it, the norm as rms_norm's.
        let yv = random_vec(&mut rng, rows * cols, 3.0);
        let sum: Vec<f32> = xv.iter().zip(&yv).map(|(a, b)| a + b).collect();
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
        CpuOps
            .rms_norm(
                &cpu_buf(rows, cols, sum.clone()),
                &w.cpu,
                1e-5,
                &mut cpu_out,
            )
            .unwrap();
        let mut xs = ops.upload(rows, cols, &xv).unwrap();
        let y = ops.upload(rows, cols, &yv).unwrap();
        ops.add_rms_norm(&mut xs, &y, &w.gpu, 1e-5, &mut out)
            .unwrap();
        assert_eq!(
            host(&mut ops, &xs),
            sum,
            "add_rms_norm {rows}x{cols}: the sum"
        );
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-5, "add_rms_norm {rows}x{cols}: {e:e}");
        worst = worst.max(e);
    }
    eprintln!("rms_norm: max relative error {worst:.2e}");
}

/// A weight as wide as one head normalises each head on its own (Gemma 3's
/// Q and K norms), in prefill and in decode.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rms_norm_of_each_head_matches_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for (rows, heads, width) in [(1, 4, 256), (9, 4, 256), (1, 1, 256), (3, 8, 64)] {
        let cols = heads * width;
        let wv: Vec<f32> = (0..width)
            .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
            .collect();
        let w = test_weight(&mut ops, GgmlType::F32, 1, width, &wv);
        let xv = random_vec(&mut rng, rows * cols, 3.0);
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
        CpuOps
            .rms_norm(&cpu_buf(rows, cols, xv.clone()), &w.cpu, 1e-6, &mut cpu_out)
            .unwrap();
        let x = ops.upload(rows, cols, &xv).unwrap();
        let mut out = ops.buf(rows, cols).unwrap();
        ops.rms_norm(&x, &w.gpu, 1e-6, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(
            e <= 1e-5,
            "rms_norm of {heads} heads of {width}, {rows} rows: {e:e}"
        );
    }
    // A weight that does not divide the row is refused.
    let w = test_weight(&mut ops, GgmlType::F32, 1, 100, &[1.0; 100]);
    let x = ops.buf(1, 256).unwrap();
    let mut out = ops.buf(1, 256).unwrap();
    assert!(ops.rms_norm(&x, &w.gpu, 1e-6, &mut out).is_err());
}

/// M0-W-1432: GPT-2's LayerNorm against the CPU at GPT-2's widths (768,
/// 1600) and an odd one (577), with and without bias, on rows centred at 0
/// and rows with a large mean (where E[x^2] - mean^2 would lose the
/// variance to cancellation).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1432_cuda_layer_norm_matches_cpu_at_widths_768_1600_577() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(40);
    let mut worst = 0f64;
    for cols in [768, 1600, 577] {
        for rows in [1, 7, 64] {
            for offset in [0.0f32, 8.0] {
                let wv: Vec<f32> = (0..cols)
                    .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
                    .collect();
                let w = test_weight(&mut ops, GgmlType::F32, 1, cols, &wv);
                let b = test_weight(
                    &mut ops,
                    GgmlType::F32,
                    1,
                    cols,
                    &random_vec(&mut rng, cols, 0.5),
                );
                let xv: Vec<f32> = random_vec(&mut rng, rows * cols, 3.0)
                    .into_iter()
                    .map(|v| v + offset)
                    .collect();
                let x = ops.upload(rows, cols, &xv).unwrap();
                let mut out = ops.buf(rows, cols).unwrap();
                for with_bias in [true, false] {
                    let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
                    let cpu_bias = with_bias.then_some(&b.cpu);
                    CpuOps
                        .layer_norm(
                            &cpu_buf(rows, cols, xv.clone()),
                            &w.cpu,
                            cpu_bias,
                            1e-5,
                            &mut cpu_out,
                        )
                        .unwrap();
                    let gpu_bias = with_bias.then_some(&b.gpu);
                    ops.layer_norm(&x, &w.gpu, gpu_bias, 1e-5, &mut out)
                        .unwrap();
                    let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
                    assert!(e <= 1e-5, "layer_norm {rows}x{cols} offset {offset} bias {with_bias}: relative error {e:e}");
                    worst = worst.max(e);
                }
                assert_deterministic("layer_norm", || {
                    ops.layer_norm(&x, &w.gpu, Some(&b.gpu), 1e-5, &mut out)
                        .unwrap();
                    host(&mut ops, &out)
                });
            }
        }
    }
    eprintln!("layer_norm: max relative error {worst:.2e}");
}

/// `norm_add_rms_norm` (Gemma 3's norm of a block's output, the residual
/// add and the next norm) in one `add_rms_norm` launch, with the bits of
/// `rms_norm` then `add_rms_norm`: the residual and the normed output.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn norm_add_rms_norm_matches_two_launches_bit_for_bit() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for (rows, cols) in [(1, 640), (9, 640), (1, 1152), (3, 4096), (2, 33)] {
        let mut weight = || {
            let v: Vec<f32> = (0..cols)
                .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
                .collect();
            v
        };
        let (yw, w) = (weight(), weight());
        let yw = test_weight(&mut ops, GgmlType::F32, 1, cols, &yw);
        let w = test_weight(&mut ops, GgmlType::F32, 1, cols, &w);
        let xv = random_vec(&mut rng, rows * cols, 3.0);
        let y = ops
            .upload(rows, cols, &random_vec(&mut rng, rows * cols, 40.0))
            .unwrap();
        let run = |ops: &mut CudaOps, fused: bool| {
            let mut x = ops.upload(rows, cols, &xv).unwrap();
            let mut out = ops.buf(rows, cols).unwrap();
            let before = dev().kernels.writes();
            if fused {
                ops.norm_add_rms_norm(&mut x, &y, &yw.gpu, &w.gpu, 1e-6, &mut out)
                    .unwrap();
            } else {
                let mut normed = ops.buf(rows, cols).unwrap();
                ops.rms_norm(&y, &yw.gpu, 1e-6, &mut normed).unwrap();
                ops.add_rms_norm(&mut x, &normed, &w.gpu, 1e-6, &mut out)
                    .unwrap();
            }
            let launches = dev().kernels.writes() - before;
            ([&x, &out].map(|b| bits(&host(ops, b))), launches)
        };
        let (fused, launches) = run(&mut ops, true);
        let (steps, _) = run(&mut ops, false);
        assert_eq!(launches, 1, "{rows}x{cols}: one launch");
        assert!(fused[0] == steps[0], "{rows}x{cols}: the residual differs");
        assert!(
            fused[1] == steps[1],
            "{rows}x{cols}: the normed output differs"
        );
    }
}

//! The kernels that decode stored weights: `matmul` (`mv_*`, `mvw_*`,
//! `gemm_*`) and `embed_*`, for every weight format, against the CPU
//! reference; determinism; matmul timings.

use super::*;

// ------------------------------------------------------------------ kernels

/// Matmul shapes: (rows, cols, tokens). Real SmolLM2 shapes and odd ones.
fn matmul_shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    let mut v: Vec<(usize, usize, usize)> = vec![
        (576, 576, 1),
        (1536, 576, 1),
        (576, 1536, 1),
        (1536, 576, 7),
        (1536, 576, 64),
        (576, 1536, 13),
        (1536, 576, 32),
        (576, 1536, 33),
        (576, 1536, 100),
        (1536, 576, 129),
        (49152, 576, 1),
        (49152, 576, 64),
        (577, 768, 3),
        (600, 800, 20),
        (191, 256, 65),
        (3, 512, 9),
        // One row of x through mv8_*'s row groups of one warp (up to 1024
        // columns), two (2048) and four, with a partial last group.
        (191, 256, 1),
        (3, 512, 1),
        (201, 4096, 1),
    ];
    if quick() {
        // Still every path: mv (n <= 8), mv groups (13..=100) and gemm (129),
        // each through both mv kernels (the caller forces each), but no
        // LM-head-sized matrix.
        v.retain(|&(r, c, _)| r * c <= 1536 * 576 && !(r == 576 && c == 576));
    }
    if ty.block_len() == 1 {
        v.extend([(33, 577, 1), (65, 99, 70), (5, 1, 2)]);
    }
    // Rows of the 256-value formats hold whole super-blocks: 576 becomes 768.
    v.into_iter()
        .map(|(r, c, n)| (r, c.next_multiple_of(ty.block_len()), n))
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_matches_cpu_for_every_format_and_shape() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut worst = Vec::new();
    for ty in GgmlType::ALL {
        let mut worst_ty = 0f64;
        for (rows, cols, n) in matmul_shapes(ty) {
            let wv = random_vec(&mut rng, rows * cols, 1.0);
            let w = test_weight(&mut ops, ty, rows, cols, &wv);
            let xv = random_vec(&mut rng, n * cols, 1.0);
            let bias_v = random_vec(&mut rng, rows, 1.0);
            let bias = test_weight(&mut ops, GgmlType::F32, 1, rows, &bias_v);
            // Every shape through both mv kernels (a warp or a block per
            // row), then through mv8 (up to 32 rows of x, integer formats),
            // mv1 (one row) and gemm_tc (many), then as the backend
            // chooses (gemm_few or gemm_tck, split columns, and cuBLAS
            // from BLAS_MIN_ROWS rows of x), the same without gemm_few
            // (gemm_tck and mmq), then cuBLAS for every row count
            // (quantized and F16 formats).
            let off = usize::MAX;
            let mut kinds = vec![
                (0, false, false, false, true, off),
                (off, false, false, false, true, off),
                (off, true, true, false, true, off),
                (off, true, true, true, true, kernels::BLAS_MIN_ROWS),
                (off, true, true, true, false, kernels::BLAS_MIN_ROWS),
                (off, true, true, true, true, 0),
            ];
            if kernels::has_mv8(ty) && n == 1 {
                kinds.push((off, true, false, false, true, off));
            }
            for (with_bias, (warp_rows, newer, mv8, split, few, blas)) in [false, true]
                .into_iter()
                .flat_map(|b| kinds.clone().into_iter().map(move |k| (b, k)))
            {
                dev().set_mv_warp_min_rows(warp_rows);
                force_newer_matmuls(newer);
                dev().kernels.set_mv8(mv8);
                dev().kernels.set_gemm_split(split);
                dev().kernels.set_gemm_few(few);
                dev().kernels.set_blas_min_rows(blas);
                let b = with_bias.then_some(&bias);
                let mut cpu_out = cpu_buf(n, rows, vec![0.0; n * rows]);
                CpuOps
                    .matmul(
                        &cpu_buf(n, cols, xv.clone()),
                        &w.cpu,
                        b.map(|b| &b.cpu),
                        &mut cpu_out,
                    )
                    .unwrap();
                let x = ops.upload(n, cols, &xv).unwrap();
                let mut out = ops.buf(n, rows).unwrap();
                ops.matmul(&x, &w.gpu, b.map(|b| &b.gpu), &mut out).unwrap();
                let g = host(&mut ops, &out);
                let e = rel_err(&g, &cpu_out.data);
                let what = format!(
                    "{ty} {rows}x{cols} n={n} bias={with_bias} mvw from {warp_rows} mv1/tc {newer} mv8 {mv8} split {split} few {few} blas from {blas}"
                );
                assert!(e <= 1e-3, "{what}: relative error {e:e}");
                worst_ty = worst_ty.max(e);
            }
        }
        worst.push((ty, worst_ty));
    }
    for (ty, e) in worst {
        eprintln!("matmul {ty:>5}: max relative error {e:.2e}");
    }
    restore_matmul_choice();
}

/// A context built for a model's formats (as `CudaBackend::load` builds
/// it: the formats its matrices are stored in) multiplies in them as the CPU
/// does, and refuses another format, F32 too, with an error that names the
/// missing kernel.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn a_context_for_some_formats_runs_them_and_refuses_others() {
    let _gpu = exclusive_gpu();
    let set = KernelSet {
        formats: &[GgmlType::Q4K],
        layer_formats: &[GgmlType::Q4K],
        expert_formats: &[],
        head_dim: 64,
        group: 1,
        kv_type: KvType::F16,
    };
    let dev = CudaDevice::with_cap(0, None, Some(set)).expect("GPU 0 initialises");
    let mut ops = CudaOps::new(dev);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (rows, cols) = (300, 256);
    for (ty, compiled) in [
        (GgmlType::Q4K, true),
        (GgmlType::F32, false),
        (GgmlType::Q8_0, false),
    ] {
        let wv = random_vec(&mut rng, rows * cols, 1.0);
        let w = test_weight(&mut ops, ty, rows, cols, &wv);
        for n in [1, 3, 70] {
            let xv = random_vec(&mut rng, n * cols, 1.0);
            let x = ops.upload(n, cols, &xv).unwrap();
            let mut out = ops.buf(n, rows).unwrap();
            let r = ops.matmul(&x, &w.gpu, None, &mut out);
            if !compiled {
                let e = r
                    .expect_err("a format the context was not built for")
                    .to_string();
                let name = ty.name().to_ascii_lowercase();
                assert!(
                    e.contains("was not compiled") && e.contains(&name),
                    "{ty} n={n}: {e}"
                );
                continue;
            }
            r.unwrap_or_else(|e| panic!("{ty} n={n}: {e}"));
            let mut cpu_out = cpu_buf(n, rows, vec![0.0; n * rows]);
            CpuOps
                .matmul(&cpu_buf(n, cols, xv), &w.cpu, None, &mut cpu_out)
                .unwrap();
            let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
            assert!(e <= 1e-3, "{ty} n={n}: relative error {e:e}");
        }
    }
}

/// `mv1_*` for every single row of x and `gemm_tc_*` for every product that
/// takes the GEMM path (`true`), or neither (`false`).
pub(super) fn force_newer_matmuls(on: bool) {
    dev()
        .kernels
        .set_mv1_min_rows(if on { 0 } else { usize::MAX });
    dev()
        .kernels
        .set_tc_min_blocks(if on { 0 } else { usize::MAX });
}

/// The matmul kernel choice as the backend makes it.
pub(super) fn restore_matmul_choice() {
    dev().kernels.set_mv8(true);
    dev().kernels.set_gemm_split(true);
    dev().kernels.set_gemm_few(true);
    dev().kernels.set_blas_min_rows(kernels::BLAS_MIN_ROWS);
    dev().set_mv_warp_min_rows(kernels::MV_WARP_MIN_ROWS);
    dev().kernels.set_mv1_min_rows(kernels::MV1_MIN_ROWS);
    dev()
        .kernels
        .set_tc_min_blocks(kernels::TC_MIN_BLOCKS_PER_SM * dev().kernels.sm_count());
}

/// Prefill products on cuBLAS: a matrix larger than the f16 scratch goes
/// in chunks of rows (Llama-3-8B's FFN shapes), F16 weights are read in
/// place, a bias is added after, and an activation beyond f16's range is
/// clamped, never turned into inf or NaN.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn blas_matmul_chunks_large_matrices_and_matches_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    dev().kernels.set_blas_min_rows(0);
    let mut shapes = vec![
        (GgmlType::Q4K, 14336, 4096, 70),
        (GgmlType::Q6K, 4096, 14336, 65),
    ];
    if quick() {
        shapes.clear();
    }
    shapes.extend([
        (GgmlType::F16, 1000, 512, 129),
        (GgmlType::Q8_0, 896, 4864, 64),
    ]);
    for (ty, rows, cols, n) in shapes {
        let w = test_weight(
            &mut ops,
            ty,
            rows,
            cols,
            &random_vec(&mut rng, rows * cols, 1.0),
        );
        let bias_v = random_vec(&mut rng, rows, 1.0);
        let bias = test_weight(&mut ops, GgmlType::F32, 1, rows, &bias_v);
        let xv = random_vec(&mut rng, n * cols, 1.0);
        let mut cpu_out = cpu_buf(n, rows, vec![0.0; n * rows]);
        CpuOps
            .matmul(
                &cpu_buf(n, cols, xv.clone()),
                &w.cpu,
                Some(&bias.cpu),
                &mut cpu_out,
            )
            .unwrap();
        let x = ops.upload(n, cols, &xv).unwrap();
        let mut out = ops.buf(n, rows).unwrap();
        ops.matmul(&x, &w.gpu, Some(&bias.gpu), &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        eprintln!("cuBLAS {ty} {rows}x{cols} n={n}: relative error {e:.2e}");
        assert!(e <= 1e-3, "{ty} {rows}x{cols} n={n}: relative error {e:e}");
    }
    let (rows, cols, n) = (256, 256, 64);
    let w = test_weight(
        &mut ops,
        GgmlType::Q8_0,
        rows,
        cols,
        &random_vec(&mut rng, rows * cols, 1.0),
    );
    let mut xv = random_vec(&mut rng, n * cols, 1.0);
    xv[5] = 1e9;
    xv[cols + 7] = -3e38;
    let x = ops.upload(n, cols, &xv).unwrap();
    let mut out = ops.buf(n, rows).unwrap();
    ops.matmul(&x, &w.gpu, None, &mut out).unwrap();
    let g = host(&mut ops, &out);
    assert!(
        g.iter().all(|v| v.is_finite()),
        "an out-of-range activation made inf or NaN"
    );
    restore_matmul_choice();
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_is_deterministic_for_every_format() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for ty in GgmlType::ALL {
        let (rows, cols) = (1536, 576usize.next_multiple_of(ty.block_len()));
        let w = test_weight(
            &mut ops,
            ty,
            rows,
            cols,
            &random_vec(&mut rng, rows * cols, 1.0),
        );
        for (n, newer) in [1, 5, 20, 64, 300]
            .into_iter()
            .flat_map(|n| [(n, false), (n, true)])
        {
            force_newer_matmuls(newer);
            let x = ops
                .upload(n, cols, &random_vec(&mut rng, n * cols, 1.0))
                .unwrap();
            let mut out = ops.buf(n, rows).unwrap();
            assert_deterministic(&format!("matmul {ty} n={n} mv1/tc {newer}"), || {
                ops.matmul(&x, &w.gpu, None, &mut out).unwrap();
                host(&mut ops, &out)
            });
        }
    }
    restore_matmul_choice();
}

/// `gemm_few_*` gives a row of x the same bits whatever rows share its
/// launch (9 to 63 of them: its column ranges depend on the matrix alone),
/// the base of batch-invariant decoding of several jobs.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gemm_few_gives_a_row_the_same_bits_in_any_batch() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_1] {
        let (rows, cols) = (1000, 1536);
        let wv = random_vec(&mut rng, rows * cols, 1.0);
        let w = test_weight(&mut ops, ty, rows, cols, &wv);
        let xv = random_vec(&mut rng, 63 * cols, 1.0);
        let mut first: Option<Vec<f32>> = None;
        for n in [63, 9, 20, 37, 50] {
            let x = ops.upload(n, cols, &xv[..n * cols]).unwrap();
            let mut out = ops.buf(n, rows).unwrap();
            ops.matmul(&x, &w.gpu, None, &mut out).unwrap();
            let got = host(&mut ops, &out);
            let all = first.get_or_insert_with(|| got.clone());
            let differ = (0..n * rows).filter(|&i| got[i].to_bits() != all[i].to_bits());
            assert_eq!(differ.count(), 0, "{ty}: rows of x differ with {n} of them");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn embed_matches_cpu_for_every_format() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in GgmlType::ALL {
        let mut shapes = vec![
            (49152usize, 576usize.next_multiple_of(ty.block_len())),
            (300, 256),
        ];
        if quick() {
            shapes.remove(0);
        }
        if ty.block_len() == 1 {
            shapes.push((17, 577));
        }
        for (rows, cols) in shapes {
            let w = test_weight(
                &mut ops,
                ty,
                rows,
                cols,
                &random_vec(&mut rng, rows * cols, 1.0),
            );
            let tokens: Vec<u32> = [0, rows - 1, 1, rows / 2]
                .into_iter()
                .chain((0..60).map(|_| rng.random_range(0..rows)))
                .map(|t| t as u32)
                .collect();
            let mut cpu_out = cpu_buf(tokens.len(), cols, vec![0.0; tokens.len() * cols]);
            CpuOps.embed(&w.cpu, &tokens, &mut cpu_out).unwrap();
            let mut out = ops.buf(tokens.len(), cols).unwrap();
            ops.embed(&w.gpu, &tokens, &mut out).unwrap();
            let g = host(&mut ops, &out);
            assert!(
                bits(&g) == bits(&cpu_out.data),
                "{ty} {rows}x{cols}: embedding is not bit-exact (err {:e})",
                rel_err(&g, &cpu_out.data)
            );
            assert_deterministic(&format!("embed {ty}"), || {
                ops.embed(&w.gpu, &tokens, &mut out).unwrap();
                host(&mut ops, &out)
            });
        }
        let w = test_weight(&mut ops, ty, 64, 256, &random_vec(&mut rng, 64 * 256, 1.0));
        let mut out = ops.buf(1, 256).unwrap();
        assert!(
            ops.embed(&w.gpu, &[64], &mut out).is_err(),
            "an id past the table is refused before launch"
        );
    }
    eprintln!("embed: bit-exact with the CPU for every format");
}

/// Times the decode matmul at the LM head's shape (49152 x 576) and a layer's
/// shape with both mv kernels, and the gemm at prefill shapes.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_timings() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let time = |ops: &mut CudaOps, w: &CudaWeight, x: &CudaBuf, out: &mut CudaBuf| {
        for _ in 0..20 {
            ops.matmul(x, w, None, out).unwrap();
        }
        dev().synchronize().unwrap();
        let reps = 200;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            ops.matmul(x, w, None, out).unwrap();
        }
        dev().synchronize().unwrap();
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    };
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q6K,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::F16,
    ] {
        for (rows, cols) in [(49152usize, 576usize), (1536, 576), (576, 1536)] {
            let cols = cols.next_multiple_of(ty.block_len());
            let w = test_weight(
                &mut ops,
                ty,
                rows,
                cols,
                &random_vec(&mut rng, rows * cols, 1.0),
            )
            .gpu;
            let bytes = (w.rows * w.row_bytes) as f64;
            let mut line = format!("{ty:>5} {rows:>5}x{cols:<4}");
            for n in [1usize, 16, 64, 512] {
                let x = ops
                    .upload(n, cols, &random_vec(&mut rng, n * cols, 1.0))
                    .unwrap();
                let mut out = ops.buf(n, rows).unwrap();
                if n == 1 {
                    for (name, warp_rows, newer) in [
                        ("block/row", usize::MAX, false),
                        ("warp/row", 0, false),
                        ("mv1", usize::MAX, true),
                    ] {
                        dev().set_mv_warp_min_rows(warp_rows);
                        force_newer_matmuls(newer);
                        let us = time(&mut ops, &w, &x, &mut out);
                        line +=
                            &format!("  n=1 {name} {us:7.1} us ({:5.0} GB/s)", bytes / us / 1e3);
                    }
                } else {
                    for (name, newer) in [("f32", false), ("tc", true)] {
                        force_newer_matmuls(newer);
                        let us = time(&mut ops, &w, &x, &mut out);
                        let tflops = 2.0 * (rows * cols * n) as f64 / us / 1e6;
                        line += &format!("  n={n} {name} {us:8.1} us ({tflops:6.1} TFLOP/s)");
                    }
                }
                restore_matmul_choice();
            }
            eprintln!("{line}");
        }
    }
}

//! SwiGLU, GeGLU, scaling, residual add, and GPT-2's GELU (M0-W-1433).

use super::*;

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn swiglu_and_add_match_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut worst_s, mut worst_g, mut worst_a) = (0f64, 0f64, 0f64);
    for (rows, cols) in [(1, 1536), (64, 1536), (3, 577), (1, 1)] {
        let n = rows * cols;
        let (gv, uv) = (random_vec(&mut rng, n, 8.0), random_vec(&mut rng, n, 2.0));
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; n]);
        CpuOps
            .swiglu(
                &cpu_buf(rows, cols, gv.clone()),
                &cpu_buf(rows, cols, uv.clone()),
                &mut cpu_out,
            )
            .unwrap();
        let (g, u) = (
            ops.upload(rows, cols, &gv).unwrap(),
            ops.upload(rows, cols, &uv).unwrap(),
        );
        let mut out = ops.buf(rows, cols).unwrap();
        ops.swiglu(&g, &u, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-6, "swiglu {rows}x{cols}: {e:e}");
        worst_s = worst_s.max(e);
        assert_deterministic("swiglu", || {
            ops.swiglu(&g, &u, &mut out).unwrap();
            host(&mut ops, &out)
        });

        // GeGLU: tanhf here and Rust's tanh on the CPU may differ in the last bit.
        CpuOps
            .geglu(
                &cpu_buf(rows, cols, gv.clone()),
                &cpu_buf(rows, cols, uv.clone()),
                &mut cpu_out,
            )
            .unwrap();
        ops.geglu(&g, &u, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-5, "geglu {rows}x{cols}: {e:e}");
        worst_g = worst_g.max(e);

        let mut cpu_x = cpu_buf(rows, cols, gv.clone());
        CpuOps.scale(&mut cpu_x, 25.3).unwrap();
        let mut x = ops.upload(rows, cols, &gv).unwrap();
        ops.scale(&mut x, 25.3).unwrap();
        assert_eq!(host(&mut ops, &x), cpu_x.data, "scale {rows}x{cols}");

        let mut cpu_x = cpu_buf(rows, cols, gv.clone());
        CpuOps
            .add_assign(&mut cpu_x, &cpu_buf(rows, cols, uv.clone()))
            .unwrap();
        let mut x = ops.upload(rows, cols, &gv).unwrap();
        ops.add_assign(&mut x, &u).unwrap();
        let e = rel_err(&host(&mut ops, &x), &cpu_x.data);
        assert!(e == 0.0, "add {rows}x{cols}: {e:e}");
        worst_a = worst_a.max(e);
        assert_deterministic("add", || {
            let mut x = ops.upload(rows, cols, &gv).unwrap();
            ops.add_assign(&mut x, &u).unwrap();
            host(&mut ops, &x)
        });
    }
    // Shape errors are refused before launch.
    let a = ops.buf(2, 3).unwrap();
    let mut b = ops.buf(3, 3).unwrap();
    assert!(ops.add_assign(&mut b, &a).is_err());
    assert!(ops.swiglu(&a, &a, &mut b).is_err());
    assert!(ops.geglu(&a, &a, &mut b).is_err());
    eprintln!("swiglu: max relative error {worst_s:.2e}; geglu: {worst_g:.2e}; add: {worst_a:.2e}");
}

/// `copy_cols` takes each part of a fused projection exactly; a range past
/// the row is refused.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn copy_cols_takes_the_parts_of_fused_rows() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for (rows, cols, parts) in [
        (1, 9216, [0, 3072, 6144]),
        (7, 768 * 3, [0, 768, 1536]),
        (3, 96, [0, 40, 70]),
    ] {
        let xv = random_vec(&mut rng, rows * cols, 2.0);
        let x = ops.upload(rows, cols, &xv).unwrap();
        for (i, &start) in parts.iter().enumerate() {
            let end = parts.get(i + 1).copied().unwrap_or(cols);
            let mut cpu_out = cpu_buf(rows, end - start, vec![0.0; rows * (end - start)]);
            CpuOps
                .copy_cols(&cpu_buf(rows, cols, xv.clone()), start, &mut cpu_out)
                .unwrap();
            let mut out = ops.buf(rows, end - start).unwrap();
            ops.copy_cols(&x, start, &mut out).unwrap();
            assert_eq!(
                host(&mut ops, &out),
                cpu_out.data,
                "{rows}x{cols} from {start}"
            );
        }
        let mut past = ops.buf(rows, 8).unwrap();
        assert!(ops.copy_cols(&x, cols - 4, &mut past).is_err());
    }
}

/// GELU (tanh form) in f64, the reference for M0-W-1433.
fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// M0-W-1433: GPT-2's GELU over a dense grid of [-10, 10] (2^20 points)
/// against f64, max absolute error <= 1e-3; and finite, saturated results
/// far outside it, where x^3 overflows f32.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1433_cuda_gelu_matches_f64_over_minus_10_to_10() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let n = 1usize << 20;
    let xv: Vec<f32> = (0..n)
        .map(|i| (-10.0 + 20.0 * i as f64 / (n - 1) as f64) as f32)
        .collect();
    let x = ops.upload(1, n, &xv).unwrap();
    let mut out = ops.buf(1, n).unwrap();
    ops.gelu(&x, &mut out).unwrap();
    let g = host(&mut ops, &out);
    let mut cpu_out = cpu_buf(1, n, vec![0.0; n]);
    CpuOps
        .gelu(&cpu_buf(1, n, xv.clone()), &mut cpu_out)
        .unwrap();
    let (mut worst, mut worst_at, mut worst_cpu) = (0f64, 0f32, 0f64);
    for ((&xi, &gi), &ci) in xv.iter().zip(&g).zip(&cpu_out.data) {
        let e = (gi as f64 - gelu_f64(xi as f64)).abs();
        if e > worst {
            (worst, worst_at) = (e, xi);
        }
        worst_cpu = worst_cpu.max((gi as f64 - ci as f64).abs());
    }
    assert!(worst <= 1e-3, "gelu: error {worst:e} at x = {worst_at}");
    // Far outside the grid: x for large positive x, (-)0 for large negative x.
    let big = [
        1e4f32,
        3e12,
        1e20,
        f32::MAX,
        -1e4,
        -3e12,
        -1e20,
        -f32::MAX,
        0.0,
        -0.0,
    ];
    let xb = ops.upload(1, big.len(), &big).unwrap();
    let mut ob = ops.buf(1, big.len()).unwrap();
    ops.gelu(&xb, &mut ob).unwrap();
    for (&xi, &gi) in big.iter().zip(&host(&mut ops, &ob)) {
        let want = if xi > 0.0 { xi } else { 0.0 };
        assert!(
            gi.is_finite() && gi == want,
            "gelu({xi}) = {gi}, expected {want}"
        );
    }
    assert_deterministic("gelu", || {
        ops.gelu(&x, &mut out).unwrap();
        host(&mut ops, &out)
    });
    eprintln!("gelu over [-10, 10], {n} points: max error vs f64 {worst:.2e} (at {worst_at}); max difference from the CPU {worst_cpu:.2e}");
}

//! The integer mat-vec's split of x (`quantize_x8`, `mv8_*`): products of
//! one x fused into one launch bit for bit, x split again whenever it may
//! have changed, and the norms and activations that split their output for
//! the next mat-vec (one block or a cluster) against the CPU reference.

use super::matmul::{force_newer_matmuls, restore_matmul_choice};
use super::*;
use crate::model::ops::Product;

/// `x W^T` for one row `xv` on the CPU: the reference for the mv8 tests.
fn cpu_row_product(w: &TestWeight, rows: usize, xv: &[f32]) -> Vec<f32> {
    let mut out = cpu_buf(1, rows, vec![0.0; rows]);
    CpuOps
        .matmul(&cpu_buf(1, xv.len(), xv.to_vec()), &w.cpu, None, &mut out)
        .unwrap();
    out.data
}

/// `matmuls` runs the products of one row of x that share a format with
/// `mv8_*` as one `mv8m_*` launch, and each output has exactly the bits its
/// own `matmul` gives (the blocks of each matrix are laid out as its own
/// launch lays them out); a product in another format runs alone, and rows
/// of x past one take the products one by one.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmuls_fuse_products_of_one_format_bit_for_bit() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    restore_matmul_choice();
    // Q, K, V shapes with a partial last block in K, a V in another
    // format; gate and up; narrow rows (one warp a group of rows).
    let cases: [(usize, &[(GgmlType, usize)]); 3] = [
        (
            1024,
            &[
                (GgmlType::Q4K, 512),
                (GgmlType::Q4K, 131),
                (GgmlType::Q6K, 128),
            ],
        ),
        (2048, &[(GgmlType::Q6K, 700), (GgmlType::Q6K, 700)]),
        (
            896,
            &[
                (GgmlType::Q8_0, 896),
                (GgmlType::Q8_0, 128),
                (GgmlType::Q5_0, 128),
            ],
        ),
    ];
    for (cols, shapes) in cases {
        let ws: Vec<(TestWeight, TestWeight)> = shapes
            .iter()
            .map(|&(ty, rows)| {
                let w = test_weight(
                    &mut ops,
                    ty,
                    rows,
                    cols,
                    &random_vec(&mut rng, rows * cols, 1.0),
                );
                let b = random_vec(&mut rng, rows, 1.0);
                (w, test_weight(&mut ops, GgmlType::F32, 1, rows, &b))
            })
            .collect();
        for n in [1, 3] {
            let xv = random_vec(&mut rng, n * cols, 1.0);
            let x = ops.upload(n, cols, &xv).unwrap();
            let mut alone = Vec::new();
            for (w, b) in &ws {
                let mut out = ops.buf(n, w.gpu.rows).unwrap();
                ops.matmul(&x, &w.gpu, Some(&b.gpu), &mut out).unwrap();
                alone.push(host(&mut ops, &out));
            }
            let mut outs: Vec<CudaBuf> = ws
                .iter()
                .map(|(w, _)| ops.buf(n, w.gpu.rows).unwrap())
                .collect();
            let before = dev().kernels.writes();
            {
                let mut products: Vec<Product<'_, CudaWeight, CudaBuf>> = ws
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|((w, b), out)| Product {
                        w: &w.gpu,
                        bias: Some(&b.gpu),
                        out,
                    })
                    .collect();
                ops.matmuls(&x, &mut products).unwrap();
            }
            let launches = dev().kernels.writes() - before;
            let what = format!("{cols} columns, {shapes:?}, n={n}");
            if n == 1 {
                // x was split by the products above: one mv8m_* launch for
                // the products of the first format, one mv8_* for a third
                // product of another.
                let formats = 1 + shapes.iter().any(|s| s.0 != shapes[0].0) as u64;
                assert_eq!(launches, formats, "{what}: launches");
            }
            for (i, out) in outs.iter().enumerate() {
                let got = host(&mut ops, out);
                assert!(
                    got.iter()
                        .zip(&alone[i])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: product {i} differs from its own matmul"
                );
                let cpu = {
                    let mut o = cpu_buf(n, ws[i].0.gpu.rows, vec![0.0; n * ws[i].0.gpu.rows]);
                    CpuOps
                        .matmul(
                            &cpu_buf(n, cols, xv.clone()),
                            &ws[i].0.cpu,
                            Some(&ws[i].1.cpu),
                            &mut o,
                        )
                        .unwrap();
                    o.data
                };
                let e = rel_err(&got, &cpu);
                assert!(e <= 1e-3, "{what}: product {i} relative error {e:e}");
            }
        }
    }
}

/// `mv8_*` splits x once for products that read the same x (Q, K and V),
/// and again whenever x may have changed: rewritten by a kernel, by a copy
/// into a new buffer at a freed buffer's address, or by a product into x.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn mv8_splits_x_again_whenever_it_may_have_changed() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (rows, cols, ty) = (2304, 512, GgmlType::Q4K);
    let ws: Vec<TestWeight> = (0..2)
        .map(|_| {
            test_weight(
                &mut ops,
                ty,
                rows,
                cols,
                &random_vec(&mut rng, rows * cols, 1.0),
            )
        })
        .collect();
    let check = |ops: &mut CudaOps, x: &CudaBuf, xv: &[f32], w: &TestWeight, what: &str| {
        let mut out = ops.buf(1, rows).unwrap();
        ops.matmul(x, &w.gpu, None, &mut out).unwrap();
        let e = rel_err(&host(ops, &out), &cpu_row_product(w, rows, xv));
        assert!(e <= 1e-3, "{what}: relative error {e:e}");
    };
    force_newer_matmuls(false);
    dev().kernels.set_mv1_min_rows(0);
    // The same x through two weights: split once, right for both.
    let xv = random_vec(&mut rng, cols, 1.0);
    let x = ops.upload(1, cols, &xv).unwrap();
    let before = dev().kernels.writes();
    check(&mut ops, &x, &xv, &ws[0], "first product");
    check(&mut ops, &x, &xv, &ws[1], "second product, same x");
    // quantize_x8 + 2 x mv8_q4_k: the second product did not split x again.
    assert_eq!(dev().kernels.writes() - before, 3, "x was split twice");
    drop(x);
    // A new x, copied to wherever the pool puts it (often the freed
    // address), then rewritten in place by a kernel.
    for round in 0..3 {
        let xv = random_vec(&mut rng, cols, 1.0 + round as f32);
        let x = ops.upload(1, cols, &xv).unwrap();
        check(&mut ops, &x, &xv, &ws[round % 2], &format!("new x {round}"));
        check(
            &mut ops,
            &x,
            &xv,
            &ws[(round + 1) % 2],
            &format!("new x {round}, other weight"),
        );
        let mut sum = x;
        let add = ops.upload(1, cols, &xv).unwrap();
        ops.add_assign(&mut sum, &add).unwrap();
        let doubled: Vec<f32> = xv.iter().map(|v| v + v).collect();
        check(
            &mut ops,
            &sum,
            &doubled,
            &ws[0],
            &format!("x {round} doubled by a kernel"),
        );
    }
    restore_matmul_choice();
}

/// A decode step's RMSNorm and SwiGLU split their one output row for
/// `mv8_*` as they write it: the next product launches no `quantize_x8`,
/// and agrees with the CPU (a wrong split would not).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn norm_and_swiglu_split_their_row_for_mv8() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (rows, cols, ty) = (2304, 512, GgmlType::Q4K);
    ops.reserve_x8(cols).unwrap();
    let w = test_weight(
        &mut ops,
        ty,
        rows,
        cols,
        &random_vec(&mut rng, rows * cols, 1.0),
    );
    force_newer_matmuls(false);
    dev().kernels.set_mv1_min_rows(0);
    let gpu_product = |ops: &mut CudaOps, x: &CudaBuf, what: &str| {
        let before = dev().kernels.writes();
        let mut out = ops.buf(1, rows).unwrap();
        ops.matmul(x, &w.gpu, None, &mut out).unwrap();
        assert_eq!(
            dev().kernels.writes() - before,
            1,
            "{what}: x was split again"
        );
        host(ops, &out)
    };

    let nv: Vec<f32> = (0..cols)
        .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
        .collect();
    let norm = test_weight(&mut ops, GgmlType::F32, 1, cols, &nv);
    let xv = random_vec(&mut rng, cols, 3.0);
    let mut cpu_h = cpu_buf(1, cols, vec![0.0; cols]);
    CpuOps
        .rms_norm(&cpu_buf(1, cols, xv.clone()), &norm.cpu, 1e-5, &mut cpu_h)
        .unwrap();
    let x = ops.upload(1, cols, &xv).unwrap();
    let mut h = ops.buf(1, cols).unwrap();
    ops.rms_norm(&x, &norm.gpu, 1e-5, &mut h).unwrap();
    let e = rel_err(
        &gpu_product(&mut ops, &h, "rms_norm"),
        &cpu_row_product(&w, rows, &cpu_h.data),
    );
    assert!(e <= 1e-3, "product of rms_norm's row: relative error {e:e}");

    let (gv, uv) = (
        random_vec(&mut rng, cols, 2.0),
        random_vec(&mut rng, cols, 2.0),
    );
    let mut cpu_act = cpu_buf(1, cols, vec![0.0; cols]);
    CpuOps
        .swiglu(
            &cpu_buf(1, cols, gv.clone()),
            &cpu_buf(1, cols, uv.clone()),
            &mut cpu_act,
        )
        .unwrap();
    let (g, u) = (
        ops.upload(1, cols, &gv).unwrap(),
        ops.upload(1, cols, &uv).unwrap(),
    );
    let mut act = ops.buf(1, cols).unwrap();
    ops.swiglu(&g, &u, &mut act).unwrap();
    let e = rel_err(
        &gpu_product(&mut ops, &act, "swiglu"),
        &cpu_row_product(&w, rows, &cpu_act.data),
    );
    assert!(e <= 1e-3, "product of swiglu's row: relative error {e:e}");
    restore_matmul_choice();
}

/// The decode norm over a cluster of blocks (`add_rms_norm_cluster`, sm_90
/// on, from `NORM_CLUSTER_MIN_COLS` values) at a 3B's, the 8B's and a 70B's
/// widths, the one-block kernel it stands in for, and the narrow rows that
/// keep it: the residual sum exact, the
/// row within rounding of the CPU's, its split (read by the next product,
/// which launches no `quantize_x8`) agreeing with the CPU, the same bits on
/// every run.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn add_rms_norm_over_a_cluster_splits_its_row_for_mv8() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let clusters = dev().kernels.clusters();
    force_newer_matmuls(false);
    dev().kernels.set_mv1_min_rows(0);
    let rows = 96;
    for cols in [576, 896, 3072, 4096, 8192] {
        ops.reserve_x8(cols).unwrap();
        let w = test_weight(
            &mut ops,
            GgmlType::Q8_0,
            rows,
            cols,
            &random_vec(&mut rng, rows * cols, 1.0),
        );
        let nv: Vec<f32> = (0..cols)
            .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
            .collect();
        let norm = test_weight(&mut ops, GgmlType::F32, 1, cols, &nv);
        let xv = random_vec(&mut rng, cols, 3.0);
        let yv = random_vec(&mut rng, cols, 3.0);
        let sum: Vec<f32> = xv.iter().zip(&yv).map(|(a, b)| a + b).collect();
        let mut cpu_h = cpu_buf(1, cols, vec![0.0; cols]);
        CpuOps
            .rms_norm(&cpu_buf(1, cols, sum.clone()), &norm.cpu, 1e-5, &mut cpu_h)
            .unwrap();
        let cpu_product = cpu_row_product(&w, rows, &cpu_h.data);
        let y = ops.upload(1, cols, &yv).unwrap();
        let mut h = ops.buf(1, cols).unwrap();
        let mut out = ops.buf(1, rows).unwrap();
        let mut run = |ops: &mut CudaOps, cluster: bool| {
            dev().kernels.set_clusters(cluster && clusters);
            let mut x = ops.upload(1, cols, &xv).unwrap();
            ops.add_rms_norm(&mut x, &y, &norm.gpu, 1e-5, &mut h)
                .unwrap();
            let before = dev().kernels.writes();
            ops.matmul(&h, &w.gpu, None, &mut out).unwrap();
            assert_eq!(
                dev().kernels.writes() - before,
                1,
                "{cols}: h was split again"
            );
            (host(ops, &x), host(ops, &h), host(ops, &out))
        };
        for cluster in [true, false] {
            let (x, h, product) = run(&mut ops, cluster);
            assert_eq!(x, sum, "{cols} (cluster {cluster}): the residual sum");
            let e = rel_err(&h, &cpu_h.data);
            assert!(e <= 1e-5, "{cols} (cluster {cluster}): the row, {e:e}");
            let e = rel_err(&product, &cpu_product);
            assert!(e <= 1e-3, "{cols} (cluster {cluster}): the product, {e:e}");
        }
        assert_deterministic("add_rms_norm_cluster", || {
            let (_, h, product) = run(&mut ops, true);
            [h, product].concat()
        });
    }
    dev().kernels.set_clusters(clusters);
    restore_matmul_choice();
}

//! The CPU operations' own checks: grouped RMSNorm, the sliding window,
//! LayerNorm (M0-W-1432) and GELU (M0-W-1433) against worked-out values.

use super::arith::gelu;
use super::*;
use crate::model::ops::{AttentionShape, Ops};

fn buf(rows: usize, cols: usize, data: Vec<f32>) -> CpuBuf {
    CpuBuf { rows, cols, data }
}

fn vector(values: &[f32]) -> CpuWeight {
    CpuWeight::Dense {
        values: values.to_vec(),
    }
}

/// A weight as wide as a head normalises each head of the row on its
/// own: the same as normalising the heads as rows of their own.
#[test]
fn a_narrow_rms_norm_weight_normalises_each_group() {
    let x: Vec<f32> = (0..24)
        .map(|i| (i as f32 * 0.7).sin() * (1 + i / 8) as f32)
        .collect();
    let w = vector(&[1.0, 0.5, 2.0, -1.0, 0.25, 3.0, 1.5, 0.75]);
    let mut whole = buf(1, 24, vec![0.0; 24]);
    CpuOps
        .rms_norm(&buf(1, 24, x.clone()), &w, 1e-6, &mut whole)
        .unwrap();
    let mut heads = buf(3, 8, vec![0.0; 24]);
    CpuOps
        .rms_norm(&buf(3, 8, x), &w, 1e-6, &mut heads)
        .unwrap();
    assert_eq!(whole.data, heads.data);
    let mut odd = buf(1, 20, vec![0.0; 20]);
    let x20 = buf(1, 20, vec![1.0; 20]);
    assert!(CpuOps.rms_norm(&x20, &w, 1e-6, &mut odd).is_err());
}

/// With a sliding window, a query sees only the window's positions: the
/// same output as attention over just those keys, and different from
/// attention over all of them.
#[test]
fn a_sliding_window_hides_older_positions() {
    let (hd, n) = (4, 6);
    let rows = |seed: f32| -> Vec<f32> {
        (0..n * hd)
            .map(|i| ((i as f32 + seed) * 0.37).sin())
            .collect()
    };
    let (q, k, v) = (rows(0.0), rows(1.0), rows(2.0));
    let shape = AttentionShape {
        layer: 0,
        start_pos: 0,
        n_tokens: n,
        n_head: 1,
        n_head_kv: 1,
        head_dim: hd,
        window: Some(3),
        scale: 0.5,
    };
    let run = |shape: AttentionShape, q: &[f32], k: &[f32], v: &[f32]| {
        let rows = shape.n_tokens;
        let mut cache = CpuCache::new(1, n, hd);
        let mut out = buf(rows, hd, vec![0.0; rows * hd]);
        CpuOps
            .attention(
                &buf(rows, hd, q.to_vec()),
                &buf(rows, hd, k.to_vec()),
                &buf(rows, hd, v.to_vec()),
                &mut cache,
                shape,
                &mut out,
            )
            .unwrap();
        out.data
    };
    let windowed = run(shape, &q, &k, &v);
    let full = run(
        AttentionShape {
            window: None,
            ..shape
        },
        &q,
        &k,
        &v,
    );
    // The last row (position 5) sees positions 3, 4, 5: attention of a
    // three-token sequence made of just those keys, at its last row.
    let tail = |x: &[f32]| x[3 * hd..].to_vec();
    let three = AttentionShape {
        n_tokens: 3,
        window: None,
        ..shape
    };
    let alone = run(three, &tail(&q), &tail(&k), &tail(&v));
    assert_eq!(&windowed[5 * hd..], &alone[2 * hd..]);
    assert_ne!(&windowed[5 * hd..], &full[5 * hd..]);
    // Rows within the window of the start see everything, as without one.
    assert_eq!(&windowed[..3 * hd], &full[..3 * hd]);
}

/// M0-W-1432: the CPU LayerNorm against the formula worked out in f64,
/// on a plain row, a row far from zero, and a constant row (zero
/// variance: the output is the bias).
#[test]
fn m0_w_1432_cpu_layer_norm_matches_a_hand_computed_f64_value() {
    let rows: [[f32; 4]; 3] = [
        [1.0, 2.0, 3.0, 4.0],
        [1000.5, 1001.0, 999.25, 1003.0],
        [7.0; 4],
    ];
    let (w, b, eps) = ([1.0f32, 0.5, 2.0, -1.0], [0.0f32, 1.0, -1.0, 0.25], 1e-5f32);
    let x = buf(3, 4, rows.concat());
    for with_bias in [true, false] {
        let mut out = buf(3, 4, vec![0.0; 12]);
        let bias = vector(&b);
        CpuOps
            .layer_norm(&x, &vector(&w), with_bias.then_some(&bias), eps, &mut out)
            .unwrap();
        for (r, row) in rows.iter().enumerate() {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 4.0;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 4.0;
            for c in 0..4 {
                let bias = if with_bias { b[c] as f64 } else { 0.0 };
                let want = (row[c] as f64 - mean) / (var + eps as f64).sqrt() * w[c] as f64 + bias;
                let got = out.data[r * 4 + c] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "row {r} col {c}: {got} vs {want}"
                );
            }
        }
    }
    // Row 0 by hand: mean 2.5, variance 1.25, so (x - 2.5) / sqrt(1.25 + 1e-5).
    let mut out = buf(1, 4, vec![0.0; 4]);
    let x0 = buf(1, 4, rows[0].to_vec());
    CpuOps
        .layer_norm(&x0, &vector(&[1.0; 4]), None, eps, &mut out)
        .unwrap();
    let s = 1.0 / (1.25f64 + 1e-5).sqrt();
    for (got, want) in out.data.iter().zip([-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s]) {
        assert!((*got as f64 - want).abs() <= 1e-6, "{got} vs {want}");
    }
    // A bias of the wrong length is a shape error.
    let mut out = buf(3, 4, vec![0.0; 12]);
    assert!(CpuOps
        .layer_norm(&x, &vector(&w), Some(&vector(&[0.0; 3])), eps, &mut out)
        .is_err());
}

/// M0-W-1433: the CPU GELU over a dense grid of [-10, 10] against f64
/// (max absolute error <= 1e-3), and finite, saturated values far outside.
#[test]
fn m0_w_1433_cpu_gelu_matches_f64_over_minus_10_to_10() {
    let reference = |x: f64| {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
    };
    let n = 1usize << 20;
    let mut worst = 0f64;
    for i in 0..n {
        let x = (-10.0 + 20.0 * i as f64 / (n - 1) as f64) as f32;
        worst = worst.max((gelu(x) as f64 - reference(x as f64)).abs());
    }
    assert!(worst <= 1e-3, "max error {worst:e}");
    // Float rounding only: far below the requirement's bound.
    assert!(worst <= 1e-5, "max error {worst:e}");
    assert_eq!(gelu(0.0), 0.0);
    assert!(
        (gelu(1.0) as f64 - 0.841_191_990_608_277).abs() < 1e-6,
        "{}",
        gelu(1.0)
    );
    for x in [1e4f32, 3e12, 1e20, f32::MAX] {
        assert_eq!(gelu(x), x, "gelu({x})");
        assert_eq!(gelu(-x), 0.0, "gelu({})", -x);
    }
    let x = buf(2, 2, vec![-1.0, 0.0, 1.0, 2.0]);
    let mut out = buf(2, 2, vec![0.0; 4]);
    CpuOps.gelu(&x, &mut out).unwrap();
    assert_eq!(
        out.data,
        x.data.iter().map(|&v| gelu(v)).collect::<Vec<_>>()
    );
}

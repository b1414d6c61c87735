//! Correctness tests for the quant module. Expected values are computed here
//! from the format definitions (ggml-common.h / ggml-quants.c), not by calling
//! the code under test.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::blocks::{k_scale_min, pack_k_scales, Block, BlockQ4K, BlockQ6K};
use super::*;

const E2M1: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

fn h(v: f32) -> [u8; 2] {
    let x = f16::from_f32(v);
    assert_eq!(x.to_f32(), v, "test constants must be exact in f16");
    x.to_le_bytes()
}

fn deq(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize(ty, bytes, &mut out).unwrap();
    out
}

/// A tiny deterministic byte sequence for hand-built blocks.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1103515245).wrapping_add(12345);
            (s >> 16) as u8
        })
        .collect()
}

fn assert_vals(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let w = w as f32;
        assert!(
            g == w || (g - w).abs() <= 1e-6 * w.abs(),
            "value {i}: got {g}, want {w}"
        );
    }
}

// ------------------------------------------------------------ hand-built blocks

#[test]
fn plain_types_decode() {
    let vals = [0.0f32, -1.5, 3.25, 65504.0, -0.0, 1e-3, 7.0];
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(deq(GgmlType::F32, &f32_bytes, 7), vals);

    let f16_bits: [u16; 4] = [0x3C00, 0xC000, 0x7BFF, 0x0001]; // 1, -2, 65504, 2^-24
    let bytes: Vec<u8> = f16_bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    assert_eq!(
        deq(GgmlType::F16, &bytes, 4),
        [1.0, -2.0, 65504.0, 2f32.powi(-24)]
    );

    let bf16_bits: [u16; 3] = [0x3F80, 0xC040, 0x4049]; // 1, -3, 3.140625
    let bytes: Vec<u8> = bf16_bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    assert_eq!(deq(GgmlType::BF16, &bytes, 3), [1.0, -3.0, 3.140625]);
}

#[test]
fn q4_0_hand_block() {
    let qs = pattern(16, 1);
    let mut b = h(0.5).to_vec();
    b.extend(&qs);
    let mut want = vec![0.0; 32];
    for i in 0..16 {
        want[i] = 0.5 * ((qs[i] & 15) as f64 - 8.0);
        want[i + 16] = 0.5 * ((qs[i] >> 4) as f64 - 8.0);
    }
    assert_vals(&deq(GgmlType::Q4_0, &b, 32), &want);
}

#[test]
fn q4_1_hand_block() {
    let qs = pattern(16, 2);
    let mut b = h(0.25).to_vec();
    b.extend(h(-1.5));
    b.extend(&qs);
    let mut want = vec![0.0; 32];
    for i in 0..16 {
        want[i] = 0.25 * (qs[i] & 15) as f64 - 1.5;
        want[i + 16] = 0.25 * (qs[i] >> 4) as f64 - 1.5;
    }
    assert_vals(&deq(GgmlType::Q4_1, &b, 32), &want);
}

/// Expected Q5 codes: nibble plus bit j (value j) or bit j+16 (value j+16)
/// of the little-endian u32 `qh` as 16.
fn q5_expected_codes(qh: u32, qs: &[u8]) -> Vec<f64> {
    let mut q = vec![0.0; 32];
    for j in 0..16 {
        q[j] = ((qs[j] & 15) as u32 + 16 * ((qh >> j) & 1)) as f64;
        q[j + 16] = ((qs[j] >> 4) as u32 + 16 * ((qh >> (j + 16)) & 1)) as f64;
    }
    q
}

#[test]
fn q5_0_hand_block() {
    let qh: u32 = 0xA5C3_0F81;
    let qs = pattern(16, 3);
    let mut b = h(-0.75).to_vec();
    b.extend(qh.to_le_bytes());
    b.extend(&qs);
    let want: Vec<f64> = q5_expected_codes(qh, &qs)
        .iter()
        .map(|q| -0.75 * (q - 16.0))
        .collect();
    assert_vals(&deq(GgmlType::Q5_0, &b, 32), &want);
}

#[test]
fn q5_1_hand_block() {
    let qh: u32 = 0x1234_FEDC;
    let qs = pattern(16, 4);
    let mut b = h(0.125).to_vec();
    b.extend(h(2.0));
    b.extend(qh.to_le_bytes());
    b.extend(&qs);
    let want: Vec<f64> = q5_expected_codes(qh, &qs)
        .iter()
        .map(|q| 0.125 * q + 2.0)
        .collect();
    assert_vals(&deq(GgmlType::Q5_1, &b, 32), &want);
}

#[test]
fn q8_0_hand_block() {
    let qs: Vec<u8> = (0..32).map(|i| (i * 8 + 3) as u8).collect(); // spans -128..127
    let mut b = h(0.0625).to_vec();
    b.extend(&qs);
    let want: Vec<f64> = qs.iter().map(|&q| 0.0625 * (q as i8) as f64).collect();
    assert_vals(&deq(GgmlType::Q8_0, &b, 32), &want);
}

#[test]
fn mxfp4_hand_blocks_all_codes_and_extreme_exponents() {
    // Low nibbles run through all 16 codes, high nibbles through them backwards.
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    for e in [0u8, 1, 2, 100, 127, 128, 200, 253, 254] {
        let mut b = vec![e];
        b.extend(&qs);
        let scale = 2f64.powi(e as i32 - 127);
        let mut want = vec![0.0; 32];
        for j in 0..16 {
            want[j] = E2M1[qs[j] as usize & 15] * scale;
            want[j + 16] = E2M1[qs[j] as usize >> 4] * scale;
        }
        let got = deq(GgmlType::Mxfp4, &b, 32);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            // e = 254 with |code| 6 is 1.5 * 2^129: infinite in f32, as in ggml.
            assert_eq!(g, w as f32, "e={e} value {i}");
        }
    }
}

/// 6-bit scales and mins that use bits 4 and 5, packed into 12 bytes by the
/// definition of ggml's get_scale_min_k4.
const K_SC: [u8; 8] = [1, 15, 16, 31, 32, 47, 63, 40];
const K_M: [u8; 8] = [0, 17, 63, 5, 33, 48, 9, 62];

fn k_pack_by_definition(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] |= sc[j];
            s[j + 4] |= m[j];
        } else {
            s[j + 4] |= (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
    s
}

#[test]
fn k_scale_packing() {
    let s = k_pack_by_definition(&K_SC, &K_M);
    assert_eq!(pack_k_scales(&K_SC, &K_M), s);
    for j in 0..8 {
        assert_eq!(k_scale_min(j, &s), (K_SC[j], K_M[j]), "sub-block {j}");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..1000 {
        let sc: [u8; 8] = std::array::from_fn(|_| rng.random_range(0..64));
        let m: [u8; 8] = std::array::from_fn(|_| rng.random_range(0..64));
        let s = pack_k_scales(&sc, &m);
        assert_eq!(s, k_pack_by_definition(&sc, &m));
        for j in 0..8 {
            assert_eq!(k_scale_min(j, &s), (sc[j], m[j]));
        }
    }
}

#[test]
fn q4_k_hand_block() {
    let (d, dmin) = (0.03125f32, 0.0078125f32);
    let qs = pattern(128, 5);
    let mut b = h(d).to_vec();
    b.extend(h(dmin));
    b.extend(k_pack_by_definition(&K_SC, &K_M));
    b.extend(&qs);
    let mut want = vec![0.0; 256];
    for s in 0..8 {
        // Sub-block s lives in bytes 32*(s/2).. of qs, low nibbles for even s.
        for l in 0..32 {
            let byte = qs[32 * (s / 2) + l];
            let q = if s % 2 == 0 { byte & 15 } else { byte >> 4 };
            want[32 * s + l] = d as f64 * K_SC[s] as f64 * q as f64 - dmin as f64 * K_M[s] as f64;
        }
    }
    assert_vals(&deq(GgmlType::Q4K, &b, 256), &want);
    let blk = BlockQ4K::read(&b);
    assert_eq!(blk.scales, k_pack_by_definition(&K_SC, &K_M));
    let mut back = vec![0u8; 144];
    blk.write(&mut back);
    assert_eq!(back, b);
}

#[test]
fn q5_k_hand_block() {
    let (d, dmin) = (0.015625f32, 0.25f32);
    let qh = pattern(32, 6);
    let qs = pattern(128, 7);
    let mut b = h(d).to_vec();
    b.extend(h(dmin));
    b.extend(k_pack_by_definition(&K_SC, &K_M));
    b.extend(&qh);
    b.extend(&qs);
    let mut want = vec![0.0; 256];
    for s in 0..8 {
        for l in 0..32 {
            let byte = qs[32 * (s / 2) + l];
            let nib = if s % 2 == 0 { byte & 15 } else { byte >> 4 };
            let q = nib as u32 + 16 * ((qh[l] as u32 >> s) & 1);
            want[32 * s + l] = d as f64 * K_SC[s] as f64 * q as f64 - dmin as f64 * K_M[s] as f64;
        }
    }
    assert_vals(&deq(GgmlType::Q5K, &b, 256), &want);
}

#[test]
fn q6_k_hand_block() {
    let d = 0.0009765625f32; // 2^-10
    let codes: Vec<u8> = pattern(256, 8).iter().map(|v| v & 63).collect();
    let scales: [i8; 16] = [
        1, -1, 127, -128, 15, 16, 31, 32, -33, 64, -64, 100, 0, 7, -7, 99,
    ];
    // Pack by the layout: per 128 values, ql[l] = q[l] | q[l+64] << 4,
    // ql[l+32] = q[l+32] | q[l+96] << 4, qh[l] = top bits of q[l], q[l+32],
    // q[l+64], q[l+96] at bits 0, 2, 4, 6.
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let q = &codes[128 * half..];
        for l in 0..32 {
            ql[64 * half + l] = (q[l] & 15) | ((q[l + 64] & 15) << 4);
            ql[64 * half + l + 32] = (q[l + 32] & 15) | ((q[l + 96] & 15) << 4);
            qh[32 * half + l] = (q[l] >> 4)
                | ((q[l + 32] >> 4) << 2)
                | ((q[l + 64] >> 4) << 4)
                | ((q[l + 96] >> 4) << 6);
        }
    }
    let mut b = ql.to_vec();
    b.extend(qh);
    b.extend(scales.map(|s| s as u8));
    b.extend(h(d));
    assert_eq!(b.len(), 210);
    let want: Vec<f64> = (0..256)
        .map(|i| d as f64 * scales[i / 16] as f64 * (codes[i] as f64 - 32.0))
        .collect();
    assert_vals(&deq(GgmlType::Q6K, &b, 256), &want);
    assert_eq!(BlockQ6K::read(&b).codes().to_vec(), codes);
}

#[test]
fn multi_block_rows_decode_in_order() {
    // Two Q4_1 blocks with different scales: value 32 comes from block 2.
    let mut b = Vec::new();
    for (d, m) in [(1.0f32, 0.0f32), (2.0, -100.0)] {
        b.extend(h(d));
        b.extend(h(m));
        b.extend([0x21u8; 16]); // low nibble 1, high nibble 2
    }
    let got = deq(GgmlType::Q4_1, &b, 64);
    assert_eq!(&got[..2], &[1.0, 1.0]);
    assert_eq!(got[16], 2.0);
    assert_eq!(got[32], -98.0);
    assert_eq!(got[63], -96.0);
}

// ------------------------------------------------------------ round trips

fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Vary the magnitude and offset between 32-value groups, as weights do.
    let mut out = Vec::with_capacity(n);
    for g in 0..n / 32 {
        let scale = 0.01 * (1 + g % 7) as f32;
        let offset = if g % 3 == 0 { 0.5 * scale } else { 0.0 };
        for _ in 0..32 {
            out.push(rng.random_range(-1.0f32..1.0) * scale + offset);
        }
    }
    out
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)))
}

/// Largest allowed |x - dequantize(quantize(x))| for each value of `x`.
fn error_bounds(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let f16_eps = 2f32.powi(-10); // twice f16's unit roundoff: room for f16 d, m
    let mut bound = vec![0.0f32; x.len()];
    let per_block = |bound: &mut [f32], len: usize, f: &dyn Fn(&[f32]) -> f32| {
        for (b, xs) in bound.chunks_mut(len).zip(x.chunks(len)) {
            b.fill(f(xs));
        }
    };
    match ty {
        GgmlType::F32 => {}
        // Half an ulp; f16 subnormals (below 2^-14) have a fixed ulp of 2^-24.
        GgmlType::F16 => bound
            .iter_mut()
            .zip(x)
            .for_each(|(b, v)| *b = (v.abs() * 2f32.powi(-11)).max(2f32.powi(-25))),
        GgmlType::BF16 => bound
            .iter_mut()
            .zip(x)
            .for_each(|(b, v)| *b = v.abs() * 2f32.powi(-8)),
        // Symmetric 4/5-bit: the value of largest magnitude maps to -8 (-16),
        // the other end may clip by one step.
        GgmlType::Q4_0 => per_block(&mut bound, 32, &|xs| amax(xs) / 8.0 * (1.0 + 8.0 * f16_eps)),
        GgmlType::Q5_0 => per_block(&mut bound, 32, &|xs| {
            amax(xs) / 16.0 * (1.0 + 16.0 * f16_eps)
        }),
        GgmlType::Q8_0 => per_block(&mut bound, 32, &|xs| {
            amax(xs) / 127.0 * (0.5 + 127.0 * f16_eps)
        }),
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let n = if ty == GgmlType::Q4_1 { 15.0 } else { 31.0 };
            per_block(&mut bound, 32, &|xs| {
                let (lo, hi) = min_max(xs);
                let step = (hi - lo) / n;
                0.5 * step + (n * step + lo.abs()) * f16_eps
            })
        }
        GgmlType::Mxfp4 => {
            for (b, xs) in bound.chunks_mut(32).zip(x.chunks(32)) {
                let s = 2f32.powi(amax(xs).log2().floor() as i32 - 2);
                for (bi, &v) in b.iter_mut().zip(xs) {
                    let a = v.abs();
                    // Half the gap between neighbouring E2M1 values, or the
                    // clipping error above 6.
                    *bi = if a <= 2.0 * s {
                        0.25 * s
                    } else if a <= 4.0 * s {
                        0.5 * s
                    } else if a <= 6.0 * s {
                        s
                    } else {
                        a - 6.0 * s
                    } * 1.0001;
                }
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            // The grid of each sub-block covers [min(0, lo), hi] after rounding
            // the 6-bit scale and min up, so values round to within half a step,
            // and a step exceeds range/n by at most one super-block scale unit.
            let n = if ty == GgmlType::Q4K { 15.0 } else { 31.0 };
            for (b, xs) in bound.chunks_mut(256).zip(x.chunks(256)) {
                let subs: Vec<(f32, f32)> = xs
                    .chunks(32)
                    .map(|c| {
                        let (lo, hi) = min_max(c);
                        (lo.min(0.0), hi)
                    })
                    .collect();
                let dmin = subs.iter().fold(0.0f32, |a, s| a.max(-s.0)) / 63.0 * (1.0 + f16_eps);
                let d = subs.iter().fold(0.0f32, |a, s| a.max(s.1 - s.0 + dmin)) / n / 63.0
                    * (1.0 + f16_eps);
                for (bs, (lo, hi)) in b.chunks_mut(32).zip(&subs) {
                    bs.fill(0.5 * ((hi - lo + dmin) / n + d) * 1.0001);
                }
            }
        }
        GgmlType::Q6K => {
            for (b, xs) in bound.chunks_mut(256).zip(x.chunks(256)) {
                let d = amax(xs) / 31.0 / 127.0 * (1.0 + f16_eps);
                for (bs, c) in b.chunks_mut(16).zip(xs.chunks(16)) {
                    bs.fill(0.5 * (amax(c) / 31.0 + d) * 1.0001);
                }
            }
        }
    }
    bound
}

#[test]
fn quantize_dequantize_round_trip_within_resolution() {
    for ty in GgmlType::ALL {
        for seed in 0..4 {
            let x = random_values(768, seed);
            let bytes = quantize(ty, &x).unwrap();
            assert_eq!(bytes.len() as u64, ty.bytes_for(768).unwrap());
            let y = deq(ty, &bytes, x.len());
            let bound = error_bounds(ty, &x);
            for i in 0..x.len() {
                let err = (x[i] - y[i]).abs();
                assert!(
                    err <= bound[i] + 1e-9,
                    "{ty} seed {seed} value {i}: x={} y={} err={err} bound={}",
                    x[i],
                    y[i],
                    bound[i]
                );
            }
        }
    }
}

#[test]
fn quantize_edge_inputs() {
    for ty in GgmlType::ALL {
        let n = 256;
        for x in [
            vec![0.0f32; n],
            vec![-3.0f32; n],
            vec![1e-30f32; n],
            vec![0.5f32; n],
        ] {
            let y = deq(ty, &quantize(ty, &x).unwrap(), n);
            assert!(y.iter().all(|v| v.is_finite()), "{ty}: {y:?}");
            if x[0] == 0.0 {
                assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros stay zero");
            }
        }
        let mut x = vec![0.0f32; n];
        x[5] = 1.0;
        x[200] = -2.0;
        let y = deq(ty, &quantize(ty, &x).unwrap(), n);
        assert!(
            (y[5] - 1.0).abs() < 0.2 && (y[200] + 2.0).abs() < 0.2,
            "{ty}: {} {}",
            y[5],
            y[200]
        );
    }
}

#[test]
fn mxfp4_quantize_exact_values_and_exponent() {
    // Every E2M1 value times 2^3 is representable: the round trip is exact.
    let mut x: Vec<f32> = E2M1.iter().map(|&v| (v * 8.0) as f32).collect();
    x.extend(E2M1.iter().rev().map(|&v| (v * 8.0) as f32));
    let bytes = quantize(GgmlType::Mxfp4, &x).unwrap();
    // amax 48 = 1.5 * 2^5: floor(log2) 5, exponent 5 - 2 + 127.
    assert_eq!(bytes[0], 130);
    assert_eq!(deq(GgmlType::Mxfp4, &bytes, 32), x);
}

// ------------------------------------------------------------ vec_dot

fn f64_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    let dot = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag = w
        .iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    (dot, mag)
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    for ty in GgmlType::ALL {
        let lens: &[usize] = match ty.block_len() {
            1 => &[1, 7, 8, 31, 32, 33, 100, 256, 1000],
            32 => &[32, 64, 96, 160, 576, 2048],
            _ => &[256, 512, 768, 1536],
        };
        for &n in lens {
            let w = random_values(n.div_ceil(32) * 32, n as u64);
            let w = &w[..n];
            let bytes = quantize(ty, w).unwrap();
            let wd = deq(ty, &bytes, n);
            // Activations at an offset that breaks 32-byte alignment; the row
            // at an odd byte offset, as inside a memory map.
            let mut xbuf: Vec<f32> = (0..n + 3).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            xbuf[1] = 3.0;
            let x = &xbuf[3..];
            let mut rbuf = vec![0u8; bytes.len() + 1];
            rbuf[1..].copy_from_slice(&bytes);
            let row = &rbuf[1..];

            let (want, mag) = f64_dot(&wd, x);
            let tol = 1e-4 * mag + 1e-30;
            let fast = vec_dot(ty, row, x) as f64;
            let port = vec_dot_portable(ty, row, x) as f64;
            assert!(
                (fast - want).abs() <= tol,
                "{ty} n={n}: vec_dot {fast} want {want}"
            );
            assert!(
                (port - want).abs() <= tol,
                "{ty} n={n}: portable {port} want {want}"
            );
        }
    }
}

#[test]
fn vec_dot_hand_blocks_exercise_every_code() {
    // Rows of random bytes are valid for every block type (any code, scale
    // bits chosen from random f16 values), so compare vec_dot on them too.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for ty in GgmlType::ALL {
        let n = 512;
        let nbytes = ty.bytes_for(n as u64).unwrap() as usize;
        let mut row: Vec<u8> = (0..nbytes).map(|_| rng.random()).collect();
        // Keep f16/bf16 fields finite and moderate: overwrite scale fields.
        let fix = |row: &mut [u8], off: usize, block: usize, v: f32| {
            for b in row.chunks_mut(block) {
                b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        };
        match ty {
            GgmlType::F32 => {
                for (i, c) in row.chunks_mut(4).enumerate() {
                    c.copy_from_slice(&((i % 13) as f32 - 6.0).to_le_bytes());
                }
            }
            GgmlType::F16 => {
                for (i, c) in row.chunks_mut(2).enumerate() {
                    c.copy_from_slice(&f16::from_f32((i % 11) as f32 - 5.0).to_le_bytes());
                }
            }
            GgmlType::BF16 => {
                for (i, c) in row.chunks_mut(2).enumerate() {
                    c.copy_from_slice(&bf16::from_f32((i % 9) as f32 * 0.25).to_le_bytes());
                }
            }
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                fix(&mut row, 0, ty.block_bytes(), 0.125)
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                fix(&mut row, 0, ty.block_bytes(), 0.125);
                fix(&mut row, 2, ty.block_bytes(), -0.5);
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                fix(&mut row, 0, ty.block_bytes(), 0.01);
                fix(&mut row, 2, ty.block_bytes(), 0.02);
            }
            GgmlType::Q6K => fix(&mut row, 208, 210, 0.003),
            GgmlType::Mxfp4 => {
                for b in row.chunks_mut(17) {
                    b[0] = 120 + b[0] % 10;
                }
            }
        }
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let wd = deq(ty, &row, n);
        let (want, mag) = f64_dot(&wd, &x);
        let fast = vec_dot(ty, &row, &x) as f64;
        let port = vec_dot_portable(ty, &row, &x) as f64;
        assert!(
            (fast - want).abs() <= 1e-4 * mag,
            "{ty}: vec_dot {fast} want {want}"
        );
        assert!(
            (port - want).abs() <= 1e-4 * mag,
            "{ty}: portable {port} want {want}"
        );
    }
}

#[test]
fn vec_dot_empty_row_is_zero() {
    for ty in GgmlType::ALL {
        assert_eq!(vec_dot(ty, &[], &[]), 0.0);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn simd_path_is_taken_on_this_machine() {
    // Not a requirement of the code, but the vec_dot tests above only cover
    // the AVX2 kernels if the CPU has them; say so if it does not.
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        eprintln!("warning: no AVX2/FMA here; only the portable vec_dot was tested");
    }
}

// ------------------------------------------------------------ errors

#[test]
fn dequantize_rejects_bad_lengths() {
    let mut out = vec![0.0f32; 32];
    match dequantize(GgmlType::Q4_1, &[0u8; 19], &mut out) {
        Err(QuantError::LengthMismatch {
            ty: GgmlType::Q4_1,
            bytes: 19,
            values: 32,
        }) => {}
        other => panic!("{other:?}"),
    }
    let mut out = vec![0.0f32; 33];
    match dequantize(GgmlType::Q4_1, &[0u8; 20], &mut out) {
        Err(QuantError::NotWholeBlocks {
            ty: GgmlType::Q4_1,
            values: 33,
        }) => {}
        other => panic!("{other:?}"),
    }
    let mut out = vec![0.0f32; 100];
    assert!(matches!(
        dequantize(GgmlType::Q6K, &[0u8; 210], &mut out),
        Err(QuantError::NotWholeBlocks { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::F16, &[0u8; 5], &mut out[..2]),
        Err(QuantError::LengthMismatch { .. })
    ));
    let e = dequantize(GgmlType::Q4_1, &[0u8; 19], &mut [0.0; 32]).unwrap_err();
    assert_eq!(e.to_string(), "32 values of Q4_1 take 20 bytes, got 19");
}

#[test]
fn quantize_rejects_partial_blocks() {
    assert!(matches!(
        quantize(GgmlType::Q4K, &[0.0; 300]),
        Err(QuantError::NotWholeBlocks {
            ty: GgmlType::Q4K,
            values: 300
        })
    ));
    assert!(matches!(
        quantize(GgmlType::Q8_0, &[0.0; 31]),
        Err(QuantError::NotWholeBlocks { .. })
    ));
    assert_eq!(quantize(GgmlType::F32, &[1.0; 3]).unwrap().len(), 12);
}

#[test]
#[should_panic(expected = "vec_dot")]
fn vec_dot_panics_on_length_mismatch() {
    vec_dot(GgmlType::Q8_0, &[0u8; 34], &[0.0; 64]);
}

#[test]
#[should_panic(expected = "vec_dot")]
fn vec_dot_portable_panics_on_length_mismatch() {
    vec_dot_portable(GgmlType::Q4_0, &[0u8; 18], &[0.0; 33]);
}

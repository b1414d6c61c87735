//! Reference quantizers: `f32` values to valid ggml blocks.
//!
//! The 32-value formats follow ggml's `quantize_row_*_ref` (same scale
//! choice, same rounding). The K-quants do not copy ggml's iterative scale
//! search; they pick per-sub-block scales and mins so that the grid covers
//! the sub-block's range after the 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K) scale
//! quantization, then round each value to the nearest grid point. Speed is
//! not a goal here.

use half::{bf16, f16};

use super::blocks::{
    e8m0_half, pack_k_scales, Block, BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, MXFP4_DOUBLED, QK, QK_K,
};
use super::error::QuantError;
use super::types::GgmlType;

/// Quantizes `src` to `ty`, returning the stored bytes
/// (`ty.bytes_for(src.len())` of them). `src.len()` must be whole blocks.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    if !src.len().is_multiple_of(ty.block_len()) {
        return Err(QuantError::NotWholeBlocks {
            ty,
            values: src.len(),
        });
    }
    let bytes = ty
        .bytes_for(src.len() as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(QuantError::NotWholeBlocks {
            ty,
            values: src.len(),
        })?;
    let mut out = vec![0u8; bytes];
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => blocks(src, &mut out, q4_0),
        GgmlType::Q4_1 => blocks(src, &mut out, q4_1),
        GgmlType::Q5_0 => blocks(src, &mut out, q5_0),
        GgmlType::Q5_1 => blocks(src, &mut out, q5_1),
        GgmlType::Q8_0 => blocks(src, &mut out, q8_0),
        GgmlType::Q4K => blocks(src, &mut out, q4_k),
        GgmlType::Q5K => blocks(src, &mut out, q5_k),
        GgmlType::Q6K => blocks(src, &mut out, q6_k),
        GgmlType::Mxfp4 => blocks(src, &mut out, mxfp4),
    }
    Ok(out)
}

fn blocks<B: Block>(src: &[f32], out: &mut [u8], f: impl Fn(&[f32]) -> B) {
    for (x, o) in src.chunks_exact(B::LEN).zip(out.chunks_exact_mut(B::BYTES)) {
        f(x).write(o);
    }
}

/// The value of largest magnitude (the first one on ties), as ggml picks it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 32 four-bit codes: value `i` in the low nibble of byte `i`, value
/// `i + 16` in its high nibble.
fn pack_nibbles(q: &[u8; QK]) -> [u8; 16] {
    std::array::from_fn(|i| (q[i] & 0x0F) | ((q[i + 16] & 0x0F) << 4))
}

/// Bit 4 of each of 32 codes, value `j` at bit `j`.
fn pack_fifth_bits(q: &[u8; QK]) -> [u8; 4] {
    let h = (0..QK).fold(0u32, |h, j| h | ((((q[j] >> 4) & 1) as u32) << j));
    h.to_le_bytes()
}

fn q4_0(x: &[f32]) -> BlockQ4_0 {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    let q: [u8; QK] = std::array::from_fn(|i| ((x[i] * id + 8.5) as i32).clamp(0, 15) as u8);
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs: pack_nibbles(&q),
    }
}

fn q4_1(x: &[f32]) -> BlockQ4_1 {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 15.0;
    let id = inv(d);
    let q: [u8; QK] = std::array::from_fn(|i| (((x[i] - lo) * id + 0.5) as i32).clamp(0, 15) as u8);
    BlockQ4_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(lo),
        qs: pack_nibbles(&q),
    }
}

fn q5_0(x: &[f32]) -> BlockQ5_0 {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    let q: [u8; QK] = std::array::from_fn(|i| ((x[i] * id + 16.5) as i32).clamp(0, 31) as u8);
    BlockQ5_0 {
        d: f16::from_f32(d),
        qh: pack_fifth_bits(&q),
        qs: pack_nibbles(&q),
    }
}

fn q5_1(x: &[f32]) -> BlockQ5_1 {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 31.0;
    let id = inv(d);
    let q: [u8; QK] = std::array::from_fn(|i| (((x[i] - lo) * id + 0.5) as i32).clamp(0, 31) as u8);
    BlockQ5_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(lo),
        qh: pack_fifth_bits(&q),
        qs: pack_nibbles(&q),
    }
}

fn q8_0(x: &[f32]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    let qs: [i8; QK] = std::array::from_fn(|i| (x[i] * id).round().clamp(-128.0, 127.0) as i8);
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// ggml's MXFP4 reference: the shared exponent puts the block's largest
/// magnitude in [4, 8) times the scale (values beyond 6 clip to 6), and each
/// value takes the nearest E2M1 code (the first in code order on ties).
fn mxfp4(x: &[f32]) -> BlockMxfp4 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    // floor(log2(amax)) from the exponent bits: exact, unlike log2f near
    // powers of two. Subnormal or zero amax gives the smallest exponent.
    let e = if amax.is_normal() {
        let floor_log2 = ((amax.to_bits() >> 23) & 0xFF) as i32 - 127;
        (floor_log2 - 2 + 127).clamp(0, 254) as u8
    } else {
        0
    };
    let d = e8m0_half(e);
    let code = |v: f32| -> u8 {
        let mut best = 0usize;
        let mut best_err = (MXFP4_DOUBLED[0] as f32 * d - v).abs();
        for (i, &k) in MXFP4_DOUBLED.iter().enumerate().skip(1) {
            let err = (k as f32 * d - v).abs();
            if err < best_err {
                best = i;
                best_err = err;
            }
        }
        best as u8
    };
    let q: [u8; QK] = std::array::from_fn(|i| code(x[i]));
    BlockMxfp4 {
        e,
        qs: pack_nibbles(&q),
    }
}

/// The smallest `f16` not below `v` (for `v >= 0`).
fn f16_ceil(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// Shared by Q4_K (`nmax` 15) and Q5_K (`nmax` 31): super-block scales,
/// 6-bit sub-block scales and mins, and the codes in value order.
fn k_affine(x: &[f32], nmax: u8) -> (f16, f16, [u8; 8], [u8; 8], [u8; QK_K]) {
    let n = nmax as f32;
    let mut lo = [0.0f32; 8];
    let mut hi = [0.0f32; 8];
    for s in 0..8 {
        let (a, b) = min_max(&x[32 * s..32 * s + 32]);
        lo[s] = a.min(0.0);
        hi[s] = b;
    }
    // Mins first (rounded up, so the grid starts at or below each sub-block's
    // minimum), then scales wide enough to reach each sub-block's maximum.
    let dmin = f16_ceil(lo.iter().fold(0.0f32, |a, &l| a.max(-l)) / 63.0);
    let dminf = dmin.to_f32();
    let m: [u8; 8] = std::array::from_fn(|s| {
        if dminf > 0.0 {
            (-lo[s] / dminf).ceil().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    });
    let want: [f32; 8] = std::array::from_fn(|s| ((hi[s] + dminf * m[s] as f32) / n).max(0.0));
    let d = f16_ceil(want.iter().fold(0.0f32, |a, &w| a.max(w)) / 63.0);
    let df = d.to_f32();
    let sc: [u8; 8] = std::array::from_fn(|s| {
        if df > 0.0 {
            (want[s] / df).ceil().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    });
    let mut q = [0u8; QK_K];
    for s in 0..8 {
        let step = df * sc[s] as f32;
        let off = dminf * m[s] as f32;
        let istep = inv(step);
        for l in 0..32 {
            let i = 32 * s + l;
            q[i] = ((x[i] + off) * istep).round().clamp(0.0, n) as u8;
        }
    }
    (d, dmin, sc, m, q)
}

fn q4_k(x: &[f32]) -> BlockQ4K {
    let (d, dmin, sc, m, q) = k_affine(x, 15);
    let mut qs = [0u8; 128];
    for k in 0..4 {
        for l in 0..32 {
            qs[32 * k + l] = q[64 * k + l] | (q[64 * k + 32 + l] << 4);
        }
    }
    BlockQ4K {
        d,
        dmin,
        scales: pack_k_scales(&sc, &m),
        qs,
    }
}

fn q5_k(x: &[f32]) -> BlockQ5K {
    let (d, dmin, sc, m, q) = k_affine(x, 31);
    let mut qs = [0u8; 128];
    let mut qh = [0u8; 32];
    for k in 0..4 {
        for l in 0..32 {
            let (a, b) = (q[64 * k + l], q[64 * k + 32 + l]);
            qs[32 * k + l] = (a & 0x0F) | ((b & 0x0F) << 4);
            qh[l] |= ((a >> 4) << (2 * k)) | ((b >> 4) << (2 * k + 1));
        }
    }
    BlockQ5K {
        d,
        dmin,
        scales: pack_k_scales(&sc, &m),
        qh,
        qs,
    }
}

fn q6_k(x: &[f32]) -> BlockQ6K {
    let amax: [f32; 16] = std::array::from_fn(|s| {
        x[16 * s..16 * s + 16]
            .iter()
            .fold(0.0f32, |a, v| a.max(v.abs()))
    });
    // Sub-block scales that reach each sub-block's magnitude with codes in
    // -31..=31 after rounding the scale up to 8 bits.
    let d = f16_ceil(amax.iter().fold(0.0f32, |a, &v| a.max(v)) / 31.0 / 127.0);
    let df = d.to_f32();
    let scales: [i8; 16] = std::array::from_fn(|s| {
        if df > 0.0 {
            (amax[s] / 31.0 / df).ceil().clamp(0.0, 127.0) as i8
        } else {
            0
        }
    });
    let mut q = [0u8; QK_K];
    for (s, &sc) in scales.iter().enumerate() {
        let istep = inv(df * sc as f32);
        for l in 0..16 {
            let i = 16 * s + l;
            q[i] = ((x[i] * istep).round().clamp(-32.0, 31.0) as i32 + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let q = &q[128 * half..128 * half + 128];
        for l in 0..32 {
            ql[64 * half + l] = (q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4);
            ql[64 * half + l + 32] = (q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4);
            qh[32 * half + l] = (q[l] >> 4)
                | ((q[l + 32] >> 4) << 2)
                | ((q[l + 64] >> 4) << 4)
                | ((q[l + 96] >> 4) << 6);
        }
    }
    BlockQ6K { ql, qh, scales, d }
}

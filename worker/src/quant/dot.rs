//! Dot product of one stored row with `f32` activations.
//!
//! This is the inner loop of the CPU backend's matrix-vector product. Two
//! implementations compute it:
//! - a portable one ([`vec_dot_portable`]) that decodes each block into a
//!   stack array with the same code as `dequantize` and accumulates in eight
//!   independent lanes (which LLVM vectorises for whatever target it builds);
//! - an AVX2/FMA/F16C one (x86-64, picked at run time) that decodes in
//!   registers and factors the per-block scale out of the inner sum:
//!   `sum(d * q * x) = d * sum(q * x)`, `sum(m * x) = m * sum(x)`.
//!
//! Both sum in a different order from a plain sequential loop, so results
//! agree with `dot(dequantize(row), x)` to rounding, not bit for bit.

use half::{bf16, f16};

use super::blocks::{
    Block, BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, QK_K,
};
use super::GgmlType;

/// Dot product of one stored row (`x.len()` values of type `ty` in `row`)
/// with `x`, decoding in registers without allocating.
///
/// Panics if `row.len()` is not `ty.bytes_for(x.len())`: shapes are
/// validated when a model loads, so a mismatch here is a bug.
#[inline]
pub fn vec_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    check(ty, row, x);
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has the features the kernels are compiled for, and
        // `check` guaranteed that `row` holds exactly the blocks for `x`.
        return unsafe { avx2::dot(ty, row, x) };
    }
    portable(ty, row, x)
}

/// [`vec_dot`] without the SIMD kernels: the fallback on CPUs without
/// AVX2/FMA/F16C and the reference the SIMD kernels are tested against.
pub fn vec_dot_portable(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    check(ty, row, x);
    portable(ty, row, x)
}

#[inline]
fn check(ty: GgmlType, row: &[u8], x: &[f32]) {
    if ty.bytes_for(x.len() as u64) != Some(row.len() as u64) {
        panic!(
            "vec_dot: {} bytes of {} do not hold {} values (expected {:?} bytes)",
            row.len(),
            ty,
            x.len(),
            ty.bytes_for(x.len() as u64)
        );
    }
}

// ------------------------------------------------------------------ portable

fn portable(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    match ty {
        GgmlType::F32 => plain_dot(row.chunks_exact(4), x, |b| {
            f32::from_le_bytes(b.try_into().unwrap())
        }),
        GgmlType::F16 => plain_dot(row.chunks_exact(2), x, |b| {
            f16::from_le_bytes([b[0], b[1]]).to_f32()
        }),
        GgmlType::BF16 => plain_dot(row.chunks_exact(2), x, |b| {
            bf16::from_le_bytes([b[0], b[1]]).to_f32()
        }),
        GgmlType::Q4_0 => blocks_dot::<BlockQ4_0>(row, x),
        GgmlType::Q4_1 => blocks_dot::<BlockQ4_1>(row, x),
        GgmlType::Q5_0 => blocks_dot::<BlockQ5_0>(row, x),
        GgmlType::Q5_1 => blocks_dot::<BlockQ5_1>(row, x),
        GgmlType::Q8_0 => blocks_dot::<BlockQ8_0>(row, x),
        GgmlType::Q4K => blocks_dot::<BlockQ4K>(row, x),
        GgmlType::Q5K => blocks_dot::<BlockQ5K>(row, x),
        GgmlType::Q6K => blocks_dot::<BlockQ6K>(row, x),
        GgmlType::Mxfp4 => blocks_dot::<BlockMxfp4>(row, x),
    }
}

#[inline(always)]
fn sum_lanes(acc: [f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

#[inline(always)]
fn plain_dot<'a>(
    vals: std::slice::ChunksExact<'a, u8>,
    x: &[f32],
    get: impl Fn(&[u8]) -> f32,
) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut w = [0.0f32; 8];
    let mut xs = x.chunks_exact(8);
    let mut vals = vals;
    for xc in &mut xs {
        for (wl, b) in w.iter_mut().zip(&mut vals) {
            *wl = get(b);
        }
        for l in 0..8 {
            acc[l] += w[l] * xc[l];
        }
    }
    let mut sum = sum_lanes(acc);
    for (b, xv) in vals.zip(xs.remainder()) {
        sum += get(b) * xv;
    }
    sum
}

#[inline(always)]
fn blocks_dot<B: Block>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut buf = [0.0f32; QK_K];
    let w = &mut buf[..B::LEN];
    for (b, xs) in row.chunks_exact(B::BYTES).zip(x.chunks_exact(B::LEN)) {
        B::read(b).decode(w);
        for (wc, xc) in w.chunks_exact(8).zip(xs.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += wc[l] * xc[l];
            }
        }
    }
    sum_lanes(acc)
}

// ------------------------------------------------------------------ AVX2

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::blocks::{e8m0_half, k_scales_mins, MXFP4_DOUBLED};
    use super::GgmlType;

    /// Whether the CPU runs the kernels below (cached by std after the first call).
    #[inline]
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Caller guarantees: AVX2, FMA and F16C are available, and `row` holds
    /// exactly `x.len()` values of `ty` (whole blocks).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
        let (r, xp) = (row.as_ptr(), x.as_ptr());
        match ty {
            GgmlType::F32 => dot_f32(r, xp, x.len()),
            GgmlType::F16 => dot_f16(r, xp, x.len()),
            GgmlType::BF16 => dot_bf16(r, xp, x.len()),
            GgmlType::Q4_0 => dot_q4_0(r, xp, x.len() / 32),
            GgmlType::Q4_1 => dot_q4_1(r, xp, x.len() / 32),
            GgmlType::Q5_0 => dot_q5_0(r, xp, x.len() / 32),
            GgmlType::Q5_1 => dot_q5_1(r, xp, x.len() / 32),
            GgmlType::Q8_0 => dot_q8_0(r, xp, x.len() / 32),
            GgmlType::Mxfp4 => dot_mxfp4(r, xp, x.len() / 32),
            GgmlType::Q4K => dot_q4_k(r, xp, x.len() / 256),
            GgmlType::Q5K => dot_q5_k(r, xp, x.len() / 256),
            GgmlType::Q6K => dot_q6_k(r, xp, x.len() / 256),
        }
    }

    // ---- helpers
    //
    // Plain `#[inline(always)]` functions (target features cannot be combined
    // with `inline(always)`): they are only called from the kernels, which
    // enable AVX2/FMA/F16C, and are always inlined into them.

    /// A `T` at any alignment. Loads and stores go through this instead of the
    /// `loadu`/`storeu` intrinsics or `read_unaligned`: those carry
    /// debug-build precondition checks (overlap, null) that halve the speed
    /// of these loops in the test and dev profiles; a packed field access
    /// compiles to the same unaligned move with no checks.
    #[repr(C, packed)]
    #[derive(Clone, Copy)]
    struct Unaligned<T: Copy>(T);

    #[inline(always)]
    unsafe fn ld<T: Copy>(p: *const u8) -> T {
        (*(p as *const Unaligned<T>)).0
    }

    #[inline(always)]
    unsafe fn st<T: Copy>(p: *mut u8, v: T) {
        (*(p as *mut Unaligned<T>)).0 = v;
    }

    /// 8 floats at `x`.
    #[inline(always)]
    unsafe fn ldx(x: *const f32) -> __m256 {
        ld(x as *const u8)
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The f16 at `p` (any alignment) as f32.
    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let bits: u16 = ld(p);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// Bytes 0..8 of `v`, zero-extended, as 8 floats.
    #[inline(always)]
    unsafe fn u8lo_ps(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }

    /// Bytes 8..16 of `v`, zero-extended, as 8 floats.
    #[inline(always)]
    unsafe fn u8hi_ps(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v)))
    }

    /// Bytes 0..8 of `v`, sign-extended, as 8 floats.
    #[inline(always)]
    unsafe fn i8lo_ps(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
    }

    /// Bytes 8..16 of `v`, sign-extended, as 8 floats.
    #[inline(always)]
    unsafe fn i8hi_ps(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v)))
    }

    /// 8 signed bytes at `p` as 8 floats.
    #[inline(always)]
    unsafe fn i8x8_ps(p: *const i8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(ld::<i64>(
            p as *const u8,
        ))))
    }

    /// 8 unsigned bytes at `p` as 8 floats.
    #[inline(always)]
    unsafe fn u8x8_ps(p: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(ld::<i64>(p))))
    }

    /// Low and high nibbles of 16 bytes: (values 0..16, values 16..32).
    #[inline(always)]
    unsafe fn nibbles(v: __m128i) -> (__m128i, __m128i) {
        let m4 = _mm_set1_epi8(0x0F);
        (
            _mm_and_si128(v, m4),
            _mm_and_si128(_mm_srli_epi16(v, 4), m4),
        )
    }

    /// `sum(q[i] * x[i])` over 32 values as 8 lanes, `q` given as 4 vectors.
    #[inline(always)]
    unsafe fn dot32(q: [__m256; 4], x: *const f32) -> __m256 {
        let p = _mm256_mul_ps(q[0], ldx(x));
        let p = _mm256_fmadd_ps(q[1], ldx(x.add(8)), p);
        let p = _mm256_fmadd_ps(q[2], ldx(x.add(16)), p);
        _mm256_fmadd_ps(q[3], ldx(x.add(24)), p)
    }

    /// `sum(x[i])` over 32 values as 8 lanes.
    #[inline(always)]
    unsafe fn sum32(x: *const f32) -> __m256 {
        let a = _mm256_add_ps(ldx(x), ldx(x.add(8)));
        let b = _mm256_add_ps(ldx(x.add(16)), ldx(x.add(24)));
        _mm256_add_ps(a, b)
    }

    // ---- plain types

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_f32(r: *const u8, x: *const f32, n: usize) -> f32 {
        let r = r as *const f32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * k;
                *a = _mm256_fmadd_ps(ldx(r.add(o)), ldx(x.add(o)), *a);
            }
            i += 32;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += ld::<f32>(r.add(i) as *const u8) * *x.add(i);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_f16(r: *const u8, x: *const f32, n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * k;
                let w = _mm256_cvtph_ps(ld::<__m128i>(r.add(2 * o)));
                *a = _mm256_fmadd_ps(w, ldx(x.add(o)), *a);
            }
            i += 32;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += f16_at(r.add(2 * i)) * *x.add(i);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_bf16(r: *const u8, x: *const f32, n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = i + 8 * k;
                let h = _mm256_cvtepu16_epi32(ld::<__m128i>(r.add(2 * o)));
                let w = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
                *a = _mm256_fmadd_ps(w, ldx(x.add(o)), *a);
            }
            i += 32;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            let bits: u16 = ld(r.add(2 * i));
            s += f32::from_bits((bits as u32) << 16) * *x.add(i);
            i += 1;
        }
        s
    }

    // ---- 32-value blocks

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q4_0(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let eight = _mm_set1_epi8(8);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(18 * i);
            let xb = x.add(32 * i);
            let (lo, hi) = nibbles(ld::<__m128i>(b.add(2)));
            let (lo, hi) = (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight));
            let q = [i8lo_ps(lo), i8hi_ps(lo), i8lo_ps(hi), i8hi_ps(hi)];
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, xb), acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q4_1(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(20 * i);
            let xb = x.add(32 * i);
            let (lo, hi) = nibbles(ld::<__m128i>(b.add(4)));
            let q = [u8lo_ps(lo), u8hi_ps(lo), u8lo_ps(hi), u8hi_ps(hi)];
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, xb), acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b.add(2))), sum32(xb), accm);
        }
        hsum(_mm256_add_ps(acc, accm))
    }

    /// The four 8-value groups of 5-bit codes of a Q5_0/Q5_1 block.
    #[inline(always)]
    unsafe fn q5_codes(qh: *const u8, qs: *const u8) -> [__m256i; 4] {
        let h = _mm256_set1_epi32(ld::<i32>(qh));
        let one = _mm256_set1_epi32(1);
        let bit = |base: i32| {
            let sh = _mm256_setr_epi32(
                base,
                base + 1,
                base + 2,
                base + 3,
                base + 4,
                base + 5,
                base + 6,
                base + 7,
            );
            _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, sh), one), 4)
        };
        let (lo, hi) = nibbles(ld::<__m128i>(qs));
        [
            _mm256_or_si256(_mm256_cvtepu8_epi32(lo), bit(0)),
            _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo)), bit(8)),
            _mm256_or_si256(_mm256_cvtepu8_epi32(hi), bit(16)),
            _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi)), bit(24)),
        ]
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q5_0(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let sixteen = _mm256_set1_epi32(16);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(22 * i);
            let c = q5_codes(b.add(2), b.add(6));
            let q = c.map(|v| _mm256_cvtepi32_ps(_mm256_sub_epi32(v, sixteen)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x.add(32 * i)), acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q5_1(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(24 * i);
            let xb = x.add(32 * i);
            let q = q5_codes(b.add(4), b.add(8)).map(|v| _mm256_cvtepi32_ps(v));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, xb), acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b.add(2))), sum32(xb), accm);
        }
        hsum(_mm256_add_ps(acc, accm))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q8_0(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(34 * i);
            let qs = b.add(2) as *const i8;
            let q = [
                i8x8_ps(qs),
                i8x8_ps(qs.add(8)),
                i8x8_ps(qs.add(16)),
                i8x8_ps(qs.add(24)),
            ];
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x.add(32 * i)), acc);
        }
        hsum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_mxfp4(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let table = ld::<__m128i>(MXFP4_DOUBLED.as_ptr() as *const u8);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let b = r.add(17 * i);
            let (lo, hi) = nibbles(ld::<__m128i>(b.add(1)));
            let (lo, hi) = (_mm_shuffle_epi8(table, lo), _mm_shuffle_epi8(table, hi));
            let q = [i8lo_ps(lo), i8hi_ps(lo), i8lo_ps(hi), i8hi_ps(hi)];
            acc = _mm256_fmadd_ps(_mm256_set1_ps(e8m0_half(*b)), dot32(q, x.add(32 * i)), acc);
        }
        hsum(acc)
    }

    // ---- K-quants

    /// Q4_K/Q5_K super-block tail: given the 256 codes in value order, adds
    /// `sum_s d*sc_s*sum(q*x) - dmin*m_s*sum(x)` into the accumulators.
    #[inline(always)]
    unsafe fn k_affine_blocks(
        codes: &[u8; 256],
        scales: *const u8,
        d: f32,
        dmin: f32,
        x: *const f32,
        acc: &mut __m256,
        accm: &mut __m256,
    ) {
        let (sc, m) = k_scales_mins(&*(scales as *const [u8; 12]));
        for s in 0..8 {
            let c = codes.as_ptr().add(32 * s);
            let xs = x.add(32 * s);
            let q = [
                u8x8_ps(c),
                u8x8_ps(c.add(8)),
                u8x8_ps(c.add(16)),
                u8x8_ps(c.add(24)),
            ];
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[s] as f32), dot32(q, xs), *acc);
            *accm = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m[s] as f32), sum32(xs), *accm);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q4_k(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        let mut codes = [0u8; 256];
        for i in 0..nb {
            let b = r.add(144 * i);
            let qs = b.add(16);
            for k in 0..4 {
                let v = ld::<__m256i>(qs.add(32 * k));
                let c = codes.as_mut_ptr().add(64 * k);
                st(c, _mm256_and_si256(v, m4));
                st(c.add(32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
            k_affine_blocks(
                &codes,
                b.add(4),
                d,
                dmin,
                x.add(256 * i),
                &mut acc,
                &mut accm,
            );
        }
        hsum(_mm256_add_ps(acc, accm))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q5_k(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m16 = _mm256_set1_epi8(0x10);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        let mut codes = [0u8; 256];
        for i in 0..nb {
            let b = r.add(176 * i);
            let qs = b.add(48);
            // Fifth bits: bit 2k of qh[l] for sub-block 2k, bit 2k+1 for 2k+1;
            // shift each pair down to bits 0-1 as k advances.
            let mut h = ld::<__m256i>(b.add(16));
            for k in 0..4 {
                let v = ld::<__m256i>(qs.add(32 * k));
                let lo = _mm256_or_si256(
                    _mm256_and_si256(v, m4),
                    _mm256_and_si256(_mm256_slli_epi16(h, 4), m16),
                );
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                    _mm256_and_si256(_mm256_slli_epi16(h, 3), m16),
                );
                let c = codes.as_mut_ptr().add(64 * k);
                st(c, lo);
                st(c.add(32), hi);
                h = _mm256_srli_epi16(h, 2);
            }
            let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
            k_affine_blocks(
                &codes,
                b.add(4),
                d,
                dmin,
                x.add(256 * i),
                &mut acc,
                &mut accm,
            );
        }
        hsum(_mm256_add_ps(acc, accm))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    unsafe fn dot_q6_k(r: *const u8, x: *const f32, nb: usize) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let m32 = _mm256_set1_epi8(32);
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut codes = [0i8; 256];
        for i in 0..nb {
            let b = r.add(210 * i);
            for half in 0..2 {
                let ql = b.add(64 * half);
                let a = ld::<__m256i>(ql);
                let c = ld::<__m256i>(ql.add(32));
                let h = ld::<__m256i>(b.add(128 + 32 * half));
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(a, m4),
                        _mm256_and_si256(_mm256_slli_epi16(h, 4), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(c, m4),
                        _mm256_and_si256(_mm256_slli_epi16(h, 2), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                        _mm256_and_si256(h, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(h, 2), m30),
                    ),
                ];
                let out = codes.as_mut_ptr().add(128 * half) as *mut u8;
                for (k, v) in q.into_iter().enumerate() {
                    st(out.add(32 * k), _mm256_sub_epi8(v, m32));
                }
            }
            let d = f16_at(b.add(208));
            let sc = b.add(192) as *const i8;
            let xb = x.add(256 * i);
            for s in 0..16 {
                let c = codes.as_ptr().add(16 * s);
                let xs = xb.add(16 * s);
                let p = _mm256_mul_ps(i8x8_ps(c), ldx(xs));
                let p = _mm256_fmadd_ps(i8x8_ps(c.add(8)), ldx(xs.add(8)), p);
                let a = &mut acc[s & 1];
                *a = _mm256_fmadd_ps(_mm256_set1_ps(d * *sc.add(s) as f32), p, *a);
            }
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }
}

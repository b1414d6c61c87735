//! Random weight bytes in ggml's block layouts (ggml-common.h), written
//! directly rather than quantized from floats: the quant codes are uniform
//! random bits and only the scale fields are chosen, so that the dequantized
//! values have zero mean and the requested standard deviation. That makes a
//! multi-gigabyte tensor cost little more than filling memory with random bits.
//!
//! Per format, with q the stored code and `σ` the target deviation:
//! - Q8_0 `d·q`, q ∈ [-128, 127]; Q4_0 `d·(q-8)`; Q5_0 `d·(q-16)`: the codes
//!   are off-centre by half a step, so `d` takes a random sign per block.
//! - Q4_1 `d·q + m`, Q5_1 likewise: `m = -d·(qmax/2)` centres each block.
//! - Q4_K / Q5_K `d·sc_j·q - dmin·m_j` over eight 32-value sub-blocks with
//!   6-bit `sc_j`, `m_j`: `m_j = sc_j/2` and `dmin = d·qmax` give
//!   `d·sc_j·(q - qmax/2)`, centred; `sc_j` varies per sub-block as in real files.
//! - Q6_K `d·sc_j·(q-32)` over sixteen 16-value sub-blocks with i8 `sc_j`,
//!   random sign again.
//!
//! The variance of a code uniform over `n` levels is `(n²-1)/12`; each block's
//! `d` is set from that and its own scales, times a ±25% jitter so blocks differ.

/// wyrand: small, fast and good enough for weights; one stream per chunk.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream for one chunk of one tensor: a function of these three only,
    /// so output does not depend on how chunks are shared among threads.
    pub fn for_chunk(seed: u64, tensor: u64, chunk: u64) -> Self {
        Rng(splitmix(splitmix(splitmix(seed) ^ tensor) ^ chunk))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        (t >> 64) as u64 ^ t as u64
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }

    /// Uniform in [0, 1), 24 bits.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / 16_777_216.0)
    }

    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    fn sign(&mut self) -> f32 {
        if self.next_u64() >> 63 == 0 {
            1.0
        } else {
            -1.0
        }
    }

    /// A per-block scale factor in [0.75, 1.25).
    fn jitter(&mut self) -> f32 {
        0.75 + 0.5 * self.unit()
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// IEEE binary16 bits, rounded to nearest even; subnormals kept (K-quant
/// scales of wide matrices are below f16's smallest normal, as in real files).
pub fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    // 65520 and above round to infinity.
    if a >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    // Below 2^-14: a multiple of 2^-24 (exact scaling by a power of two).
    if a < 0x3880_0000 {
        let q = (f32::from_bits(a) * 16_777_216.0).round_ties_even();
        return sign | q as u16;
    }
    // Rebias the exponent (127 -> 15) and round 23 mantissa bits to 10.
    let r = a - 0x3800_0000;
    let round = 0x0fff + ((r >> 13) & 1);
    sign | ((r + round) >> 13) as u16
}

/// bfloat16 bits, rounded to nearest even (no NaNs are ever generated).
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Standard deviation of a code uniform over `levels` values.
fn code_std(levels: f32) -> f32 {
    ((levels * levels - 1.0) / 12.0).sqrt()
}

/// The RMS of E2M1 over uniformly drawn codes: sqrt(68.5 / 8).
const MXFP4_CODE_RMS: f32 = 2.926_175;

/// What a tensor's values look like once dequantized.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Zero mean, this standard deviation.
    Matrix { std: f32 },
    /// Around 1 (RMSNorm weights).
    Norm,
    /// Small, around 0.
    Bias,
    /// A RoPE frequency-factor table (F32, one chunk), from its formula.
    Factors(FactorTable),
}

/// A RoPE frequency-factor table, computed rather than drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FactorTable {
    /// Llama 3.1's `rope_freqs` for `n_rot`-dim rotations at `base`, as
    /// llama.cpp's converter computes it (`rope_scaling` llama3: factor 8,
    /// low and high frequency factors 1 and 4, 8192 original positions).
    Llama3 {
        base: f32,
        n_rot: u32,
    },
    /// LongRoPE tables shaped like Phi-3-mini-128k's (made up): the long
    /// one rising from 1 to 40, the short one from 1 to 2.5.
    LongRopeLong,
    LongRopeShort,
}

impl FactorTable {
    /// The table's `half` values.
    pub fn values(self, half: usize) -> Vec<f32> {
        let t = |i: usize| i as f64 / (half.max(2) - 1) as f64;
        (0..half)
            .map(|i| match self {
                FactorTable::Llama3 { base, n_rot } => {
                    let (factor, low, high, old) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
                    // The converter's float32 frequency, then Python floats.
                    let freq = 1.0 / base.powf((2 * i) as f32 / n_rot as f32);
                    let wavelen = 2.0 * std::f64::consts::PI / freq as f64;
                    if wavelen < old / high {
                        1.0
                    } else if wavelen > old / low {
                        factor as f32
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                    }
                }
                FactorTable::LongRopeLong => (1.0 + 39.0 * t(i).powf(1.5)) as f32,
                FactorTable::LongRopeShort => (1.0 + 1.5 * t(i) * t(i)) as f32,
            })
            .collect()
    }
}

/// The storage formats the generator writes (the worker's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    Mxfp4,
}

impl Format {
    pub const ALL: [Format; 12] = [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q8_0,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
        Format::Mxfp4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "F32",
            Format::F16 => "F16",
            Format::BF16 => "BF16",
            Format::Q8_0 => "Q8_0",
            Format::Q4_0 => "Q4_0",
            Format::Q4_1 => "Q4_1",
            Format::Q5_0 => "Q5_0",
            Format::Q5_1 => "Q5_1",
            Format::Q4K => "Q4_K",
            Format::Q5K => "Q5_K",
            Format::Q6K => "Q6_K",
            Format::Mxfp4 => "MXFP4",
        }
    }

    /// By name, case-insensitively, with or without the underscore (`q4_k`, `Q4K`).
    pub fn from_name(s: &str) -> Option<Self> {
        let want = s.to_ascii_uppercase().replace('_', "");
        Self::ALL
            .into_iter()
            .find(|f| f.name().replace('_', "") == want)
    }

    /// The ggml type id in the tensor info.
    pub fn ggml_type(self) -> u32 {
        match self {
            Format::F32 => 0,
            Format::F16 => 1,
            Format::Q4_0 => 2,
            Format::Q4_1 => 3,
            Format::Q5_0 => 6,
            Format::Q5_1 => 7,
            Format::Q8_0 => 8,
            Format::Q4K => 12,
            Format::Q5K => 13,
            Format::Q6K => 14,
            Format::BF16 => 30,
            Format::Mxfp4 => 39,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`) of a file whose matrices
    /// are in this format. The K-quants are the `_S` kinds, whose matrices are
    /// all of one type, unlike `_M`, which mixes in Q6_K.
    pub fn file_type(self) -> u32 {
        match self {
            Format::F32 => 0,
            Format::F16 => 1,
            Format::Q4_0 => 2,
            Format::Q4_1 => 3,
            Format::Q8_0 => 7,
            Format::Q5_0 => 8,
            Format::Q5_1 => 9,
            Format::Q4K => 14,
            Format::Q5K => 16,
            Format::Q6K => 18,
            Format::BF16 => 32,
            // LLAMA_FTYPE_MOSTLY_MXFP4_MOE, the only MXFP4 kind llama.cpp names.
            Format::Mxfp4 => 38,
        }
    }

    /// (values per block, bytes per block).
    pub fn block(self) -> (u64, u64) {
        match self {
            Format::F32 => (1, 4),
            Format::F16 | Format::BF16 => (1, 2),
            Format::Q8_0 => (32, 34),
            Format::Q4_0 => (32, 18),
            Format::Q4_1 => (32, 20),
            Format::Q5_0 => (32, 22),
            Format::Q5_1 => (32, 24),
            Format::Q4K => (256, 144),
            Format::Q5K => (256, 176),
            Format::Q6K => (256, 210),
            Format::Mxfp4 => (32, 17),
        }
    }

    /// Stored bytes of `n` values (a multiple of the block size).
    pub fn bytes_for(self, n: u64) -> u64 {
        let (elems, bytes) = self.block();
        debug_assert_eq!(n % elems, 0);
        n / elems * bytes
    }

    /// The format a matrix with rows of `cols` values is stored in. K-quant
    /// super-blocks need rows that are multiples of 256; other rows fall back
    /// as llama.cpp's quantizer does (`llama_tensor_get_type`): Q4_K to Q5_0,
    /// Q5_K to Q5_1, Q6_K to Q8_0 (a little larger, never less precise);
    /// MXFP4 rows of a partial block to Q8_0.
    pub fn for_row(self, cols: u64) -> Format {
        if cols.is_multiple_of(self.block().0) {
            return self;
        }
        match self {
            Format::Q4K => Format::Q5_0,
            Format::Q5K => Format::Q5_1,
            Format::Q6K | Format::Mxfp4 => Format::Q8_0,
            other => other,
        }
    }
}

/// Writes `out.len() / block_bytes` blocks of `format` drawn from `rng`.
pub fn fill(format: Format, init: Init, rng: &mut Rng, out: &mut [u8]) {
    let std = match init {
        Init::Matrix { std } => std,
        Init::Factors(table) => {
            assert_eq!(format, Format::F32, "factor tables are F32");
            let values = table.values(out.len() / 4);
            for (c, v) in out.chunks_exact_mut(4).zip(values) {
                c.copy_from_slice(&v.to_le_bytes());
            }
            return;
        }
        Init::Norm | Init::Bias => {
            return fill_floats(
                format,
                out,
                |r| match init {
                    Init::Norm => 1.0 + 0.1 * r.symmetric(),
                    _ => 0.02 * r.symmetric(),
                },
                rng,
            )
        }
    };
    // Uniform on [-a, a) has deviation a/√3.
    let a = std * 3f32.sqrt();
    let (_, bb) = format.block();
    let bb = bb as usize;
    match format {
        Format::F32 | Format::F16 | Format::BF16 => {
            fill_floats(format, out, |r| a * r.symmetric(), rng)
        }
        Format::Q8_0 => {
            for b in out.chunks_exact_mut(bb) {
                let d = rng.sign() * rng.jitter() * std / code_std(256.0);
                b[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                rng.fill(&mut b[2..]);
            }
        }
        Format::Q4_0 | Format::Q5_0 => {
            let levels = if format == Format::Q4_0 { 16.0 } else { 32.0 };
            for b in out.chunks_exact_mut(bb) {
                let d = rng.sign() * rng.jitter() * std / code_std(levels);
                b[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                rng.fill(&mut b[2..]);
            }
        }
        Format::Q4_1 | Format::Q5_1 => {
            let levels: f32 = if format == Format::Q4_1 { 16.0 } else { 32.0 };
            for b in out.chunks_exact_mut(bb) {
                let d = f16_round(rng.jitter() * std / code_std(levels));
                let m = -d * (levels - 1.0) / 2.0;
                b[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                b[2..4].copy_from_slice(&f16_bits(m).to_le_bytes());
                rng.fill(&mut b[4..]);
            }
        }
        Format::Q4K | Format::Q5K => {
            let levels: f32 = if format == Format::Q4K { 16.0 } else { 32.0 };
            for b in out.chunks_exact_mut(bb) {
                // Even scales in [32, 62], so that m = sc/2 is exact.
                let mut sc = [0u8; 8];
                let mut m = [0u8; 8];
                let mut sum_sq = 0.0f32;
                for j in 0..8 {
                    sc[j] = 32 + 2 * (rng.next_u64() >> 60) as u8;
                    m[j] = sc[j] / 2;
                    sum_sq += f32::from(sc[j]).powi(2);
                }
                let sc_rms = (sum_sq / 8.0).sqrt();
                let d = f16_round(rng.jitter() * std / (code_std(levels) * sc_rms));
                let dmin = d * (levels - 1.0);
                b[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                b[2..4].copy_from_slice(&f16_bits(dmin).to_le_bytes());
                b[4..16].copy_from_slice(&pack_k_scales(&sc, &m));
                rng.fill(&mut b[16..]);
            }
        }
        Format::Mxfp4 => {
            // One E8M0 exponent e a block (scale 2^(e - 127)) and 32 E2M1
            // codes; uniform codes have an RMS of MXFP4_CODE_RMS.
            for b in out.chunks_exact_mut(bb) {
                let scale = rng.jitter() * std / MXFP4_CODE_RMS;
                b[0] = (127.0 + scale.log2().round()).clamp(1.0, 254.0) as u8;
                rng.fill(&mut b[1..]);
            }
        }
        Format::Q6K => {
            for b in out.chunks_exact_mut(bb) {
                rng.fill(&mut b[..192]);
                let mut sum_sq = 0.0f32;
                for s in &mut b[192..208] {
                    let mag = 64 + (rng.next_u64() >> 58) as i8;
                    let v = if rng.next_u64() >> 63 == 0 { mag } else { -mag };
                    *s = v as u8;
                    sum_sq += f32::from(v).powi(2);
                }
                let sc_rms = (sum_sq / 16.0).sqrt();
                let d = rng.jitter() * std / (code_std(64.0) * sc_rms);
                b[208..210].copy_from_slice(&f16_bits(d).to_le_bytes());
            }
        }
    }
}

/// `x` as it will read back from f16, so that offsets derived from it stay exact.
fn f16_round(x: f32) -> f32 {
    let h = f16_bits(x);
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((h >> 10) & 0x1f);
    let f = f32::from(h & 0x3ff);
    sign * if e == 0 {
        f * 2f32.powi(-24)
    } else {
        (1.0 + f / 1024.0) * 2f32.powi(e - 15)
    }
}

fn fill_floats(
    format: Format,
    out: &mut [u8],
    mut value: impl FnMut(&mut Rng) -> f32,
    rng: &mut Rng,
) {
    match format {
        Format::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&value(rng).to_le_bytes());
            }
        }
        Format::F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bits(value(rng)).to_le_bytes());
            }
        }
        Format::BF16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16_bits(value(rng)).to_le_bytes());
            }
        }
        other => unreachable!("{} is not a float format", other.name()),
    }
}

/// The 12-byte 6-bit scale/min packing of Q4_K and Q5_K (ggml's
/// `get_scale_min_k4`, inverted): sub-blocks 0-3 in the low 6 bits of bytes
/// 0-7, sub-blocks 4-7 split between byte 8-11 nibbles and the top 2 bits.
pub fn pack_k_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..4 {
        out[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `get_scale_min_k4`, to check the packing against.
    fn unpack(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    #[test]
    fn k_scales_round_trip() {
        let mut r = Rng::for_chunk(1, 2, 3);
        for _ in 0..100 {
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for j in 0..8 {
                sc[j] = (r.next_u64() % 64) as u8;
                m[j] = (r.next_u64() % 64) as u8;
            }
            let p = pack_k_scales(&sc, &m);
            for j in 0..8 {
                assert_eq!(unpack(j, &p), (sc[j], m[j]), "sub-block {j}");
            }
        }
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        assert_eq!(f16_bits(65504.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00);
        assert_eq!(f16_bits(2f32.powi(-14)), 0x0400);
        assert_eq!(f16_bits(2f32.powi(-24)), 0x0001);
        assert_eq!(f16_bits(3.0 * 2f32.powi(-25)), 0x0002);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even.
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f16_bits(0.0), 0);
        for x in [1e-6f32, 3.7e-5, 0.0123, 1.5, -7.25] {
            let back = f16_round(x);
            assert!((back - x).abs() <= x.abs() * 1e-3 + 6e-8, "{x} -> {back}");
        }
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(-1.0), 0xbf80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    }

    #[test]
    fn names_parse_loosely() {
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Some(f));
            assert_eq!(Format::from_name(&f.name().to_lowercase()), Some(f));
        }
        assert_eq!(Format::from_name("q4k"), Some(Format::Q4K));
        assert_eq!(Format::from_name("mxfp4"), Some(Format::Mxfp4));
    }

    /// The E2M1 values of MXFP4's 16 codes (ggml's `kvalues_mxfp4` halved).
    const E2M1: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    /// MXFP4 blocks decode (as ggml decodes them: E2M1 code times
    /// 2^(e - 127)) to values of the asked deviation, every code used.
    #[test]
    fn mxfp4_blocks_have_the_asked_deviation() {
        let code_rms = (E2M1.iter().map(|v| v * v).sum::<f32>() / 16.0).sqrt();
        assert!((code_rms - MXFP4_CODE_RMS).abs() < 1e-5, "{code_rms}");
        let std = 1.0 / 64.0;
        let mut out = vec![0u8; 17 * 4096];
        fill(
            Format::Mxfp4,
            Init::Matrix { std },
            &mut Rng::for_chunk(7, 0, 0),
            &mut out,
        );
        let (mut sum_sq, mut n, mut codes) = (0f64, 0usize, [0usize; 16]);
        for b in out.chunks_exact(17) {
            let scale = 2f32.powi(i32::from(b[0]) - 127);
            for &q in &b[1..] {
                for c in [q & 0x0F, q >> 4] {
                    codes[c as usize] += 1;
                    sum_sq += f64::from(E2M1[c as usize] * scale).powi(2);
                    n += 1;
                }
            }
        }
        let got = (sum_sq / n as f64).sqrt() as f32;
        assert!((got / std - 1.0).abs() < 0.25, "deviation {got} for {std}");
        assert!(codes.iter().all(|&c| c > n / 32), "codes {codes:?}");
    }

    #[test]
    fn k_quants_fall_back_on_short_rows() {
        assert_eq!(Format::Q4K.for_row(4096), Format::Q4K);
        assert_eq!(Format::Q4K.for_row(576), Format::Q5_0);
        assert_eq!(Format::Q5K.for_row(896), Format::Q5_1);
        assert_eq!(Format::Q6K.for_row(576), Format::Q8_0);
        assert_eq!(Format::Q4_1.for_row(576), Format::Q4_1);
    }

    #[test]
    fn a_chunk_is_a_function_of_its_coordinates() {
        let gen = |f: Format, c: u64| {
            let mut out = vec![0u8; f.bytes_for(1024) as usize];
            fill(
                f,
                Init::Matrix { std: 0.05 },
                &mut Rng::for_chunk(7, 3, c),
                &mut out,
            );
            out
        };
        for f in Format::ALL {
            assert_eq!(gen(f, 0), gen(f, 0), "{}", f.name());
            assert_ne!(gen(f, 0), gen(f, 1), "{}", f.name());
        }
    }
}

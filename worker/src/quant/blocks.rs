//! ggml's block structs and the decoding of one block.
//!
//! Each struct mirrors the C struct of the same name in ggml's
//! `ggml-common.h` (`block_q4_0` ...), field for field, with a compile-time
//! check of its size. The structs are for reading and writing blocks by
//! value: [`Block::read`] decodes one from little-endian bytes at any
//! alignment and [`Block::write`] encodes it back. Never cast mapped tensor
//! bytes to these types: their `f16` fields need 2-byte alignment.
//!
//! Value formulas (index `j` runs over a block's values in storage order):
//! - `Q4_0`: `d * (q - 8)`, 4-bit `q`; byte `i` of `qs` holds value `i` in its
//!   low nibble and value `i + 16` in its high nibble.
//! - `Q4_1`: `d * q + m`, nibbles as in `Q4_0`.
//! - `Q5_0`: `d * (q - 16)`, 5-bit `q`: the nibble as in `Q4_0` plus bit `j`
//!   of `qh` (read as a little-endian `u32`) as bit 4.
//! - `Q5_1`: `d * q + m`, `q` as in `Q5_0`.
//! - `Q8_0`: `d * q`, signed 8-bit `q`.
//! - `MXFP4`: `E2M1(q) * 2^(e - 127)` with the E8M0 exponent `e`; nibbles as in
//!   `Q4_0`. Like ggml this is computed as `2 * E2M1(q)` (an integer) times
//!   `2^(e - 128)`, which is the same number.
//! - `Q4_K`: 8 sub-blocks of 32, `d * sc_s * q - dmin * m_s` with 6-bit
//!   `sc_s`, `m_s` packed into `scales` (see [`k_scale_min`]); each 32 bytes
//!   of `qs` hold sub-block `2k` in the low nibbles and `2k + 1` in the high.
//! - `Q5_K`: as `Q4_K` plus a fifth bit: bit `2k` (low nibbles) or `2k + 1`
//!   (high nibbles) of `qh[l]` for the `l`-th value of the sub-block.
//! - `Q6_K`: 16 sub-blocks of 16, `d * scales[s] * (q - 32)` with 6-bit `q`:
//!   4 bits from `ql`, 2 from `qh` (see [`BlockQ6K::decode`]).

use half::f16;

use super::GgmlType;

/// Values in a `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0` or `MXFP4` block.
pub const QK: usize = 32;
/// Values in a K-quant super-block.
pub const QK_K: usize = 256;

/// One ggml block: its geometry and its byte encoding.
pub trait Block: Copy {
    /// The tensor type stored as these blocks.
    const TYPE: GgmlType;
    /// Values per block.
    const LEN: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Reads a block from the first `BYTES` bytes of `b` (any alignment).
    /// Panics if `b` is shorter.
    fn read(b: &[u8]) -> Self;
    /// Writes the block into the first `BYTES` bytes of `out`.
    fn write(&self, out: &mut [u8]);
    /// Decodes the block's `LEN` values into `out` (which must hold exactly `LEN`).
    fn decode(&self, out: &mut [f32]);
}

#[inline(always)]
fn rd_f16(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn rd_arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().unwrap()
}

#[inline(always)]
fn wr(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}

macro_rules! block_geometry {
    ($t:ty, $ty:expr, $len:expr, $bytes:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $bytes);
        const _: () = assert!($ty.block_bytes() == $bytes && $ty.block_len() == $len);
    };
}

// ---------------------------------------------------------------- Q4_0

/// `block_q4_0`: 32 values, `d * (q - 8)`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}
block_geometry!(BlockQ4_0, GgmlType::Q4_0, 32, 18);

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const LEN: usize = QK;
    const BYTES: usize = 18;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            qs: rd_arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let d = self.d.to_f32();
        for i in 0..16 {
            out[i] = d * ((self.qs[i] & 0x0F) as i32 - 8) as f32;
            out[i + 16] = d * ((self.qs[i] >> 4) as i32 - 8) as f32;
        }
    }
}

// ---------------------------------------------------------------- Q4_1

/// `block_q4_1`: 32 values, `d * q + m`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}
block_geometry!(BlockQ4_1, GgmlType::Q4_1, 32, 20);

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const LEN: usize = QK;
    const BYTES: usize = 20;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            m: rd_f16(b, 2),
            qs: rd_arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.m.to_le_bytes());
        wr(out, 4, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for i in 0..16 {
            out[i] = d * (self.qs[i] & 0x0F) as f32 + m;
            out[i + 16] = d * (self.qs[i] >> 4) as f32 + m;
        }
    }
}

// ---------------------------------------------------------------- Q5_0

/// `block_q5_0`: 32 values, `d * (q - 16)` with the fifth bit in `qh`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
block_geometry!(BlockQ5_0, GgmlType::Q5_0, 32, 22);

/// The 5-bit codes of a `Q5_0`/`Q5_1` block, in value order.
#[inline(always)]
fn q5_codes(qh: [u8; 4], qs: &[u8; 16]) -> [u8; QK] {
    let h = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for i in 0..16 {
        q[i] = (qs[i] & 0x0F) | ((((h >> i) & 1) as u8) << 4);
        q[i + 16] = (qs[i] >> 4) | ((((h >> (i + 16)) & 1) as u8) << 4);
    }
    q
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const LEN: usize = QK;
    const BYTES: usize = 22;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            qh: rd_arr(b, 2),
            qs: rd_arr(b, 6),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.qh);
        wr(out, 6, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let d = self.d.to_f32();
        let q = q5_codes(self.qh, &self.qs);
        for i in 0..QK {
            out[i] = d * (q[i] as i32 - 16) as f32;
        }
    }
}

// ---------------------------------------------------------------- Q5_1

/// `block_q5_1`: 32 values, `d * q + m` with the fifth bit in `qh`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
block_geometry!(BlockQ5_1, GgmlType::Q5_1, 32, 24);

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const LEN: usize = QK;
    const BYTES: usize = 24;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            m: rd_f16(b, 2),
            qh: rd_arr(b, 4),
            qs: rd_arr(b, 8),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.m.to_le_bytes());
        wr(out, 4, &self.qh);
        wr(out, 8, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        let q = q5_codes(self.qh, &self.qs);
        for i in 0..QK {
            out[i] = d * q[i] as f32 + m;
        }
    }
}

// ---------------------------------------------------------------- Q8_0

/// `block_q8_0`: 32 values, `d * q`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}
block_geometry!(BlockQ8_0, GgmlType::Q8_0, 32, 34);

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const LEN: usize = QK;
    const BYTES: usize = 34;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        let raw: [u8; 32] = rd_arr(b, 2);
        Self {
            d: rd_f16(b, 0),
            qs: raw.map(|v| v as i8),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.qs.map(|v| v as u8));
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

// ---------------------------------------------------------------- MXFP4

/// E2M1 code values doubled, as ggml's `kvalues_mxfp4`: code `c` stands for
/// `MXFP4_DOUBLED[c] / 2` (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives).
pub const MXFP4_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`, half the E8M0 scale `2^(e - 127)` (ggml's
/// `GGML_E8M0_TO_FP32_HALF`); exact for every `e`, subnormal for `e < 2`.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// `block_mxfp4`: 32 E2M1 values sharing the E8M0 scale `2^(e - 127)`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; 16],
}
block_geometry!(BlockMxfp4, GgmlType::Mxfp4, 32, 17);

impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::Mxfp4;
    const LEN: usize = QK;
    const BYTES: usize = 17;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            e: b[0],
            qs: rd_arr(b, 1),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0] = self.e;
        wr(out, 1, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().unwrap();
        let d = e8m0_half(self.e);
        for i in 0..16 {
            out[i] = MXFP4_DOUBLED[(self.qs[i] & 0x0F) as usize] as f32 * d;
            out[i + 16] = MXFP4_DOUBLED[(self.qs[i] >> 4) as usize] as f32 * d;
        }
    }
}

// ---------------------------------------------------------------- K-quant scales

/// Scale and min of sub-block `j` (0..8) of a `Q4_K`/`Q5_K` super-block, as
/// ggml's `get_scale_min_k4`: sub-blocks 0..4 keep their 6 bits in the low
/// bits of `scales[j]` (scale) and `scales[j + 4]` (min); sub-blocks 4..8 keep
/// their low 4 bits in `scales[j + 4]` (scale low nibble, min high nibble) and
/// their top 2 bits in the top bits of `scales[j - 4]` (scale) and
/// `scales[j]` (min).
#[inline(always)]
pub fn k_scale_min(j: usize, scales: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// All 8 scales and mins of a `Q4_K`/`Q5_K` super-block.
#[inline(always)]
pub fn k_scales_mins(scales: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = k_scale_min(j, scales);
    }
    (sc, m)
}

/// Packs 8 six-bit scales and mins the way [`k_scale_min`] reads them.
/// Panics if a value exceeds 63.
pub fn pack_k_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    assert!(
        sc.iter().chain(m).all(|&v| v < 64),
        "K-quant scales are 6-bit"
    );
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    s
}

// ---------------------------------------------------------------- Q4_K

/// `block_q4_K`: 256 values in 8 sub-blocks of 32, `d * sc * q - dmin * m`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
block_geometry!(BlockQ4K, GgmlType::Q4K, 256, 144);

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const LEN: usize = QK_K;
    const BYTES: usize = 144;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            dmin: rd_f16(b, 2),
            scales: rd_arr(b, 4),
            qs: rd_arr(b, 16),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.dmin.to_le_bytes());
        wr(out, 4, &self.scales);
        wr(out, 16, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] = out.try_into().unwrap();
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let (sc, m) = k_scales_mins(&self.scales);
        for k in 0..4 {
            let q = &self.qs[32 * k..32 * k + 32];
            let (d1, m1) = (d * sc[2 * k] as f32, dmin * m[2 * k] as f32);
            let (d2, m2) = (d * sc[2 * k + 1] as f32, dmin * m[2 * k + 1] as f32);
            for l in 0..32 {
                out[64 * k + l] = d1 * (q[l] & 0x0F) as f32 - m1;
                out[64 * k + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

// ---------------------------------------------------------------- Q5_K

/// `block_q5_K`: `Q4_K` with a fifth bit per value in `qh`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
block_geometry!(BlockQ5K, GgmlType::Q5K, 256, 176);

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const LEN: usize = QK_K;
    const BYTES: usize = 176;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        Self {
            d: rd_f16(b, 0),
            dmin: rd_f16(b, 2),
            scales: rd_arr(b, 4),
            qh: rd_arr(b, 16),
            qs: rd_arr(b, 48),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.d.to_le_bytes());
        wr(out, 2, &self.dmin.to_le_bytes());
        wr(out, 4, &self.scales);
        wr(out, 16, &self.qh);
        wr(out, 48, &self.qs);
    }
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] = out.try_into().unwrap();
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let (sc, m) = k_scales_mins(&self.scales);
        for k in 0..4 {
            let q = &self.qs[32 * k..32 * k + 32];
            let (d1, m1) = (d * sc[2 * k] as f32, dmin * m[2 * k] as f32);
            let (d2, m2) = (d * sc[2 * k + 1] as f32, dmin * m[2 * k + 1] as f32);
            for l in 0..32 {
                let h = self.qh[l] >> (2 * k);
                let lo = (q[l] & 0x0F) | ((h & 1) << 4);
                let hi = (q[l] >> 4) | (((h >> 1) & 1) << 4);
                out[64 * k + l] = d1 * lo as f32 - m1;
                out[64 * k + 32 + l] = d2 * hi as f32 - m2;
            }
        }
    }
}

// ---------------------------------------------------------------- Q6_K

/// `block_q6_K`: 256 values in 16 sub-blocks of 16, `d * scales[s] * (q - 32)`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}
block_geometry!(BlockQ6K, GgmlType::Q6K, 256, 210);

impl BlockQ6K {
    /// The 6-bit codes (0..64) in value order. Each half of 128 values uses 64
    /// bytes of `ql` and 32 of `qh`: for `l` in 0..32, value `l` takes the low
    /// nibble of `ql[l]`, `l + 32` the low nibble of `ql[l + 32]`, `l + 64` the
    /// high nibble of `ql[l]`, `l + 96` the high nibble of `ql[l + 32]`, and
    /// they take their top two bits from bits 0-1, 2-3, 4-5, 6-7 of `qh[l]`.
    #[inline(always)]
    pub fn codes(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let q = &mut q[128 * half..128 * half + 128];
            for l in 0..32 {
                q[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        q
    }
}

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const LEN: usize = QK_K;
    const BYTES: usize = 210;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        let sc: [u8; 16] = rd_arr(b, 192);
        Self {
            ql: rd_arr(b, 0),
            qh: rd_arr(b, 128),
            scales: sc.map(|v| v as i8),
            d: rd_f16(b, 208),
        }
    }
    fn write(&self, out: &mut [u8]) {
        wr(out, 0, &self.ql);
        wr(out, 128, &self.qh);
        wr(out, 192, &self.scales.map(|v| v as u8));
        wr(out, 208, &self.d.to_le_bytes());
    }
    /// Value `i` is `d * scales[i / 16] * (q[i] - 32)` with `q` from [`Self::codes`].
    #[inline(always)]
    fn decode(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] = out.try_into().unwrap();
        let d = self.d.to_f32();
        let q = self.codes();
        for s in 0..16 {
            let ds = d * self.scales[s] as f32;
            for l in 0..16 {
                out[16 * s + l] = ds * (q[16 * s + l] as i32 - 32) as f32;
            }
        }
    }
}

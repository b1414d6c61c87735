//! `--kv-type`: how the KV cache stores K and V (issue 45). `f16` as
//! before; `q8_0` and `q4_0` are ggml's block formats of those names (32
//! values a block sharing one f16 scale; 8-bit values, or 4-bit ones offset
//! by 8), so figures compare with llama.cpp's `-ctk`/`-ctv`. Both backends
//! give attention the same values: each row of `head_dim` values (one KV
//! head at one position) quantized as ggml's reference quantizer does,
//! then every value read back rounded to f16, as the GPU's kernels read
//! it.

use std::fmt;

use half::f16;

use crate::backend::BackendError;
use crate::quant::{self, GgmlType};

/// A KV cache's storage format.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum KvType {
    #[default]
    #[serde(rename = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8_0, KvType::Q4_0];

    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The ggml format of the same name.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Bytes of one row of `head_dim` values (whole blocks: see
    /// [`KvType::check_head_dim`]): its levels and its scales.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        self.level_bytes(head_dim) + self.scale_bytes(head_dim)
    }

    /// Bytes of a row's values (f16) or levels (a byte or a nibble each).
    pub fn level_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => 2 * head_dim,
            KvType::Q8_0 => head_dim,
            KvType::Q4_0 => head_dim / 2,
        }
    }

    /// Bytes of a row's scales: an f16 per block of 32 values.
    pub fn scale_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => 0,
            KvType::Q8_0 | KvType::Q4_0 => head_dim / 16,
        }
    }

    /// Bytes of one KV head's `capacity` rows on the GPU: the levels, then
    /// the scales padded to 16 bytes (`kv_head_bytes` in cuda/common.cuh).
    pub fn head_bytes(self, capacity: usize, head_dim: usize) -> u64 {
        let cap = capacity as u64;
        cap * self.level_bytes(head_dim) as u64
            + (cap * self.scale_bytes(head_dim) as u64).div_ceil(16) * 16
    }

    /// Whether heads of `head_dim` dims fit the type: a quantized cache
    /// takes rows of whole blocks of 32 values.
    pub fn fits(self, head_dim: usize) -> bool {
        self == KvType::F16 || head_dim.is_multiple_of(32)
    }

    /// [`KvType::fits`], or the error that stops a load.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), BackendError> {
        if !self.fits(head_dim) {
            return Err(BackendError::ModelLoadFailed(format!(
                "--kv-type {self} needs heads of a multiple of 32 dims; this model's have {head_dim}"
            )));
        }
        Ok(())
    }

    /// `rows` (rows of `head_dim` values, one after another) as the cache
    /// gives them back: rounded to f16, or quantized a row at a time and
    /// read back rounded to f16. The rows' values are checked to be whole
    /// rows by the caller.
    pub fn round_trip(self, values: &mut [f32], head_dim: usize) {
        if self == KvType::F16 {
            values.iter_mut().for_each(round_f16);
            return;
        }
        for row in values.chunks_exact_mut(head_dim) {
            let stored = quant::quantize(self.ggml(), row).expect("whole blocks (check_head_dim)");
            quant::dequantize(self.ggml(), &stored, row).expect("whole blocks");
            row.iter_mut().for_each(round_f16);
        }
    }
}

fn round_f16(v: &mut f32) {
    *v = f16::from_f32(*v).to_f32();
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown KV cache type {s:?} (expected f16, q8_0 or q4_0)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for t in KvType::ALL {
            assert_eq!(t.as_str().parse::<KvType>(), Ok(t));
            assert_eq!(t.ggml().name().to_ascii_lowercase(), t.as_str());
        }
        assert!("q5_1".parse::<KvType>().unwrap_err().contains("q8_0"));
    }

    #[test]
    fn rows_take_the_bytes_of_ggml_blocks() {
        for t in KvType::ALL {
            for hd in [64, 128, 256] {
                assert_eq!(Some(t.row_bytes(hd) as u64), t.ggml().bytes_for(hd as u64));
            }
        }
        assert_eq!(KvType::Q8_0.row_bytes(128), 136);
        assert_eq!(KvType::Q4_0.row_bytes(128), 72);
    }

    #[test]
    fn quantized_types_need_whole_blocks_per_head() {
        assert!(KvType::F16.check_head_dim(48).is_ok());
        assert!(KvType::Q8_0.check_head_dim(96).is_ok());
        let e = KvType::Q4_0.check_head_dim(48).unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("48"), "{e}");
    }

    /// The values read back are ggml's block values (scale times level)
    /// rounded to f16; each row's blocks scaled by their own maximum.
    #[test]
    fn round_trip_gives_the_block_values() {
        let row: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.013)
            .collect();
        for t in [KvType::Q8_0, KvType::Q4_0] {
            let mut got = row.clone();
            t.round_trip(&mut got, 64);
            // Half a step, and the scale's f16 rounding times the level (up
            // to 127 · 2^-11 steps); q4_0 clamps the level opposite the
            // maximum's sign at 7: a whole step.
            let (levels, off) = if t == KvType::Q8_0 {
                (127.0, 0.57)
            } else {
                (8.0, 1.01)
            };
            for (b, (g, x)) in got.chunks(32).zip(row.chunks(32)).enumerate() {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = f16::from_f32(amax / levels).to_f32();
                for (gv, xv) in g.iter().zip(x) {
                    let err = (gv - xv).abs();
                    assert!(err <= d * off + 1e-6, "{t} block {b}: {gv} vs {xv}");
                    // A whole level times the block's f16 scale, rounded to f16.
                    let level = (gv / d).round();
                    assert_eq!(*gv, f16::from_f32(level * d).to_f32(), "{t} block {b}");
                }
            }
        }
        let mut f = row.clone();
        KvType::F16.round_trip(&mut f, 64);
        assert!(f
            .iter()
            .zip(&row)
            .all(|(a, b)| *a == f16::from_f32(*b).to_f32()));
    }
}

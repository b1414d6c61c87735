//! Decoding stored values into `f32`.

use half::{bf16, f16};

use super::blocks::{
    Block, BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0,
};
use super::error::{check_lengths, QuantError};
use super::types::GgmlType;

/// Decodes `dst.len()` values stored as `ty` in `src`.
///
/// `src.len()` must equal `ty.bytes_for(dst.len())`; `src` may start at any
/// byte offset (a slice of a memory map).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_lengths(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => blocks::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => blocks::<BlockQ4_1>(src, dst),
        GgmlType::Q5_0 => blocks::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => blocks::<BlockQ5_1>(src, dst),
        GgmlType::Q8_0 => blocks::<BlockQ8_0>(src, dst),
        GgmlType::Q4K => blocks::<BlockQ4K>(src, dst),
        GgmlType::Q5K => blocks::<BlockQ5K>(src, dst),
        GgmlType::Q6K => blocks::<BlockQ6K>(src, dst),
        GgmlType::Mxfp4 => blocks::<BlockMxfp4>(src, dst),
    }
    Ok(())
}

fn blocks<B: Block>(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(B::BYTES).zip(dst.chunks_exact_mut(B::LEN)) {
        B::read(b).decode(out);
    }
}

//! Why a quantization routine refused its input, and the length check the
//! decoders share.

use super::types::GgmlType;

/// Why a quantization routine refused its input.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The byte buffer does not hold exactly the stored form of `values` values.
    #[error("{values} values of {ty} take {expected} bytes, got {bytes}",
        expected = expected_bytes(*ty, *values))]
    LengthMismatch {
        ty: GgmlType,
        bytes: usize,
        values: usize,
    },
    /// `values` is not a multiple of the type's block length.
    #[error("{values} values are not a whole number of {ty} blocks ({} values each)", ty.block_len())]
    NotWholeBlocks { ty: GgmlType, values: usize },
    /// The operation is not implemented for the type.
    #[error("{op} is not supported for {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
}

fn expected_bytes(ty: GgmlType, values: usize) -> String {
    match ty.bytes_for(values as u64) {
        Some(n) => n.to_string(),
        None => "an impossible number of".to_string(),
    }
}

/// Checks that `bytes` bytes hold exactly `values` values of `ty`.
pub(super) fn check_lengths(ty: GgmlType, bytes: usize, values: usize) -> Result<(), QuantError> {
    if !values.is_multiple_of(ty.block_len()) {
        return Err(QuantError::NotWholeBlocks { ty, values });
    }
    if ty.bytes_for(values as u64) != Some(bytes as u64) {
        return Err(QuantError::LengthMismatch { ty, bytes, values });
    }
    Ok(())
}

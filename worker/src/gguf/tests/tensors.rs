//! The tensor table: unknown types, bad dims, offsets past the end, misaligned, overlapping, duplicates.

use super::*;

fn bad_dims_reason(r: Result<GgufFile, GgufError>) -> String {
    match r {
        Err(GgufError::BadDims { tensor, reason }) => {
            assert_eq!(tensor, "bad");
            reason
        }
        other => panic!("expected BadDims, got {other:?}"),
    }
}

#[test]
fn unknown_tensor_type() {
    let mut w = one_tensor_f32("t", 8);
    w.raw_tensor("bad", &[8], 99, 32);
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::UnknownTensorType { tensor, type_id: 99 }) if tensor == "bad"
    ));
}

#[test]
fn bad_dims() {
    let with = |dims: &[u64], ty: GgmlType| {
        let mut w = one_tensor_f32("t", 8);
        w.raw_tensor("bad", dims, ty.id(), 32);
        parse(w.to_bytes())
    };
    assert!(bad_dims_reason(with(&[4, 0], GgmlType::F32)).contains("dimension 1 is zero"));
    assert!(bad_dims_reason(with(&[1, 1, 1, 1, 1], GgmlType::F32)).contains("5 dimensions"));
    assert!(bad_dims_reason(with(&[u64::MAX, 2], GgmlType::F32)).contains("overflows"));
    assert!(bad_dims_reason(with(&[1 << 32, 1 << 32], GgmlType::F32)).contains("overflows"));
    // 2^62 elements fit in u64, their 2^64 bytes do not.
    assert!(bad_dims_reason(with(&[1 << 62], GgmlType::F32)).contains("byte size"));
    assert!(bad_dims_reason(with(&[33], GgmlType::Q4_1)).contains("block length 32"));
    // Rows must be whole blocks even when the total is.
    assert!(bad_dims_reason(with(&[16, 2], GgmlType::Q8_0)).contains("row length 16"));
}

#[test]
fn offsets_past_the_end() {
    for offset in [64, 1 << 40, u64::MAX - 31] {
        let mut w = one_tensor_f32("t", 8);
        w.raw_tensor("far", &[8], 0, offset);
        match parse(w.to_bytes()) {
            Err(GgufError::TensorOutOfBounds {
                tensor,
                offset: o,
                size: 32,
                data_len: 32,
            }) => {
                assert_eq!((tensor.as_str(), o), ("far", offset))
            }
            other => panic!("offset {offset}: expected TensorOutOfBounds, got {other:?}"),
        }
    }
}

#[test]
fn misaligned_offset() {
    // "t" takes bytes 0..4 of a 32-byte slot; "odd" fits in the padding
    // but does not start on a multiple of 32.
    let mut w = one_tensor_f32("t", 1);
    w.raw_tensor("odd", &[1], 0, 8);
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::Misaligned { tensor, offset: 8, alignment: 32 }) if tensor == "odd"
    ));
}

#[test]
fn overlapping_tensors() {
    // "b" starts inside "a" (bytes 0..64).
    let mut w = one_tensor_f32("a", 16);
    w.raw_tensor("b", &[8], 0, 32);
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::TensorOverlap { a, b }) if a == "a" && b == "b"
    ));
    // Same start, the smaller one listed first: still caught.
    let mut w = GgufWriter::new();
    w.raw_tensor("b", &[1], 0, 0);
    w.tensor("a", &[8], GgmlType::F32, bytes(32, 0));
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::TensorOverlap { .. })
    ));
}

#[test]
fn adjacent_tensors_are_fine() {
    let mut w = one_tensor_f32("a", 16);
    w.raw_tensor("b", &[8], 0, 64);
    let mut b = w.to_bytes();
    b.extend([7u8; 32]); // the bytes "b" points at
    let f = parse(b).unwrap();
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &[7u8; 32]);
}

#[test]
fn duplicate_tensor_name() {
    let mut w = one_tensor_f32("same", 8);
    w.tensor("same", &[8], GgmlType::F32, bytes(32, 0));
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::DuplicateTensor(name)) if name == "same"
    ));
}

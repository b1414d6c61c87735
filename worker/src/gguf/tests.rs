//! Reader/writer round trips and hostile-file tests. Each hostile case
//! asserts the specific error variant the reader must return.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::reader::{parse_with, Limits, LIMITS};
use super::*;
use crate::quant::GgmlType;

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn s(v: &str) -> MetaValue {
    MetaValue::String(v.to_owned())
}

/// Deterministic filler bytes for tensor data.
fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// One metadata entry of every type, including nested arrays.
fn all_types() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-100)),
        ("t.u16", MetaValue::U16(60_000)),
        ("t.i16", MetaValue::I16(-30_000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f32", MetaValue::F32(1.5e-7)),
        ("t.f64", MetaValue::F64(-2.25e300)),
        ("t.true", MetaValue::Bool(true)),
        ("t.false", MetaValue::Bool(false)),
        ("t.str", s("héllo ▁wörld")),
        ("t.empty_str", s("")),
        ("t.strs", MetaValue::Array(vec![s("a"), s(""), s("ccc")])),
        (
            "t.f32s",
            MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-1.0)]),
        ),
        ("t.empty", MetaValue::Array(vec![])),
        (
            "t.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
                MetaValue::Array(vec![s("x")]),
                MetaValue::Array(vec![]),
            ]),
        ),
        (
            "t.deep4",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I64(-7)]),
            ])])]),
        ),
    ]
}

/// A small valid file: every metadata type and tensors of several types.
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", s("llama"));
    for (k, v) in all_types() {
        w.metadata(k, v);
    }
    w.tensor("a.f32", &[3, 2], GgmlType::F32, bytes(24, 1))
        .tensor("b.q8", &[32, 2], GgmlType::Q8_0, bytes(68, 2))
        .tensor("c.q41", &[64], GgmlType::Q4_1, bytes(40, 3))
        .tensor("d.f16", &[1, 1, 1, 5], GgmlType::F16, bytes(10, 4));
    w
}

/// A valid file with one tensor per tensor info, for placement tests.
fn one_tensor_f32(name: &str, n: u64) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.tensor(name, &[n], GgmlType::F32, bytes(4 * n as usize, 9));
    w
}

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = GGUF_MAGIC.to_le_bytes().to_vec();
    b.extend(version.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b
}

/// A file with no tensors and one metadata entry whose key is "k", type
/// `ty` and raw payload `payload`, followed by `pad` zero bytes.
fn one_kv(ty: u32, payload: &[u8], pad: usize) -> Vec<u8> {
    let mut b = header(3, 0, 1);
    b.extend(1u64.to_le_bytes());
    b.push(b'k');
    b.extend(ty.to_le_bytes());
    b.extend(payload);
    b.extend(vec![0; pad]);
    b
}

fn array_header(elem_ty: u32, count: u64) -> Vec<u8> {
    let mut b = elem_ty.to_le_bytes().to_vec();
    b.extend(count.to_le_bytes());
    b
}

// ---------------------------------------------------------------- round trip

#[test]
fn round_trip_metadata_and_tensors() {
    let w = sample_writer();
    let f = parse(w.to_bytes()).unwrap();

    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.metadata.len(), all_types().len() + 1);
    assert_eq!(f.metadata.get_str("general.architecture").unwrap(), "llama");
    for (key, value) in all_types() {
        assert_eq!(f.metadata.get(key), Some(&value), "{key}");
    }
    let order: Vec<&str> = f.metadata.iter().map(|(k, _)| k).skip(1).collect();
    let expected: Vec<&str> = all_types().iter().map(|(k, _)| *k).collect();
    assert_eq!(order, expected, "metadata keeps file order");

    let expect = [
        ("a.f32", vec![3, 2], GgmlType::F32, 24, 1),
        ("b.q8", vec![32, 2], GgmlType::Q8_0, 68, 2),
        ("c.q41", vec![64], GgmlType::Q4_1, 40, 3),
        ("d.f16", vec![1, 1, 1, 5], GgmlType::F16, 10, 4),
    ];
    assert_eq!(f.tensors.len(), expect.len());
    let mut next_offset = 0;
    for (i, (name, dims, ty, n_bytes, seed)) in expect.into_iter().enumerate() {
        let t = f.tensor(name).unwrap();
        assert_eq!(t, &f.tensors[i], "index and table agree");
        assert_eq!(t.dims, dims);
        assert_eq!(t.ggml_type, ty);
        assert_eq!(t.n_elements, dims.iter().product::<u64>());
        assert_eq!(t.n_bytes, n_bytes);
        assert_eq!(
            t.offset, next_offset,
            "{name} placed at the next aligned offset"
        );
        next_offset = (t.offset + n_bytes).next_multiple_of(32);
        assert_eq!(f.tensor_data(t), &bytes(n_bytes as usize, seed)[..]);
    }
    assert!(f.tensor("missing").is_none());
    assert_eq!(f.tensor_bytes_total(), 24 + 68 + 40 + 10);
    assert_eq!(f.file_size(), f.data_offset + next_offset);
}

#[test]
fn round_trip_custom_alignment() {
    let mut w = sample_writer().alignment(256);
    w.metadata("after", MetaValue::U8(1));
    let f = parse(w.to_bytes()).unwrap();
    assert_eq!(f.alignment, 256);
    assert_eq!(
        f.metadata.get("general.alignment"),
        Some(&MetaValue::U32(256))
    );
    assert_eq!(f.data_offset % 256, 0);
    for t in &f.tensors {
        assert_eq!(t.offset % 256, 0, "{}", t.name);
    }
    assert_eq!(f.tensor_data(f.tensor("c.q41").unwrap()), &bytes(40, 3)[..]);

    // The default alignment is not written out.
    let f = parse(sample_writer().to_bytes()).unwrap();
    assert!(f.metadata.get("general.alignment").is_none());
}

#[test]
fn write_to_streams_the_same_bytes_and_open_maps_them() {
    let w = sample_writer();
    let mut streamed = Vec::new();
    w.write_to(&mut streamed).unwrap();
    assert_eq!(streamed, w.to_bytes());

    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    w.write_to(tmp.as_file_mut()).unwrap();
    let f = GgufFile::open(tmp.path()).unwrap();
    assert_eq!(f.file_size(), streamed.len() as u64);
    let t = f.tensor("b.q8").unwrap();
    assert_eq!(f.tensor_data(t), &bytes(68, 2)[..]);
    assert!(format!("{f:?}").contains("tensors: 4"));
}

#[test]
fn file_without_tensors_may_omit_the_final_padding() {
    let mut w = GgufWriter::new();
    w.metadata("general.name", s("vocab only"));
    let mut b = w.to_bytes();
    let f = parse(b.clone()).unwrap();
    assert!(f.tensors.is_empty());
    assert_eq!(f.tensor_bytes_total(), 0);
    // Header 24 + key 8+12 + type 4 + string 8+10 = 66, padded to 96.
    assert_eq!(b.len(), 96);
    b.truncate(66);
    assert_eq!(
        parse(b).unwrap().metadata.get_str("general.name").unwrap(),
        "vocab only"
    );
}

#[test]
fn file_type_names() {
    assert_eq!(file_type_name(3), Some("Q4_1"));
    assert_eq!(file_type_name(15), Some("Q4_K_M"));
    assert_eq!(file_type_name(38), Some("MXFP4"));
    assert_eq!(file_type_name(32), Some("BF16"));
    assert_eq!(file_type_name(4), None);
}

// ---------------------------------------------------------------- truncation

fn assert_truncated(r: Result<GgufFile, GgufError>, what_contains: &str) {
    match r {
        Err(GgufError::Truncated { what, .. }) => {
            assert!(
                what.contains(what_contains),
                "'{what}' should mention '{what_contains}'"
            )
        }
        other => panic!("expected Truncated ({what_contains}), got {other:?}"),
    }
}

#[test]
fn truncated_anywhere_before_the_data_section() {
    let full = sample_writer().to_bytes();
    let data_offset = parse(full.clone()).unwrap().data_offset as usize;
    for len in 0..data_offset {
        match parse(full[..len].to_vec()) {
            Err(GgufError::Truncated { offset, .. }) => assert!(offset <= len as u64),
            other => panic!("cut at {len}: expected Truncated, got {other:?}"),
        }
    }
}

/// Few entries, so the up-front "enough bytes for N entries" checks pass
/// early and cuts further on name the exact field being read.
fn named_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", s("llama"))
        .metadata("t.u32", MetaValue::U32(7))
        .metadata("t.strs", MetaValue::Array(vec![s("abcdefghij"), s("xyz")]));
    w.tensor("a.f32", &[3, 2], GgmlType::F32, bytes(24, 1))
        .tensor("b.q8", &[32, 2], GgmlType::Q8_0, bytes(68, 2));
    w
}

#[test]
fn truncated_at_named_places() {
    let full = named_writer().to_bytes();
    let find = |needle: &[u8]| {
        full.windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    };
    let cut = |len: usize| parse(full[..len].to_vec());

    // Header.
    assert_truncated(cut(0), "header magic");
    assert_truncated(cut(6), "header version");
    assert_truncated(cut(12), "header tensor count");
    assert_truncated(cut(20), "header metadata count");
    // Section boundary: header complete, no metadata.
    assert_truncated(cut(24), "3 metadata entries");

    // In a key, before a value's type, in a value.
    let key = find(b"t.u32");
    assert_truncated(cut(key - 8), "key of metadata entry 1");
    assert_truncated(cut(key + 2), "key of metadata entry 1");
    assert_truncated(cut(key + 5 + 2), "value type of key 't.u32'");
    assert_truncated(cut(key + 5 + 4 + 1), "value of key 't.u32'");

    // In an array: its header, too few bytes for its count, an element.
    let arr = find(b"t.strs") + 6 + 4;
    assert_truncated(cut(arr + 2), "array element type of key 't.strs'");
    assert_truncated(cut(arr + 4 + 3), "array length of key 't.strs'");
    assert_truncated(cut(arr + 12 + 10), "2 array elements of key 't.strs'");
    assert_truncated(cut(arr + 12 + 20), "value of key 't.strs'");

    // Section boundary: metadata complete, no tensor infos.
    let table = arr + 12 + 18 + 11;
    assert_truncated(cut(table), "2 tensor infos");
    // In a tensor info: its name, its fields.
    let name = find(b"b.q8");
    assert_truncated(cut(name + 1), "name of tensor 1");
    assert_truncated(cut(name + 4 + 6), "info of tensor 'b.q8'");

    // Section boundary: tensor table complete, padding missing.
    let table_end = name + 4 + 4 + 16 + 4 + 8;
    let data_offset = parse(full.clone()).unwrap().data_offset as usize;
    assert!(
        table_end < data_offset,
        "the layout has padding to cut into"
    );
    assert_truncated(cut(table_end), "padding before the data section");
    assert_truncated(cut(data_offset - 1), "padding before the data section");
}

#[test]
fn truncated_in_the_data_section() {
    let full = sample_writer().to_bytes();
    let f = parse(full.clone()).unwrap();
    let last = f.tensors.last().unwrap();
    let data_end = (f.data_offset + last.offset + last.n_bytes) as usize;
    for len in f.data_offset as usize..full.len() {
        match parse(full[..len].to_vec()) {
            Ok(_) => assert!(len >= data_end, "cut at {len} lost tensor bytes"),
            Err(GgufError::TensorOutOfBounds { data_len, .. }) => {
                assert!(len < data_end);
                assert_eq!(data_len, len as u64 - f.data_offset);
            }
            Err(e) => panic!("cut at {len}: expected TensorOutOfBounds, got {e:?}"),
        }
    }
    assert!(matches!(
        parse(full[..data_end - 1].to_vec()),
        Err(GgufError::TensorOutOfBounds { tensor, .. }) if tensor == "d.f16"
    ));
}

#[test]
fn empty_and_missing_files() {
    assert_truncated(parse(Vec::new()), "magic");
    let tmp = tempfile::NamedTempFile::new().unwrap();
    assert_truncated(GgufFile::open(tmp.path()), "magic");
    let missing = tmp.path().with_extension("does-not-exist");
    match GgufFile::open(&missing) {
        Err(e @ GgufError::Io { .. }) => assert!(e.to_string().contains("does-not-exist")),
        other => panic!("expected Io, got {other:?}"),
    }
}

// ---------------------------------------------------------------- header

#[test]
fn bad_magic() {
    let mut b = sample_writer().to_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse(b), Err(GgufError::BadMagic(0x4c4d_4747))));
}

#[test]
fn versions_other_than_3_are_refused() {
    for version in [1u32, 2, 4, 0x0300_0000] {
        let mut b = sample_writer().to_bytes();
        b[4..8].copy_from_slice(&version.to_le_bytes());
        match parse(b) {
            Err(e @ GgufError::UnsupportedVersion(v)) => {
                assert_eq!(v, version);
                assert_eq!(
                    e.to_string(),
                    format!("unsupported GGUF version {version} (only version 3 is supported)")
                );
            }
            other => panic!("version {version}: expected UnsupportedVersion, got {other:?}"),
        }
    }
}

#[test]
fn too_many_tensors_fails_fast() {
    // Only the header exists: the count is refused before anything else is
    // read or allocated.
    for count in [10_000u64, 10_001, u64::MAX] {
        assert!(matches!(
            parse(header(3, count, 0)),
            Err(GgufError::TooMany { what: "tensors", count: c, max: 9_999 }) if c == count
        ));
    }
    // Under the cap, the count must still be backed by bytes.
    assert_truncated(parse(header(3, 9_999, 0)), "9999 tensor infos");
}

#[test]
fn too_many_metadata_entries() {
    assert!(matches!(
        parse(header(3, 0, 65_537)),
        Err(GgufError::TooMany {
            what: "metadata entries",
            count: 65_537,
            ..
        })
    ));
    assert_truncated(parse(header(3, 0, 65_536)), "65536 metadata entries");
}

// ---------------------------------------------------------------- metadata

#[test]
fn absurd_string_lengths() {
    // In a key.
    let mut b = header(3, 0, 1);
    b.extend(u64::MAX.to_le_bytes());
    b.extend([0; 64]);
    assert!(matches!(
        parse(b),
        Err(GgufError::StringTooLong {
            len: u64::MAX,
            max: 16_777_216
        })
    ));
    // In a value.
    let b = one_kv(8, &u64::MAX.to_le_bytes(), 64);
    assert!(matches!(
        parse(b),
        Err(GgufError::StringTooLong { len: u64::MAX, .. })
    ));
    // Under the cap but longer than the file.
    let b = one_kv(8, &(1u64 << 20).to_le_bytes(), 64);
    assert_truncated(parse(b), "value of key 'k'");
}

#[test]
fn absurd_array_counts() {
    let b = one_kv(9, &array_header(4, u64::MAX), 64);
    assert!(matches!(
        parse(b),
        Err(GgufError::TooMany {
            what: "array elements",
            count: u64::MAX,
            ..
        })
    ));
    // 1M u32s need 4 MB; refused before allocating.
    let b = one_kv(9, &array_header(4, 1 << 20), 64);
    assert_truncated(parse(b), "1048576 array elements of key 'k'");
    // 16 u8s fit in 16 bytes, but 16 strings need at least 128.
    let b = one_kv(9, &array_header(8, 16), 16);
    assert_truncated(parse(b), "16 array elements");
}

#[test]
fn array_element_budget_spans_all_metadata() {
    // The real budget (32 Mi elements) would take gigabytes to reach.
    let limits = Limits {
        array_elems_total: 10,
        ..LIMITS
    };
    let mut w = GgufWriter::new();
    w.metadata("a", MetaValue::Array(vec![MetaValue::U8(0); 6]))
        .metadata("b", MetaValue::Array(vec![MetaValue::U8(0); 4]));
    assert!(parse_with(&w.to_bytes(), &limits).is_ok());
    // Nested arrays count too: one outer element, no inner ones.
    w.metadata("c", MetaValue::Array(vec![MetaValue::Array(vec![])]));
    assert!(matches!(
        parse_with(&w.to_bytes(), &limits),
        Err(GgufError::TooMany {
            what: "array elements in all metadata",
            count: 11,
            max: 10
        })
    ));
}

#[test]
fn unknown_value_types() {
    let b = one_kv(13, &[0; 8], 32);
    assert!(matches!(
        parse(b),
        Err(GgufError::UnknownValueType { key, type_id: 13 }) if key == "k"
    ));
    let b = one_kv(9, &array_header(99, 1), 32);
    assert!(matches!(
        parse(b),
        Err(GgufError::UnknownValueType { type_id: 99, .. })
    ));
}

#[test]
fn nesting_deeper_than_four_is_refused() {
    let mut v = MetaValue::U8(1);
    for _ in 0..5 {
        v = MetaValue::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.metadata("deep", v);
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::NestingTooDeep { key }) if key == "deep"
    ));
}

#[test]
fn invalid_utf8_is_refused() {
    let mut b = header(3, 0, 1);
    b.extend(2u64.to_le_bytes());
    b.extend([0xc3, 0x28]);
    b.extend([0; 32]);
    assert!(matches!(
        parse(b),
        Err(GgufError::InvalidUtf8 { offset: 32 })
    ));
}

#[test]
fn duplicate_metadata_key() {
    let mut w = sample_writer();
    w.metadata("t.u8", MetaValue::U8(1));
    assert!(matches!(parse(w.to_bytes()), Err(GgufError::DuplicateKey(k)) if k == "t.u8"));
}

#[test]
fn bad_alignment_values() {
    for a in [3u64, 48, 1000] {
        let w = one_tensor_f32("t", 8).alignment(a);
        assert!(matches!(parse(w.to_bytes()), Err(GgufError::BadAlignment(x)) if x == a));
    }
    let mut w = one_tensor_f32("t", 8);
    w.metadata("general.alignment", MetaValue::U32(0));
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::BadAlignment(0))
    ));
    let mut w = one_tensor_f32("t", 8);
    w.metadata("general.alignment", MetaValue::U64(32));
    assert!(matches!(
        parse(w.to_bytes()),
        Err(GgufError::WrongType {
            expected: "u32",
            found: "u64",
            ..
        })
    ));
}

// ---------------------------------------------------------------- tensors

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

// ---------------------------------------------------------------- fuzz

/// One random mutation of `b`: flip bytes, truncate, or splice an extreme
/// or small integer over a random window (counts and lengths live there).
fn mutate(rng: &mut ChaCha8Rng, b: &mut Vec<u8>) {
    if b.is_empty() {
        return;
    }
    match rng.random_range(0..5) {
        0 => {
            for _ in 0..rng.random_range(1..=4) {
                let i = rng.random_range(0..b.len());
                b[i] ^= rng.random_range(1..=255u8);
            }
        }
        1 => {
            let len = rng.random_range(0..b.len());
            b.truncate(len);
        }
        k => {
            let value: u64 = match k {
                2 => u64::MAX,
                3 => rng.random_range(0..=64),
                _ => rng.random(),
            };
            let bytes = value.to_le_bytes();
            let n = bytes.len().min(b.len());
            let i = rng.random_range(0..=b.len() - n);
            b[i..i + n].copy_from_slice(&bytes[..n]);
        }
    }
}

#[test]
fn fuzz_mutations_never_panic() {
    let base = sample_writer().to_bytes();
    let mut rng = ChaCha8Rng::seed_from_u64(0x6767_7566);
    let (mut ok, mut err) = (0u32, 0u32);
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..rng.random_range(1..=3) {
            mutate(&mut rng, &mut b);
        }
        match parse(b) {
            Ok(f) => {
                ok += 1;
                // Whatever passed validation must be safe to slice.
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
            Err(e) => {
                err += 1;
                let _ = e.to_string();
            }
        }
    }
    eprintln!("fuzz: {ok} parsed, {err} refused");
    assert!(
        ok > 0 && err > 0,
        "mutations should both keep and break files"
    );
}

// ---------------------------------------------------------------- real model

#[test]
fn reference_model_smollm2() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.models/smollm2-135m-instruct-q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping: {} not present (CI fetches it first)",
            path.display()
        );
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let m = &f.metadata;
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u64("llama.context_length").unwrap(), 8192);
    assert_eq!(m.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let file_type = m.get_u64("general.file_type").unwrap();
    assert_eq!(file_type, 3);
    assert_eq!(file_type_name(file_type as u32), Some("Q4_1"));

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(f.tensor_data(embd).len() as u64, 576 * 49152 / 32 * 34);

    let count = |ty| f.tensors.iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::Q8_0), 1);
    assert!(f.data_offset + f.tensor_bytes_total() <= f.file_size());
}

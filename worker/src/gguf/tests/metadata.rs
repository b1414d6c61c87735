//! Metadata: absurd lengths and counts, unknown types, nesting, UTF-8, duplicates, alignment.

use super::*;

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

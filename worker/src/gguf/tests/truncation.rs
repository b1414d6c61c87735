//! Files cut anywhere: each cut fails with the error naming what was being read.

use super::*;

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
            Err(GgufError::CutShort { file_len, needed }) => {
                assert!(len < data_end);
                assert_eq!(file_len, len as u64);
                assert_eq!(needed, data_end as u64);
            }
            Err(e) => panic!("cut at {len}: expected CutShort, got {e:?}"),
        }
    }
    let message = parse(full[..data_end - 1].to_vec())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("truncated")
            && message.contains(&format!("needs {data_end} bytes"))
            && message.contains(&format!("has {}", data_end - 1))
            && message.contains("download it again"),
        "{message}"
    );
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

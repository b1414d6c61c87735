//! Writer → reader round trips, custom alignment, streaming writes, file type names.

use super::*;

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

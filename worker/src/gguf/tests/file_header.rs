//! The header: magic, version, and counts that cannot fit the file.

use super::*;

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

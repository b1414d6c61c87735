//! Reader/writer round trips and hostile-file tests. Each hostile case
//! asserts the specific error variant the reader must return. Shared builders
//! here; the cases by concern in `tests/`.

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

/// `r` failed as truncated while reading something named `what_contains`.
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

mod file_header;
mod metadata;
mod round_trip;
mod tensors;
mod truncation;

// ---------------------------------------------------------------- fuzz
// (here, not in `tests/`: the conformance suite names these tests by path)

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

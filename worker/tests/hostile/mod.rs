//! A deterministic corpus of hostile GGUF files derived from the reference
//! model: absurd counts, lengths, dimensions, offsets and types written over
//! each field of the header, metadata and tensor table; truncation at every
//! structural boundary; absurd hyperparameters (also re-encoded as u64);
//! NaN/Inf weights; and seeded random byte damage. Each case is a recipe
//! applied to the reference bytes, so the corpus costs no disk.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

use memmap2::MmapOptions;
use worker_orcd::gguf::{GgufError, GgufFile, GgufWriter, MetaValue};

/// What a numeric field of the file holds, for picking hostile values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Count,
    Length,
    Type,
    Dim,
    Offset,
    Scalar,
}

/// A little-endian integer field of the file.
#[derive(Clone, Debug)]
pub struct Field {
    pub at: usize,
    pub width: usize,
    pub kind: Kind,
    pub label: String,
}

/// Where things are in a GGUF file, found by walking it independently of the
/// worker's reader.
#[derive(Debug, Default)]
pub struct Layout {
    pub fields: Vec<Field>,
    /// Offsets where a structure (header field, entry, tensor info) starts,
    /// with the index of the tensor info they belong to.
    pub boundaries: Vec<(usize, Option<usize>)>,
    /// Scalar metadata values: key, offset of the value, its GGUF type id.
    pub scalars: Vec<(String, usize, u32)>,
    pub data_offset: usize,
    /// Each tensor's name, ggml type id and absolute data offset.
    pub tensors: Vec<(String, u32, usize)>,
}

struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    out: Layout,
}

impl Walker<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.pos..self.pos + 4].try_into().unwrap());
        self.pos += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().unwrap());
        self.pos += 8;
        v
    }
    fn field(&mut self, width: usize, kind: Kind, label: String, record: bool) -> u64 {
        if record {
            self.out.fields.push(Field {
                at: self.pos,
                width,
                kind,
                label,
            });
        }
        if width == 4 {
            u64::from(self.u32())
        } else {
            self.u64()
        }
    }
    fn string(&mut self, label: String, record: bool) -> String {
        let len = self.field(8, Kind::Length, label, record) as usize;
        let s = String::from_utf8_lossy(&self.b[self.pos..self.pos + len]).into_owned();
        self.pos += len;
        s
    }

    /// One value of type `ty`; `record` is false for array elements past the
    /// first few, so a 49 152-entry vocabulary gives a handful of fields.
    fn value(&mut self, key: &str, ty: u32, record: bool) {
        let at = self.pos;
        match ty {
            0 | 1 | 7 => self.pos += 1,
            2 | 3 => self.pos += 2,
            4..=6 => self.pos += 4,
            10..=12 => self.pos += 8,
            8 => {
                self.string(format!("{key}: string length"), record);
            }
            9 => {
                let ety = self.field(4, Kind::Type, format!("{key}: element type"), record) as u32;
                let n = self.field(8, Kind::Count, format!("{key}: array length"), record);
                for i in 0..n {
                    let rec = record && (i < 3 || i + 1 == n);
                    self.value(key, ety, rec);
                }
            }
            _ => panic!("the reference model has an unknown value type {ty}"),
        }
        if record && ty != 8 && ty != 9 {
            self.out.scalars.push((key.to_string(), at, ty));
        }
    }
}

/// Walks a well-formed GGUF v3 file.
pub fn layout(bytes: &[u8]) -> Layout {
    let mut w = Walker {
        b: bytes,
        pos: 0,
        out: Layout::default(),
    };
    for (width, kind, label) in [
        (4, Kind::Scalar, "magic"),
        (4, Kind::Type, "version"),
        (8, Kind::Count, "tensor count"),
        (8, Kind::Count, "metadata count"),
    ] {
        w.out.boundaries.push((w.pos, None));
        w.field(width, kind, label.into(), true);
    }
    let n_tensors = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let n_kv = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    for i in 0..n_kv {
        w.out.boundaries.push((w.pos, None));
        let key = w.string(format!("key {i} length"), true);
        w.out.boundaries.push((w.pos, None));
        let ty = w.field(4, Kind::Type, format!("{key}: value type"), true) as u32;
        w.out.boundaries.push((w.pos, None));
        w.value(&key, ty, true);
    }
    let mut infos = Vec::new();
    for i in 0..n_tensors {
        w.out.boundaries.push((w.pos, Some(i as usize)));
        let name = w.string(format!("tensor {i} name length"), true);
        w.out.boundaries.push((w.pos, Some(i as usize)));
        let n_dims = w.field(4, Kind::Count, format!("{name}: n_dims"), true);
        for d in 0..n_dims {
            w.field(8, Kind::Dim, format!("{name}: dim {d}"), true);
        }
        w.out.boundaries.push((w.pos, Some(i as usize)));
        let ty = w.field(4, Kind::Type, format!("{name}: ggml type"), true) as u32;
        let off = w.field(8, Kind::Offset, format!("{name}: data offset"), true);
        infos.push((name, ty, off));
    }
    w.out.boundaries.push((w.pos, None));
    let data_offset = w.pos.next_multiple_of(32);
    w.out.data_offset = data_offset;
    w.out.tensors = infos
        .into_iter()
        .map(|(n, t, o)| (n, t, data_offset + o as usize))
        .collect();
    w.out
}

/// One hostile file: how to make it from the reference bytes.
#[derive(Clone, Debug)]
pub enum Recipe {
    /// The first `n` bytes only.
    Truncate(usize),
    /// Writes `value` (its low `width` bytes) at `at`.
    Poke { at: usize, width: usize, value: u64 },
    /// Fills `len` bytes from `at` with a repeated pattern (NaN/Inf weights).
    Fill {
        at: usize,
        len: usize,
        pattern: Vec<u8>,
    },
    /// Re-encodes the file with metadata `key` replaced by `value`.
    Rewrite { key: String, value: MetaValue },
    /// Overwrites `(offset, byte)` pairs.
    Bytes(Vec<(usize, u8)>),
}

/// A named case of the corpus.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub recipe: Recipe,
}

impl Case {
    pub fn bytes(&self, base: &[u8]) -> Vec<u8> {
        match &self.recipe {
            Recipe::Truncate(n) => base[..*n].to_vec(),
            Recipe::Poke { at, width, value } => {
                let mut b = base.to_vec();
                b[*at..*at + width].copy_from_slice(&value.to_le_bytes()[..*width]);
                b
            }
            Recipe::Fill { at, len, pattern } => {
                let mut b = base.to_vec();
                for (i, x) in b[*at..*at + len].iter_mut().enumerate() {
                    *x = pattern[i % pattern.len()];
                }
                b
            }
            Recipe::Rewrite { key, value } => rewrite(base, key, value),
            Recipe::Bytes(pairs) => {
                let mut b = base.to_vec();
                for &(at, x) in pairs {
                    b[at] = x;
                }
                b
            }
        }
    }
}

impl Case {
    /// Parses the case without copying the reference file: a private
    /// copy-on-write map of it (only the pages a recipe touches are copied).
    pub fn parse(&self, path: &Path, base: &[u8]) -> Result<GgufFile, GgufError> {
        let file = std::fs::File::open(path).unwrap();
        let mut opts = MmapOptions::new();
        match &self.recipe {
            Recipe::Rewrite { .. } => return GgufFile::from_bytes(self.bytes(base)),
            Recipe::Truncate(n) => {
                // An empty map is an error of its own; an empty file a short read.
                if *n == 0 {
                    return GgufFile::from_bytes(Vec::new());
                }
                opts.len(*n);
            }
            _ => {}
        }
        // SAFETY: a private map; the reference file is not modified while
        // the tests run.
        let mut map = unsafe { opts.map_copy(&file) }.unwrap();
        match &self.recipe {
            Recipe::Poke { at, width, value } => {
                map[*at..*at + width].copy_from_slice(&value.to_le_bytes()[..*width])
            }
            Recipe::Fill { at, len, pattern } => {
                for (i, x) in map[*at..*at + len].iter_mut().enumerate() {
                    *x = pattern[i % pattern.len()];
                }
            }
            Recipe::Bytes(pairs) => {
                for &(at, x) in pairs {
                    map[at] = x;
                }
            }
            Recipe::Truncate(_) | Recipe::Rewrite { .. } => {}
        }
        GgufFile::from_map(map.make_read_only().unwrap())
    }
}

/// The file written again by the crate's writer with one metadata value
/// replaced (or added), so a u32 key can hold a u64.
fn rewrite(base: &[u8], key: &str, value: &MetaValue) -> Vec<u8> {
    let f = GgufFile::from_bytes(base.to_vec()).expect("the reference model parses");
    let mut w = GgufWriter::new();
    let mut seen = false;
    for (k, v) in f.metadata.iter() {
        if k == key {
            seen = true;
            w.metadata(k, value.clone());
        } else {
            w.metadata(k, v.clone());
        }
    }
    if !seen {
        w.metadata(key, value.clone());
    }
    for t in &f.tensors {
        w.tensor(&t.name, &t.dims, t.ggml_type, f.tensor_data(t).to_vec());
    }
    w.to_bytes()
}

/// The block counts of issue #15's first failure.
pub const ABSURD_BLOCK_COUNTS: [u64; 6] = [
    (1 << 31) - 1,
    (1 << 32) - 1,
    1 << 32,
    1 << 40,
    1 << 62,
    u64::MAX,
];

fn hostile_values(f: &Field, original: u64) -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        original.wrapping_add(1),
        original.wrapping_sub(1),
        (1 << 31) - 1,
        (1 << 32) - 1,
    ];
    if f.width == 8 {
        v.extend([1 << 32, 1 << 40, 1 << 62, u64::MAX]);
    } else {
        v.extend([1 << 31, 13, 41]);
    }
    if f.kind == Kind::Type {
        v.extend([9, 12, 14]);
    }
    v.retain(|&x| x != original);
    v.sort_unstable();
    v.dedup();
    v
}

fn read(base: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&base[at..at + width]);
    u64::from_le_bytes(b)
}

/// Every case, in a fixed order. `tensor_stride` picks which tensor infos
/// get every hostile value (1: all of them).
pub fn corpus(base: &[u8], tensor_stride: usize) -> Vec<Case> {
    let lay = layout(base);
    let n = lay.tensors.len();
    // Tensor infos all look alike: the first four, the last two and every
    // `tensor_stride`-th get every hostile value and every cut.
    let keep = |i: usize| i < 4 || i + 2 >= n || i.is_multiple_of(tensor_stride);
    let mut cases = Vec::new();
    truncations(base, &lay, &keep, &mut cases);
    field_pokes(base, &lay, &keep, &mut cases);
    hyperparameters(&lay, &mut cases);
    weights(&lay, base.len(), &mut cases);
    random_damage(&lay, &mut cases);
    cases
}

fn truncations(base: &[u8], lay: &Layout, keep: &dyn Fn(usize) -> bool, cases: &mut Vec<Case>) {
    let mut cuts: Vec<usize> = Vec::new();
    for &(b, tensor) in &lay.boundaries {
        if tensor.is_none_or(keep) {
            cuts.extend([b, b + 1, b.saturating_sub(1)]);
        }
    }
    cuts.push(lay.data_offset);
    // Inside the data: each tensor's start and middle, and the last byte.
    let starts: Vec<usize> = lay.tensors.iter().map(|t| t.2).collect();
    for (i, &s) in starts.iter().enumerate().filter(|(i, _)| keep(*i)) {
        let end = starts.get(i + 1).copied().unwrap_or(base.len());
        cuts.extend([s, s + (end - s) / 2]);
    }
    cuts.push(base.len() - 1);
    cuts.sort_unstable();
    cuts.dedup();
    for n in cuts.into_iter().filter(|&n| n < base.len()) {
        cases.push(Case {
            name: format!("truncated at byte {n}"),
            recipe: Recipe::Truncate(n),
        });
    }
}

fn field_pokes(base: &[u8], lay: &Layout, keep: &dyn Fn(usize) -> bool, cases: &mut Vec<Case>) {
    let kept = |label: &str| -> bool {
        let prefix = |t: &(String, u32, usize)| label.starts_with(&format!("{}:", t.0));
        lay.tensors.iter().position(prefix).is_none_or(keep)
    };
    for f in lay.fields.iter().filter(|f| kept(&f.label)) {
        let original = read(base, f.at, f.width);
        for value in hostile_values(f, original) {
            cases.push(Case {
                name: format!("{} = {value} (was {original})", f.label),
                recipe: Recipe::Poke {
                    at: f.at,
                    width: f.width,
                    value,
                },
            });
        }
    }
}

fn hyperparameters(lay: &Layout, cases: &mut Vec<Case>) {
    let u32s = [0u64, 1, 3, 7, 255, 65_535, (1 << 31) - 1, (1 << 32) - 1];
    let f32s: [f32; 7] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -1.0,
        1e38,
        1e-38,
    ];
    for (key, at, ty) in &lay.scalars {
        match ty {
            4 | 5 => {
                for v in u32s {
                    let name = format!("{key} = {v}");
                    let recipe = Recipe::Poke {
                        at: *at,
                        width: 4,
                        value: v,
                    };
                    cases.push(Case { name, recipe });
                }
            }
            6 => {
                for v in f32s {
                    let name = format!("{key} = {v}");
                    let recipe = Recipe::Poke {
                        at: *at,
                        width: 4,
                        value: u64::from(v.to_bits()),
                    };
                    cases.push(Case { name, recipe });
                }
            }
            _ => {}
        }
    }
    let arch = "llama";
    for v in ABSURD_BLOCK_COUNTS {
        for key in [
            "block_count",
            "context_length",
            "embedding_length",
            "vocab_size",
        ] {
            cases.push(Case {
                name: format!("{arch}.{key} = {v} (u64)"),
                recipe: Recipe::Rewrite {
                    key: format!("{arch}.{key}"),
                    value: MetaValue::U64(v),
                },
            });
        }
    }
}

/// NaN and Inf written over the start of a sample of tensors: f16 and f32
/// NaN (all ones), f16 +Inf pairs (0x7c00), f32 +Inf.
fn weights(lay: &Layout, file_len: usize, cases: &mut Vec<Case>) {
    let patterns: [(&str, Vec<u8>); 3] = [
        ("NaN", vec![0xff]),
        ("f16 Inf", vec![0x00, 0x7c]),
        ("f32 Inf", vec![0x00, 0x00, 0x80, 0x7f]),
    ];
    for (i, (name, _, at)) in lay.tensors.iter().enumerate() {
        if !i.is_multiple_of(29) && !name.starts_with("output_norm") {
            continue;
        }
        for (what, pattern) in &patterns {
            cases.push(Case {
                name: format!("{what} over the start of {name}"),
                recipe: Recipe::Fill {
                    at: *at,
                    len: 256.min(file_len - at),
                    pattern: pattern.clone(),
                },
            });
        }
    }
}

/// Seeded random damage to the header, metadata and tensor table.
fn random_damage(lay: &Layout, cases: &mut Vec<Case>) {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    for i in 0..400 {
        let n = rng.random_range(1..=8);
        let pairs = (0..n)
            .map(|_| (rng.random_range(0..lay.data_offset), rng.random::<u8>()))
            .collect();
        cases.push(Case {
            name: format!("random damage {i}"),
            recipe: Recipe::Bytes(pairs),
        });
    }
}

//! A small, independent GGUF v3 header reader and re-writer for test fixtures:
//! bad and hostile model files (M0-W-1200, M0-W-1210, M0-W-1211, M0-W-1212,
//! M0-W-1360, M0-W-1410, EXT-004) made from the reference model by patching bytes
//! or rewriting metadata. It is deliberately not the worker's reader, so the
//! suite does not test the worker's parser with itself.
//!
//! Layout (ggml's gguf.md): magic `GGUF`, u32 version, u64 tensor count, u64 KV
//! count; KVs (string key, u32 type, value); tensor infos (string name, u32 n_dims,
//! u64 dims, u32 type, u64 offset); padding to `general.alignment` (default 32);
//! tensor data.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

/// One metadata entry, its value kept as raw bytes.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub vtype: u32,
    pub raw: Vec<u8>,
    /// Byte offset of the key's length field in the original file.
    pub at: usize,
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ttype: u32,
    pub offset: u64,
    /// Byte offsets in the original file of the first dim, the type and the offset fields.
    pub dims_at: usize,
    pub type_at: usize,
    pub offset_at: usize,
}

#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: usize,
    pub bytes: Vec<u8>,
    /// Tensor data appended after the original data section by `add_tensor`.
    pub extra_data: Vec<u8>,
}

/// GGUF value types (gguf.md's `gguf_metadata_value_type`) this crate writes.
pub const U32: u32 = 4;
pub const I32: u32 = 5;
pub const F32: u32 = 6;
pub const BOOL: u32 = 7;
pub const STRING: u32 = 8;
pub const ARRAY: u32 = 9;
pub const U64: u32 = 10;

fn scalar_size(t: u32) -> Option<usize> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// (elements per block, bytes per block) of a ggml type.
pub fn type_block(t: u32) -> Option<(u64, u64)> {
    Some(match t {
        0 => (1, 4),
        1 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        6 => (32, 22),
        7 => (32, 24),
        8 => (32, 34),
        9 => (32, 36),
        10 => (256, 84),
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        24 => (1, 1),
        25 => (1, 2),
        26 => (1, 4),
        27 | 28 => (1, 8),
        30 => (1, 2),
        39 => (32, 17),
        _ => return None,
    })
}

struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl Cur<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self
            .p
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| anyhow!("read past end at {}", self.p))?;
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()? as usize;
        Ok(String::from_utf8(self.take(n)?.to_vec())?)
    }
    fn skip_value(&mut self, t: u32) -> Result<()> {
        match t {
            STRING => {
                let n = self.u64()? as usize;
                self.take(n)?;
            }
            ARRAY => {
                let et = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.skip_value(et)?;
                }
            }
            t => {
                self.take(scalar_size(t).ok_or_else(|| anyhow!("unknown value type {t}"))?)?;
            }
        }
        Ok(())
    }
}

impl Gguf {
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(bytes)
    }

    /// The metadata and tensor infos only, reading as little of the file as it
    /// takes (a synthetic model can be gigabytes). `bytes` then holds the header
    /// alone: `write` and the tensor data are not available.
    pub fn read_header(path: &Path) -> Result<Self> {
        use std::io::Read;
        let mut f =
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        let len = f.metadata()?.len();
        let mut want = 1u64 << 20;
        let mut bytes = Vec::new();
        loop {
            let target = want.min(len);
            (&mut f)
                .take(target - bytes.len() as u64)
                .read_to_end(&mut bytes)?;
            match Self::parse(bytes.clone()) {
                Ok(g) => return Ok(g),
                Err(_) if target < len => want *= 4,
                Err(e) => return Err(e.context(format!("parsing {}", path.display()))),
            }
        }
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Self> {
        let mut c = Cur { b: &bytes, p: 0 };
        if c.take(4)? != b"GGUF" {
            bail!("not a GGUF file");
        }
        let version = c.u32()?;
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        let mut kvs = Vec::new();
        for _ in 0..n_kv {
            let at = c.p;
            let key = c.string()?;
            let vtype = c.u32()?;
            let start = c.p;
            c.skip_value(vtype)?;
            kvs.push(Kv {
                key,
                vtype,
                raw: bytes[start..c.p].to_vec(),
                at,
            });
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let nd = c.u32()?;
            let dims_at = c.p;
            let dims = (0..nd).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
            let type_at = c.p;
            let ttype = c.u32()?;
            let offset_at = c.p;
            let offset = c.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ttype,
                offset,
                dims_at,
                type_at,
                offset_at,
            });
        }
        let alignment = kvs
            .iter()
            .find(|k| k.key == "general.alignment")
            .map(|k| u32::from_le_bytes(k.raw[..4].try_into().unwrap()) as u64)
            .unwrap_or(32);
        let data_offset = c.p.div_ceil(alignment as usize) * alignment as usize;
        Ok(Self {
            version,
            kvs,
            tensors,
            alignment,
            data_offset,
            bytes,
            extra_data: Vec::new(),
        })
    }

    pub fn kv(&self, key: &str) -> Option<&Kv> {
        self.kvs.iter().find(|k| k.key == key)
    }

    pub fn string(&self, key: &str) -> Option<String> {
        let kv = self.kv(key).filter(|k| k.vtype == STRING)?;
        String::from_utf8(kv.raw[8..].to_vec()).ok()
    }

    pub fn u64_value(&self, key: &str) -> Option<u64> {
        let kv = self.kv(key)?;
        Some(match kv.vtype {
            4 => u32::from_le_bytes(kv.raw[..4].try_into().ok()?) as u64,
            5 => i32::from_le_bytes(kv.raw[..4].try_into().ok()?) as u64,
            10 | 11 => u64::from_le_bytes(kv.raw[..8].try_into().ok()?),
            _ => return None,
        })
    }

    /// Element count of an array value.
    pub fn array_len(&self, key: &str) -> Option<u64> {
        let kv = self.kv(key).filter(|k| k.vtype == ARRAY)?;
        Some(u64::from_le_bytes(kv.raw[4..12].try_into().ok()?))
    }

    pub fn tensor_bytes(t: &TensorInfo) -> Option<u64> {
        let (block, size) = type_block(t.ttype)?;
        let n: u64 = t.dims.iter().product();
        Some(n / block * size)
    }

    /// Sum of every tensor's stored bytes.
    pub fn total_tensor_bytes(&self) -> Result<u64> {
        self.tensors
            .iter()
            .map(|t| {
                Self::tensor_bytes(t)
                    .ok_or_else(|| anyhow!("tensor {} has unknown type {}", t.name, t.ttype))
            })
            .sum()
    }

    /// The file re-serialized from the (possibly edited) KVs and tensor infos.
    pub fn write(&self) -> Vec<u8> {
        let tensors = self.tensors.iter().map(|t| TensorEntry {
            name: &t.name,
            dims: &t.dims,
            ttype: t.ttype,
            offset: t.offset,
        });
        let mut out = write_header(self.version, &self.kvs, tensors, self.alignment);
        out.extend_from_slice(self.bytes.get(self.data_offset..).unwrap_or_default());
        out.extend_from_slice(&self.extra_data);
        out
    }

    /// Appends an F32 tensor (aligned after everything else) with the given values.
    pub fn add_f32_tensor(&mut self, name: &str, values: &[f32]) {
        let a = self.alignment as usize;
        let data_len = self.bytes.len() - self.data_offset;
        let pad =
            (data_len + self.extra_data.len()).div_ceil(a) * a - (data_len + self.extra_data.len());
        self.extra_data.extend(std::iter::repeat_n(0u8, pad));
        let offset = (data_len + self.extra_data.len()) as u64;
        self.extra_data
            .extend(values.iter().flat_map(|v| v.to_le_bytes()));
        self.tensors.push(TensorInfo {
            name: name.into(),
            dims: vec![values.len() as u64],
            ttype: 0,
            offset,
            dims_at: 0,
            type_at: 0,
            offset_at: 0,
        });
    }

    pub fn set_string(&mut self, key: &str, value: &str) -> Result<()> {
        let kv = self
            .kvs
            .iter_mut()
            .find(|k| k.key == key)
            .ok_or_else(|| anyhow!("no key {key}"))?;
        let mut raw = Vec::new();
        put_string(&mut raw, value);
        kv.vtype = STRING;
        kv.raw = raw;
        Ok(())
    }

    pub fn remove_key(&mut self, key: &str) -> Result<()> {
        let before = self.kvs.len();
        self.kvs.retain(|k| k.key != key);
        if self.kvs.len() == before {
            bail!("no key {key}");
        }
        Ok(())
    }

    /// Renames every key starting with `from` to start with `to` (e.g. `llama.` -> `qwen2.`).
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        for kv in &mut self.kvs {
            if let Some(rest) = kv.key.strip_prefix(from) {
                kv.key = format!("{to}{rest}");
            }
        }
    }
}

/// A tensor's entry in a header.
pub struct TensorEntry<'a> {
    pub name: &'a str,
    /// ggml order (ne0 first).
    pub dims: &'a [u64],
    pub ttype: u32,
    /// From the start of the data section.
    pub offset: u64,
}

/// A header up to the data section, padded to `alignment` (gguf.md's layout):
/// magic, version, counts, the KVs, the tensor infos. The one writer of both
/// the fixtures' re-written files and the synthetic models (`synth`).
pub fn write_header<'a>(
    version: u32,
    kvs: &[Kv],
    tensors: impl ExactSizeIterator<Item = TensorEntry<'a>>,
    alignment: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        put_string(&mut out, &kv.key);
        out.extend_from_slice(&kv.vtype.to_le_bytes());
        out.extend_from_slice(&kv.raw);
    }
    for t in tensors {
        put_string(&mut out, t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ttype.to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    let a = alignment as usize;
    out.resize(out.len().div_ceil(a) * a, 0);
    out
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A new metadata entry (not from a file: `at` is 0).
pub fn kv(key: &str, vtype: u32, raw: Vec<u8>) -> Kv {
    Kv {
        key: key.into(),
        vtype,
        raw,
        at: 0,
    }
}

/// A string value's bytes: its u64 length, then its UTF-8.
pub fn string_raw(s: &str) -> Vec<u8> {
    let mut raw = Vec::with_capacity(8 + s.len());
    put_string(&mut raw, s);
    raw
}

/// An array value's bytes: element type, count, then each element's bytes.
pub fn array_raw(elem: u32, items: impl ExactSizeIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut raw = elem.to_le_bytes().to_vec();
    raw.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for i in items {
        raw.extend(i);
    }
    raw
}

/// Overwrites bytes at `at` in a copy.
pub fn patched(bytes: &[u8], at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + with.len()].copy_from_slice(with);
    b
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny valid file: two KVs and two F32 tensors.
    pub fn tiny() -> Vec<u8> {
        let mut g = Vec::new();
        g.extend_from_slice(b"GGUF");
        g.extend_from_slice(&3u32.to_le_bytes());
        g.extend_from_slice(&2u64.to_le_bytes());
        g.extend_from_slice(&2u64.to_le_bytes());
        put_string(&mut g, "general.architecture");
        g.extend_from_slice(&STRING.to_le_bytes());
        put_string(&mut g, "llama");
        put_string(&mut g, "llama.block_count");
        g.extend_from_slice(&4u32.to_le_bytes());
        g.extend_from_slice(&7u32.to_le_bytes());
        for (name, off) in [("a", 0u64), ("b", 32)] {
            put_string(&mut g, name);
            g.extend_from_slice(&1u32.to_le_bytes());
            g.extend_from_slice(&4u64.to_le_bytes());
            g.extend_from_slice(&0u32.to_le_bytes());
            g.extend_from_slice(&off.to_le_bytes());
        }
        g.resize(g.len().div_ceil(32) * 32, 0);
        g.extend(std::iter::repeat_n(1u8, 48));
        g
    }

    #[test]
    fn parses_and_rewrites_byte_identically() {
        let g = Gguf::parse(tiny()).unwrap();
        assert_eq!(g.string("general.architecture").as_deref(), Some("llama"));
        assert_eq!(g.u64_value("llama.block_count"), Some(7));
        assert_eq!(g.tensors.len(), 2);
        assert_eq!(g.total_tensor_bytes().unwrap(), 32);
        assert_eq!(g.write(), tiny());
    }

    #[test]
    fn edits_survive_a_round_trip() {
        let mut g = Gguf::parse(tiny()).unwrap();
        g.set_string("general.architecture", "gpt-oss").unwrap();
        g.rename_prefix("llama.", "qwen2.");
        let back = Gguf::parse(g.write()).unwrap();
        assert_eq!(
            back.string("general.architecture").as_deref(),
            Some("gpt-oss")
        );
        assert_eq!(back.u64_value("qwen2.block_count"), Some(7));
        assert_eq!(&back.bytes[back.data_offset..], &tiny()[g.data_offset..]);
        let mut g = back;
        g.add_f32_tensor("bias", &[1.0, 2.0]);
        let with = Gguf::parse(g.write()).unwrap();
        let t = with.tensors.last().unwrap();
        assert_eq!(
            (t.name.as_str(), t.dims.as_slice(), t.offset % 32),
            ("bias", &[2u64][..], 0)
        );
        let at = with.data_offset + t.offset as usize;
        assert_eq!(&with.bytes[at..at + 8], &[0, 0, 128, 63, 0, 0, 0, 64]);
        g.remove_key("qwen2.block_count").unwrap();
        assert!(g.remove_key("nope").is_err());
    }

    #[test]
    fn recorded_offsets_point_at_the_fields() {
        let g = Gguf::parse(tiny()).unwrap();
        let t = &g.tensors[1];
        assert_eq!(
            u64::from_le_bytes(g.bytes[t.offset_at..t.offset_at + 8].try_into().unwrap()),
            32
        );
        assert_eq!(
            u64::from_le_bytes(g.bytes[t.dims_at..t.dims_at + 8].try_into().unwrap()),
            4
        );
        let p = patched(&g.bytes, t.type_at, &99u32.to_le_bytes());
        assert_eq!(Gguf::parse(p).unwrap().tensors[1].ttype, 99);
    }
}

//! Writing GGUF v3 files: for tests, the synthetic-model generator and
//! hostile-file tests.
//!
//! The writer lays tensors out itself (in insertion order, each at the next
//! aligned offset) so ordinary callers cannot produce a bad file by mistake.
//! Hostile-file tests need bad files on purpose, so the writer checks only
//! what it needs to serialise: it writes metadata keys as given (duplicates
//! included), accepts any nonzero alignment, and [`GgufWriter::raw_tensor`]
//! adds a tensor info entry with arbitrary dims, type id and offset.

use std::io::{self, Write};

use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION};
use super::value::{type_id, MetaValue};
use crate::quant::GgmlType;

/// Builds a GGUF v3 file in memory and serialises it.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorEntry>,
}

#[derive(Clone, Debug)]
enum TensorEntry {
    /// A tensor with data, placed by the writer.
    Data {
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        data: Vec<u8>,
    },
    /// A tensor info written verbatim, with no data of its own.
    Raw {
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        offset: u64,
    },
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment of 32.
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Aligns the data section and each tensor to `a` bytes. Unless `a` is
    /// 32, `general.alignment` is written first (unless the caller already
    /// added that key). `a` need not be a power of two, so that tests can
    /// write files the reader must refuse.
    ///
    /// # Panics
    /// If `a` is zero or does not fit in the u32 the key is stored as.
    pub fn alignment(mut self, a: u64) -> Self {
        assert!(
            a != 0 && u32::try_from(a).is_ok(),
            "GGUF alignment {a} must be nonzero and fit in a u32"
        );
        self.alignment = a;
        self
    }

    /// Appends a metadata entry. Arrays must be homogeneous (each nested
    /// array may have its own element type); an empty array is written with
    /// element type u8.
    pub fn metadata(&mut self, key: &str, v: MetaValue) -> &mut Self {
        check_homogeneous(&v);
        self.metadata.push((key.to_owned(), v));
        self
    }

    /// Appends a tensor; `dims` in ggml order (ne0 first).
    ///
    /// # Panics
    /// If `data.len()` is not the size of `dims` elements of `ty`.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let expected = n_elements.and_then(|n| ty.bytes_for(n));
        assert_eq!(
            expected,
            Some(data.len() as u64),
            "tensor '{name}': {} bytes of data for dims {dims:?} of type {ty}",
            data.len()
        );
        self.tensors.push(TensorEntry::Data {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Appends a tensor info entry exactly as given, with no data: the way
    /// to write unknown types, bad dims, misaligned or overlapping offsets.
    /// `offset` is relative to the data section, where the writer places the
    /// [`Self::tensor`] tensors from offset 0 in insertion order.
    pub fn raw_tensor(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.tensors.push(TensorEntry::Raw {
            name: name.to_owned(),
            dims: dims.to_vec(),
            type_id,
            offset,
        });
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec<u8> cannot fail");
        out
    }

    /// Streams the file to `w`; tensor data is written from the buffers
    /// given, never copied into one big buffer.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut w = CountingWriter {
            inner: w,
            written: 0,
        };
        let implicit_alignment = self.implicit_alignment_entry();
        let kv_count = self.metadata.len() + usize::from(implicit_alignment.is_some());

        w.put(&GGUF_MAGIC.to_le_bytes())?;
        w.put(&GGUF_VERSION.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(kv_count as u64).to_le_bytes())?;

        if let Some(value) = &implicit_alignment {
            write_kv(&mut w, ALIGNMENT_KEY, value)?;
        }
        for (key, value) in &self.metadata {
            write_kv(&mut w, key, value)?;
        }
        for (entry, offset) in self.tensors.iter().zip(self.data_offsets()) {
            write_tensor_info(&mut w, entry, offset)?;
        }
        w.pad_to(self.alignment)?;

        // Each tensor is followed by padding to the next aligned offset, as
        // ggml writes it; data offsets are relative to here, itself aligned.
        for entry in &self.tensors {
            if let TensorEntry::Data { data, .. } = entry {
                w.put(data)?;
                w.pad_to(self.alignment)?;
            }
        }
        w.inner.flush()
    }

    /// `general.alignment` to write first, when the alignment is not the
    /// default and the caller did not write the key themselves.
    fn implicit_alignment_entry(&self) -> Option<MetaValue> {
        let explicit = self.metadata.iter().any(|(k, _)| k == ALIGNMENT_KEY);
        // `alignment()` checked that it fits in a u32.
        (self.alignment != DEFAULT_ALIGNMENT && !explicit)
            .then_some(MetaValue::U32(self.alignment as u32))
    }

    /// The data-section offset of each tensor entry, in order.
    fn data_offsets(&self) -> Vec<u64> {
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|entry| match entry {
                TensorEntry::Data { data, .. } => {
                    let offset = next;
                    next = align_up(offset + data.len() as u64, self.alignment);
                    offset
                }
                TensorEntry::Raw { offset, .. } => *offset,
            })
            .collect()
    }
}

fn align_up(n: u64, alignment: u64) -> u64 {
    n.next_multiple_of(alignment)
}

/// Panics on an array whose elements are not all of one type: GGUF stores
/// one element type per array, so such a value cannot be written.
fn check_homogeneous(v: &MetaValue) {
    if let MetaValue::Array(items) = v {
        if let Some(first) = items.first() {
            assert!(
                items.iter().all(|i| i.type_id() == first.type_id()),
                "GGUF arrays must be homogeneous, got a mix including {}",
                first.type_name()
            );
        }
        items.iter().for_each(check_homogeneous);
    }
}

/// Counts bytes written so padding can be computed while streaming.
struct CountingWriter<'w, W: Write> {
    inner: &'w mut W,
    written: u64,
}

impl<W: Write> CountingWriter<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut pad = align_up(self.written, alignment) - self.written;
        while pad > 0 {
            let n = pad.min(ZEROS.len() as u64);
            self.put(&ZEROS[..n as usize])?;
            pad -= n;
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> io::Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }
}

fn write_kv<W: Write>(w: &mut CountingWriter<W>, key: &str, value: &MetaValue) -> io::Result<()> {
    w.string(key)?;
    w.put(&value.type_id().to_le_bytes())?;
    write_value(w, value)
}

/// Writes a value's payload (its type id is written by the caller).
fn write_value<W: Write>(w: &mut CountingWriter<W>, value: &MetaValue) -> io::Result<()> {
    match value {
        MetaValue::U8(v) => w.put(&v.to_le_bytes()),
        MetaValue::I8(v) => w.put(&v.to_le_bytes()),
        MetaValue::U16(v) => w.put(&v.to_le_bytes()),
        MetaValue::I16(v) => w.put(&v.to_le_bytes()),
        MetaValue::U32(v) => w.put(&v.to_le_bytes()),
        MetaValue::I32(v) => w.put(&v.to_le_bytes()),
        MetaValue::U64(v) => w.put(&v.to_le_bytes()),
        MetaValue::I64(v) => w.put(&v.to_le_bytes()),
        MetaValue::F32(v) => w.put(&v.to_le_bytes()),
        MetaValue::F64(v) => w.put(&v.to_le_bytes()),
        MetaValue::Bool(v) => w.put(&[u8::from(*v)]),
        MetaValue::String(s) => w.string(s),
        MetaValue::Array(items) => {
            let elem_ty = items.first().map_or(type_id::U8, MetaValue::type_id);
            w.put(&elem_ty.to_le_bytes())?;
            w.put(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|item| write_value(w, item))
        }
    }
}

fn write_tensor_info<W: Write>(
    w: &mut CountingWriter<W>,
    entry: &TensorEntry,
    offset: u64,
) -> io::Result<()> {
    let (name, dims, type_id) = match entry {
        TensorEntry::Data { name, dims, ty, .. } => (name, dims, ty.id()),
        TensorEntry::Raw {
            name,
            dims,
            type_id,
            ..
        } => (name, dims, *type_id),
    };
    w.string(name)?;
    w.put(&(dims.len() as u32).to_le_bytes())?;
    for d in dims {
        w.put(&d.to_le_bytes())?;
    }
    w.put(&type_id.to_le_bytes())?;
    w.put(&offset.to_le_bytes())
}

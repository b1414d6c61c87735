//! Parsing and validating a GGUF v3 file.
//!
//! The file is untrusted input: every read goes through a bounds-checked
//! [`Cursor`], every count is capped and checked against the bytes left
//! before anything is allocated from it, and every tensor is checked to lie
//! whole, aligned and alone inside the data section. Any defect is a typed
//! [`GgufError`], never a panic.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::error::GgufError;
use super::value::{type_id, MetaValue, Metadata};
use crate::quant::GgmlType;

/// "GGUF" read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// The only version read; v1 used u32 counts and v2 is long obsolete.
pub(crate) const GGUF_VERSION: u32 = 3;
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";

/// Caps on what a file may claim, so that a hostile file cannot make the
/// reader allocate or loop beyond a fixed budget. A struct rather than
/// constants so tests can shrink a cap that would take gigabytes to reach.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Largest tensor count accepted: fewer than 10 000 (M0-W-1210).
    pub tensors: u64,
    pub kv: u64,
    pub string_len: u64,
    pub array_len: u64,
    /// Array elements across all metadata. Each element becomes a 32-byte
    /// `MetaValue`, so this bounds the heap a file full of u8 arrays could
    /// claim (~1 GiB), independent of the file's size. Real tokenizers hold
    /// a few million at most.
    pub array_elems_total: u64,
    /// A top-level array is depth 1; real files never nest at all.
    pub nesting: usize,
}

pub(crate) const LIMITS: Limits = Limits {
    tensors: 9_999,
    kv: 65_536,
    string_len: 16 << 20,
    array_len: 16 << 20,
    array_elems_total: 32 << 20,
    nesting: 4,
};

/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;

/// Fewest bytes one metadata entry can take: key length, value type, a u8.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes one tensor info can take: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

type Result<T> = std::result::Result<T, GgufError>;

/// One tensor's entry in the tensor info table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne0) is the contiguous dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

/// A parsed, validated GGUF file and the bytes its tensors live in.
pub struct GgufFile {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    index: HashMap<String, usize>,
    storage: Storage,
}

/// Where the file's bytes are: a read-only map of the file on disk (weights
/// are gigabytes; the page cache holds them, not the heap) or an owned buffer.
enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses it. Nothing but the metadata and
    /// tensor table is copied to the heap. For a reader done with the file
    /// when it returns (the CUDA upload, the tools): the map reads the file
    /// as it is now, so whoever keeps it must not outlive a replacement of
    /// the file; [`Self::read`] is for one that does.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only, so we never write through it. Another
        // process truncating or rewriting the model file while it is mapped
        // would change the bytes under us (or raise SIGBUS); callers hold the
        // map only while loading, and a file replaced mid-load is not served.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mapped(map))
    }

    /// Reads `path` into memory in one go and parses it: one heap copy of
    /// the file, which nothing done to the file afterwards (truncated,
    /// overwritten in place, deleted) can change or take away.
    pub fn read(path: &Path) -> Result<GgufFile> {
        // std::fs::read sizes the buffer from the file's length up front:
        // one allocation, no copy beyond the one kept.
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(bytes)
    }

    /// Parses an existing read-only map (for instance a private copy-on-write
    /// map that a test has altered) with the same validation as [`Self::open`].
    pub fn from_map(map: Mmap) -> Result<GgufFile> {
        Self::from_storage(Storage::Mapped(map))
    }

    /// Parses an in-memory file with the same validation as [`Self::open`].
    /// The buffer only has byte alignment, so read tensor values with
    /// `from_le_bytes`, never by casting the slice.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        let p = parse(storage.bytes())?;
        Ok(GgufFile {
            version: p.version,
            metadata: p.metadata,
            tensors: p.tensors,
            alignment: p.alignment,
            data_offset: p.data_offset,
            index: p.index,
            storage,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The `t.n_bytes` bytes of tensor `t`.
    ///
    /// # Panics
    /// If `t` is not one of this file's tensors and lies outside its data.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(t.offset)
            .and_then(|start| Some(start..start.checked_add(t.n_bytes)?))
            .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?));
        range
            .and_then(|r| self.storage.bytes().get(r))
            .unwrap_or_else(|| panic!("tensor '{}' is not inside this GGUF file", t.name))
    }

    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// Sum of all tensors' sizes (no overflow: they lie disjoint in the file).
    pub fn tensor_bytes_total(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_len", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_size", &self.file_size())
            .finish()
    }
}

/// A read position in the file that refuses to go past its end.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    max_string_len: u64,
}

/// Describes what was being read, for error messages; only called on failure
/// so the happy path formats nothing.
type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8], max_string_len: u64) -> Self {
        Cursor {
            buf,
            pos: 0,
            max_string_len,
        }
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Fails unless at least `n` more bytes exist; used before allocating
    /// anything sized by a count read from the file.
    fn ensure(&self, n: Option<u64>, what: What) -> Result<()> {
        match n {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(self.truncated(what)),
        }
    }

    fn truncated(&self, what: What) -> GgufError {
        GgufError::Truncated {
            what: what(),
            offset: self.offset(),
        }
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8]> {
        self.ensure(Some(n), what)?;
        // `n <= remaining`, so it fits in usize and the slice is in bounds.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u8(&mut self, what: What) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }
    fn i8(&mut self, what: What) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }
    fn u16(&mut self, what: What) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn i16(&mut self, what: What) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: What) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn i32(&mut self, what: What) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: What) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn i64(&mut self, what: What) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    fn f32(&mut self, what: What) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    fn f64(&mut self, what: What) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A gguf string: u64 byte length, then that many UTF-8 bytes.
    fn string(&mut self, what: What) -> Result<String> {
        let len = self.u64(what)?;
        if len > self.max_string_len {
            return Err(GgufError::StringTooLong {
                len,
                max: self.max_string_len,
            });
        }
        let start = self.offset();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::InvalidUtf8 { offset: start })
    }
}

/// Everything [`GgufFile`] holds except the bytes.
pub(crate) struct Parsed {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
    index: HashMap<String, usize>,
}

fn parse(buf: &[u8]) -> Result<Parsed> {
    parse_with(buf, &LIMITS)
}

pub(crate) fn parse_with(buf: &[u8], limits: &Limits) -> Result<Parsed> {
    let mut c = Cursor::new(buf, limits.string_len);
    let (tensor_count, kv_count) = read_header(&mut c, limits)?;
    let metadata = MetaReader::new(&mut c, limits).read_all(kv_count)?;
    let alignment = read_alignment(&metadata)?;
    let (tensors, index) = read_tensor_infos(&mut c, tensor_count)?;

    // The data section starts at the first aligned offset after the tensor
    // table. A file without tensors may end before that padding.
    let data_offset = c
        .offset()
        .checked_next_multiple_of(alignment)
        .filter(|&o| o <= buf.len() as u64 || tensors.is_empty())
        .ok_or_else(|| c.truncated(&|| "padding before the data section".into()))?;
    let data_len = (buf.len() as u64).saturating_sub(data_offset);
    check_truncation(&tensors, alignment, data_offset, data_len)?;
    check_placement(&tensors, alignment, data_len)?;

    Ok(Parsed {
        version: GGUF_VERSION,
        metadata,
        tensors,
        alignment,
        data_offset,
        index,
    })
}

/// Reads magic, version and the two counts; returns (tensor_count, kv_count).
/// The caps are checked here, before anything is sized from the counts.
fn read_header(c: &mut Cursor, limits: &Limits) -> Result<(u64, u64)> {
    let magic = c.u32(&|| "header magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32(&|| "header version".into())?;
    if version != GGUF_VERSION {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = c.u64(&|| "header tensor count".into())?;
    if tensor_count > limits.tensors {
        return Err(GgufError::TooMany {
            what: "tensors",
            count: tensor_count,
            max: limits.tensors,
        });
    }
    let kv_count = c.u64(&|| "header metadata count".into())?;
    if kv_count > limits.kv {
        return Err(GgufError::TooMany {
            what: "metadata entries",
            count: kv_count,
            max: limits.kv,
        });
    }
    Ok((tensor_count, kv_count))
}

/// Reads the metadata section, counting array elements against the budget.
struct MetaReader<'c, 'a> {
    c: &'c mut Cursor<'a>,
    limits: &'c Limits,
    array_elems: u64,
}

impl<'c, 'a> MetaReader<'c, 'a> {
    fn new(c: &'c mut Cursor<'a>, limits: &'c Limits) -> Self {
        MetaReader {
            c,
            limits,
            array_elems: 0,
        }
    }

    fn read_all(mut self, kv_count: u64) -> Result<Metadata> {
        self.c.ensure(kv_count.checked_mul(MIN_KV_BYTES), &|| {
            format!("{kv_count} metadata entries")
        })?;
        let mut metadata = Metadata::new();
        for i in 0..kv_count {
            let key = self.c.string(&|| format!("key of metadata entry {i}"))?;
            let ty = self.c.u32(&|| format!("value type of key '{key}'"))?;
            let value = self.value(&key, ty, 0)?;
            metadata.insert(&key, value)?;
        }
        Ok(metadata)
    }

    /// Reads one value of type `ty`; `depth` is how many arrays enclose it.
    fn value(&mut self, key: &str, ty: u32, depth: usize) -> Result<MetaValue> {
        let c = &mut *self.c;
        let what: What = &|| format!("value of key '{key}'");
        Ok(match ty {
            type_id::U8 => MetaValue::U8(c.u8(what)?),
            type_id::I8 => MetaValue::I8(c.i8(what)?),
            type_id::U16 => MetaValue::U16(c.u16(what)?),
            type_id::I16 => MetaValue::I16(c.i16(what)?),
            type_id::U32 => MetaValue::U32(c.u32(what)?),
            type_id::I32 => MetaValue::I32(c.i32(what)?),
            type_id::U64 => MetaValue::U64(c.u64(what)?),
            type_id::I64 => MetaValue::I64(c.i64(what)?),
            type_id::F32 => MetaValue::F32(c.f32(what)?),
            type_id::F64 => MetaValue::F64(c.f64(what)?),
            // The spec says 0 or 1; like ggml, any nonzero byte reads as true.
            type_id::BOOL => MetaValue::Bool(c.u8(what)? != 0),
            type_id::STRING => MetaValue::String(c.string(what)?),
            type_id::ARRAY => self.array(key, depth + 1)?,
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    type_id: ty,
                })
            }
        })
    }

    /// Reads an array's element type, count and elements; `depth` counts
    /// this array (1 for a top-level array).
    fn array(&mut self, key: &str, depth: usize) -> Result<MetaValue> {
        if depth > self.limits.nesting {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
            });
        }
        let elem_ty = self
            .c
            .u32(&|| format!("array element type of key '{key}'"))?;
        let count = self.c.u64(&|| format!("array length of key '{key}'"))?;
        let min_elem = min_encoded_len(elem_ty).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            type_id: elem_ty,
        })?;
        self.claim_elements(count)?;
        self.c.ensure(count.checked_mul(min_elem), &|| {
            format!("{count} array elements of key '{key}'")
        })?;
        // `count` is capped and bounded by the bytes left, so this
        // allocation is too.
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(self.value(key, elem_ty, depth)?);
        }
        Ok(MetaValue::Array(items))
    }

    /// Checks `count` against the per-array cap and the file-wide budget.
    fn claim_elements(&mut self, count: u64) -> Result<()> {
        if count > self.limits.array_len {
            return Err(GgufError::TooMany {
                what: "array elements",
                count,
                max: self.limits.array_len,
            });
        }
        // Both terms are capped well below u64::MAX: no overflow.
        self.array_elems += count;
        if self.array_elems > self.limits.array_elems_total {
            return Err(GgufError::TooMany {
                what: "array elements in all metadata",
                count: self.array_elems,
                max: self.limits.array_elems_total,
            });
        }
        Ok(())
    }
}

/// Fewest bytes one value of a type takes in the file, or `None` for an
/// unknown type id.
fn min_encoded_len(ty: u32) -> Option<u64> {
    Some(match ty {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,
        type_id::ARRAY => 4 + 8,
        _ => return None,
    })
}

/// `general.alignment`, if present, must be a u32 nonzero power of two.
fn read_alignment(metadata: &Metadata) -> Result<u64> {
    match metadata.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetaValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(MetaValue::U32(a)) => Err(GgufError::BadAlignment(u64::from(*a))),
        Some(other) => Err(GgufError::WrongType {
            key: ALIGNMENT_KEY.to_owned(),
            expected: "u32",
            found: other.type_name(),
        }),
    }
}

fn read_tensor_infos(
    c: &mut Cursor,
    count: u64,
) -> Result<(Vec<TensorInfo>, HashMap<String, usize>)> {
    c.ensure(count.checked_mul(MIN_TENSOR_INFO_BYTES), &|| {
        format!("{count} tensor infos")
    })?;
    // `count` is capped and bounded by the bytes left.
    let mut tensors = Vec::with_capacity(count as usize);
    let mut index = HashMap::with_capacity(count as usize);
    for i in 0..count {
        let t = read_tensor_info(c, i)?;
        if index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor(t.name));
        }
        tensors.push(t);
    }
    Ok((tensors, index))
}

fn read_tensor_info(c: &mut Cursor, i: u64) -> Result<TensorInfo> {
    let name = c.string(&|| format!("name of tensor {i}"))?;
    let what: What = &|| format!("info of tensor '{name}'");
    let n_dims = c.u32(what)?;
    if n_dims > MAX_DIMS {
        return Err(bad_dims(
            &name,
            format!("{n_dims} dimensions, at most {MAX_DIMS} allowed"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(what)?);
    }
    let type_id = c.u32(what)?;
    let offset = c.u64(what)?;

    let n_elements = element_count(&name, &dims)?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        type_id,
    })?;
    let n_bytes = byte_size(&name, &dims, n_elements, ggml_type)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}

/// Product of the dims; every dim must be at least 1 and the product must
/// not overflow. No dims at all is a scalar, as in ggml.
fn element_count(name: &str, dims: &[u64]) -> Result<u64> {
    if let Some(i) = dims.iter().position(|&d| d == 0) {
        return Err(bad_dims(name, format!("dimension {i} is zero")));
    }
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad_dims(name, format!("element count of {dims:?} overflows u64")))
}

/// Bytes the tensor takes. Each row (ne0 values) must be whole blocks of the
/// type, which ggml requires and which also makes the total whole blocks.
fn byte_size(name: &str, dims: &[u64], n_elements: u64, ty: GgmlType) -> Result<u64> {
    let ne0 = dims.first().copied().unwrap_or(1);
    let block = ty.block_len() as u64;
    if !ne0.is_multiple_of(block) {
        return Err(bad_dims(
            name,
            format!("row length {ne0} is not a multiple of the {ty} block length {block}"),
        ));
    }
    ty.bytes_for(n_elements).ok_or_else(|| {
        bad_dims(
            name,
            format!("byte size of {n_elements} {ty} values overflows u64"),
        )
    })
}

fn bad_dims(name: &str, reason: String) -> GgufError {
    GgufError::BadDims {
        tensor: name.to_owned(),
        reason,
    }
}

/// Every tensor must start aligned, end inside the data section and share
/// no byte with another tensor.
/// A file cut short (the first tensor that runs past the end starts inside
/// the data section, or in the alignment padding right after the cut) is
/// reported as truncated, with the size its tensor table needs; a tensor
/// placed far beyond the end is left to [`check_placement`]'s
/// `TensorOutOfBounds`, since no cut explains it.
fn check_truncation(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    data_len: u64,
) -> Result<()> {
    let end = |t: &TensorInfo| t.offset.checked_add(t.n_bytes);
    let Some(first_out) = tensors
        .iter()
        .filter(|t| end(t).is_none_or(|e| e > data_len))
        .min_by_key(|t| t.offset)
    else {
        return Ok(());
    };
    let needed = tensors
        .iter()
        .try_fold(0u64, |most, t| Some(most.max(end(t)?)))
        .and_then(|most| most.checked_add(data_offset));
    match needed {
        Some(needed) if first_out.offset <= data_len.next_multiple_of(alignment) => {
            Err(GgufError::CutShort {
                file_len: data_offset + data_len,
                needed,
            })
        }
        _ => Ok(()),
    }
}

fn check_placement(tensors: &[TensorInfo], alignment: u64, data_len: u64) -> Result<()> {
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset
            .checked_add(t.n_bytes)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                size: t.n_bytes,
                data_len,
            });
        }
    }
    // Sorted by start, any overlap shows up between neighbours.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // In bounds, so `a.offset + a.n_bytes` cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::TensorOverlap {
                a: a.name.clone(),
                b: b.name.clone(),
            });
        }
    }
    Ok(())
}

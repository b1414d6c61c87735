//! What the CPU backend holds: weights in their stored format (or decoded
//! vectors), row-major f32 activations, and one sequence's f32 KV cache.

use std::sync::Arc;

use crate::backend::{BackendError, KvType};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, GgmlType};

use super::arith::shape_error;

/// A weight as the CPU backend holds it: matrices stay in the file's stored
/// format (in the file's bytes, held in memory); vectors are decoded to f32 once.
pub enum CpuWeight {
    Stored {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        file: Arc<GgufFile>,
        info: TensorInfo,
    },
    Dense {
        values: Vec<f32>,
    },
}

impl CpuWeight {
    pub fn stored(
        file: Arc<GgufFile>,
        info: &TensorInfo,
        rows: usize,
        cols: usize,
    ) -> Result<Self, BackendError> {
        let ty = info.ggml_type;
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| {
            BackendError::ModelLoadFailed(format!(
                "{}: {cols} columns are not whole {ty} blocks",
                info.name
            ))
        })? as usize;
        Ok(CpuWeight::Stored {
            ty,
            rows,
            cols,
            row_bytes,
            file,
            info: info.clone(),
        })
    }

    pub fn dense(file: &GgufFile, info: &TensorInfo, len: usize) -> Result<Self, BackendError> {
        let mut values = vec![0.0; len];
        quant::dequantize(info.ggml_type, file.tensor_data(info), &mut values)
            .map_err(|e| BackendError::ModelLoadFailed(format!("{}: {e}", info.name)))?;
        Ok(CpuWeight::Dense { values })
    }

    pub(super) fn values(&self) -> &[f32] {
        match self {
            CpuWeight::Dense { values } => values,
            CpuWeight::Stored { .. } => &[],
        }
    }

    /// A stored matrix's rows as the products read them; for a dense
    /// vector, an error that `what` is not a matrix.
    pub(super) fn matrix(&self, what: &str) -> Result<StoredMatrix<'_>, BackendError> {
        match self {
            CpuWeight::Stored {
                ty,
                rows,
                cols,
                row_bytes,
                file,
                info,
            } => Ok(StoredMatrix {
                ty: *ty,
                rows: *rows,
                cols: *cols,
                row_bytes: *row_bytes,
                data: file.tensor_data(info),
                name: &info.name,
            }),
            CpuWeight::Dense { .. } => Err(shape_error(&format!("{what} is not a matrix"))),
        }
    }
}

/// A stored matrix: its format, shape and bytes.
pub(super) struct StoredMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    pub name: &'a str,
}

impl<'a> StoredMatrix<'a> {
    /// Row `r`'s stored bytes (`r < rows`).
    pub(super) fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// A row-major f32 matrix.
#[derive(Clone, Debug)]
pub struct CpuBuf {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuBuf {
    pub(super) fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// One sequence's K and V for every layer, `[capacity, kv_dim]` each: the
/// values of `kv_type` (`KvType::round_trip`), kept widened to f32.
pub struct CpuCache {
    pub capacity: usize,
    pub kv_dim: usize,
    pub kv_type: KvType,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl CpuCache {
    /// An f16 cache.
    pub fn new(n_layer: usize, capacity: usize, kv_dim: usize) -> Self {
        Self::of_type(KvType::F16, n_layer, capacity, kv_dim)
    }

    pub fn of_type(kv_type: KvType, n_layer: usize, capacity: usize, kv_dim: usize) -> Self {
        CpuCache {
            capacity,
            kv_dim,
            kv_type,
            k: (0..n_layer).map(|_| vec![0.0; capacity * kv_dim]).collect(),
            v: (0..n_layer).map(|_| vec![0.0; capacity * kv_dim]).collect(),
        }
    }

    pub fn bytes(&self) -> u64 {
        (self.k.len() * 2 * self.capacity * self.kv_dim * 4) as u64
    }

    /// Positions `start..start + n` of every layer, as a cache of `n`
    /// positions of its own (a prefix cache's chunk).
    pub fn span(&self, start: usize, n: usize) -> CpuCache {
        let range = start * self.kv_dim..(start + n) * self.kv_dim;
        CpuCache {
            capacity: n,
            kv_dim: self.kv_dim,
            kv_type: self.kv_type,
            k: self.k.iter().map(|l| l[range.clone()].to_vec()).collect(),
            v: self.v.iter().map(|l| l[range.clone()].to_vec()).collect(),
        }
    }

    /// Writes `part`'s positions at `start..` of every layer (`part` from
    /// [`CpuCache::span`] of a cache of the same model; it fits).
    pub fn put(&mut self, start: usize, part: &CpuCache) {
        let range = start * self.kv_dim..(start + part.capacity) * self.kv_dim;
        for (dst, src) in self.k.iter_mut().zip(&part.k) {
            dst[range.clone()].copy_from_slice(src);
        }
        for (dst, src) in self.v.iter_mut().zip(&part.v) {
            dst[range.clone()].copy_from_slice(src);
        }
    }
}

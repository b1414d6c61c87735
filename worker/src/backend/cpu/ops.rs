//! The graph operations in plain Rust, f32 arithmetic, spread over the cores
//! with rayon. This is the numerical reference the CUDA kernels are checked
//! against, so each operation is written the obvious way; speed comes only
//! from parallel rows and dot products the compiler can vectorize.

use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::BackendError;
use crate::gguf::{GgufFile, TensorInfo};
use crate::model::config::RopeStyle;
use crate::model::ops::{AttentionShape, MoeWeights, Ops, RopeParams};
use crate::quant::{self, GgmlType};

/// A weight as the CPU backend holds it: matrices stay in the file's stored
/// format (read through the memory map); vectors are decoded to f32 once.
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

    fn values(&self) -> &[f32] {
        match self {
            CpuWeight::Dense { values } => values,
            CpuWeight::Stored { .. } => &[],
        }
    }

    /// A stored matrix's rows as the products read them; for a dense
    /// vector, an error that `what` is not a matrix.
    fn matrix(&self, what: &str) -> Result<StoredMatrix<'_>, BackendError> {
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
struct StoredMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
    name: &'a str,
}

impl<'a> StoredMatrix<'a> {
    /// Row `r`'s stored bytes (`r < rows`).
    fn row(&self, r: usize) -> &'a [u8] {
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
    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// One sequence's K and V for every layer, f32, `[capacity, kv_dim]` each.
pub struct CpuCache {
    pub capacity: usize,
    pub kv_dim: usize,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl CpuCache {
    pub fn new(n_layer: usize, capacity: usize, kv_dim: usize) -> Self {
        CpuCache {
            capacity,
            kv_dim,
            k: (0..n_layer).map(|_| vec![0.0; capacity * kv_dim]).collect(),
            v: (0..n_layer).map(|_| vec![0.0; capacity * kv_dim]).collect(),
        }
    }

    pub fn bytes(&self) -> u64 {
        (self.k.len() * 2 * self.capacity * self.kv_dim * 4) as u64
    }
}

/// Largest head size the attention accepts (stack buffer for one query head).
pub const MAX_HEAD_DIM: usize = 256;

fn round_f16_into(src: &[f32], dst: &mut [f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(v).to_f32();
    }
}

/// Output rows handled by one rayon task in a matrix product.
const ROWS_PER_TASK: usize = 16;

pub struct CpuOps;

fn shape_error(what: &str) -> BackendError {
    BackendError::InferenceFailed(format!("shape mismatch in {what}"))
}

/// f32 dot product through the F32 kernel of `quant::vec_dot`, which uses
/// AVX2/FMA when the CPU has them (this crate is built for baseline x86-64,
/// so a plain loop would get SSE2 only). An f32 slice is that kernel's
/// stored form on a little-endian host.
#[cfg(target_endian = "little")]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: any f32 slice is a valid byte slice of four times its length.
    let bytes =
        unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), std::mem::size_of_val(a)) };
    quant::vec_dot(GgmlType::F32, bytes, b)
}

/// GPT-2's tanh-approximated GELU in f32 (M0-W-1433), written as the
/// kernel writes it: `tanh` of a large or infinite argument is exactly +-1
/// (Rust's `tanh` is not a ratio of exponentials that would give inf/inf), so
/// large positive x give x and large negative x give -0.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x);
    0.5 * x * (1.0 + u.tanh())
}

impl Ops for CpuOps {
    type Weight = CpuWeight;
    type Buf = CpuBuf;
    type Cache = CpuCache;
    type Error = BackendError;

    fn buf(&mut self, rows: usize, cols: usize) -> Result<CpuBuf, BackendError> {
        Ok(CpuBuf {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        })
    }

    fn dims(&self, x: &CpuBuf) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &mut self,
        table: &CpuWeight,
        tokens: &[u32],
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let m = table.matrix("embed: table")?;
        let cols = m.cols;
        if out.rows != tokens.len() || out.cols != cols {
            return Err(shape_error("embed"));
        }
        for (t, &id) in tokens.iter().enumerate() {
            let id = id as usize;
            if id >= m.rows {
                return Err(BackendError::InferenceFailed(format!(
                    "token id {id} is outside the vocabulary ({})",
                    m.rows
                )));
            }
            quant::dequantize(m.ty, m.row(id), &mut out.data[t * cols..(t + 1) * cols])
                .map_err(|e| BackendError::InferenceFailed(e.to_string()))?;
        }
        Ok(())
    }

    fn embed_positions(
        &mut self,
        table: &CpuWeight,
        start_pos: usize,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let end = start_pos + out.rows;
        if let CpuWeight::Stored { rows, .. } = table {
            if end > *rows {
                return Err(BackendError::InferenceFailed(format!(
                    "position {} is past the {rows} learned positions",
                    end - 1
                )));
            }
        }
        let positions: Vec<u32> = (start_pos..end).map(|p| p as u32).collect();
        self.embed(table, &positions, out)
    }

    fn copy_cols(
        &mut self,
        x: &CpuBuf,
        start: usize,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        if out.rows != x.rows || start + out.cols > x.cols {
            return Err(shape_error("copy_cols"));
        }
        for (xr, or) in x
            .data
            .chunks_exact(x.cols)
            .zip(out.data.chunks_exact_mut(out.cols))
        {
            or.copy_from_slice(&xr[start..start + out.cols]);
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &CpuBuf,
        weight: &CpuWeight,
        eps: f32,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let w = weight.values();
        let width = w.len();
        if width == 0 || !x.cols.is_multiple_of(width) || out.rows != x.rows || out.cols != x.cols {
            return Err(shape_error("rms_norm"));
        }
        for (xr, or) in x
            .data
            .chunks_exact(width)
            .zip(out.data.chunks_exact_mut(width))
        {
            let mean_sq = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / width as f64;
            let scale = (1.0 / (mean_sq + eps as f64).sqrt()) as f32;
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * scale * g;
            }
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        x: &CpuBuf,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let m = w.matrix("matmul: weight")?;
        let (rows, cols, ty) = (m.rows, m.cols, m.ty);
        if x.cols != cols || out.rows != x.rows || out.cols != rows {
            return Err(shape_error(&format!(
                "matmul {}: x {}x{}, w {rows}x{cols}, out {}x{}",
                m.name, x.rows, x.cols, out.rows, out.cols
            )));
        }
        let n = x.rows;
        if n == 1 {
            // Decode: one dot product per weight row, decoded in registers.
            let xv = &x.data;
            out.data
                .par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(chunk, o)| {
                    for (i, slot) in o.iter_mut().enumerate() {
                        let r = chunk * ROWS_PER_TASK + i;
                        *slot = quant::vec_dot(ty, m.row(r), xv);
                    }
                });
        } else {
            // Prefill: decode each weight row once, then use it for every token.
            // Results are gathered as [row][token] and transposed afterwards.
            let mut by_row = vec![0.0f32; rows * n];
            by_row
                .par_chunks_mut(ROWS_PER_TASK * n)
                .enumerate()
                .for_each_init(
                    || vec![0.0f32; cols],
                    |decoded, (chunk, o)| {
                        for (i, orow) in o.chunks_exact_mut(n).enumerate() {
                            let r = chunk * ROWS_PER_TASK + i;
                            quant::dequantize(ty, m.row(r), decoded)
                                .expect("row size checked at load");
                            for (t, slot) in orow.iter_mut().enumerate() {
                                *slot = dot_f32(decoded, x.row(t));
                            }
                        }
                    },
                );
            for r in 0..rows {
                for t in 0..n {
                    out.data[t * rows + r] = by_row[r * n + t];
                }
            }
        }
        if let Some(b) = bias {
            let b = b.values();
            if b.len() != rows {
                return Err(shape_error("matmul bias"));
            }
            for orow in out.data.chunks_exact_mut(rows) {
                for (o, &bv) in orow.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
        Ok(())
    }

    fn rope(&mut self, x: &mut CpuBuf, p: RopeParams<'_>) -> Result<(), BackendError> {
        if x.cols != p.n_head * p.head_dim || p.n_rot > p.head_dim || !p.factors_fit() {
            return Err(shape_error("rope"));
        }
        let half = p.n_rot / 2;
        // theta_i = pos * scale * base^(-2i / n_rot) / factor_i, in f64.
        let inv_freq = p.inv_freqs();
        let m = p.mscale as f64;
        for (t, row) in x.data.chunks_exact_mut(x.cols).enumerate() {
            let pos = (p.start_pos + t) as f64 * p.freq_scale as f64;
            for head in row.chunks_exact_mut(p.head_dim) {
                for (i, &f) in inv_freq.iter().enumerate() {
                    let (sin, cos) = (pos * f).sin_cos();
                    let (sin, cos) = (sin * m, cos * m);
                    let (a, b) = match p.style {
                        RopeStyle::Normal => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a] as f64, head[b] as f64);
                    head[a] = (x0 * cos - x1 * sin) as f32;
                    head[b] = (x0 * sin + x1 * cos) as f32;
                }
            }
        }
        Ok(())
    }

    fn attention(
        &mut self,
        q: &CpuBuf,
        k: &CpuBuf,
        v: &CpuBuf,
        cache: &mut CpuCache,
        s: AttentionShape,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        attention(q, k, v, cache, s, None, out)
    }

    fn attention_sinks(
        &mut self,
        q: &CpuBuf,
        k: &CpuBuf,
        v: &CpuBuf,
        cache: &mut CpuCache,
        s: AttentionShape,
        sinks: &CpuWeight,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let sinks = sinks.values();
        if sinks.len() != s.n_head {
            return Err(shape_error("attention sinks"));
        }
        attention(q, k, v, cache, s, Some(sinks), out)
    }

    fn moe(
        &mut self,
        x: &CpuBuf,
        logits: &CpuBuf,
        w: MoeWeights<'_, CpuWeight>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        moe(x, logits, &w, out)
    }

    fn swiglu(&mut self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) -> Result<(), BackendError> {
        if gate.data.len() != up.data.len() || out.data.len() != up.data.len() {
            return Err(shape_error("swiglu"));
        }
        for ((o, &g), &u) in out.data.iter_mut().zip(&gate.data).zip(&up.data) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
        Ok(())
    }

    fn geglu(&mut self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) -> Result<(), BackendError> {
        if gate.data.len() != up.data.len() || out.data.len() != up.data.len() {
            return Err(shape_error("geglu"));
        }
        for ((o, &g), &u) in out.data.iter_mut().zip(&gate.data).zip(&up.data) {
            *o = gelu(g) * u;
        }
        Ok(())
    }

    fn scale(&mut self, x: &mut CpuBuf, factor: f32) -> Result<(), BackendError> {
        for v in x.data.iter_mut() {
            *v *= factor;
        }
        Ok(())
    }

    fn layer_norm(
        &mut self,
        x: &CpuBuf,
        weight: &CpuWeight,
        bias: Option<&CpuWeight>,
        eps: f32,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let w = weight.values();
        let b = bias.map(CpuWeight::values);
        if w.len() != x.cols
            || b.is_some_and(|b| b.len() != x.cols)
            || out.rows != x.rows
            || out.cols != x.cols
            || x.cols == 0
        {
            return Err(shape_error("layer_norm"));
        }
        for (xr, or) in x
            .data
            .chunks_exact(x.cols)
            .zip(out.data.chunks_exact_mut(x.cols))
        {
            // The statistics in f64 (the reference is the more exact side);
            // the normalisation in f32, in the kernel's order of rounding.
            let n = x.cols as f64;
            let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let scale = (1.0 / (var + eps as f64).sqrt()) as f32;
            let mean = mean as f32;
            for (c, (o, &v)) in or.iter_mut().zip(xr).enumerate() {
                let y = (v - mean) * scale * w[c];
                *o = match b {
                    Some(b) => y + b[c],
                    None => y,
                };
            }
        }
        Ok(())
    }

    fn gelu(&mut self, x: &CpuBuf, out: &mut CpuBuf) -> Result<(), BackendError> {
        if out.data.len() != x.data.len() {
            return Err(shape_error("gelu"));
        }
        for (o, &v) in out.data.iter_mut().zip(&x.data) {
            *o = gelu(v);
        }
        Ok(())
    }

    fn add_assign(&mut self, x: &mut CpuBuf, y: &CpuBuf) -> Result<(), BackendError> {
        if x.data.len() != y.data.len() {
            return Err(shape_error("add"));
        }
        for (a, &b) in x.data.iter_mut().zip(&y.data) {
            *a += b;
        }
        Ok(())
    }

    fn take_row(&mut self, x: &CpuBuf, row: usize) -> Result<CpuBuf, BackendError> {
        if row >= x.rows {
            return Err(shape_error("take_row"));
        }
        Ok(CpuBuf {
            rows: 1,
            cols: x.cols,
            data: x.row(row).to_vec(),
        })
    }

    fn to_host(&mut self, x: &CpuBuf, out: &mut Vec<f32>) -> Result<(), BackendError> {
        out.clear();
        out.extend_from_slice(&x.data);
        Ok(())
    }

    /// The CPU backend keeps its own copy of the logits it is handed.
    fn keep_last_row(&mut self, _x: &CpuBuf) -> Result<(), BackendError> {
        Ok(())
    }

    fn row_to_host(
        &mut self,
        x: &CpuBuf,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        if row >= x.rows {
            return Err(shape_error("row_to_host"));
        }
        out.clear();
        out.extend_from_slice(x.row(row));
        Ok(())
    }
}

/// Attention as [`Ops::attention`] computes it, with a sink logit per head
/// in each softmax's denominator where `sinks` is given.
fn attention(
    q: &CpuBuf,
    k: &CpuBuf,
    v: &CpuBuf,
    cache: &mut CpuCache,
    s: AttentionShape,
    sinks: Option<&[f32]>,
    out: &mut CpuBuf,
) -> Result<(), BackendError> {
    let (hd, kvd) = (s.head_dim, s.n_head_kv * s.head_dim);
    if q.cols != s.n_head * hd
        || k.cols != kvd
        || v.cols != kvd
        || cache.kv_dim != kvd
        || out.cols != q.cols
        || q.rows != s.n_tokens
        || out.rows != s.n_tokens
    {
        return Err(shape_error("attention"));
    }
    if hd > MAX_HEAD_DIM {
        return Err(shape_error("attention: head size above 256"));
    }
    let end = s.start_pos + s.n_tokens;
    if end > cache.capacity {
        return Err(BackendError::InferenceFailed(format!(
            "KV cache holds {} positions, {end} needed",
            cache.capacity
        )));
    }
    // The cache holds f16 values, as llama.cpp's (and our CUDA backend's)
    // f16 KV cache does; they are kept widened to f32 here.
    let (kc, vc) = (&mut cache.k[s.layer], &mut cache.v[s.layer]);
    round_f16_into(&k.data, &mut kc[s.start_pos * kvd..end * kvd]);
    round_f16_into(&v.data, &mut vc[s.start_pos * kvd..end * kvd]);
    let (kc, vc) = (&cache.k[s.layer], &cache.v[s.layer]);

    let group = s.n_head / s.n_head_kv;
    let scale = s.scale;
    out.data
        .par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (idx, o)| {
            let (t, h) = (idx / s.n_head, idx % s.n_head);
            let kvh = h / group;
            // ggml multiplies the f16 cache with queries converted to f16, and
            // the f16 values with probabilities converted to f16.
            let mut qv = [0.0f32; MAX_HEAD_DIM];
            let qv = &mut qv[..hd];
            round_f16_into(&q.data[t * q.cols + h * hd..t * q.cols + (h + 1) * hd], qv);
            let (first, n_ctx) = (s.first_visible(t), s.start_pos + t + 1);
            scores.clear();
            scores.extend(
                (first..n_ctx).map(|j| {
                    dot_f32(qv, &kc[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd]) * scale
                }),
            );
            // The sink takes part in the max and the sum, never in the values.
            let sink = sinks.map(|sk| sk[h]);
            let max = scores
                .iter()
                .cloned()
                .chain(sink)
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = sink.map_or(0.0, |sk| (sk - max).exp() as f64);
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc as f64;
            }
            let inv = (1.0 / sum) as f32;
            o.fill(0.0);
            for (j, &p) in (first..).zip(scores.iter()) {
                let vrow = &vc[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd];
                let p = half::f16::from_f32(p * inv).to_f32();
                for (oi, &vi) in o.iter_mut().zip(vrow) {
                    *oi += p * vi;
                }
            }
        });
    Ok(())
}

/// gpt-oss's clamped SwiGLU (llama.cpp's `ggml_swiglu_oai`, alpha 1.702,
/// limit 7): `min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
fn swiglu_oai(g: f32, u: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let g = g.min(LIMIT);
    let u = u.clamp(-LIMIT, LIMIT);
    g / (1.0 + (-ALPHA * g).exp()) * (u + 1.0)
}

/// Row `r` of a stored matrix, decoded to f32.
fn stored_row(w: &CpuWeight, r: usize) -> Result<Vec<f32>, BackendError> {
    let m = w.matrix("moe: bias")?;
    if r >= m.rows {
        return Err(shape_error(m.name));
    }
    let mut out = vec![0.0; m.cols];
    quant::dequantize(m.ty, m.row(r), &mut out)
        .map_err(|e| BackendError::InferenceFailed(format!("{}: {e}", m.name)))?;
    Ok(out)
}

/// `rows` products `w[first + i] . x` of a stored matrix, in parallel.
fn stored_products(
    w: &CpuWeight,
    first: usize,
    rows: usize,
    x: &[f32],
) -> Result<Vec<f32>, BackendError> {
    let m = w.matrix("moe: weight")?;
    if x.len() != m.cols || first + rows > m.rows {
        return Err(shape_error(m.name));
    }
    Ok((first..first + rows)
        .into_par_iter()
        .map(|r| quant::vec_dot(m.ty, m.row(r), x))
        .collect())
}

/// [`Ops::moe`] on the CPU.
fn moe(
    x: &CpuBuf,
    logits: &CpuBuf,
    w: &MoeWeights<'_, CpuWeight>,
    out: &mut CpuBuf,
) -> Result<(), BackendError> {
    let (n_embd, experts, used) = (x.cols, w.experts, w.used);
    let gate_rows = w.gate.matrix("moe: gate")?.rows;
    if experts == 0 || gate_rows % experts != 0 {
        return Err(shape_error("moe gate"));
    }
    let n_ff = gate_rows / experts;
    if out.rows != x.rows || out.cols != n_embd || used == 0 || used > experts {
        return Err(shape_error("moe"));
    }
    if logits.rows != x.rows || logits.cols != experts {
        return Err(shape_error("moe router logits"));
    }
    for t in 0..x.rows {
        let xr = x.row(t);
        let logits = logits.row(t);
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let chosen = &order[..used];
        let max = chosen
            .iter()
            .map(|&e| logits[e])
            .fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = chosen.iter().map(|&e| (logits[e] - max).exp()).collect();
        let sum: f64 = exps.iter().map(|&v| v as f64).sum();
        let acc = &mut out.data[t * n_embd..(t + 1) * n_embd];
        acc.fill(0.0);
        for (&e, &p) in chosen.iter().zip(&exps) {
            let weight = (p as f64 / sum) as f32;
            let gate = stored_products(w.gate, e * n_ff, n_ff, xr)?;
            let up = stored_products(w.up, e * n_ff, n_ff, xr)?;
            let (gb, ub) = (stored_row(w.gate_bias, e)?, stored_row(w.up_bias, e)?);
            let act: Vec<f32> = (0..n_ff)
                .map(|j| swiglu_oai(gate[j] + gb[j], up[j] + ub[j]))
                .collect();
            let down = stored_products(w.down, e * n_embd, n_embd, &act)?;
            let db = stored_row(w.down_bias, e)?;
            for ((a, d), b) in acc.iter_mut().zip(&down).zip(&db) {
                *a += (d + b) * weight;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(values: &[f32]) -> CpuWeight {
        CpuWeight::Dense {
            values: values.to_vec(),
        }
    }

    /// A weight as wide as a head normalises each head of the row on its
    /// own: the same as normalising the heads as rows of their own.
    #[test]
    fn a_narrow_rms_norm_weight_normalises_each_group() {
        let x: Vec<f32> = (0..24)
            .map(|i| (i as f32 * 0.7).sin() * (1 + i / 8) as f32)
            .collect();
        let w = vector(&[1.0, 0.5, 2.0, -1.0, 0.25, 3.0, 1.5, 0.75]);
        let mut whole = CpuBuf {
            rows: 1,
            cols: 24,
            data: vec![0.0; 24],
        };
        CpuOps
            .rms_norm(
                &CpuBuf {
                    rows: 1,
                    cols: 24,
                    data: x.clone(),
                },
                &w,
                1e-6,
                &mut whole,
            )
            .unwrap();
        let mut heads = CpuBuf {
            rows: 3,
            cols: 8,
            data: vec![0.0; 24],
        };
        CpuOps
            .rms_norm(
                &CpuBuf {
                    rows: 3,
                    cols: 8,
                    data: x,
                },
                &w,
                1e-6,
                &mut heads,
            )
            .unwrap();
        assert_eq!(whole.data, heads.data);
        let mut odd = CpuBuf {
            rows: 1,
            cols: 20,
            data: vec![0.0; 20],
        };
        let x20 = CpuBuf {
            rows: 1,
            cols: 20,
            data: vec![1.0; 20],
        };
        assert!(CpuOps.rms_norm(&x20, &w, 1e-6, &mut odd).is_err());
    }

    /// With a sliding window, a query sees only the window's positions: the
    /// same output as attention over just those keys, and different from
    /// attention over all of them.
    #[test]
    fn a_sliding_window_hides_older_positions() {
        let (hd, n) = (4, 6);
        let rows = |seed: f32| -> Vec<f32> {
            (0..n * hd)
                .map(|i| ((i as f32 + seed) * 0.37).sin())
                .collect()
        };
        let (q, k, v) = (rows(0.0), rows(1.0), rows(2.0));
        let shape = AttentionShape {
            layer: 0,
            start_pos: 0,
            n_tokens: n,
            n_head: 1,
            n_head_kv: 1,
            head_dim: hd,
            window: Some(3),
            scale: 0.5,
        };
        let buf = |data: &[f32], rows: usize| CpuBuf {
            rows,
            cols: hd,
            data: data.to_vec(),
        };
        let run = |shape: AttentionShape, q: &[f32], k: &[f32], v: &[f32]| {
            let rows = shape.n_tokens;
            let mut cache = CpuCache::new(1, n, hd);
            let mut out = buf(&vec![0.0; rows * hd], rows);
            CpuOps
                .attention(
                    &buf(q, rows),
                    &buf(k, rows),
                    &buf(v, rows),
                    &mut cache,
                    shape,
                    &mut out,
                )
                .unwrap();
            out.data
        };
        let windowed = run(shape, &q, &k, &v);
        let full = run(
            AttentionShape {
                window: None,
                ..shape
            },
            &q,
            &k,
            &v,
        );
        // The last row (position 5) sees positions 3, 4, 5: attention of a
        // three-token sequence made of just those keys, at its last row.
        let tail = |x: &[f32]| x[3 * hd..].to_vec();
        let three = AttentionShape {
            n_tokens: 3,
            window: None,
            ..shape
        };
        let alone = run(three, &tail(&q), &tail(&k), &tail(&v));
        assert_eq!(&windowed[5 * hd..], &alone[2 * hd..]);
        assert_ne!(&windowed[5 * hd..], &full[5 * hd..]);
        // Rows within the window of the start see everything, as without one.
        assert_eq!(&windowed[..3 * hd], &full[..3 * hd]);
    }

    /// M0-W-1432: the CPU LayerNorm against the formula worked out in f64,
    /// on a plain row, a row far from zero, and a constant row (zero
    /// variance: the output is the bias).
    #[test]
    fn m0_w_1432_cpu_layer_norm_matches_a_hand_computed_f64_value() {
        let rows: [[f32; 4]; 3] = [
            [1.0, 2.0, 3.0, 4.0],
            [1000.5, 1001.0, 999.25, 1003.0],
            [7.0; 4],
        ];
        let (w, b, eps) = ([1.0f32, 0.5, 2.0, -1.0], [0.0f32, 1.0, -1.0, 0.25], 1e-5f32);
        let x = CpuBuf {
            rows: 3,
            cols: 4,
            data: rows.concat(),
        };
        for with_bias in [true, false] {
            let mut out = CpuBuf {
                rows: 3,
                cols: 4,
                data: vec![0.0; 12],
            };
            let bias = vector(&b);
            CpuOps
                .layer_norm(&x, &vector(&w), with_bias.then_some(&bias), eps, &mut out)
                .unwrap();
            for (r, row) in rows.iter().enumerate() {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 4.0;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 4.0;
                for c in 0..4 {
                    let bias = if with_bias { b[c] as f64 } else { 0.0 };
                    let want =
                        (row[c] as f64 - mean) / (var + eps as f64).sqrt() * w[c] as f64 + bias;
                    let got = out.data[r * 4 + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "row {r} col {c}: {got} vs {want}"
                    );
                }
            }
        }
        // Row 0 by hand: mean 2.5, variance 1.25, so (x - 2.5) / sqrt(1.25 + 1e-5).
        let mut out = CpuBuf {
            rows: 1,
            cols: 4,
            data: vec![0.0; 4],
        };
        let x0 = CpuBuf {
            rows: 1,
            cols: 4,
            data: rows[0].to_vec(),
        };
        CpuOps
            .layer_norm(&x0, &vector(&[1.0; 4]), None, eps, &mut out)
            .unwrap();
        let s = 1.0 / (1.25f64 + 1e-5).sqrt();
        for (got, want) in out.data.iter().zip([-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s]) {
            assert!((*got as f64 - want).abs() <= 1e-6, "{got} vs {want}");
        }
        // A bias of the wrong length is a shape error.
        let mut out = CpuBuf {
            rows: 3,
            cols: 4,
            data: vec![0.0; 12],
        };
        assert!(CpuOps
            .layer_norm(&x, &vector(&w), Some(&vector(&[0.0; 3])), eps, &mut out)
            .is_err());
    }

    /// M0-W-1433: the CPU GELU over a dense grid of [-10, 10] against f64
    /// (max absolute error <= 1e-3), and finite, saturated values far outside.
    #[test]
    fn m0_w_1433_cpu_gelu_matches_f64_over_minus_10_to_10() {
        let reference = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        let n = 1usize << 20;
        let mut worst = 0f64;
        for i in 0..n {
            let x = (-10.0 + 20.0 * i as f64 / (n - 1) as f64) as f32;
            worst = worst.max((gelu(x) as f64 - reference(x as f64)).abs());
        }
        assert!(worst <= 1e-3, "max error {worst:e}");
        // Float rounding only: far below the requirement's bound.
        assert!(worst <= 1e-5, "max error {worst:e}");
        assert_eq!(gelu(0.0), 0.0);
        assert!(
            (gelu(1.0) as f64 - 0.841_191_990_608_277).abs() < 1e-6,
            "{}",
            gelu(1.0)
        );
        for x in [1e4f32, 3e12, 1e20, f32::MAX] {
            assert_eq!(gelu(x), x, "gelu({x})");
            assert_eq!(gelu(-x), 0.0, "gelu({})", -x);
        }
        let x = CpuBuf {
            rows: 2,
            cols: 2,
            data: vec![-1.0, 0.0, 1.0, 2.0],
        };
        let mut out = CpuBuf {
            rows: 2,
            cols: 2,
            data: vec![0.0; 4],
        };
        CpuOps.gelu(&x, &mut out).unwrap();
        assert_eq!(
            out.data,
            x.data.iter().map(|&v| gelu(v)).collect::<Vec<_>>()
        );
    }
}

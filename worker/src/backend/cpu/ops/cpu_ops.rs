//! [`CpuOps`]: the [`Ops`] implementation, each operation a loop over rows
//! spread over the cores.

use rayon::prelude::*;

use crate::backend::cpu::ops::arith::{dot_f32, gelu, shape_error, silu};
use crate::backend::cpu::ops::{attention, moe, CpuBuf, CpuCache, CpuWeight};
use crate::backend::BackendError;
use crate::model::config::RopeStyle;
use crate::model::ops::{AttentionShape, MoeWeights, Ops, RopeParams};
use crate::quant;

/// Output rows handled by one rayon task in a matrix product.
const ROWS_PER_TASK: usize = 16;

pub struct CpuOps;

/// `out = act(gate) * up`, elementwise: the gated activations.
fn gated(
    what: &str,
    gate: &CpuBuf,
    up: &CpuBuf,
    out: &mut CpuBuf,
    act: impl Fn(f32) -> f32,
) -> Result<(), BackendError> {
    if gate.data.len() != up.data.len() || out.data.len() != up.data.len() {
        return Err(shape_error(what));
    }
    for ((o, &g), &u) in out.data.iter_mut().zip(&gate.data).zip(&up.data) {
        *o = act(g) * u;
    }
    Ok(())
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
        attention::attention(q, k, v, cache, s, None, out)
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
        attention::attention(q, k, v, cache, s, Some(sinks), out)
    }

    fn moe(
        &mut self,
        x: &CpuBuf,
        logits: &CpuBuf,
        w: MoeWeights<'_, CpuWeight>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        moe::moe(x, logits, &w, out)
    }

    fn swiglu(&mut self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) -> Result<(), BackendError> {
        gated("swiglu", gate, up, out, silu)
    }

    fn geglu(&mut self, gate: &CpuBuf, up: &CpuBuf, out: &mut CpuBuf) -> Result<(), BackendError> {
        gated("geglu", gate, up, out, gelu)
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

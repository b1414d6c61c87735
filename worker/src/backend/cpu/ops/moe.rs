//! The mixture-of-experts feed-forward on the CPU (gpt-oss, Qwen3-MoE):
//! each row's chosen experts, their gated activation and the weighted sum,
//! one stored row at a time.

use rayon::prelude::*;

use crate::backend::BackendError;
use crate::model::ops::{ExpertAct, MoeWeights};
use crate::quant;

use super::arith::{shape_error, silu};
use super::{CpuBuf, CpuWeight};

/// gpt-oss's clamped SwiGLU (llama.cpp's `ggml_swiglu_oai`, alpha 1.702,
/// limit 7): `min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
fn swiglu_oai(g: f32, u: f32) -> f32 {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    let g = g.min(LIMIT);
    let u = u.clamp(-LIMIT, LIMIT);
    g / (1.0 + (-ALPHA * g).exp()) * (u + 1.0)
}

/// The experts' activation of one gate and up value.
fn activation(act: ExpertAct, g: f32, u: f32) -> f32 {
    match act {
        ExpertAct::SwiGlu => silu(g) * u,
        ExpertAct::SwiGluOai => swiglu_oai(g, u),
    }
}

/// Row `r` of a stored bias (zeros where the family has none), decoded to f32.
fn bias_row(w: Option<&CpuWeight>, r: usize, len: usize) -> Result<Vec<f32>, BackendError> {
    match w {
        Some(w) => stored_row(w, r),
        None => Ok(vec![0.0; len]),
    }
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

/// [`Ops::moe`](crate::model::ops::Ops::moe) on the CPU.
pub(super) fn moe(
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
            let gb = bias_row(w.gate_bias, e, n_ff)?;
            let ub = bias_row(w.up_bias, e, n_ff)?;
            let act: Vec<f32> = (0..n_ff)
                .map(|j| activation(w.act, gate[j] + gb[j], up[j] + ub[j]))
                .collect();
            let down = stored_products(w.down, e * n_embd, n_embd, &act)?;
            let db = bias_row(w.down_bias, e, n_embd)?;
            for ((a, d), b) in acc.iter_mut().zip(&down).zip(&db) {
                *a += (d + b) * weight;
            }
        }
    }
    Ok(())
}

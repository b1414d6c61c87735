//! Attention on the CPU: the KV cache's values as its type stores them (f16
//! by default, as llama.cpp's), each query head's softmax over the
//! positions it sees, with a sink logit per head where the model has them
//! (gpt-oss).

use rayon::prelude::*;

use crate::backend::{BackendError, KvType};
use crate::model::ops::AttentionShape;

use super::arith::{dot_f32, shape_error};
use super::{CpuBuf, CpuCache};

/// Largest head size the attention accepts (stack buffer for one query head).
pub const MAX_HEAD_DIM: usize = 256;

fn round_f16_into(src: &[f32], dst: &mut [f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(v).to_f32();
    }
}

/// Stores `src`'s rows in `dst` as the cache's type gives them back.
fn store(kv_type: KvType, src: &[f32], dst: &mut [f32], head_dim: usize) {
    dst.copy_from_slice(src);
    kv_type.round_trip(dst, head_dim);
}

/// Attention as [`Ops::attention`] computes it, with a sink logit per head
/// in each softmax's denominator where `sinks` is given.
pub(super) fn attention(
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
    // The cache holds f16 values (as llama.cpp's and our CUDA backend's f16
    // KV cache does) or a quantized type's, kept widened to f32 here.
    if !cache.kv_type.fits(hd) {
        return Err(shape_error(
            "attention: a quantized KV cache needs heads of whole blocks",
        ));
    }
    let (kc, vc) = (&mut cache.k[s.layer], &mut cache.v[s.layer]);
    store(
        cache.kv_type,
        &k.data,
        &mut kc[s.start_pos * kvd..end * kvd],
        hd,
    );
    store(
        cache.kv_type,
        &v.data,
        &mut vc[s.start_pos * kvd..end * kvd],
        hd,
    );
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

//! Attention on `CudaOps`: the checks every attention call passes, the fused
//! launch before it (`qk_rope_store`: Q's and K's norms and rotations and the
//! KV store; in decode, `mv8q_*` does that as it writes Q, K and V), and
//! attention over the cache, split across the context for long decode steps,
//! splitting its output for the next mat-vec in decode.

use super::buffers::{check_bufs, is_f32_vector, shape_check, CudaBuf, CudaCache, CudaWeight};
use super::products::matmul_args;
use super::CudaOps;
use crate::backend::cuda::kernels::{
    AttentionArgs, AttentionCombineArgs, AttentionSplitArgs, CacheWindow, HeadNormArgs,
    KvStoreArgs, MatVec8ManyCall, MatVec8QkvCall, QkRopeStoreArgs, RopePairs,
};
use crate::backend::cuda::ptr::DevPtr;
use crate::backend::cuda::source::ATT_MAX_HEAD_DIM;
use crate::backend::{BackendError, KvType};
use crate::model::ops::{AttentionShape, Product, QkPrep};

/// Refuses an attention call whose buffers, cache or positions do not fit
/// its shape, or whose cache is not of the kernels' `kv_type` (before
/// anything is launched).
pub(super) fn check_attention(
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    cache: &CudaCache,
    s: &AttentionShape,
    out: &CudaBuf,
    kv_type: KvType,
) -> Result<(), BackendError> {
    let (hd, kvd) = (s.head_dim, s.n_head_kv * s.head_dim);
    let rows_ok = [q.rows, k.rows, v.rows, out.rows]
        .iter()
        .all(|&r| r == s.n_tokens);
    shape_check(
        s.n_tokens == 0
            || s.n_head_kv == 0
            || !s.n_head.is_multiple_of(s.n_head_kv)
            || hd == 0
            || !hd.is_multiple_of(2)
            || hd > ATT_MAX_HEAD_DIM
            || q.cols != s.n_head * hd
            || k.cols != kvd
            || v.cols != kvd
            || !rows_ok
            || out.cols != q.cols
            || cache.n_head_kv != s.n_head_kv
            || cache.head_dim != hd
            || cache.kv_type != kv_type
            || s.layer >= cache.n_layer,
        || format!("attention: {s:?}"),
    )?;
    check_bufs("attention", &[q, k, v, out])?;
    let end = s.start_pos + s.n_tokens;
    if end > cache.capacity {
        return Err(BackendError::Shape(format!(
            "KV cache holds {} positions, {end} needed",
            cache.capacity
        )));
    }
    let cache_bytes = CudaCache::bytes_of(
        cache.kv_type,
        cache.n_layer,
        cache.n_head_kv,
        cache.head_dim,
        cache.capacity,
    );
    shape_check(cache.mem.bytes() < cache_bytes, || {
        format!(
            "attention: a cache of {cache_bytes} bytes in a block of {}",
            cache.mem.bytes()
        )
    })?;
    Ok(())
}

/// The checked head norms of `prep` (Q's weights, K's, epsilon) for heads
/// of `head_dim`, as `qk_rope_store*` take them.
pub(super) fn head_norms(
    prep: &QkPrep<'_, CudaWeight>,
    head_dim: usize,
) -> Result<Option<HeadNormArgs>, BackendError> {
    let Some(n) = &prep.norms else {
        return Ok(None);
    };
    shape_check(
        !is_f32_vector(n.q, head_dim) || !is_f32_vector(n.k, head_dim),
        || {
            format!(
                "attend: head norms of {} and {} values for heads of {head_dim}",
                n.q.cols, n.k.cols
            )
        },
    )?;
    Ok(Some((n.q.vector(), n.k.vector(), n.eps)))
}

impl CudaOps {
    /// Where this call's rows go in the cache (a decode graph reads the
    /// position from the step's slot).
    pub(super) fn cache_window(&self, s: &AttentionShape, cache: &CudaCache) -> CacheWindow {
        CacheWindow {
            start_pos: s.start_pos,
            pos_ptr: self.pos_ptr(),
            capacity: cache.capacity,
        }
    }

    /// `Ops::attention` (with each head's sink logit where `sinks` is
    /// given, checked by the caller): the KV store, then attention.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_attend(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: Option<DevPtr<f32>>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        check_attention(q, k, v, cache, &s, out, self.dev.kernels.kv_type())?;
        let (k_cache, v_cache) = cache.planes_mut(s.layer);
        self.dev.bind()?;
        let store = KvStoreArgs {
            k: k.input(),
            v: v.input(),
            n: s.n_tokens,
            n_head_kv: s.n_head_kv,
            head_dim: s.head_dim,
            window: self.cache_window(&s, cache),
            k_cache,
            v_cache,
        };
        self.dev.kernels.launch(&self.dev.stream, &store)?;
        self.attend_cached(q, cache, s, sinks, out)
    }

    /// The checked `qk_rope_store` launch of an `attend` call, or `None`
    /// where Q and K do not turn alike (then it runs in steps).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn qk_rope_store_args(
        &mut self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: &AttentionShape,
        out: &CudaBuf,
    ) -> Result<Option<QkRopeStoreArgs>, BackendError> {
        check_attention(q, k, v, cache, s, out, self.dev.kernels.kv_type())?;
        let norms = head_norms(prep, s.head_dim)?;
        let rope = match prep.rope {
            Some((pq, pk)) => match (self.rope_args(q, pq)?, self.rope_args(k, pk)?) {
                (Some(a), Some(b)) if a.rotates_like(&b) => Some(a),
                (None, None) => None,
                _ => return Ok(None),
            },
            None => None,
        };
        let (k_cache, v_cache) = cache.planes_mut(s.layer);
        self.dev.bind()?;
        Ok(Some(QkRopeStoreArgs {
            q: q.output(),
            k: k.output(),
            v: v.input(),
            n: s.n_tokens,
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim: s.head_dim,
            norms,
            rope,
            window: self.cache_window(s, cache),
            k_cache,
            v_cache,
        }))
    }

    /// The `mv8q_*` launch of a decode step's Q, K and V products, or none
    /// where it does not apply: more than one row, head norms, a rotation
    /// other than adjacent pairs alike for Q and K, products not all on
    /// `mv8_*` alike, no room for the split x (inside a capture).
    pub(super) fn qkv_rope_call(
        &mut self,
        x: &CudaBuf,
        qkv: &mut [Product<'_, CudaWeight, CudaBuf>; 3],
        prep: &QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: &AttentionShape,
        out: &CudaBuf,
    ) -> Result<Option<MatVec8QkvCall>, BackendError> {
        let (Some((pq, pk)), None, 1) = (prep.rope, &prep.norms, x.rows) else {
            return Ok(None);
        };
        let [q, k, v] = qkv;
        let args = [
            matmul_args(x, q.w, q.bias, q.out)?,
            matmul_args(x, k.w, k.bias, k.out)?,
            matmul_args(x, v.w, v.bias, v.out)?,
        ];
        self.dev.bind()?;
        if !self
            .dev
            .kernels
            .qkv_rope_ready(&args[0], &args[1], &args[2])
        {
            return Ok(None);
        }
        check_attention(
            q.out,
            k.out,
            v.out,
            cache,
            s,
            out,
            self.dev.kernels.kv_type(),
        )?;
        let rope = match (self.rope_args(q.out, pq)?, self.rope_args(k.out, pk)?) {
            (Some(a), Some(b)) if a.rotates_like(&b) && a.pairs == RopePairs::Adjacent => a,
            _ => return Ok(None),
        };
        let Some(x8) = self.quantized_x(x)? else {
            return Ok(None);
        };
        let window = self.cache_window(s, cache);
        let (k_cache, v_cache) = cache.planes_mut(s.layer);
        Ok(Some(MatVec8QkvCall {
            products: MatVec8ManyCall { args, count: 3, x8 },
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim: s.head_dim,
            rope,
            window,
            k_cache,
            v_cache,
        }))
    }

    /// Attention of `q` over the cache (this call's K and V already in it):
    /// split across the context for a long decode step, one block per
    /// (row, head) or on tensor cores otherwise. One row of output is also
    /// split for the next mat-vec (saving `quantize_x8` before `wo`).
    /// `sinks`: each head's sink logit (gpt-oss), checked by the caller.
    pub(super) fn attend_cached(
        &mut self,
        q: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: Option<DevPtr<f32>>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let (n, hd) = (s.n_tokens, s.head_dim);
        let split = self.context_split(&s, cache.capacity);
        let part = match split {
            Some(sp) => Some(self.split_part(s.n_head * sp.nsplit, hd + 2)?),
            None => None,
        };
        let window = self.cache_window(&s, cache);
        let (k_cache, v_cache) = cache.planes_mut(s.layer);
        let (k_cache, v_cache) = (k_cache.as_const(), v_cache.as_const());
        self.dev.bind()?;
        let tensor_cores = self.dev.kernels.attention_on_tensor_cores(n, hd);
        let x8 = self
            .x8_for(out)
            .filter(|_| hd.is_multiple_of(32) && !tensor_cores);
        // A window as wide as the cache hides nothing.
        let sliding = s.window.map_or(0, |w| w.min(cache.capacity));
        let (n_head, n_head_kv, scale) = (s.n_head, s.n_head_kv, s.scale);
        if let (Some(sp), Some(mut part)) = (split, part) {
            let nsplit = sp.nsplit;
            let a = AttentionSplitArgs {
                q: q.input(),
                n_head,
                n_head_kv,
                head_dim: hd,
                window,
                k_cache,
                v_cache,
                scale,
                sliding,
                nsplit,
                part: part.output(),
            };
            let c = AttentionCombineArgs {
                part: part.input(),
                n_head,
                head_dim: hd,
                nsplit,
                sinks,
                out: out.output(),
                x8,
            };
            self.dev.kernels.attention_split(&self.dev.stream, &a, &c)?;
            if x8.is_some() {
                self.x8_now_holds(out);
            }
            return Ok(());
        }
        let attend = AttentionArgs {
            q: q.input(),
            n,
            n_head,
            n_head_kv,
            head_dim: hd,
            window,
            k_cache,
            v_cache,
            scale,
            sliding,
            sinks,
            out: out.output(),
            tensor_cores,
            x8,
        };
        self.launch_splitting(&attend, out)
    }
}

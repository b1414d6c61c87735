//! The operations a device provides to run an architecture's graph.
//!
//! Architecture files (`llama.rs`) describe the forward pass once in terms of
//! these operations; each backend implements them (`backend::cpu` in plain
//! Rust, `backend::cuda` with kernels), so both backends run the same graph
//! (M0-W-1213). Activations are f32 matrices, row-major, one row per token.

use crate::model::config::RopeStyle;

/// What the graph code itself finds wrong: a file that lacks a tensor or holds
/// one of the wrong shape, or a forward pass asked for nothing. Each device's
/// error type takes these in ([`Ops::Error`]), so the graph never names a backend.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    #[error("tensor {name} has shape {dims:?}, expected {want:?} (ne0 first)")]
    WrongShape {
        name: String,
        dims: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("block_count {layers} needs at least {needed} tensors; the file has {have}")]
    TooFewTensors {
        layers: usize,
        needed: u64,
        have: usize,
    },
    #[error("forward called with no tokens")]
    NoTokens,
    #[error("{0}")]
    Unsupported(String),
}

/// Which positions of a forward pass the caller wants logits for. Whatever
/// is asked, the last position's logits are kept where the backend's sampler
/// reads them (see [`Ops::keep_last_row`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None on the host: the last position's logits stay with the backend
    /// (on the device for CUDA) for its sampler; `out` is left empty.
    None,
    /// Only the last position's `vocab_size` logits.
    Last,
    /// Every position's logits, position-major (`n_tokens * vocab_size`).
    All,
    /// A batched decode step's (`Backend::decode`): each row is the
    /// last position of a sequence of its own, and every row's logits stay
    /// with the backend for that sequence's sampler (see
    /// [`Ops::keep_last_row`]); `out` is left empty.
    Rows,
}

/// Intermediate values of one forward pass at its last position, recorded for
/// parity logging (EXT-001). Names follow llama.cpp's graph names
/// (`inp_embd`, `l_out-<layer>`, `result_norm`).
#[derive(Clone, Debug, Default)]
pub struct Checkpoints {
    pub entries: Vec<(String, Vec<f32>)>,
}

impl Checkpoints {
    pub fn record(&mut self, name: impl Into<String>, values: &[f32]) {
        self.entries.push((name.into(), values.to_vec()));
    }
}

/// Shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub layer: usize,
    /// Position of the first query row; the cache holds `start_pos + n_tokens` entries after the store.
    pub start_pos: usize,
    pub n_tokens: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Query row `t` sees the cached positions `p` with
    /// `start_pos + t - p < window` (sliding-window layers), or all of
    /// `0..=start_pos + t` when `None`.
    pub window: Option<usize>,
    /// The factor on `q . k` before the softmax (`1 / sqrt(head_dim)` in
    /// most architectures).
    pub scale: f32,
}

impl AttentionShape {
    /// The first cached position query row `t` sees.
    pub fn first_visible(&self, t: usize) -> usize {
        let pos = self.start_pos + t;
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }
}

/// Parameters of one RoPE call: pair `i` of a head at position `p` turns by
/// `p * freq_scale * freq_base^(-2i / n_rot) / freq_factors[i]`, and its
/// cosine and sine are multiplied by `mscale` (llama.cpp's `ggml_rope_ext`
/// without YaRN's extrapolation mix).
#[derive(Clone, Copy, Debug)]
pub struct RopeParams<'a> {
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub start_pos: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
    /// `n_rot / 2` divisors of the frequencies (Llama 3.1's `rope_freqs`,
    /// Phi-3's LongRoPE tables), or none.
    pub freq_factors: Option<&'a [f32]>,
    /// The factor on cosines and sines (`rope.scaling.attn_factor`).
    pub mscale: f32,
}

/// `freq_base^(-2i / n_rot) / factors[i]` for `i < n_rot / 2`, in f64
/// (`factors` of `n_rot / 2` values, or none).
pub fn rope_inv_freqs(freq_base: f32, n_rot: usize, factors: Option<&[f32]>) -> Vec<f64> {
    (0..n_rot / 2)
        .map(|i| {
            let f = (freq_base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            match factors {
                Some(ff) => f / ff[i] as f64,
                None => f,
            }
        })
        .collect()
}

impl RopeParams<'_> {
    /// `freq_base^(-2i / n_rot) / freq_factors[i]` for `i < n_rot / 2`, in
    /// f64: what the CPU reference turns by and the CUDA backend's table holds.
    /// `freq_factors` must hold `n_rot / 2` values (the backends check).
    pub fn inv_freqs(&self) -> Vec<f64> {
        rope_inv_freqs(self.freq_base, self.n_rot, self.freq_factors)
    }

    /// Whether the factors, if any, are one per rotated pair.
    pub fn factors_fit(&self) -> bool {
        self.freq_factors
            .is_none_or(|ff| ff.len() == self.n_rot / 2)
    }
}

/// One product of [`Ops::matmuls`]: `out = x w^T (+ bias)`.
pub struct Product<'a, W, B> {
    pub w: &'a W,
    pub bias: Option<&'a W>,
    pub out: &'a mut B,
}

/// What a layer does to Q and K before attention: per-head RMSNorm (Gemma 3's
/// `attn_q_norm` / `attn_k_norm`) and RoPE (every architecture here but GPT-2).
pub struct QkPrep<'a, W> {
    pub norms: Option<HeadNorms<'a, W>>,
    /// Q's and K's rotations.
    pub rope: Option<(RopeParams<'a>, RopeParams<'a>)>,
}

/// `[head_dim]` RMSNorm weights applied to each head of Q and of K.
pub struct HeadNorms<'a, W> {
    pub q: &'a W,
    pub k: &'a W,
    pub eps: f32,
}

/// [`Ops::attend`] as separate operations: each norm into a new buffer that
/// then replaces its input, [`Ops::rope_qk`], [`Ops::attention`]. What every
/// device does unless it has a fused way.
#[allow(clippy::too_many_arguments)]
pub fn attend_in_steps<O: Ops + ?Sized>(
    ops: &mut O,
    q: &mut O::Buf,
    k: &mut O::Buf,
    v: &O::Buf,
    prep: QkPrep<'_, O::Weight>,
    cache: &mut O::Cache,
    shape: AttentionShape,
    out: &mut O::Buf,
) -> Result<(), O::Error> {
    if let Some(norms) = prep.norms {
        for (x, w) in [(&mut *q, norms.q), (&mut *k, norms.k)] {
            let (rows, cols) = ops.dims(x);
            let mut normed = ops.buf(rows, cols)?;
            ops.rms_norm(x, w, norms.eps, &mut normed)?;
            *x = normed;
        }
    }
    if let Some((pq, pk)) = prep.rope {
        ops.rope_qk(q, k, pq, pk)?;
    }
    ops.attention(q, k, v, cache, shape, out)
}

/// [`Ops::project_attend`] as [`Ops::matmuls`] then [`Ops::attend`].
pub fn project_attend_in_steps<O: Ops + ?Sized>(
    ops: &mut O,
    x: &O::Buf,
    mut qkv: [Product<'_, O::Weight, O::Buf>; 3],
    prep: QkPrep<'_, O::Weight>,
    cache: &mut O::Cache,
    shape: AttentionShape,
    out: &mut O::Buf,
) -> Result<(), O::Error> {
    ops.matmuls(x, &mut qkv)?;
    let [q, k, v] = qkv;
    ops.attend(q.out, k.out, v.out, prep, cache, shape, out)
}

/// A mixture-of-experts feed-forward's experts: their gate, up
/// (`[experts * n_ff, n_embd]`, expert `e`'s rows `e * n_ff..`) and down
/// (`[experts * n_embd, n_ff]`) matrices, each with a bias `[experts, rows]`
/// where the family has them (gpt-oss; Qwen3-MoE has none); `used` experts a
/// token, `act` between gate and up. The router's product is the graph's
/// own (`ffn_moe_logits`, as llama.cpp names it).
pub struct MoeWeights<'a, W> {
    pub gate: &'a W,
    pub gate_bias: Option<&'a W>,
    pub up: &'a W,
    pub up_bias: Option<&'a W>,
    pub down: &'a W,
    pub down_bias: Option<&'a W>,
    pub experts: usize,
    pub used: usize,
    pub act: ExpertAct,
}

/// The gated activation of a mixture's experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertAct {
    /// `silu(g) * u` (Qwen3-MoE, llama.cpp's `LLM_FFN_SILU`).
    SwiGlu,
    /// gpt-oss's clamped SwiGLU: `min(g, 7) * sigmoid(1.702 min(g, 7)) *
    /// (clamp(u, -7, 7) + 1)` (llama.cpp's `swiglu_oai`).
    SwiGluOai,
}

pub trait Ops {
    /// A weight tensor as stored in the file (possibly quantized), with its
    /// logical shape `[rows, cols]` (`cols` = GGUF `ne0`, contiguous).
    type Weight;
    /// An f32 activation matrix `[rows, cols]`.
    type Buf;
    /// The KV cache of one sequence, all layers.
    type Cache;
    /// The device's error; the graph's own findings convert into it.
    type Error: From<GraphError>;

    /// A zeroed activation matrix.
    fn buf(&mut self, rows: usize, cols: usize) -> Result<Self::Buf, Self::Error>;

    /// `(rows, cols)` of an activation matrix.
    fn dims(&self, x: &Self::Buf) -> (usize, usize);

    /// `out[t] = table[tokens[t]]`, decoding the table's stored format.
    fn embed(
        &mut self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `out[t] = table[start_pos + t]`: learned position embeddings (GPT-2).
    /// Positions past the table are refused.
    fn embed_positions(
        &mut self,
        table: &Self::Weight,
        start_pos: usize,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `out[t] = x[t][start..start + out.cols]`: one part of a fused
    /// projection (Q, K and V of `attn_qkv`; gate and up of phi3's `ffn_up`).
    fn copy_cols(
        &mut self,
        x: &Self::Buf,
        start: usize,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `out[t] = x[t] / rms(x[t]) * weight`. A weight narrower than the row
    /// normalises each `weight`-wide group of it on its own (Gemma 3's
    /// per-head Q and K norms); the row width must be a multiple of it.
    fn rms_norm(
        &mut self,
        x: &Self::Buf,
        weight: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `out[t][r] = sum_c x[t][c] * w[r][c]` (+ `bias[r]` when given).
    fn matmul(
        &mut self,
        x: &Self::Buf,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// Every product of one input (Q, K and V; gate and up), as
    /// [`Ops::matmul`] computes each; a device may run several as one.
    fn matmuls(
        &mut self,
        x: &Self::Buf,
        products: &mut [Product<'_, Self::Weight, Self::Buf>],
    ) -> Result<(), Self::Error> {
        for p in products {
            self.matmul(x, p.w, p.bias, p.out)?;
        }
        Ok(())
    }

    /// Rotates each head of every row in place; row `t` is at position `start_pos + t`.
    fn rope(&mut self, x: &mut Self::Buf, p: RopeParams<'_>) -> Result<(), Self::Error>;

    /// [`Ops::rope`] of Q and of K (a device may rotate both in one go).
    fn rope_qk(
        &mut self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        pq: RopeParams<'_>,
        pk: RopeParams<'_>,
    ) -> Result<(), Self::Error> {
        self.rope(q, pq)?;
        self.rope(k, pk)
    }

    /// Writes rows of K and V into the cache at positions `start_pos..`, then
    /// computes causal grouped-query attention of `q` over positions
    /// `0..=start_pos + t` for each row `t`.
    fn attention(
        &mut self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        cache: &mut Self::Cache,
        shape: AttentionShape,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// [`Ops::attention`] with a learned sink per head (gpt-oss): each
    /// head's softmax also counts `exp(sinks[h])` in its denominator, a
    /// logit that carries no value (llama.cpp's `ggml_soft_max_add_sinks`).
    #[allow(clippy::too_many_arguments)]
    fn attention_sinks(
        &mut self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        cache: &mut Self::Cache,
        shape: AttentionShape,
        sinks: &Self::Weight,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// A mixture-of-experts feed-forward, row by row of `x` (`[n, n_embd]`
    /// into `out`, the same shape), as llama.cpp's `build_moe_ffn` runs
    /// gpt-oss and Qwen3-MoE: of the router's `logits` (`[n, experts]`), the
    /// `used` highest (the lower expert first on a tie), a softmax over those
    /// as the experts' weights (gpt-oss's softmax of the chosen; Qwen3-MoE's
    /// softmax of all, renormalised over the chosen, is the same function);
    /// each chosen expert's `down(act(gate x + b, up x + b)) + b` (biases
    /// where `w` has them, `act` [`ExpertAct`]), weighted and summed.
    fn moe(
        &mut self,
        x: &Self::Buf,
        logits: &Self::Buf,
        w: MoeWeights<'_, Self::Weight>,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// The attention of one layer from its projections: Q and K normed per
    /// head and rotated as `prep` says (in place), then [`Ops::attention`].
    /// A device may do the steps before attention in one pass.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        prep: QkPrep<'_, Self::Weight>,
        cache: &mut Self::Cache,
        shape: AttentionShape,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error> {
        attend_in_steps(self, q, k, v, prep, cache, shape, out)
    }

    /// A layer's Q, K and V products of `x` ([`Ops::matmuls`] of `qkv`, in
    /// that order), then [`Ops::attend`] of them. A device may turn Q and K
    /// and store K and V as it writes the products.
    #[allow(clippy::too_many_arguments)]
    fn project_attend(
        &mut self,
        x: &Self::Buf,
        qkv: [Product<'_, Self::Weight, Self::Buf>; 3],
        prep: QkPrep<'_, Self::Weight>,
        cache: &mut Self::Cache,
        shape: AttentionShape,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error> {
        project_attend_in_steps(self, x, qkv, prep, cache, shape, out)
    }

    /// `out = silu(gate) * up`, elementwise.
    fn swiglu(
        &mut self,
        gate: &Self::Buf,
        up: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `out = gelu(gate) * up`, elementwise, GELU in its tanh form (Gemma's GeGLU).
    fn geglu(
        &mut self,
        gate: &Self::Buf,
        up: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// `x *= factor`, elementwise.
    fn scale(&mut self, x: &mut Self::Buf, factor: f32) -> Result<(), Self::Error>;

    /// GPT-2's LayerNorm: `out[t] = (x[t] - mean(x[t])) / sqrt(var(x[t]) + eps) * weight (+ bias)`,
    /// the variance being the mean squared deviation (M0-W-1432).
    fn layer_norm(
        &mut self,
        x: &Self::Buf,
        weight: &Self::Weight,
        bias: Option<&Self::Weight>,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error>;

    /// GPT-2's GELU, elementwise: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (M0-W-1433).
    fn gelu(&mut self, x: &Self::Buf, out: &mut Self::Buf) -> Result<(), Self::Error>;

    /// `x += y`, elementwise.
    fn add_assign(&mut self, x: &mut Self::Buf, y: &Self::Buf) -> Result<(), Self::Error>;

    /// `x += y`, then `out = rms_norm(x) * weight`: a residual add and the
    /// norm after it, which a backend may do in one pass (same results).
    fn add_rms_norm(
        &mut self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        weight: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error> {
        self.add_assign(x, y)?;
        self.rms_norm(x, weight, eps, out)
    }

    /// `x += rms_norm(y) * y_weight`, then `out = rms_norm(x) * weight`:
    /// Gemma 3's norm of a block's output, its residual add and the next
    /// norm, which a backend may do in one pass (same results).
    fn norm_add_rms_norm(
        &mut self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        y_weight: &Self::Weight,
        weight: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<(), Self::Error> {
        let (rows, cols) = self.dims(y);
        let mut normed = self.buf(rows, cols)?;
        self.rms_norm(y, y_weight, eps, &mut normed)?;
        self.add_rms_norm(x, &normed, weight, eps, out)
    }

    /// Copies row `row` of `x` into a new one-row matrix.
    fn take_row(&mut self, x: &Self::Buf, row: usize) -> Result<Self::Buf, Self::Error>;

    /// Copies the whole matrix to the host, row-major.
    fn to_host(&mut self, x: &Self::Buf, out: &mut Vec<f32>) -> Result<(), Self::Error>;

    /// Keeps the last row of `x` (the last position's logits) where the
    /// backend's sampler reads it, without a copy to the host; in a batched
    /// decode step ([`Logits::Rows`]) every row, each for its own sequence.
    /// Devices whose backend keeps the logits itself (the CPU's) do nothing.
    fn keep_last_row(&mut self, x: &Self::Buf) -> Result<(), Self::Error>;

    /// Copies row `row` to the host (for checkpoints).
    fn row_to_host(
        &mut self,
        x: &Self::Buf,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), Self::Error>;
}

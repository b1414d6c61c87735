//! Pieces of a layer that several families share: separate Q, K and V
//! projections, the activations of attention, the residual stream, the
//! gated feed-forward and the end of a pre-norm layer. Each makes exactly
//! the [`Ops`] calls, in the order, that its family's graph would make
//! written out: the backends' results are compared bit for bit, and a moved
//! or merged call could change them.

use crate::model::config::ModelConfig;
use crate::model::ops::{AttentionShape, GraphError, Ops, Product};
use crate::model::parts::{Binder, Blk, Recorder};

/// Separate Q, K and V projections, with biases where the family has them.
pub struct Qkv<W> {
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
}

/// [`Qkv`]'s tensors in a layer.
pub const QKV: [&str; 3] = ["attn_q", "attn_k", "attn_v"];

impl<W> Qkv<W> {
    /// Layer `blk`'s `attn_q`, `attn_k` and `attn_v`, and their biases when `bias`.
    pub fn bind<E: From<GraphError>>(
        b: &mut Binder<'_, '_, W, E>,
        blk: Blk,
        bias: bool,
    ) -> Result<Self, E> {
        let (d, qd, kvd) = (b.cfg.n_embd, b.cfg.q_dim(), b.cfg.kv_dim());
        Ok(Qkv {
            wq: b.get(&blk.weight("attn_q"), qd, d)?,
            wk: b.get(&blk.weight("attn_k"), kvd, d)?,
            wv: b.get(&blk.weight("attn_v"), kvd, d)?,
            bq: b.when(bias, &blk.bias("attn_q"), 1, qd)?,
            bk: b.when(bias, &blk.bias("attn_k"), 1, kvd)?,
            bv: b.when(bias, &blk.bias("attn_v"), 1, kvd)?,
        })
    }

    /// The three products into `q`, `k` and `v`, in that order
    /// ([`Ops::matmuls`], [`Ops::project_attend`]).
    pub fn products<'a, B>(
        &'a self,
        q: &'a mut B,
        k: &'a mut B,
        v: &'a mut B,
    ) -> [Product<'a, W, B>; 3] {
        [
            Product {
                w: &self.wq,
                bias: self.bq.as_ref(),
                out: q,
            },
            Product {
                w: &self.wk,
                bias: self.bk.as_ref(),
                out: k,
            },
            Product {
                w: &self.wv,
                bias: self.bv.as_ref(),
                out: v,
            },
        ]
    }
}

/// A gated feed-forward's matrices: `down(act(gate x) * up x)`.
pub struct GatedFfn<W> {
    pub gate: W,
    pub up: W,
    pub down: W,
}

/// [`GatedFfn`]'s tensors in a layer.
pub const GATED_FFN: [&str; 3] = ["ffn_gate", "ffn_up", "ffn_down"];

impl<W> GatedFfn<W> {
    /// Layer `blk`'s `ffn_gate`, `ffn_up` and `ffn_down`.
    pub fn bind<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>, blk: Blk) -> Result<Self, E> {
        let (d, ff) = (b.cfg.n_embd, b.cfg.n_ff);
        Ok(GatedFfn {
            gate: b.get(&blk.weight("ffn_gate"), ff, d)?,
            up: b.get(&blk.weight("ffn_up"), ff, d)?,
            down: b.get(&blk.weight("ffn_down"), d, ff)?,
        })
    }
}

/// The activation of a gated feed-forward.
#[derive(Clone, Copy, Debug)]
pub enum Glu {
    /// [`Ops::swiglu`] (llama, Phi-3).
    SwiGlu,
    /// [`Ops::geglu`] (Gemma 3).
    GeGlu,
}

/// The residual stream `x` and `h`, the normed copy of it that the next
/// block reads.
pub struct Stream<B> {
    pub x: B,
    pub h: B,
}

impl<B> Stream<B> {
    /// `x` and a new `h` of its shape.
    pub fn new<O: Ops<Buf = B>>(ops: &mut O, x: B) -> Result<Self, O::Error> {
        let (rows, cols) = ops.dims(&x);
        let h = ops.buf(rows, cols)?;
        Ok(Stream { x, h })
    }

    /// The first layer's input norm (`norm`: its `attn_norm`; none without
    /// layers). Every later norm is done with the residual add before it
    /// ([`end_layer`]).
    pub fn first_norm<O: Ops<Buf = B>>(
        &mut self,
        ops: &mut O,
        cfg: &ModelConfig,
        norm: Option<&O::Weight>,
    ) -> Result<(), O::Error> {
        match norm {
            Some(w) => ops.rms_norm(&self.x, w, cfg.norm_eps, &mut self.h),
            None => Ok(()),
        }
    }
}

/// The activations of a layer's attention, `n` rows each: Q, K and V, the
/// heads' output and the output projection's (which the feed-forward's
/// output then reuses).
pub struct AttnBufs<B> {
    pub q: B,
    pub k: B,
    pub v: B,
    pub attn: B,
    pub proj: B,
}

impl<B> AttnBufs<B> {
    pub fn new<O: Ops<Buf = B>>(
        ops: &mut O,
        cfg: &ModelConfig,
        n: usize,
    ) -> Result<Self, O::Error> {
        let (d, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        Ok(AttnBufs {
            q: ops.buf(n, qd)?,
            k: ops.buf(n, kvd)?,
            v: ops.buf(n, kvd)?,
            attn: ops.buf(n, qd)?,
            proj: ops.buf(n, d)?,
        })
    }
}

/// Q, K and V out of a fused `attn_qkv` product (Q's columns, then K's,
/// then V's).
pub fn split_qkv<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    qkv: &O::Buf,
    a: &mut AttnBufs<O::Buf>,
) -> Result<(), O::Error> {
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    ops.copy_cols(qkv, 0, &mut a.q)?;
    ops.copy_cols(qkv, qd, &mut a.k)?;
    ops.copy_cols(qkv, qd + kvd, &mut a.v)
}

/// Layer `il`'s attention over `n_tokens` rows from `start_pos`, as the
/// configuration says: the layer's window (none but on windowed layers) and
/// the `1 / sqrt(head_dim)` scale.
pub fn attention_shape(
    cfg: &ModelConfig,
    il: usize,
    start_pos: usize,
    n_tokens: usize,
) -> AttentionShape {
    AttentionShape {
        layer: il,
        start_pos,
        n_tokens,
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        window: cfg.window(il),
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
    }
}

/// The activations of a gated feed-forward, `[n, n_ff]` each.
pub struct GluBufs<B> {
    pub gate: B,
    pub up: B,
    pub act: B,
}

impl<B> GluBufs<B> {
    pub fn new<O: Ops<Buf = B>>(ops: &mut O, n: usize, n_ff: usize) -> Result<Self, O::Error> {
        Ok(GluBufs {
            gate: ops.buf(n, n_ff)?,
            up: ops.buf(n, n_ff)?,
            act: ops.buf(n, n_ff)?,
        })
    }
}

/// The gated feed-forward of `h` into `out`: gate and up as one
/// [`Ops::matmuls`], then [`glu_down`].
pub fn gated_ffn<O: Ops>(
    ops: &mut O,
    h: &O::Buf,
    w: &GatedFfn<O::Weight>,
    glu: Glu,
    f: &mut GluBufs<O::Buf>,
    out: &mut O::Buf,
) -> Result<(), O::Error> {
    let mut products = [
        Product {
            w: &w.gate,
            bias: None,
            out: &mut f.gate,
        },
        Product {
            w: &w.up,
            bias: None,
            out: &mut f.up,
        },
    ];
    ops.matmuls(h, &mut products)?;
    glu_down(ops, glu, f, &w.down, out)
}

/// The second half of a gated feed-forward, once `f.gate` and `f.up` hold
/// their products: the activation into `f.act`, then `down` into `out`.
pub fn glu_down<O: Ops>(
    ops: &mut O,
    glu: Glu,
    f: &mut GluBufs<O::Buf>,
    down: &O::Weight,
    out: &mut O::Buf,
) -> Result<(), O::Error> {
    match glu {
        Glu::SwiGlu => ops.swiglu(&f.gate, &f.up, &mut f.act)?,
        Glu::GeGlu => ops.geglu(&f.gate, &f.up, &mut f.act)?,
    }
    ops.matmul(&f.act, down, None, out)
}

/// The end of pre-norm layer `il`: its block's output `y` added to the
/// stream and, where a layer follows, normed by its `attn_norm` (`next`)
/// into `h` in the same call ([`Ops::add_rms_norm`]); then the stream
/// recorded as `l_out-<il>`.
pub fn end_layer<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    rec: &mut Recorder<'_>,
    il: usize,
    s: &mut Stream<O::Buf>,
    y: &O::Buf,
    next: Option<&O::Weight>,
) -> Result<(), O::Error> {
    match next {
        Some(norm) => ops.add_rms_norm(&mut s.x, y, norm, cfg.norm_eps, &mut s.h)?,
        None => ops.add_assign(&mut s.x, y)?,
    }
    rec.layer_out(ops, il, &s.x)
}

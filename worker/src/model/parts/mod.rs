//! Pieces the architecture files share, so that each keeps only what
//! differs: binding a file's tensors with their shapes checked and the
//! tensors around the layers ([`bind`]), the RoPE frequency factors and a
//! layer's rotations ([`rope`]), a layer's separate Q, K and V, its
//! activations, the gated feed-forward and the residual add that ends a
//! pre-norm layer ([`layer`]), and a pass's embeddings, checkpoints and LM
//! head ([`pass`]).

pub mod bind;
pub mod layer;
pub mod pass;
pub mod rope;

pub use bind::{
    check_layer_count, layer_names, tensor_names, Affine, Binder, Blk, LayerTensors, OutputNorm,
    Trunk, Upload, WeightSpec, FUSED_LAYER,
};
pub use layer::{
    attention_shape, end_layer, gated_ffn, glu_down, split_qkv, AttnBufs, GatedFfn, Glu, GluBufs,
    Qkv, Stream, GATED_FFN, QKV,
};
pub use pass::{embed, lm_head, Pass, Recorder};
pub use rope::{rope_factor_names, rope_factors, rope_pair, ROPE_FACTOR_TENSORS};

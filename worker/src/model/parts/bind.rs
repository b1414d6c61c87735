//! Binding a file's tensors by name with their shapes checked, and the
//! tensors around the layers that every family has (the [`Trunk`]).

use crate::gguf::{GgufFile, TensorInfo};
use crate::model::config::ModelConfig;
use crate::model::ops::GraphError;

/// Where a weight's bytes are and what logical shape it has.
pub struct WeightSpec<'a> {
    pub info: &'a TensorInfo,
    /// `[rows, cols]`; a vector is `[1, len]`.
    pub rows: usize,
    pub cols: usize,
}

/// The device's upload function: binds one tensor as a weight handle.
pub type Upload<'u, W, E> = dyn FnMut(WeightSpec<'_>) -> Result<W, E> + 'u;

/// Binds a model's tensors by name through the device's upload, checking
/// each one's shape first.
pub struct Binder<'a, 'u, W, E> {
    pub cfg: &'a ModelConfig,
    pub file: &'a GgufFile,
    pub upload: &'a mut Upload<'u, W, E>,
}

/// The names of layer `N`'s tensors (`blk.N.<name>...`).
#[derive(Clone, Copy, Debug)]
pub struct Blk(pub usize);

impl Blk {
    /// `blk.N.<name>`, without a suffix (see [`Binder::affine`]).
    pub fn name(self, name: &str) -> String {
        format!("blk.{}.{name}", self.0)
    }

    /// `blk.N.<name>.weight`.
    pub fn weight(self, name: &str) -> String {
        format!("blk.{}.{name}.weight", self.0)
    }

    /// `blk.N.<name>.bias`.
    pub fn bias(self, name: &str) -> String {
        format!("blk.{}.{name}.bias", self.0)
    }
}

/// Tensors every layer has: `blk.N.<name>.<suffix>` for each name and, per
/// name, each suffix.
#[derive(Clone, Copy, Debug)]
pub struct LayerTensors {
    pub names: &'static [&'static str],
    pub suffixes: &'static [&'static str],
}

impl LayerTensors {
    /// Each name's `.weight`.
    pub const fn weights(names: &'static [&'static str]) -> Self {
        LayerTensors {
            names,
            suffixes: &["weight"],
        }
    }

    /// Each name's `.bias`.
    pub const fn biases(names: &'static [&'static str]) -> Self {
        LayerTensors {
            names,
            suffixes: &["bias"],
        }
    }

    fn count(groups: &[LayerTensors]) -> u64 {
        let n: usize = groups
            .iter()
            .map(|g| g.names.len() * g.suffixes.len())
            .sum();
        n as u64
    }
}

/// The layer tensors of a block with fused projections: `attn_qkv` holds Q,
/// K and V, and one `ffn_up` feeds the activation (Phi-3's holds the gate
/// too). GPT-2 and Phi-3 name the same six.
pub const FUSED_LAYER: [&str; 6] = [
    "attn_norm",
    "attn_qkv",
    "attn_output",
    "ffn_norm",
    "ffn_up",
    "ffn_down",
];

/// A weight and its bias.
pub struct Affine<W> {
    pub weight: W,
    pub bias: W,
}

/// The norm before the LM head, as the architecture normalises
/// ([`crate::model::config::Architecture::layer_norm`]).
pub enum OutputNorm<W> {
    Rms(W),
    /// LayerNorm with its bias (GPT-2).
    Layer(Affine<W>),
}

/// What every family has around its layers: the token embeddings, the
/// layers, the norm before the LM head and the head itself.
pub struct Trunk<W, L> {
    pub token_embd: W,
    pub layers: Vec<L>,
    pub output_norm: OutputNorm<W>,
    /// `None` when the LM head is tied to `token_embd`.
    pub output: Option<W>,
}

impl<W, L> Trunk<W, L> {
    /// The LM head's matrix: `output`, or the embeddings it is tied to.
    pub fn head(&self) -> &W {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}

impl<'a, W, E: From<GraphError>> Binder<'a, '_, W, E> {
    /// The tensor `name`, which must be `[rows, cols]` (`cols` = `ne0`); a
    /// vector is asked for as `rows == 1`.
    pub fn get(&mut self, name: &str, rows: usize, cols: usize) -> Result<W, E> {
        let want: &[u64] = if rows == 1 {
            &[cols as u64]
        } else {
            &[cols as u64, rows as u64]
        };
        let info = self.shaped(name, want)?;
        (self.upload)(WeightSpec { info, rows, cols })
    }

    /// A 3-D tensor of `experts` matrices of `[rows, cols]` (`[cols, rows,
    /// experts]` in the file), bound as one `[experts * rows, cols]` matrix:
    /// expert `e`'s rows are `e * rows..`.
    pub fn experts(
        &mut self,
        name: &str,
        experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<W, E> {
        let info = self.shaped(name, &[cols as u64, rows as u64, experts as u64])?;
        // The file's dims passed the reader's size checks, so the product fits.
        (self.upload)(WeightSpec {
            info,
            rows: experts * rows,
            cols,
        })
    }

    /// The tensor `name`, which must have the dims `want` (`ne0` first).
    fn shaped(&self, name: &str, want: &[u64]) -> Result<&'a TensorInfo, GraphError> {
        let file = self.file;
        let info = file
            .tensor(name)
            .ok_or_else(|| GraphError::MissingTensor(name.to_string()))?;
        if info.dims != want {
            let (name, dims, want) = (name.to_string(), info.dims.to_vec(), want.to_vec());
            return Err(GraphError::WrongShape { name, dims, want });
        }
        Ok(info)
    }

    /// Like [`get`](Self::get) for a tensor the file may leave out.
    pub fn optional(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<W>, E> {
        match self.file.tensor(name) {
            Some(_) => self.get(name, rows, cols).map(Some),
            None => Ok(None),
        }
    }

    /// The tensor when `present`, else `None` (biases an architecture has or lacks).
    pub fn when(
        &mut self,
        present: bool,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<W>, E> {
        if present {
            self.get(name, rows, cols).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `<name>.weight` of `[rows, cols]` and `<name>.bias`: as long as the
    /// weight for a norm (`rows == 1`), as its outputs for a projection.
    pub fn affine(&mut self, name: &str, rows: usize, cols: usize) -> Result<Affine<W>, E> {
        let bias_len = if rows == 1 { cols } else { rows };
        Ok(Affine {
            weight: self.get(&format!("{name}.weight"), rows, cols)?,
            bias: self.get(&format!("{name}.bias"), 1, bias_len)?,
        })
    }

    /// The trunk, each layer bound by `layer`, once the file is known to
    /// hold the `groups` of tensors for every layer
    /// ([`check_layer_count`]). In file order: `token_embd`, the layers,
    /// `output_norm`, `output` where the file has one.
    pub fn trunk<L>(
        &mut self,
        groups: &[LayerTensors],
        mut layer: impl FnMut(&mut Self, Blk) -> Result<L, E>,
    ) -> Result<Trunk<W, L>, E> {
        let cfg = self.cfg;
        check_layer_count(cfg, self.file, LayerTensors::count(groups))?;
        let (d, v) = (cfg.n_embd, cfg.vocab_size);
        let token_embd = self.get("token_embd.weight", v, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            layers.push(layer(self, Blk(i))?);
        }
        let output_norm = if cfg.architecture.layer_norm() {
            OutputNorm::Layer(self.affine("output_norm", 1, d)?)
        } else {
            OutputNorm::Rms(self.get("output_norm.weight", 1, d)?)
        };
        let output = self.optional("output.weight", v, d)?;
        Ok(Trunk {
            token_embd,
            layers,
            output_norm,
            output,
        })
    }
}

/// A layer count the file cannot hold is refused before anything is sized
/// from it (a hostile `block_count` would otherwise size the layer table).
pub fn check_layer_count(
    cfg: &ModelConfig,
    file: &GgufFile,
    tensors_per_layer: u64,
) -> Result<(), GraphError> {
    let needed = (cfg.n_layer as u64).saturating_mul(tensors_per_layer);
    if needed > file.tensors.len() as u64 {
        return Err(GraphError::TooFewTensors {
            layers: cfg.n_layer,
            needed,
            have: file.tensors.len(),
        });
    }
    Ok(())
}

/// The names a family's [`Binder::trunk`] binds: `token_embd.weight`, then
/// `extra` (a family's own, such as GPT-2's `position_embd.weight`),
/// `output_norm` (its bias too with LayerNorm), `output.weight` where the
/// file has one (the head is tied otherwise), and [`layer_names`].
pub fn tensor_names(
    cfg: &ModelConfig,
    file: &GgufFile,
    extra: &[&str],
    groups: &[LayerTensors],
) -> Vec<String> {
    let mut names = vec!["token_embd.weight".to_string()];
    names.extend(extra.iter().map(|n| n.to_string()));
    names.push("output_norm.weight".into());
    if cfg.architecture.layer_norm() {
        names.push("output_norm.bias".into());
    }
    if file.tensor("output.weight").is_some() {
        names.push("output.weight".into());
    }
    names.extend(layer_names(cfg, groups));
    names
}

/// `blk.N.<name>.<suffix>` for every layer, in layer order, and within a
/// layer group by group, name by name.
pub fn layer_names<'a>(
    cfg: &ModelConfig,
    groups: &'a [LayerTensors],
) -> impl Iterator<Item = String> + 'a {
    (0..cfg.n_layer).flat_map(move |i| {
        groups.iter().flat_map(move |g| {
            g.names
                .iter()
                .flat_map(move |n| g.suffixes.iter().map(move |s| format!("blk.{i}.{n}.{s}")))
        })
    })
}

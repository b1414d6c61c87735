//! Pieces every architecture file shares: binding a file's tensors with
//! their shapes checked, recording checkpoints, and the LM head at the end
//! of the forward pass.

use crate::gguf::{GgufFile, TensorInfo};
use crate::model::config::ModelConfig;
use crate::model::ops::{AttentionShape, Checkpoints, GraphError, Logits, Ops, RopeParams};
use crate::quant::GgmlType;

/// Where a weight's bytes are and what logical shape it has.
pub struct WeightSpec<'a> {
    pub info: &'a TensorInfo,
    /// `[rows, cols]`; a vector is `[1, len]`.
    pub rows: usize,
    pub cols: usize,
}

/// The device's upload function: binds one tensor as a weight handle.
pub type Upload<'u, W, E> = dyn FnMut(WeightSpec<'_>) -> Result<W, E> + 'u;

/// Binds tensors by name through the device's upload, checking each one's
/// shape first.
pub struct Binder<'a, 'u, W, E> {
    pub file: &'a GgufFile,
    pub upload: &'a mut Upload<'u, W, E>,
}

impl<W, E: From<GraphError>> Binder<'_, '_, W, E> {
    /// The tensor `name`, which must be `[rows, cols]` (`cols` = `ne0`); a
    /// vector is asked for as `rows == 1`.
    pub fn get(&mut self, name: &str, rows: usize, cols: usize) -> Result<W, E> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| GraphError::MissingTensor(name.to_string()))?;
        let want: &[u64] = if rows == 1 {
            &[cols as u64]
        } else {
            &[cols as u64, rows as u64]
        };
        if info.dims != want {
            let (name, dims, want) = (name.to_string(), info.dims.to_vec(), want.to_vec());
            return Err(GraphError::WrongShape { name, dims, want }.into());
        }
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
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| GraphError::MissingTensor(name.to_string()))?;
        let want = [cols as u64, rows as u64, experts as u64];
        if info.dims != want {
            let (name, dims, want) = (name.to_string(), info.dims.to_vec(), want.to_vec());
            return Err(GraphError::WrongShape { name, dims, want }.into());
        }
        // The file's dims passed the reader's size checks, so the product fits.
        (self.upload)(WeightSpec {
            info,
            rows: experts * rows,
            cols,
        })
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

/// Records the last row of named intermediate values when checkpoints are
/// asked for (parity logging), and does nothing otherwise.
pub struct Recorder<'c> {
    checkpoints: Option<&'c mut Checkpoints>,
    last: usize,
    row: Vec<f32>,
}

impl<'c> Recorder<'c> {
    pub fn new(checkpoints: Option<&'c mut Checkpoints>, n_tokens: usize) -> Self {
        Recorder {
            checkpoints,
            last: n_tokens.saturating_sub(1),
            row: Vec::new(),
        }
    }

    pub fn record<O: Ops>(&mut self, ops: &mut O, name: &str, x: &O::Buf) -> Result<(), O::Error> {
        self.record_row(ops, name, x, self.last)
    }

    fn record_row<O: Ops>(
        &mut self,
        ops: &mut O,
        name: &str,
        x: &O::Buf,
        row: usize,
    ) -> Result<(), O::Error> {
        if let Some(cp) = self.checkpoints.as_deref_mut() {
            ops.row_to_host(x, row, &mut self.row)?;
            cp.record(name, &self.row);
        }
        Ok(())
    }
}

/// One forward pass as every architecture's graph takes it: `tokens` at
/// positions `start_pos..` (never empty: `model::forward` refuses that), the
/// logits wanted and where they go, and the checkpoint recorder.
pub struct Pass<'p> {
    pub tokens: &'p [u32],
    pub start_pos: usize,
    pub logits: Logits,
    pub out: &'p mut Vec<f32>,
    pub rec: Recorder<'p>,
}

/// The frequency-factor tensors a file may hold, as llama.cpp names them:
/// Llama 3.1's `rope_freqs`, Phi-3's LongRoPE `rope_factors_long` / `_short`.
pub const ROPE_FACTOR_TENSORS: [&str; 3] = [
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

/// Those of [`ROPE_FACTOR_TENSORS`] the file holds.
pub fn rope_factor_names(file: &GgufFile) -> Vec<String> {
    ROPE_FACTOR_TENSORS
        .iter()
        .filter(|n| file.tensor(n).is_some())
        .map(|n| n.to_string())
        .collect()
}

/// The RoPE frequency factors the model turns by: YaRN's table where the
/// file asks for YaRN ([`crate::model::config::Yarn::freq_factors`]); else read to the host as
/// llama.cpp chooses them (`llama_model::get_rope_factors`): `rope_freqs`
/// where the file has it; else LongRoPE's long table when the served
/// context exceeds `rope.scaling.original_context_length`, its short one
/// otherwise; else none. Each must be `n_rot / 2` finite positive F32 values.
pub fn rope_factors(cfg: &ModelConfig, file: &GgufFile) -> Result<Option<Vec<f32>>, GraphError> {
    let [freqs, long, short] = ROPE_FACTOR_TENSORS;
    if let Some(yarn) = cfg.rope_yarn {
        if !rope_factor_names(file).is_empty() {
            return Err(GraphError::Unsupported(
                "YaRN beside a frequency-factor tensor".into(),
            ));
        }
        return Ok(Some(yarn.freq_factors(cfg.n_rot, cfg.rope_freq_base)));
    }
    let name = if file.tensor(freqs).is_some() {
        freqs
    } else if file.tensor(long).is_some() || file.tensor(short).is_some() {
        let orig = cfg.rope_orig_context.unwrap_or(cfg.context_length);
        if cfg.context_length > orig {
            long
        } else {
            short
        }
    } else {
        return Ok(None);
    };
    let info = file
        .tensor(name)
        .ok_or_else(|| GraphError::MissingTensor(name.to_string()))?;
    let want = vec![(cfg.n_rot / 2) as u64];
    if info.dims != want {
        let (name, dims) = (name.to_string(), info.dims.to_vec());
        return Err(GraphError::WrongShape { name, dims, want });
    }
    if info.ggml_type != GgmlType::F32 {
        return Err(GraphError::Unsupported(format!(
            "{name} is {}, not F32",
            info.ggml_type
        )));
    }
    let values: Vec<f32> = file
        .tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if values.len() != cfg.n_rot / 2 || values.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(GraphError::Unsupported(format!(
            "{name} must hold {} finite positive values",
            cfg.n_rot / 2
        )));
    }
    Ok(Some(values))
}

/// The names of a family's tensors: `top`, `output.weight` where the file
/// has one (the head is tied otherwise), and `blk.N.<name>.<suffix>` for
/// every layer, per-layer name and suffix.
pub fn tensor_names(
    cfg: &ModelConfig,
    file: &GgufFile,
    top: &[&str],
    layer: &[&str],
    suffixes: &[&str],
) -> Vec<String> {
    let mut names: Vec<String> = top.iter().map(|n| n.to_string()).collect();
    if file.tensor("output.weight").is_some() {
        names.push("output.weight".into());
    }
    for i in 0..cfg.n_layer {
        for n in layer {
            names.extend(suffixes.iter().map(|s| format!("blk.{i}.{n}.{s}")));
        }
    }
    names
}

/// The rotation of `n_head` heads of a pass starting at `start_pos`, as the
/// configuration says (one RoPE base for every layer) and with `factors`.
pub fn rope_params<'a>(
    cfg: &ModelConfig,
    n_head: usize,
    start_pos: usize,
    factors: Option<&'a [f32]>,
) -> RopeParams<'a> {
    RopeParams {
        n_head,
        head_dim: cfg.head_dim,
        n_rot: cfg.n_rot,
        start_pos,
        freq_base: cfg.rope_freq_base,
        freq_scale: cfg.rope_freq_scale,
        style: cfg.rope_style(),
        freq_factors: factors,
        mscale: cfg.rope_attn_factor,
    }
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

/// The norm before the LM head.
pub enum FinalNorm<'w, W> {
    Rms(&'w W),
    /// LayerNorm with its bias (GPT-2).
    Layer(&'w W, &'w W),
}

/// The end of every forward pass: the rows whose logits are wanted go
/// through the final norm and the LM head; the last row is kept for the
/// backend's sampler and the requested logits copied to `pass.out` (left
/// empty for `Logits::None`).
pub fn lm_head<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    x: O::Buf,
    norm: FinalNorm<'_, O::Weight>,
    head: &O::Weight,
    pass: Pass<'_>,
) -> Result<(), O::Error> {
    let Pass {
        logits,
        out,
        rec: mut recorder,
        ..
    } = pass;
    let n = recorder.last + 1;
    let x = match logits {
        Logits::All | Logits::Rows => x,
        Logits::Last | Logits::None if n == 1 => x,
        Logits::Last | Logits::None => ops.take_row(&x, recorder.last)?,
    };
    let rows = match logits {
        Logits::All | Logits::Rows => n,
        Logits::Last | Logits::None => 1,
    };
    let mut normed = ops.buf(rows, cfg.n_embd)?;
    match norm {
        FinalNorm::Rms(w) => ops.rms_norm(&x, w, cfg.norm_eps, &mut normed)?,
        FinalNorm::Layer(w, b) => ops.layer_norm(&x, w, Some(b), cfg.norm_eps, &mut normed)?,
    }
    recorder.record_row(ops, "result_norm", &normed, rows - 1)?;
    let mut result = ops.buf(rows, cfg.vocab_size)?;
    ops.matmul(&normed, head, None, &mut result)?;
    ops.keep_last_row(&result)?;
    if matches!(logits, Logits::None | Logits::Rows) {
        out.clear();
        return Ok(());
    }
    ops.to_host(&result, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, MetaValue};
    use crate::model::synthetic::{synthetic_model, synthetic_model_with};
    use crate::model::Weights;

    fn file_with(tensors: &[(&str, &[f32])]) -> GgufFile {
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", MetaValue::String("phi3".into()));
        for (name, values) in tensors {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.tensor(name, &[values.len() as u64], GgmlType::F32, bytes);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    /// As llama.cpp's `get_rope_factors`: `rope_freqs` first; else the long
    /// LongRoPE table only when the served context exceeds the original one;
    /// every table `n_rot / 2` finite positive F32 values.
    #[test]
    fn rope_factors_are_chosen_as_llama_cpp_chooses_them() {
        let f = GgufFile::from_bytes(synthetic_model("phi3", 1, 64)).unwrap();
        let mut cfg = ModelConfig::try_from(&f.metadata).unwrap();
        let half = cfg.n_rot / 2;
        let (long, short, freqs) = (vec![4.0; half], vec![1.5; half], vec![8.0; half]);
        let tables = [
            ("rope_factors_long.weight", &long[..]),
            ("rope_factors_short.weight", &short[..]),
        ];
        let file = file_with(&tables);
        cfg.context_length = 4096;
        cfg.rope_orig_context = Some(1024);
        assert_eq!(rope_factors(&cfg, &file).unwrap(), Some(long.clone()));
        for orig in [Some(4096), Some(8192), None] {
            cfg.rope_orig_context = orig;
            assert_eq!(rope_factors(&cfg, &file).unwrap(), Some(short.clone()));
        }
        let with_freqs = file_with(&[tables[0], tables[1], ("rope_freqs.weight", &freqs[..])]);
        assert_eq!(rope_factors(&cfg, &with_freqs).unwrap(), Some(freqs));
        assert_eq!(rope_factors(&cfg, &file_with(&[])).unwrap(), None);
        assert_eq!(
            rope_factor_names(&with_freqs).len(),
            3,
            "every factor tensor is among the names the model reads"
        );

        let mut bad = short.clone();
        bad[3] = 0.0;
        let zero = file_with(&[("rope_factors_short.weight", &bad[..])]);
        assert!(rope_factors(&cfg, &zero).is_err(), "a zero factor");
        bad[3] = f32::NAN;
        let nan = file_with(&[("rope_factors_short.weight", &bad[..])]);
        assert!(rope_factors(&cfg, &nan).is_err(), "a NaN factor");
        let wrong = file_with(&[("rope_factors_short.weight", &short[1..])]);
        assert!(
            matches!(
                rope_factors(&cfg, &wrong),
                Err(GraphError::WrongShape { .. })
            ),
            "a table of the wrong length"
        );
    }

    /// The synthetic files with factors load them as their family reads
    /// them: phi3 its long table (served past the original context) and its
    /// magnitude factor, llama its `rope_freqs`.
    #[test]
    fn synthetic_files_with_factors_load_them() {
        for arch in ["llama", "phi3"] {
            let f = GgufFile::from_bytes(synthetic_model_with(arch, 2, 64, true)).unwrap();
            let cfg = ModelConfig::try_from(&f.metadata).unwrap();
            let w = Weights::<()>::load::<GraphError>(&cfg, &f, &mut |_| Ok(())).unwrap();
            let ff = w.rope_freq_factors().expect("factors");
            assert_eq!(ff.len(), cfg.n_rot / 2, "{arch}");
            let top = if arch == "phi3" { 40.0 } else { 8.0 };
            assert_eq!(ff.last().copied(), Some(top), "{arch}");
            let attn = if arch == "phi3" { 1.1 } else { 1.0 };
            assert!((cfg.rope_attn_factor - attn).abs() < 1e-6, "{arch}");
        }
    }
}

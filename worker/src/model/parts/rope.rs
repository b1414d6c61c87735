//! The rotation every RoPE architecture shares: the frequency factors a
//! file may hold (or YaRN's table), and one layer's Q and K parameters.

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{GraphError, RopeParams};
use crate::quant::GgmlType;

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

/// The rotations of layer `il`'s Q (`n_head` heads) and K (`n_head_kv`) in
/// a pass starting at `start_pos`, with the layer's base and scale as the
/// configuration says ([`ModelConfig::rope_base`], [`ModelConfig::rope_scale`])
/// and `factors`.
pub fn rope_pair<'a>(
    cfg: &ModelConfig,
    il: usize,
    start_pos: usize,
    factors: Option<&'a [f32]>,
) -> (RopeParams<'a>, RopeParams<'a>) {
    let rope = |n_head| RopeParams {
        n_head,
        head_dim: cfg.head_dim,
        n_rot: cfg.n_rot,
        start_pos,
        freq_base: cfg.rope_base(il),
        freq_scale: cfg.rope_scale(il),
        style: cfg.rope_style(),
        freq_factors: factors,
        mscale: cfg.rope_attn_factor,
    };
    (rope(cfg.n_head), rope(cfg.n_head_kv))
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

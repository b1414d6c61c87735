//! The attention's shape from the metadata: the head size, and which
//! layers attend through a sliding window.

use crate::gguf::{MetaValue, Metadata};
use crate::model::config::{Architecture, ConfigError};

/// The head size: `attention.key_length` where the file has it (Gemma 3's
/// heads are wider than `embedding_length / head_count`), else the width
/// shared among the heads. K and V heads must be the same size.
pub(super) fn head_dim(
    md: &Metadata,
    arch: &str,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
) -> Result<usize, ConfigError> {
    if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return Err(ConfigError::Invalid(format!(
            "{n_head} heads and {n_head_kv} KV heads do not divide evenly"
        )));
    }
    let key_len = md.opt_u64(&format!("{arch}.attention.key_length"))?;
    let value_len = md.opt_u64(&format!("{arch}.attention.value_length"))?;
    match (key_len, value_len) {
        (Some(k), v) if v.is_none_or(|v| v == k) => {
            if k == 0 || k > MAX_HEAD_DIM {
                return Err(ConfigError::Invalid(format!(
                    "attention.key_length {k} must be 1 to {MAX_HEAD_DIM}"
                )));
            }
            Ok(k as usize)
        }
        (None, None) if n_embd.is_multiple_of(n_head) => Ok(n_embd / n_head),
        (None, None) => Err(ConfigError::Invalid(format!(
            "{n_head} heads do not divide the width {n_embd}"
        ))),
        (k, v) => Err(ConfigError::Invalid(format!(
            "attention.key_length {k:?} and value_length {v:?} differ"
        ))),
    }
}

/// Largest head size a file may claim (every backend also checks its own).
const MAX_HEAD_DIM: u64 = 1024;

/// The sliding window and the layers that use it. Gemma 3, as llama.cpp's
/// loader reads it: `attention.sliding_window`, and either a per-layer
/// `attention.sliding_window_pattern` array or a period `n` (default 6) in
/// which every layer but the `n`-th is windowed. Phi-3: every layer, as
/// Hugging Face's Phi-3 attends (llama.cpp ignores phi3's window, which
/// makes a difference only past it: 2,047 positions for Phi-3-mini-4k).
pub(super) fn sliding_window(
    md: &Metadata,
    arch: Architecture,
    n_layer: usize,
) -> Result<Option<(usize, Vec<bool>)>, ConfigError> {
    let name = arch.name();
    let window = match md.opt_u64(&format!("{name}.attention.sliding_window"))? {
        Some(w) if w > 0 => w,
        _ => return Ok(None),
    };
    let window = usize::try_from(window).unwrap_or(usize::MAX);
    match arch {
        Architecture::Gemma3 => {}
        Architecture::Phi3 => return Ok(Some((window, vec![true; n_layer]))),
        // llama.cpp's `load_swa_pattern(ml, 2)`: layers 0, 2, 4, ... windowed.
        Architecture::GptOss => {
            return Ok(Some((window, (0..n_layer).map(|il| il % 2 == 0).collect())))
        }
        _ => {
            return Err(ConfigError::Invalid(format!(
                "sliding-window attention is not supported for {name}"
            )))
        }
    }
    let pattern_key = format!("{name}.attention.sliding_window_pattern");
    let layers = match md.get(&pattern_key) {
        Some(MetaValue::Array(items)) => {
            let layers: Option<Vec<bool>> = items.iter().map(MetaValue::as_bool).collect();
            match layers {
                Some(l) if l.len() == n_layer => l,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{pattern_key} must hold {n_layer} booleans"
                    )))
                }
            }
        }
        _ => {
            let period = md.opt_u64(&pattern_key)?.unwrap_or(6) as usize;
            (0..n_layer)
                .map(|il| period == 0 || il % period < period - 1)
                .collect()
        }
    };
    Ok(Some((window, layers)))
}

#[cfg(test)]
mod tests {
    use crate::gguf::MetaValue;
    use crate::model::config::tests::{metadata, with};
    use crate::model::config::ModelConfig;

    /// Gemma 3: heads from `attention.key_length`, a window on the layers
    /// its pattern names (a period, or one boolean a layer), their own RoPE base.
    #[test]
    fn gemma3_heads_windows_and_rope_bases() {
        let md = metadata("gemma3");
        let cfg = ModelConfig::try_from(&md).unwrap();
        assert_eq!((cfg.head_dim, cfg.q_dim()), (128, 512));
        assert_eq!((cfg.window(0), cfg.window(1)), (Some(8), None));
        assert_eq!(
            (cfg.rope_base(0), cfg.rope_base(1)),
            (10_000.0, 1_000_000.0)
        );

        let pattern = |v: Vec<MetaValue>| {
            let key = "gemma3.attention.sliding_window_pattern";
            with(&md, &[(key, Some(MetaValue::Array(v)))])
        };
        let cfg = ModelConfig::try_from(&pattern(vec![
            MetaValue::Bool(false),
            MetaValue::Bool(true),
        ]))
        .unwrap();
        assert_eq!((cfg.window(0), cfg.window(1)), (None, Some(8)));
        let err = ModelConfig::try_from(&pattern(vec![MetaValue::Bool(true)])).unwrap_err();
        assert!(err.to_string().contains("2 booleans"), "{err}");

        let base = with(
            &md,
            &[("gemma3.rope.freq_base_swa", Some(MetaValue::F32(5e5)))],
        );
        assert_eq!(ModelConfig::try_from(&base).unwrap().rope_base(0), 5e5);
        let no_window = with(&md, &[("gemma3.attention.sliding_window", None)]);
        let cfg = ModelConfig::try_from(&no_window).unwrap();
        assert_eq!((cfg.window(0), cfg.rope_base(0)), (None, 1_000_000.0));
    }

    /// K and V heads of different sizes, or of none, are refused by name.
    #[test]
    fn key_and_value_lengths_must_agree() {
        let md = metadata("gemma3");
        let (k, v) = (
            "gemma3.attention.key_length",
            "gemma3.attention.value_length",
        );
        let differ = with(&md, &[(v, Some(MetaValue::U32(64)))]);
        let err = ModelConfig::try_from(&differ).unwrap_err();
        assert!(err.to_string().contains("differ"), "{err}");
        let empty = with(&md, &[(k, Some(MetaValue::U32(0))), (v, None)]);
        let err = ModelConfig::try_from(&empty).unwrap_err();
        assert!(err.to_string().contains("1 to 1024"), "{err}");
    }

    /// Phi-3 windows every layer and keeps one RoPE base; gpt2 reads
    /// LayerNorm's epsilon; an architecture without windows refuses one.
    #[test]
    fn phi3_gpt2_and_windows_elsewhere() {
        let cfg = ModelConfig::try_from(&metadata("phi3")).unwrap();
        assert_eq!((cfg.window(0), cfg.window(1)), (Some(16), Some(16)));
        assert_eq!(cfg.rope_base(0), cfg.rope_freq_base);
        let cfg = ModelConfig::try_from(&metadata("gpt2")).unwrap();
        assert_eq!((cfg.norm_eps, cfg.window(0)), (1e-5, None));
        let llama = with(
            &metadata("llama"),
            &[("llama.attention.sliding_window", Some(MetaValue::U32(8)))],
        );
        let err = ModelConfig::try_from(&llama).unwrap_err();
        assert!(err.to_string().contains("not supported for llama"), "{err}");
        let capped = with(
            &metadata("gemma3"),
            &[("gemma3.final_logit_softcapping", Some(MetaValue::F32(30.0)))],
        );
        let err = ModelConfig::try_from(&capped).unwrap_err();
        assert!(err.to_string().contains("final_logit_softcapping"), "{err}");
    }
}

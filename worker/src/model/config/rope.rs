//! RoPE scaling by YaRN (`rope.scaling.type` yarn): its keys, and the
//! frequency-factor table and magnitude it turns into, as llama.cpp's
//! `ggml_rope_yarn_corr_dims` and `rope_yarn` compute them.

use crate::gguf::Metadata;
use crate::model::config::{Architecture, ConfigError};

/// YaRN's parameters (llama.cpp's `yarn_*` hparams and `n_ctx_orig_yarn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.factor`: the interpolated dimensions turn `1 / factor`
    /// as fast.
    pub factor: f32,
    /// `rope.scaling.original_context_length`.
    pub orig_context: usize,
    /// `rope.scaling.yarn_beta_fast` / `_slow` (32 and 1 by default): the
    /// rotations per original context that bound the ramp.
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `rope.scaling.yarn_ext_factor` (1 by default): how much of the ramp
    /// extrapolates.
    pub ext_factor: f32,
}

impl Yarn {
    /// llama.cpp's `ggml_rope_yarn_corr_dims`: the pair indices where the
    /// ramp from extrapolation (below) to interpolation (above) starts and
    /// ends, for `n_rot` rotated dimensions at `base`.
    pub fn corr_dims(&self, n_rot: usize, base: f32) -> (f32, f32) {
        let n = n_rot as f32;
        let dim = |beta: f32| {
            n * (self.orig_context as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = dim(self.beta_fast).floor().max(0.0);
        let end = dim(self.beta_slow).ceil().min(n - 1.0);
        (start, end)
    }

    /// The divisor of each rotated pair's frequency that makes `pos *
    /// base^(-2i/n_rot) / factor_i` ggml's `rope_yarn` angle: the
    /// interpolated angle (`1 / factor` as fast) blended with the original
    /// one by the ramp (`ext_factor` times 1 below the correction dims, 0
    /// above, linear between). The blend is linear in the position, so a
    /// table serves every position and both backends' RoPE take it as they
    /// take Llama 3.1's `rope_freqs`.
    pub fn freq_factors(&self, n_rot: usize, base: f32) -> Vec<f32> {
        let (low, high) = self.corr_dims(n_rot, base);
        let scale = 1.0 / self.factor;
        (0..n_rot / 2)
            .map(|i| {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                1.0 / (scale * (1.0 - mix) + mix)
            })
            .collect()
    }

    /// The factor on the cosines and sines: llama.cpp's `yarn_attn_factor`
    /// (`0.1 ln(factor) + 1`, over the same factor that `rope_yarn` then
    /// multiplies back in when `ext_factor` is not 0), so `0.1 ln(factor) +
    /// 1` in all; 1 without extrapolation.
    pub fn mscale(&self) -> f32 {
        if self.ext_factor == 0.0 || self.factor <= 1.0 {
            1.0
        } else {
            0.1 * self.factor.ln() + 1.0
        }
    }
}

/// YaRN's keys, for the architectures that take it (llama, qwen2, qwen3,
/// qwen3moe, gpt-oss).
pub(super) fn yarn(
    md: &Metadata,
    arch_name: &str,
    arch: Architecture,
    orig_context: Option<usize>,
) -> Result<Yarn, ConfigError> {
    let key = |k: &str| format!("{arch_name}.rope.scaling.{k}");
    if !matches!(
        arch,
        Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::GptOss
    ) {
        return Err(ConfigError::Invalid(format!(
            "YaRN RoPE scaling is not supported for {arch_name}"
        )));
    }
    if md.opt_f32(&key("yarn_log_multiplier"))?.is_some() {
        return Err(ConfigError::Invalid(
            "rope.scaling.yarn_log_multiplier is not supported".into(),
        ));
    }
    let y = Yarn {
        factor: md.get_f32(&key("factor"))?,
        orig_context: orig_context.ok_or_else(|| {
            ConfigError::Invalid(format!("YaRN needs {}", key("original_context_length")))
        })?,
        beta_fast: md.opt_f32(&key("yarn_beta_fast"))?.unwrap_or(32.0),
        beta_slow: md.opt_f32(&key("yarn_beta_slow"))?.unwrap_or(1.0),
        ext_factor: md.opt_f32(&key("yarn_ext_factor"))?.unwrap_or(1.0),
    };
    let ok = |v: f32| v.is_finite() && v > 0.0;
    let in_range = ok(y.factor)
        && ok(y.beta_fast)
        && ok(y.beta_slow)
        && y.orig_context > 0
        && (0.0..=1.0).contains(&y.ext_factor);
    if !in_range {
        return Err(ConfigError::Invalid(format!(
            "YaRN parameters out of range: {y:?}"
        )));
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetaValue;
    use crate::model::config::tests::{metadata, with};
    use crate::model::config::ModelConfig;

    /// ggml's `rope_yarn` angle for pair `i` at `pos` (ggml-cpu's ops.cpp,
    /// written out in f64): the interpolated angle blended with the
    /// original one by the ramp between the correction dims.
    fn ggml_yarn_theta(y: &Yarn, n_rot: usize, base: f64, pos: f64, i: usize) -> f64 {
        let corr = |beta: f64| {
            n_rot as f64 * (y.orig_context as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr(y.beta_fast as f64).floor().max(0.0);
        let high = corr(y.beta_slow as f64).ceil().min(n_rot as f64 - 1.0);
        let extrap = pos * base.powf(-2.0 * i as f64 / n_rot as f64);
        let interp = extrap / y.factor as f64;
        let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let mix = ramp * y.ext_factor as f64;
        interp * (1.0 - mix) + extrap * mix
    }

    /// YaRN as gpt-oss has it (factor 32 over 4096 positions, betas 32 and
    /// 1, base 150 000, 64 rotated dims): correction dims 8 and 18, a
    /// factor table whose angles are ggml's `rope_yarn` angles at every
    /// pair and position, and llama.cpp's magnitude 0.1 ln 32 + 1; linear
    /// scaling off; refused for architectures without it.
    #[test]
    fn yarn_turns_into_llama_cpps_angles() {
        let md = with(
            &metadata("llama"),
            &[
                ("llama.rope.freq_base", Some(MetaValue::F32(150_000.0))),
                (
                    "llama.rope.scaling.type",
                    Some(MetaValue::String("yarn".into())),
                ),
                ("llama.rope.scaling.factor", Some(MetaValue::F32(32.0))),
                (
                    "llama.rope.scaling.original_context_length",
                    Some(MetaValue::U32(4096)),
                ),
                (
                    "llama.rope.scaling.yarn_beta_fast",
                    Some(MetaValue::F32(32.0)),
                ),
                (
                    "llama.rope.scaling.yarn_beta_slow",
                    Some(MetaValue::F32(1.0)),
                ),
            ],
        );
        let cfg = ModelConfig::try_from(&md).unwrap();
        let y = cfg.rope_yarn.unwrap();
        assert_eq!(cfg.rope_freq_scale, 1.0);
        assert!((cfg.rope_attn_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        let n_rot = 64;
        assert_eq!(y.corr_dims(n_rot, 150_000.0), (8.0, 18.0));
        let factors = y.freq_factors(n_rot, 150_000.0);
        assert_eq!(factors.len(), 32);
        assert_eq!(
            (factors[0], factors[8], factors[18], factors[31]),
            (1.0, 1.0, 32.0, 32.0)
        );
        let inv = crate::model::ops::rope_inv_freqs(150_000.0, n_rot, Some(&factors));
        for pos in [1.0, 7.0, 130.0, 4095.0, 100_000.0] {
            for (i, f) in inv.iter().enumerate() {
                let want = ggml_yarn_theta(&y, n_rot, 150_000.0, pos, i);
                let got = pos * f;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "pos {pos} pair {i}: {got} vs {want}"
                );
            }
        }
        let missing = with(&md, &[("llama.rope.scaling.original_context_length", None)]);
        let err = ModelConfig::try_from(&missing).unwrap_err();
        assert!(err.to_string().contains("original_context_length"), "{err}");
        let phi3 = with(
            &metadata("phi3"),
            &[(
                "phi3.rope.scaling.type",
                Some(MetaValue::String("yarn".into())),
            )],
        );
        let err = ModelConfig::try_from(&phi3).unwrap_err();
        assert!(err.to_string().contains("not supported for phi3"), "{err}");
    }
}

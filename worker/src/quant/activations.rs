//! Rounding activations the way ggml does before a dot product with stored
//! weights.
//!
//! ggml never multiplies quantized weights by f32 activations directly: each
//! weight type has a `vec_dot_type`, and the activation row is first converted
//! to it (`Q4_0`, `Q5_0`, `Q8_0`, `MXFP4` → `Q8_0`; `Q4_1`, `Q5_1` → `Q8_1`;
//! the K-quants → `Q8_K`; `F16` → `F16`; `BF16` → `BF16`; `F32` stays). The
//! reference model is sensitive to that rounding at the 0.1-nat level, so the
//! CPU reference applies the same rounding to agree with llama.cpp, and the
//! CUDA kernels do the same (their int8 dot products need it anyway).
//!
//! [`round_activations`] replaces each value with the one the converted block
//! stands for, so the product that follows can stay a plain f32 dot.

use half::{bf16, f16};

use super::GgmlType;

/// The activation format ggml converts to before a dot product with `weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationFormat {
    F32,
    F16,
    BF16,
    /// 32-value blocks, `d = amax / 127` stored as f16 (`Q8_0` and `Q8_1`
    /// carry the same values; `Q8_1` adds a sum used with the weight minimum).
    Q8,
    /// 256-value blocks, `d = 1 / iscale` stored as f32 (`Q8_K`).
    Q8K,
}

impl ActivationFormat {
    pub fn for_weight(weight: GgmlType) -> Self {
        match weight {
            GgmlType::F32 => ActivationFormat::F32,
            GgmlType::F16 => ActivationFormat::F16,
            GgmlType::BF16 => ActivationFormat::BF16,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Mxfp4 => ActivationFormat::Q8,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => ActivationFormat::Q8K,
        }
    }
}

/// Rounds one activation row in place to what ggml's `vec_dot_type` for
/// `weight` would carry. The row length must be a whole number of the
/// weight's blocks (checked when the weight was loaded).
pub fn round_activations(weight: GgmlType, x: &mut [f32]) {
    match ActivationFormat::for_weight(weight) {
        ActivationFormat::F32 => {}
        ActivationFormat::F16 => x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32()),
        ActivationFormat::BF16 => x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        ActivationFormat::Q8 => x.chunks_mut(32).for_each(round_q8_block),
        ActivationFormat::Q8K => x.chunks_mut(256).for_each(round_q8k_block),
    }
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)`,
/// and the block's scale is kept as f16.
fn round_q8_block(block: &mut [f32]) {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let stored_d = f16::from_f32(d).to_f32();
    for v in block.iter_mut() {
        *v = (*v * id).round() * stored_d;
    }
}

/// ggml's `quantize_row_q8_K_ref`: the scale comes from the value of largest
/// magnitude (with its sign), `iscale = -127 / max`, `q = round(iscale * x)`
/// clamped to 127, and `d = 1 / iscale` stays f32.
fn round_q8k_block(block: &mut [f32]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in block.iter() {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        block.fill(0.0);
        return;
    }
    let iscale = -127.0 / max;
    let d = 1.0 / iscale;
    for v in block.iter_mut() {
        *v = (iscale * *v).round().min(127.0) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_blocks_keep_127_levels_of_the_block_maximum() {
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 * 0.1 - 1.0).collect();
        x[5] = 2.54; // amax: d = 0.02
        let original = x.clone();
        round_activations(GgmlType::Q4_1, &mut x);
        let d = f16::from_f32(2.54 / 127.0).to_f32();
        for (r, o) in x.iter().zip(&original) {
            let q = (o / (2.54 / 127.0)).round();
            assert_eq!(*r, q * d);
            assert!((r - o).abs() <= 0.011, "{o} rounded to {r}");
        }
    }

    #[test]
    fn q8k_blocks_use_the_signed_maximum() {
        let mut x = vec![0.5f32; 256];
        x[17] = -3.0;
        round_activations(GgmlType::Q4K, &mut x);
        let iscale = -127.0f32 / -3.0;
        assert_eq!(x[17], (iscale * -3.0f32).round() / iscale);
        assert_eq!(x[0], (iscale * 0.5f32).round() / iscale);
    }

    #[test]
    fn f32_weights_leave_activations_alone_and_zero_blocks_stay_zero() {
        let mut x = vec![0.123456789f32; 64];
        round_activations(GgmlType::F32, &mut x);
        assert_eq!(x[0], 0.123456789);
        let mut z = vec![0.0f32; 256];
        round_activations(GgmlType::Q6K, &mut z);
        round_activations(GgmlType::Q8_0, &mut z);
        assert!(z.iter().all(|&v| v == 0.0));
    }
}

//! Benchmarks live under benches/; this is what they share: where the models
//! are, the real tensor shapes the GPU benches use, and the skip rule (a bench
//! that cannot run says so and why, and exits 0; it never passes silently).
//! The environment variables are documented in benches/README.md.

use std::path::PathBuf;
use std::sync::Arc;

use worker_orcd::backend::cuda::CudaDevice;
use worker_orcd::quant::{quantize, GgmlType};

/// The reference model, which `ci/fetch-model` puts in place; panics with
/// that hint when it is missing.
pub fn reference_model() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.models/smollm2-135m-instruct-q4_1.gguf");
    assert!(
        path.exists(),
        "run ci/fetch-model first: {} is missing",
        path.display()
    );
    path
}

/// Prints why `bench` does not run.
pub fn skip(bench: &str, why: &str) {
    println!("{bench}: skipped: {why}");
}

/// GPU 0, or `None` after printing why there is none.
pub fn cuda_device_or_skip(bench: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(dev) => {
            println!(
                "{bench}: on {} (sm {})",
                dev.info().name,
                dev.info().sm.as_deref().unwrap_or("?")
            );
            Some(dev)
        }
        Err(e) => {
            skip(bench, &format!("no CUDA device ({e})"));
            None
        }
    }
}

/// A model shape the GPU benches measure, and the variable naming its file.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    /// Environment variable holding the path of a GGUF file of this shape.
    pub env: &'static str,
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

pub const SMOLLM2: Shape = Shape {
    name: "smollm2",
    env: "BENCH_MODEL_SMOLLM2",
    hidden: 576,
    ffn: 1536,
    vocab: 49152,
    n_head: 9,
    n_head_kv: 3,
    head_dim: 64,
};
pub const QWEN_05B: Shape = Shape {
    name: "qwen2.5-0.5b",
    env: "BENCH_MODEL_QWEN05B",
    hidden: 896,
    ffn: 4864,
    vocab: 151936,
    n_head: 14,
    n_head_kv: 2,
    head_dim: 64,
};
pub const LLAMA_8B: Shape = Shape {
    name: "llama-3-8b",
    env: "BENCH_MODEL_LLAMA8B",
    hidden: 4096,
    ffn: 14336,
    vocab: 128256,
    n_head: 32,
    n_head_kv: 8,
    head_dim: 128,
};

impl Shape {
    /// The weight matrices `(label, rows, cols)` of one layer and the LM head:
    /// rows are outputs, cols (GGUF `ne0`) inputs.
    pub fn matrices(&self) -> [(&'static str, usize, usize); 4] {
        [
            ("attn_q", self.hidden, self.hidden),
            ("ffn_up", self.ffn, self.hidden),
            ("ffn_down", self.hidden, self.ffn),
            ("output", self.vocab, self.hidden),
        ]
    }

    /// The GGUF file of this shape: `$env`, or for SmolLM2 the reference
    /// model; `None` after printing why there is none.
    pub fn model_or_skip(&self, bench: &str) -> Option<PathBuf> {
        let path = match std::env::var_os(self.env) {
            Some(p) => PathBuf::from(p),
            None if self.name == SMOLLM2.name => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../.models/smollm2-135m-instruct-q4_1.gguf"),
            None => {
                let why = format!("{} is not set (a GGUF file of this shape)", self.env);
                skip(&format!("{bench}/{}", self.name), &why);
                return None;
            }
        };
        if !path.exists() {
            skip(
                &format!("{bench}/{}", self.name),
                &format!("{} does not exist", path.display()),
            );
            return None;
        }
        Some(path)
    }
}

/// Weight formats to bench: `$BENCH_FORMATS` (comma-separated names), else all.
pub fn formats() -> Vec<GgmlType> {
    match std::env::var("BENCH_FORMATS") {
        Ok(list) => list
            .split(',')
            .filter_map(|n| GgmlType::from_name(n.trim()))
            .collect(),
        Err(_) => GgmlType::ALL.to_vec(),
    }
}

/// Stored bytes of a `rows x cols` matrix of `ty`: a few rows of random values
/// quantized by the reference quantizer, repeated. Speed depends on the format
/// and shape, not on the values, and quantizing a 128256-row matrix would take
/// longer than the bench.
pub fn tiled_weight(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    const DISTINCT_ROWS: usize = 8;
    let n = DISTINCT_ROWS.min(rows);
    let values: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.05)
        .collect();
    let block = quantize(ty, &values).expect("the shape is whole blocks of the format");
    let row_bytes = block.len() / n;
    let mut out = Vec::with_capacity(rows * row_bytes);
    while out.len() < rows * row_bytes {
        let take = (rows * row_bytes - out.len()).min(block.len());
        out.extend_from_slice(&block[..take]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_weights_have_the_stored_size_of_every_format() {
        for ty in GgmlType::ALL {
            let (rows, cols) = (19, 512);
            let bytes = tiled_weight(ty, rows, cols);
            assert_eq!(
                bytes.len() as u64,
                rows as u64 * ty.bytes_for(cols as u64).unwrap(),
                "{ty}"
            );
        }
    }

    #[test]
    fn every_shape_is_whole_blocks_and_heads() {
        for shape in [SMOLLM2, QWEN_05B, LLAMA_8B] {
            for (label, _, cols) in shape.matrices() {
                assert_eq!(cols % 32, 0, "{} {label}: {cols} columns", shape.name);
            }
            assert_eq!(
                shape.n_head * shape.head_dim,
                shape.hidden,
                "{}",
                shape.name
            );
        }
    }
}

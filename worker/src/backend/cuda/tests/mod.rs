//! Tests of the CUDA backend, a module per kernel family; the helpers they
//! share are here.
//!
//! - Without a GPU: every `cuda/*.cu` compiles through the worker's own NVRTC
//!   path for sm_80 and sm_90 when libnvrtc can be loaded (CI loads it from
//!   the `nvidia-cuda-nvrtc` wheel; with `CI` set, a missing NVRTC fails);
//!   every kernel symbol is defined in its module and every launcher's
//!   parameters match its C signature (`compile`); every kernel's grid and
//!   block (`geometry`); the launch-argument and
//!   alignment checks (M0-W-1431, M0-W-1220); a zero upload chunk is refused
//!   (M0-W-1222).
//! - With a GPU (`#[ignore]`d, run with `--run-ignored all` / `--include-ignored`):
//!   each kernel against the CPU reference ops at real and odd shapes for
//!   every weight format (`matmul`; `mv8`: x split for the integer mat-vecs;
//!   `norm`: LayerNorm at GPT-2's widths,
//!   M0-W-1432; `attention`; `elementwise`: GELU against f64, M0-W-1433),
//!   determinism over 50 runs, device set-up (`setup`), sampling
//!   (`sample`), graph replay (`graph`), memory accounting, residency, and
//!   whole models (`model`: a synthetic llama/qwen2 with every format, and
//!   the reference model when present) against the CPU backend.
//! - `weights`: stored bytes on the device byte for byte (M0-W-1201), 256-byte
//!   boundaries (M0-W-1220), the chunked upload and its failure (M0-W-1222),
//!   and the driver's free memory back after a load and drop (M0-SYS-2.5.1).
//! - `safety`: operations and launchers refuse undersized buffers and zero
//!   lengths before launching, and compute-sanitizer memcheck over the
//!   kernel tests is clean (M0-W-1431).
//!
//! GPU tests hold a shared lock on one file, and the tests that read the
//! driver's free memory an exclusive one (see [`gpu_lock`]). Under
//! compute-sanitizer the kernel tests run in a quick mode ([`QUICK_ENV`]).

mod attention;
mod compile;
mod elementwise;
mod file_replaced;
mod geometry;
mod gpt_oss;
mod graph;
mod kv_pool;
mod launchers;
mod matmul;
mod memcheck;
mod model;
mod moe;
mod mv8;
mod norm;
mod rows;
mod safety;
mod sample;
mod setup;
mod weights;

use std::sync::{Arc, OnceLock};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::backend::cpu::{CpuBackend, CpuBuf, CpuCache, CpuOps, CpuWeight};
use crate::backend::Backend;
use crate::gguf::{GgufFile, GgufWriter, MetaValue};
use crate::model::config::RopeStyle;
use crate::model::ops::{AttentionShape, Ops, RopeParams};
use crate::quant::{quantize, GgmlType};

const GPU: &str = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)";

// ------------------------------------------------------------------ helpers

fn rel_err(gpu: &[f32], cpu: &[f32]) -> f64 {
    assert_eq!(gpu.len(), cpu.len(), "lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "GPU value {g} is not finite");
        num += (g as f64 - c as f64).powi(2);
        den += (c as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

use crate::model::synthetic::random_vec;

/// A file or folder of the workspace: beside the crate when built here, or
/// under the current directory (a checkout elsewhere, such as the GPU machine).
fn workspace_path(rel: &str) -> std::path::PathBuf {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    if built.exists() {
        built
    } else {
        std::path::PathBuf::from(rel)
    }
}

/// Set (by `m0_w_1431_compute_sanitizer_memcheck_is_clean`) when the kernel
/// tests run under compute-sanitizer, where every launch is many times
/// slower: the tests then skip their largest shapes and check determinism
/// over 2 runs instead of 50. Every kernel and code path is still reached.
const QUICK_ENV: &str = "WORKER_ORCD_KERNEL_TESTS_QUICK";

fn quick() -> bool {
    std::env::var_os(QUICK_ENV).is_some()
}

/// GPU tests run side by side (threads under `cargo test`, processes under
/// nextest), but the tests that read the driver's free memory
/// (M0-SYS-2.5.1, M0-W-1220) need the GPU to themselves. So every GPU test
/// here holds an flock on one file in the temp directory: shared for most,
/// exclusive for those. Each call opens the file anew, so the lock works
/// between threads of one process as between processes. Dropping the file
/// releases it.
fn gpu_lock(exclusive: bool) -> std::fs::File {
    let path = std::env::temp_dir().join("worker-orcd-gpu-tests.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    if exclusive { f.lock() } else { f.lock_shared() }
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    f
}

fn shared_gpu() -> std::fs::File {
    gpu_lock(false)
}

fn exclusive_gpu() -> std::fs::File {
    gpu_lock(true)
}

fn dev() -> Arc<CudaDevice> {
    static DEV: OnceLock<Arc<CudaDevice>> = OnceLock::new();
    DEV.get_or_init(|| CudaDevice::new(0).expect("GPU 0 initialises"))
        .clone()
}

fn gpu_ops() -> CudaOps {
    CudaOps::new(dev())
}

/// One weight, both as the CPU backend holds it and on the GPU.
struct TestWeight {
    cpu: CpuWeight,
    gpu: CudaWeight,
}

fn test_weight(
    ops: &mut CudaOps,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    values: &[f32],
) -> TestWeight {
    let bytes = quantize(ty, values).expect("quantizes");
    let dims: Vec<u64> = if rows == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    let mut w = GgufWriter::new();
    w.tensor("w", &dims, ty, bytes.clone());
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes()).expect("valid GGUF"));
    let info = file.tensor("w").unwrap().clone();
    let cpu = if rows == 1 {
        CpuWeight::dense(&file, &info, cols).unwrap()
    } else {
        CpuWeight::stored(file.clone(), &info, rows, cols).unwrap()
    };
    let gpu = ops.upload_weight(ty, rows, cols, &bytes).expect("uploads");
    TestWeight { cpu, gpu }
}

fn cpu_buf(rows: usize, cols: usize, data: Vec<f32>) -> CpuBuf {
    CpuBuf { rows, cols, data }
}

fn host(ops: &mut CudaOps, b: &CudaBuf) -> Vec<f32> {
    let mut v = Vec::new();
    ops.to_host(b, &mut v).unwrap();
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `f` 50 times (twice in quick mode) and asserts that every run gives
/// the same bytes (M0-W-1031).
fn assert_deterministic(what: &str, mut f: impl FnMut() -> Vec<f32>) {
    let first = bits(&f());
    let runs = if quick() { 2 } else { 50 };
    for i in 1..runs {
        assert!(bits(&f()) == first, "{what}: run {i} differs from run 0");
    }
}

// ----------------------------------------------- models shared by the tests

fn reference_model_path() -> Option<std::path::PathBuf> {
    let p = match std::env::var_os("WORKER_ORCD_REFERENCE_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => workspace_path(".models/smollm2-135m-instruct-q4_1.gguf"),
    };
    p.exists().then_some(p)
}

/// The reference model for a test that needs it; `None`, with a note, when
/// it is absent, which CI does not allow.
fn reference_model_or_skip() -> Option<std::path::PathBuf> {
    let path = reference_model_path();
    if path.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch the reference model"
        );
        eprintln!("skipping: the reference model is absent");
    }
    path
}

/// Loads `file` on both backends.
fn both_backends(file: Arc<GgufFile>, opts: &CudaLoadOptions) -> (CpuBackend, CudaBackend) {
    let cfg = ModelConfig::try_from(&file.metadata).expect("config");
    let cpu = CpuBackend::load(cfg.clone(), file.clone(), &mut |_| {}).expect("CPU load");
    let gpu = CudaBackend::load(cfg, &file, opts, &mut |_| {}).expect("GPU load");
    (cpu, gpu)
}

/// A random-weight model of SmolLM2-135M's exact shapes and formats (Q4_1
/// matrices, Q8_0 tied embedding): speed depends on shapes, not values, so
/// this times the reference model without carrying its file.
fn smollm2_shaped_model() -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let (d, n_layer, n_head, n_kv, ff, vocab) =
        (576usize, 30usize, 9usize, 3usize, 1536usize, 49152usize);
    let hd = d / n_head;
    let mut w = GgufWriter::new();
    let s = |v: &str| MetaValue::String(v.to_string());
    w.metadata("general.architecture", s("llama"));
    w.metadata("general.name", s("smollm2-shaped"));
    for (k, v) in [
        ("context_length", 8192u32),
        ("embedding_length", d as u32),
        ("block_count", n_layer as u32),
        ("attention.head_count", n_head as u32),
        ("attention.head_count_kv", n_kv as u32),
        ("feed_forward_length", ff as u32),
        ("vocab_size", vocab as u32),
        ("rope.dimension_count", hd as u32),
    ] {
        w.metadata(&format!("llama.{k}"), MetaValue::U32(v));
    }
    w.metadata(
        "llama.attention.layer_norm_rms_epsilon",
        MetaValue::F32(1e-5),
    );
    w.metadata("llama.rope.freq_base", MetaValue::F32(100000.0));
    let q = |rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize| {
        quantize(
            ty,
            &random_vec(rng, rows * cols, 1.5 / (cols as f32).sqrt()),
        )
        .unwrap()
    };
    let ones = |n: usize| quantize(GgmlType::F32, &vec![1.0; n]).unwrap();
    w.tensor(
        "token_embd.weight",
        &[d as u64, vocab as u64],
        GgmlType::Q8_0,
        q(&mut rng, GgmlType::Q8_0, vocab, d),
    );
    // One layer's weights, repeated: the cost is the same.
    let layer = [
        ("attn_q", n_head * hd, d),
        ("attn_k", n_kv * hd, d),
        ("attn_v", n_kv * hd, d),
        ("attn_output", d, n_head * hd),
        ("ffn_gate", ff, d),
        ("ffn_up", ff, d),
        ("ffn_down", d, ff),
    ]
    .map(|(name, rows, cols)| (name, rows, cols, q(&mut rng, GgmlType::Q4_1, rows, cols)));
    for i in 0..n_layer {
        w.tensor(
            &format!("blk.{i}.attn_norm.weight"),
            &[d as u64],
            GgmlType::F32,
            ones(d),
        );
        w.tensor(
            &format!("blk.{i}.ffn_norm.weight"),
            &[d as u64],
            GgmlType::F32,
            ones(d),
        );
        for (name, rows, cols, bytes) in &layer {
            w.tensor(
                &format!("blk.{i}.{name}.weight"),
                &[*cols as u64, *rows as u64],
                GgmlType::Q4_1,
                bytes.clone(),
            );
        }
    }
    w.tensor("output_norm.weight", &[d as u64], GgmlType::F32, ones(d));
    w.to_bytes()
}

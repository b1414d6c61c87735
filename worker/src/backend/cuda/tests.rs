//! Tests of the CUDA backend.
//!
//! - Without a GPU: every `cuda/*.cu` compiles through the worker's own NVRTC
//!   path for sm_80 and sm_90 when libnvrtc can be loaded (CI loads it from
//!   the `nvidia-cuda-nvrtc` wheel; with `CI` set, a missing NVRTC fails);
//!   every kernel symbol is defined in its module; the launch-argument and
//!   alignment checks (M0-W-1431, M0-W-1220); a zero upload chunk is refused
//!   (M0-W-1222).
//! - With a GPU (`#[ignore]`d, run with `--run-ignored all` / `--include-ignored`):
//!   each kernel against the CPU reference ops at real and odd shapes for
//!   every weight format (LayerNorm at GPT-2's widths, M0-W-1432; GELU
//!   against f64, M0-W-1433), determinism over 50 runs, device set-up,
//!   memory accounting, residency, and whole models (a synthetic llama/qwen2
//!   with every format, and the reference model when present) against the
//!   CPU backend.
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

mod safety;
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
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
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
    if exclusive { f.lock() } else { f.lock_shared() }.unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
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
    DEV.get_or_init(|| CudaDevice::new(0).expect("GPU 0 initialises")).clone()
}

fn gpu_ops() -> CudaOps {
    CudaOps::new(dev())
}

/// One weight, both as the CPU backend holds it and on the GPU.
struct TestWeight {
    cpu: CpuWeight,
    gpu: CudaWeight,
}

fn test_weight(ops: &mut CudaOps, ty: GgmlType, rows: usize, cols: usize, values: &[f32]) -> TestWeight {
    let bytes = quantize(ty, values).expect("quantizes");
    let dims: Vec<u64> = if rows == 1 { vec![cols as u64] } else { vec![cols as u64, rows as u64] };
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

// ------------------------------------------------------ without a GPU (CI)

/// Compiles every kernel module with the worker's NVRTC path for sm_80 and
/// sm_90. Needs only libnvrtc, no GPU.
#[test]
fn nvrtc_compiles_every_module_for_sm80_and_sm90() {
    if !nvrtc_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to load libnvrtc (nvidia-cuda-nvrtc wheel, nvidia/cu13/lib on LD_LIBRARY_PATH)"
        );
        eprintln!("skipping: libnvrtc cannot be loaded (set LD_LIBRARY_PATH to a folder holding libnvrtc.so)");
        return;
    }
    // Every .cu in cuda/ is a module the worker embeds, and every .cuh a header.
    let dir = workspace_path("cuda");
    for entry in std::fs::read_dir(&dir).into_iter().flatten() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".cu") {
            assert!(Module::ALL.iter().any(|m| m.file_name() == name), "{name} is not embedded as a module");
        } else if name.ends_with(".cuh") {
            assert!(HEADERS.iter().any(|(h, _)| *h == name), "{name} is not embedded as a header");
        }
    }
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(Some(cache_dir.path().to_path_buf()));
    for arch in [(8, 0), (9, 0)] {
        for m in Module::ALL {
            let (cubin, from_cache) = cache
                .load_or_compile(m, arch)
                .unwrap_or_else(|e| panic!("{} for sm_{}{}: {e}", m.file_name(), arch.0, arch.1));
            assert!(!from_cache);
            assert!(cubin.starts_with(b"\x7fELF"), "{} did not give an ELF CUBIN", m.file_name());
            let (again, from_cache) = cache.load_or_compile(m, arch).unwrap();
            assert!(from_cache && again == cubin, "the disk cache returns what was stored");
        }
    }
}

#[test]
fn nvrtc_reports_a_broken_kernel_with_its_log() {
    if !nvrtc_available() {
        eprintln!("skipping: libnvrtc cannot be loaded");
        return;
    }
    let src = "#include \"common.cuh\"\nextern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n";
    match compile_source("broken.cu", src, (9, 0)) {
        Err(BackendError::KernelLaunchFailed(msg)) => {
            assert!(msg.contains("undefined_name"), "the NVRTC log names the error: {msg}")
        }
        other => panic!("expected a compile error, got {:?}", other.map(|b| b.len())),
    }
}

#[test]
fn every_kernel_symbol_is_defined_in_its_module() {
    for k in Kernel::all() {
        let src = k.module().source();
        let sym = k.symbol();
        let defined = match k {
            Kernel::Embed(_) => src.contains("embed_##name"),
            Kernel::MatVec(_) => src.contains("mv_##name"),
            Kernel::MatVecWarp(_) => src.contains("mvw_##name"),
            Kernel::Gemm(_) => src.contains("gemm_##name"),
            _ => src.contains(&format!(" {sym}(")) || src.contains(&format!("\n    {sym}(")),
        };
        assert!(defined, "{sym} is not defined in {}", k.module().file_name());
    }
}

// ------------------------------------------------------------ device set-up

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn device_init_reads_facts_and_applies_vram_only_settings() {
    let _gpu = shared_gpu();
    let _ = GPU;
    let d = dev();
    let info = d.info();
    assert_eq!(info.backend, crate::backend::BackendKind::Cuda);
    assert!(!info.name.is_empty());
    assert!(info.sm.is_some() && info.total_memory_bytes.unwrap() > 0);
    let limits = d.limits();
    eprintln!("device {} sm {:?}, limits {limits:?}", info.name, info.sm);
    assert!(limits.prefers_l1, "L1 preferred (M0-W-1010)");
    assert!(limits.malloc_heap_bytes <= 8 << 20, "heap limit as low as allowed: {}", limits.malloc_heap_bytes);
    // The probe: a fresh allocation is plain device memory.
    let b = d.alloc(device::Purpose::Scratch, 1000).unwrap();
    assert_eq!(device::memory_type(b.ptr()).unwrap(), MemoryKind::Device);
    assert_eq!(b.ptr() % 256, 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn device_id_equal_to_the_count_is_invalid() {
    let _gpu = shared_gpu();
    let _ = dev();
    let count = cudarc::driver::result::device::get_count().unwrap() as usize;
    match CudaDevice::new(count) {
        Err(BackendError::InvalidDevice(msg)) => assert!(msg.contains(&count.to_string())),
        Err(e) => panic!("expected InvalidDevice, got {e}"),
        Ok(_) => panic!("expected InvalidDevice, got a device"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn host_mapped_memory_is_not_device_memory() {
    let _gpu = shared_gpu();
    // Each test runs on its own thread: make the context current here.
    dev().bind().unwrap();
    let h = host_mapped_buffer().unwrap();
    assert_eq!(device::memory_type(h.dptr).unwrap(), MemoryKind::Host);
    unsafe { cudarc::driver::sys::cuMemFreeHost(h.host) };
}

// ------------------------------------------------------------------ kernels

/// Matmul shapes: (rows, cols, tokens). Real SmolLM2 shapes and odd ones.
fn matmul_shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    let mut v: Vec<(usize, usize, usize)> = vec![
        (576, 576, 1),
        (1536, 576, 1),
        (576, 1536, 1),
        (1536, 576, 7),
        (1536, 576, 64),
        (576, 1536, 13),
        (1536, 576, 32),
        (576, 1536, 33),
        (576, 1536, 100),
        (1536, 576, 129),
        (49152, 576, 1),
        (49152, 576, 64),
        (577, 768, 3),
        (191, 256, 65),
        (3, 512, 9),
    ];
    if quick() {
        // Still every path: mv (n <= 8), mv groups (13..=100) and gemm (129),
        // each through both mv kernels (the caller forces each), but no
        // LM-head-sized matrix.
        v.retain(|&(r, c, _)| r * c <= 1536 * 576 && !(r == 576 && c == 576));
    }
    if ty.block_len() == 1 {
        v.extend([(33, 577, 1), (65, 99, 70), (5, 1, 2)]);
    }
    // Rows of the 256-value formats hold whole super-blocks: 576 becomes 768.
    v.into_iter().map(|(r, c, n)| (r, c.next_multiple_of(ty.block_len()), n)).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_matches_cpu_for_every_format_and_shape() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut worst = Vec::new();
    for ty in GgmlType::ALL {
        let mut worst_ty = 0f64;
        for (rows, cols, n) in matmul_shapes(ty) {
            let wv = random_vec(&mut rng, rows * cols, 1.0);
            let w = test_weight(&mut ops, ty, rows, cols, &wv);
            let xv = random_vec(&mut rng, n * cols, 1.0);
            let bias_v = random_vec(&mut rng, rows, 1.0);
            let bias = test_weight(&mut ops, GgmlType::F32, 1, rows, &bias_v);
            for (with_bias, warp_rows) in [(false, 0), (true, 0), (false, usize::MAX), (true, usize::MAX)] {
                // Every shape through both mv kernels (a warp or a block per row).
                dev().set_mv_warp_min_rows(warp_rows);
                let b = with_bias.then_some(&bias);
                let mut cpu_out = cpu_buf(n, rows, vec![0.0; n * rows]);
                CpuOps.matmul(&cpu_buf(n, cols, xv.clone()), &w.cpu, b.map(|b| &b.cpu), &mut cpu_out).unwrap();
                let x = ops.upload(n, cols, &xv).unwrap();
                let mut out = ops.buf(n, rows).unwrap();
                ops.matmul(&x, &w.gpu, b.map(|b| &b.gpu), &mut out).unwrap();
                let g = host(&mut ops, &out);
                let e = rel_err(&g, &cpu_out.data);
                assert!(e <= 1e-3, "{ty} {rows}x{cols} n={n} bias={with_bias} mvw from {warp_rows}: relative error {e:e}");
                worst_ty = worst_ty.max(e);
            }
        }
        worst.push((ty, worst_ty));
    }
    dev().set_mv_warp_min_rows(kernels::MV_WARP_MIN_ROWS);
    for (ty, e) in worst {
        eprintln!("matmul {ty:>5}: max relative error {e:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_is_deterministic_for_every_format() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for ty in GgmlType::ALL {
        let (rows, cols) = (1536, 576usize.next_multiple_of(ty.block_len()));
        let w = test_weight(&mut ops, ty, rows, cols, &random_vec(&mut rng, rows * cols, 1.0));
        for n in [1, 5, 20, 64] {
            let x = ops.upload(n, cols, &random_vec(&mut rng, n * cols, 1.0)).unwrap();
            let mut out = ops.buf(n, rows).unwrap();
            assert_deterministic(&format!("matmul {ty} n={n}"), || {
                ops.matmul(&x, &w.gpu, None, &mut out).unwrap();
                host(&mut ops, &out)
            });
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn embed_matches_cpu_for_every_format() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in GgmlType::ALL {
        let mut shapes = vec![(49152usize, 576usize.next_multiple_of(ty.block_len())), (300, 256)];
        if quick() {
            shapes.remove(0);
        }
        if ty.block_len() == 1 {
            shapes.push((17, 577));
        }
        for (rows, cols) in shapes {
            let w = test_weight(&mut ops, ty, rows, cols, &random_vec(&mut rng, rows * cols, 1.0));
            let tokens: Vec<u32> = [0, rows - 1, 1, rows / 2]
                .into_iter()
                .chain((0..60).map(|_| rng.random_range(0..rows)))
                .map(|t| t as u32)
                .collect();
            let mut cpu_out = cpu_buf(tokens.len(), cols, vec![0.0; tokens.len() * cols]);
            CpuOps.embed(&w.cpu, &tokens, &mut cpu_out).unwrap();
            let mut out = ops.buf(tokens.len(), cols).unwrap();
            ops.embed(&w.gpu, &tokens, &mut out).unwrap();
            let g = host(&mut ops, &out);
            assert!(bits(&g) == bits(&cpu_out.data), "{ty} {rows}x{cols}: embedding is not bit-exact (err {:e})", rel_err(&g, &cpu_out.data));
            assert_deterministic(&format!("embed {ty}"), || {
                ops.embed(&w.gpu, &tokens, &mut out).unwrap();
                host(&mut ops, &out)
            });
        }
        let w = test_weight(&mut ops, ty, 64, 256, &random_vec(&mut rng, 64 * 256, 1.0));
        let mut out = ops.buf(1, 256).unwrap();
        assert!(ops.embed(&w.gpu, &[64], &mut out).is_err(), "an id past the table is refused before launch");
    }
    eprintln!("embed: bit-exact with the CPU for every format");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rms_norm_matches_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut worst = 0f64;
    for (rows, cols) in [(1, 576), (64, 576), (7, 1536), (3, 577), (2, 4096), (5, 33)] {
        let wv: Vec<f32> = (0..cols).map(|_| 1.0 + rng.random_range(-0.5f32..0.5)).collect();
        let w = test_weight(&mut ops, GgmlType::F32, 1, cols, &wv);
        let xv = random_vec(&mut rng, rows * cols, 3.0);
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
        CpuOps.rms_norm(&cpu_buf(rows, cols, xv.clone()), &w.cpu, 1e-5, &mut cpu_out).unwrap();
        let x = ops.upload(rows, cols, &xv).unwrap();
        let mut out = ops.buf(rows, cols).unwrap();
        ops.rms_norm(&x, &w.gpu, 1e-5, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-5, "rms_norm {rows}x{cols}: {e:e}");
        worst = worst.max(e);
        assert_deterministic("rms_norm", || {
            ops.rms_norm(&x, &w.gpu, 1e-5, &mut out).unwrap();
            host(&mut ops, &out)
        });
    }
    eprintln!("rms_norm: max relative error {worst:.2e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rope_matches_cpu_in_both_styles() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut worst = 0f64;
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_head, head_dim, n_rot) in [(9, 64, 64), (3, 64, 64), (4, 128, 64), (2, 80, 80)] {
            for (rows, start_pos) in [(64, 0), (1, 64), (5, 8000), (3, 100_000)] {
                let p = RopeParams {
                    n_head,
                    head_dim,
                    n_rot,
                    start_pos,
                    freq_base: 100_000.0,
                    freq_scale: 1.0,
                    style,
                };
                let xv = random_vec(&mut rng, rows * n_head * head_dim, 2.0);
                let mut cpu_x = cpu_buf(rows, n_head * head_dim, xv.clone());
                CpuOps.rope(&mut cpu_x, p).unwrap();
                for with_table in [false, true] {
                    let mut ops = gpu_ops();
                    if with_table {
                        ops.prepare_rope(p.freq_base, n_rot).unwrap();
                    }
                    let mut x = ops.upload(rows, n_head * head_dim, &xv).unwrap();
                    ops.rope(&mut x, p).unwrap();
                    let e = rel_err(&host(&mut ops, &x), &cpu_x.data);
                    assert!(e <= 1e-6, "rope {style:?} {n_head}x{head_dim} rot {n_rot} pos {start_pos} table {with_table}: {e:e}");
                    worst = worst.max(e);
                }
                assert_deterministic("rope", || {
                    let mut x = ops.upload(rows, n_head * head_dim, &xv).unwrap();
                    ops.rope(&mut x, p).unwrap();
                    host(&mut ops, &x)
                });
            }
        }
    }
    // Position 0 is unchanged by either style; position 1 tells them apart.
    eprintln!("rope: max relative error {worst:.2e}");
}

/// Runs the same sequence of attention calls (prefill, then decode steps)
/// on both backends and compares every output.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn attention_matches_cpu_over_prefill_and_decode() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut worst = 0f64;
    // (n_head, n_head_kv, head_dim, capacity, steps as token counts)
    let cases: [(usize, usize, usize, usize, &[usize]); 6] = [
        (9, 3, 64, 200, &[64, 1, 1, 5, 1]),
        (9, 3, 64, 1100, &[300, 1, 700, 1]),
        (4, 4, 128, 40, &[1, 1, 17, 1]),
        (8, 2, 256, 20, &[9, 1]),
        (6, 1, 80, 33, &[32, 1]),
        (2, 1, 36, 150, &[140, 1, 2]),
    ];
    for (n_head, n_kv, hd, capacity, steps) in cases {
        if quick() && capacity > 1000 {
            continue;
        }
        let n_layer = 2;
        let mut cpu_cache = CpuCache::new(n_layer, capacity, n_kv * hd);
        let mut gpu_cache = CudaCache::new(&dev(), n_layer, n_kv, hd, capacity).unwrap();
        let mut pos = 0;
        for &n in steps {
            for layer in 0..n_layer {
                let s = AttentionShape { layer, start_pos: pos, n_tokens: n, n_head, n_head_kv: n_kv, head_dim: hd };
                let qv = random_vec(&mut rng, n * n_head * hd, 2.0);
                let kv = random_vec(&mut rng, n * n_kv * hd, 2.0);
                let vv = random_vec(&mut rng, n * n_kv * hd, 2.0);
                let mut cpu_out = cpu_buf(n, n_head * hd, vec![0.0; n * n_head * hd]);
                CpuOps
                    .attention(
                        &cpu_buf(n, n_head * hd, qv.clone()),
                        &cpu_buf(n, n_kv * hd, kv.clone()),
                        &cpu_buf(n, n_kv * hd, vv.clone()),
                        &mut cpu_cache,
                        s,
                        &mut cpu_out,
                    )
                    .unwrap();
                let (q, k, v) = (
                    ops.upload(n, n_head * hd, &qv).unwrap(),
                    ops.upload(n, n_kv * hd, &kv).unwrap(),
                    ops.upload(n, n_kv * hd, &vv).unwrap(),
                );
                let mut out = ops.buf(n, n_head * hd).unwrap();
                ops.attention(&q, &k, &v, &mut gpu_cache, s, &mut out).unwrap();
                let g = host(&mut ops, &out);
                let e = rel_err(&g, &cpu_out.data);
                assert!(e <= 1e-2, "attention {n_head}/{n_kv}x{hd} pos {pos} n {n}: {e:e}");
                worst = worst.max(e);
                assert_deterministic("attention", || {
                    ops.attention(&q, &k, &v, &mut gpu_cache, s, &mut out).unwrap();
                    host(&mut ops, &out)
                });
                // The current positions' K/V are in the cache, rounded to f16.
                let last = pos + n - 1;
                let (kc, _) = gpu_cache.read_entry(&dev(), layer, n_kv - 1, last).unwrap();
                let want: Vec<u16> = kv[(n - 1) * n_kv * hd + (n_kv - 1) * hd..][..hd]
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect();
                assert_eq!(kc, want, "K of the last position is stored as f16");
            }
            pos += n;
        }
        // Overflowing the cache is refused before launch.
        let s = AttentionShape { layer: 0, start_pos: capacity, n_tokens: 1, n_head, n_head_kv: n_kv, head_dim: hd };
        let q = ops.buf(1, n_head * hd).unwrap();
        let k = ops.buf(1, n_kv * hd).unwrap();
        let mut out = ops.buf(1, n_head * hd).unwrap();
        assert!(ops.attention(&q, &k, &k, &mut gpu_cache, s, &mut out).is_err());
    }
    eprintln!("attention (f16 KV): max relative error {worst:.2e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn swiglu_and_add_match_cpu() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut worst_s, mut worst_a) = (0f64, 0f64);
    for (rows, cols) in [(1, 1536), (64, 1536), (3, 577), (1, 1)] {
        let n = rows * cols;
        let (gv, uv) = (random_vec(&mut rng, n, 8.0), random_vec(&mut rng, n, 2.0));
        let mut cpu_out = cpu_buf(rows, cols, vec![0.0; n]);
        CpuOps.swiglu(&cpu_buf(rows, cols, gv.clone()), &cpu_buf(rows, cols, uv.clone()), &mut cpu_out).unwrap();
        let (g, u) = (ops.upload(rows, cols, &gv).unwrap(), ops.upload(rows, cols, &uv).unwrap());
        let mut out = ops.buf(rows, cols).unwrap();
        ops.swiglu(&g, &u, &mut out).unwrap();
        let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
        assert!(e <= 1e-6, "swiglu {rows}x{cols}: {e:e}");
        worst_s = worst_s.max(e);
        assert_deterministic("swiglu", || {
            ops.swiglu(&g, &u, &mut out).unwrap();
            host(&mut ops, &out)
        });

        let mut cpu_x = cpu_buf(rows, cols, gv.clone());
        CpuOps.add_assign(&mut cpu_x, &cpu_buf(rows, cols, uv.clone())).unwrap();
        let mut x = ops.upload(rows, cols, &gv).unwrap();
        ops.add_assign(&mut x, &u).unwrap();
        let e = rel_err(&host(&mut ops, &x), &cpu_x.data);
        assert!(e == 0.0, "add {rows}x{cols}: {e:e}");
        worst_a = worst_a.max(e);
        assert_deterministic("add", || {
            let mut x = ops.upload(rows, cols, &gv).unwrap();
            ops.add_assign(&mut x, &u).unwrap();
            host(&mut ops, &x)
        });
    }
    // Shape errors are refused before launch.
    let a = ops.buf(2, 3).unwrap();
    let mut b = ops.buf(3, 3).unwrap();
    assert!(ops.add_assign(&mut b, &a).is_err());
    assert!(ops.swiglu(&a, &a, &mut b).is_err());
    eprintln!("swiglu: max relative error {worst_s:.2e}; add: {worst_a:.2e}");
}

/// M0-W-1432: GPT-2's LayerNorm against the CPU at GPT-2's widths (768,
/// 1600) and an odd one (577), with and without bias, on rows centred at 0
/// and rows with a large mean (where E[x^2] - mean^2 would lose the
/// variance to cancellation).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1432_cuda_layer_norm_matches_cpu_at_widths_768_1600_577() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(40);
    let mut worst = 0f64;
    for cols in [768, 1600, 577] {
        for rows in [1, 7, 64] {
            for offset in [0.0f32, 8.0] {
                let wv: Vec<f32> = (0..cols).map(|_| 1.0 + rng.random_range(-0.5f32..0.5)).collect();
                let w = test_weight(&mut ops, GgmlType::F32, 1, cols, &wv);
                let b = test_weight(&mut ops, GgmlType::F32, 1, cols, &random_vec(&mut rng, cols, 0.5));
                let xv: Vec<f32> = random_vec(&mut rng, rows * cols, 3.0).into_iter().map(|v| v + offset).collect();
                let x = ops.upload(rows, cols, &xv).unwrap();
                let mut out = ops.buf(rows, cols).unwrap();
                for with_bias in [true, false] {
                    let mut cpu_out = cpu_buf(rows, cols, vec![0.0; rows * cols]);
                    let cpu_bias = with_bias.then_some(&b.cpu);
                    CpuOps.layer_norm(&cpu_buf(rows, cols, xv.clone()), &w.cpu, cpu_bias, 1e-5, &mut cpu_out).unwrap();
                    let gpu_bias = with_bias.then_some(&b.gpu);
                    ops.layer_norm(&x, &w.gpu, gpu_bias, 1e-5, &mut out).unwrap();
                    let e = rel_err(&host(&mut ops, &out), &cpu_out.data);
                    assert!(e <= 1e-5, "layer_norm {rows}x{cols} offset {offset} bias {with_bias}: relative error {e:e}");
                    worst = worst.max(e);
                }
                assert_deterministic("layer_norm", || {
                    ops.layer_norm(&x, &w.gpu, Some(&b.gpu), 1e-5, &mut out).unwrap();
                    host(&mut ops, &out)
                });
            }
        }
    }
    eprintln!("layer_norm: max relative error {worst:.2e}");
}

/// GELU (tanh form) in f64, the reference for M0-W-1433.
fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// M0-W-1433: GPT-2's GELU over a dense grid of [-10, 10] (2^20 points)
/// against f64, max absolute error <= 1e-3; and finite, saturated results
/// far outside it, where x^3 overflows f32.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1433_cuda_gelu_matches_f64_over_minus_10_to_10() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let n = 1usize << 20;
    let xv: Vec<f32> = (0..n).map(|i| (-10.0 + 20.0 * i as f64 / (n - 1) as f64) as f32).collect();
    let x = ops.upload(1, n, &xv).unwrap();
    let mut out = ops.buf(1, n).unwrap();
    ops.gelu(&x, &mut out).unwrap();
    let g = host(&mut ops, &out);
    let mut cpu_out = cpu_buf(1, n, vec![0.0; n]);
    CpuOps.gelu(&cpu_buf(1, n, xv.clone()), &mut cpu_out).unwrap();
    let (mut worst, mut worst_at, mut worst_cpu) = (0f64, 0f32, 0f64);
    for ((&xi, &gi), &ci) in xv.iter().zip(&g).zip(&cpu_out.data) {
        let e = (gi as f64 - gelu_f64(xi as f64)).abs();
        if e > worst {
            (worst, worst_at) = (e, xi);
        }
        worst_cpu = worst_cpu.max((gi as f64 - ci as f64).abs());
    }
    assert!(worst <= 1e-3, "gelu: error {worst:e} at x = {worst_at}");
    // Far outside the grid: x for large positive x, (-)0 for large negative x.
    let big = [1e4f32, 3e12, 1e20, f32::MAX, -1e4, -3e12, -1e20, -f32::MAX, 0.0, -0.0];
    let xb = ops.upload(1, big.len(), &big).unwrap();
    let mut ob = ops.buf(1, big.len()).unwrap();
    ops.gelu(&xb, &mut ob).unwrap();
    for (&xi, &gi) in big.iter().zip(&host(&mut ops, &ob)) {
        let want = if xi > 0.0 { xi } else { 0.0 };
        assert!(gi.is_finite() && gi == want, "gelu({xi}) = {gi}, expected {want}");
    }
    assert_deterministic("gelu", || {
        ops.gelu(&x, &mut out).unwrap();
        host(&mut ops, &out)
    });
    eprintln!("gelu over [-10, 10], {n} points: max error vs f64 {worst:.2e} (at {worst_at}); max difference from the CPU {worst_cpu:.2e}");
}

// ------------------------------------------------------------ whole models

fn reference_model_path() -> Option<std::path::PathBuf> {
    let p = match std::env::var_os("WORKER_ORCD_REFERENCE_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => workspace_path(".models/smollm2-135m-instruct-q4_1.gguf"),
    };
    p.exists().then_some(p)
}

/// Loads `file` on both backends.
fn both_backends(file: Arc<GgufFile>, opts: &CudaLoadOptions) -> (CpuBackend, CudaBackend) {
    let cfg = ModelConfig::try_from(&file.metadata).expect("config");
    let cpu = CpuBackend::load(cfg.clone(), file.clone(), &mut |_| {}).expect("CPU load");
    let gpu = CudaBackend::load(cfg, &file, opts, &mut |_| {}).expect("GPU load");
    (cpu, gpu)
}

/// Prefill of `tokens[..n_prompt]` with logits at every position, then
/// teacher-forced decode of the rest one token at a time: GPU logits vs CPU
/// logits at every position. Returns the worst relative error.
fn compare_sequence(cpu: &mut CpuBackend, gpu: &mut CudaBackend, tokens: &[u32], n_prompt: usize, what: &str) -> f64 {
    let vocab = cpu.config().vocab_size;
    cpu.begin_sequence(tokens.len()).unwrap();
    gpu.begin_sequence(tokens.len()).unwrap();
    let (mut c, mut g) = (Vec::new(), Vec::new());
    cpu.forward(&tokens[..n_prompt], Logits::All, &mut c, None).unwrap();
    gpu.forward(&tokens[..n_prompt], Logits::All, &mut g, None).unwrap();
    assert_eq!(g.len(), n_prompt * vocab);
    let mut worst = 0f64;
    let mut check = |g: &[f32], c: &[f32], pos: usize| {
        let e = rel_err(g, c);
        assert!(e <= 1e-2, "{what}: position {pos}: relative error {e:e}");
        assert_eq!(argmax(g), argmax(c), "{what}: position {pos}: argmax differs");
        worst = worst.max(e);
    };
    for p in 0..n_prompt {
        check(&g[p * vocab..(p + 1) * vocab], &c[p * vocab..(p + 1) * vocab], p);
    }
    for (i, &t) in tokens[n_prompt..].iter().enumerate() {
        cpu.forward(&[t], Logits::Last, &mut c, None).unwrap();
        gpu.forward(&[t], Logits::Last, &mut g, None).unwrap();
        check(&g, &c, n_prompt + i);
    }
    assert_eq!(gpu.sequence_len(), tokens.len());
    cpu.end_sequence();
    gpu.end_sequence();
    worst
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn synthetic_models_with_every_format_match_the_cpu_backend() {
    let _gpu = shared_gpu();
    for (arch, seed) in [("llama", 10u64), ("qwen2", 11)] {
        let file = Arc::new(GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, seed, 512)).unwrap());
        let opts = CudaLoadOptions { upload_chunk_bytes: 4096, ..Default::default() };
        let (mut cpu, mut gpu) = both_backends(file.clone(), &opts);
        let vocab = cpu.config().vocab_size as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let tokens: Vec<u32> = (0..80).map(|_| rng.random_range(0..vocab)).collect();
        let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 64, arch);
        // A prompt longer than mv's batch but not a whole gemm tile, and a short one.
        let e2 = compare_sequence(&mut cpu, &mut gpu, &tokens[..30], 9, arch);
        let e3 = compare_sequence(&mut cpu, &mut gpu, &tokens[..12], 3, arch);
        eprintln!("synthetic {arch}: logits max relative error {:.2e}", e.max(e2).max(e3));

        // Checkpoints record the same names as the CPU backend.
        let (mut cc, mut gc) = (Checkpoints::default(), Checkpoints::default());
        let (mut c, mut g) = (Vec::new(), Vec::new());
        cpu.begin_sequence(8).unwrap();
        gpu.begin_sequence(8).unwrap();
        cpu.forward(&tokens[..5], Logits::Last, &mut c, Some(&mut cc)).unwrap();
        gpu.forward(&tokens[..5], Logits::Last, &mut g, Some(&mut gc)).unwrap();
        let names = |cp: &Checkpoints| cp.entries.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&gc), names(&cc));
        for ((name, gv), (_, cv)) in gc.entries.iter().zip(&cc.entries) {
            let e = rel_err(gv, cv);
            assert!(e <= 1e-2, "checkpoint {name}: {e:e}");
        }

        // Every format was uploaded byte for byte, on 256-byte boundaries.
        let stats = gpu.upload_stats();
        assert!(stats.max_copy_bytes <= 4096, "no copy over the chunk size: {stats:?}");
        assert_eq!(stats.total_bytes, file.tensor_bytes_total(), "all tensor bytes copied (vectors are F32)");
        assert!(gpu.weight_buffers().iter().all(|b| b.ptr % 256 == 0));
        assert!(gpu.check_residency().unwrap());
    }
}

/// Decode steps replayed from the captured graph give the same bits as the
/// same steps launched one by one.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn graph_decode_is_bit_identical_to_eager_decode() {
    let _gpu = shared_gpu();
    for arch in ["llama", "qwen2"] {
        let file = Arc::new(GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, 30, 512)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let mut gpu = CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 384) as u32).collect();
        let run = |gpu: &mut CudaBackend, graphs: bool| {
            gpu.set_decode_graphs(graphs);
            gpu.begin_sequence(300).unwrap();
            let mut all = Vec::new();
            let mut out = Vec::new();
            gpu.forward(&tokens[..20], Logits::Last, &mut out, None).unwrap();
            all.extend_from_slice(&out);
            // Long enough for attention to pass its 128-key chunk.
            for i in 0..150 {
                gpu.forward(&[tokens[20 + i % 20]], Logits::Last, &mut out, None).unwrap();
                all.extend_from_slice(&out);
            }
            assert_eq!(gpu.decoding_with_graph(), graphs);
            gpu.end_sequence();
            all
        };
        let with = run(&mut gpu, true);
        let without = run(&mut gpu, false);
        assert!(bits(&with) == bits(&without), "{arch}: graph replay differs from eager decode");
        let again = run(&mut gpu, true);
        assert!(bits(&with) == bits(&again), "{arch}: graph replay is not deterministic");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn memory_accounting_kv_limits_and_vram_cap() {
    let _gpu = shared_gpu();
    let bytes = crate::model::synthetic::synthetic_llama("llama", 20, 4096);
    let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let opts = CudaLoadOptions { kv_cache_size_mb: Some(1), ..Default::default() };
    let mut gpu = CudaBackend::load(cfg.clone(), &file, &opts, &mut |_| {}).unwrap();
    let after_load = gpu.memory_use();
    assert!(after_load.weights >= file.tensor_bytes_total(), "{after_load:?}");
    assert_eq!(after_load.kv_cache + after_load.scratch, 0, "{after_load:?}");

    gpu.begin_sequence(100).unwrap();
    let kv = CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 100);
    assert_eq!(gpu.memory_use().kv_cache, align_up(kv));
    let mut out = Vec::new();
    gpu.forward(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], Logits::All, &mut out, None).unwrap();
    assert_eq!(gpu.memory_use().scratch, 0, "activations are freed when a step ends");
    gpu.forward(&[11], Logits::Last, &mut out, None).unwrap();
    assert!(gpu.decoding_with_graph());
    eprintln!("during decode: {:?} (the decode graph's arena is scratch)", gpu.memory_use());
    gpu.end_sequence();
    assert_eq!(gpu.memory_use(), after_load, "back at the post-load value after a job");

    // A sequence whose cache exceeds --kv-cache-size-mb is refused; the next one works.
    let too_long = (1 << 20) / CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 1) as usize + 1;
    assert!(matches!(gpu.begin_sequence(too_long), Err(BackendError::OutOfMemory { .. })));
    assert_eq!(gpu.memory_use(), after_load);
    gpu.begin_sequence(16).unwrap();
    gpu.forward(&[1, 2], Logits::Last, &mut out, None).unwrap();
    gpu.end_sequence();
    drop(gpu);

    // Under a cap below the model, the load fails before allocating.
    let capped = CudaLoadOptions { vram_cap_bytes: Some(file.tensor_bytes_total() / 2), ..Default::default() };
    match CudaBackend::load(cfg.clone(), &file, &capped, &mut |_| {}) {
        Err(BackendError::OutOfMemory { needed, available }) => {
            assert!(needed > available && needed >= file.tensor_bytes_total())
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("expected OutOfMemory"),
    }
    // Under a cap that fits the model but not a long sequence, the sequence
    // fails with OutOfMemory and the backend keeps serving.
    let weights = after_load.weights;
    let capped = CudaLoadOptions { vram_cap_bytes: Some(weights + (5 << 20)), ..Default::default() };
    let mut gpu = CudaBackend::load(cfg.clone(), &file, &capped, &mut |_| {}).unwrap();
    let post = gpu.memory_use();
    assert!(matches!(gpu.begin_sequence(512), Err(BackendError::OutOfMemory { .. })) || {
        // The cache fits; then a long prefill must run out.
        gpu.forward(&vec![1u32; 512], Logits::All, &mut out, None).is_err()
    });
    gpu.end_sequence();
    assert_eq!(gpu.memory_use(), post);
    gpu.begin_sequence(8).unwrap();
    gpu.forward(&[1, 2, 3], Logits::Last, &mut out, None).unwrap();
    gpu.end_sequence();
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn reference_model_matches_the_cpu_backend() {
    let _gpu = shared_gpu();
    let Some(path) = reference_model_path() else {
        assert!(std::env::var_os("CI").is_none(), "CI must fetch the reference model");
        eprintln!("skipping: the reference model is absent");
        return;
    };
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let (mut cpu, mut gpu) = both_backends(file.clone(), &CudaLoadOptions::default());
    assert!(gpu.check_residency().unwrap());
    // Real text: the golden prompts and their greedy continuations, joined.
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_path("testdata/golden/greedy.json")).unwrap(),
    )
    .unwrap();
    let mut tokens = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        for key in ["prompt_token_ids", "generated_token_ids"] {
            tokens.extend(case[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32));
        }
    }
    assert!(tokens.len() >= 80);
    let e = compare_sequence(&mut cpu, &mut gpu, &tokens[..80], 64, "SmolLM2");
    eprintln!("SmolLM2-135M Q4_1: GPU vs CPU logits, 64 prefill + 16 decode positions: max relative error {e:.2e}, same argmax");

    // Timing: time to first token for a 16-token prompt and decode speed.
    let mut out = Vec::new();
    let mut ttft = Vec::new();
    for _ in 0..10 {
        gpu.begin_sequence(256).unwrap();
        let t = std::time::Instant::now();
        gpu.forward(&tokens[..16], Logits::Last, &mut out, None).unwrap();
        ttft.push(t.elapsed().as_secs_f64() * 1e3);
        gpu.end_sequence();
    }
    ttft.sort_by(|a, b| a.partial_cmp(b).unwrap());
    gpu.begin_sequence(256).unwrap();
    gpu.forward(&tokens[..16], Logits::Last, &mut out, None).unwrap();
    let mut next = argmax(&out) as u32;
    for _ in 0..8 {
        gpu.forward(&[next], Logits::Last, &mut out, None).unwrap();
        next = argmax(&out) as u32;
    }
    let steps = 128;
    let t = std::time::Instant::now();
    for _ in 0..steps {
        gpu.forward(&[next], Logits::Last, &mut out, None).unwrap();
        next = argmax(&out) as u32;
    }
    let dt = t.elapsed().as_secs_f64();
    assert!(gpu.decoding_with_graph());
    gpu.end_sequence();
    // The same without graphs, for comparison.
    gpu.set_decode_graphs(false);
    gpu.begin_sequence(256).unwrap();
    gpu.forward(&tokens[..16], Logits::Last, &mut out, None).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..steps {
        gpu.forward(&[next], Logits::Last, &mut out, None).unwrap();
        next = argmax(&out) as u32;
    }
    let dt_eager = t.elapsed().as_secs_f64();
    gpu.end_sequence();
    gpu.set_decode_graphs(true);
    let pp = {
        gpu.begin_sequence(512).unwrap();
        let prompt: Vec<u32> = tokens.iter().cycle().take(512).copied().collect();
        gpu.forward(&prompt, Logits::Last, &mut out, None).unwrap();
        gpu.end_sequence();
        gpu.begin_sequence(512).unwrap();
        let t = std::time::Instant::now();
        gpu.forward(&prompt, Logits::Last, &mut out, None).unwrap();
        let s = t.elapsed().as_secs_f64();
        gpu.end_sequence();
        512.0 / s
    };
    eprintln!(
        "SmolLM2 on {}: prefill 16 tokens (median of 10) {:.2} ms; decode {:.1} tok/s ({:.2} ms/token over {steps}; without graphs {:.1} tok/s); prefill 512: {:.0} tok/s",
        gpu.device().name,
        ttft[ttft.len() / 2],
        steps as f64 / dt,
        dt * 1e3 / steps as f64,
        steps as f64 / dt_eager,
        pp
    );
}

/// Times the decode matmul at the LM head's shape (49152 x 576) and a layer's
/// shape with both mv kernels, and the gemm at prefill shapes.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn matmul_timings() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let time = |ops: &mut CudaOps, w: &CudaWeight, x: &CudaBuf, out: &mut CudaBuf| {
        for _ in 0..20 {
            ops.matmul(x, w, None, out).unwrap();
        }
        dev().synchronize().unwrap();
        let reps = 200;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            ops.matmul(x, w, None, out).unwrap();
        }
        dev().synchronize().unwrap();
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    };
    for ty in [GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q4_1, GgmlType::Q4K, GgmlType::F16] {
        for (rows, cols) in [(49152usize, 576usize), (1536, 576), (576, 1536)] {
            let cols = cols.next_multiple_of(ty.block_len());
            let w = test_weight(&mut ops, ty, rows, cols, &random_vec(&mut rng, rows * cols, 1.0)).gpu;
            let bytes = (w.rows * w.row_bytes) as f64;
            let mut line = format!("{ty:>5} {rows:>5}x{cols:<4}");
            for n in [1usize, 16, 64, 512] {
                let x = ops.upload(n, cols, &random_vec(&mut rng, n * cols, 1.0)).unwrap();
                let mut out = ops.buf(n, rows).unwrap();
                if n == 1 {
                    for (name, warp_rows) in [("block/row", usize::MAX), ("warp/row", 0)] {
                        dev().set_mv_warp_min_rows(warp_rows);
                        let us = time(&mut ops, &w, &x, &mut out);
                        line += &format!("  n=1 {name} {us:7.1} us ({:5.0} GB/s)", bytes / us / 1e3);
                    }
                    dev().set_mv_warp_min_rows(kernels::MV_WARP_MIN_ROWS);
                } else {
                    let us = time(&mut ops, &w, &x, &mut out);
                    line += &format!("  n={n} {us:8.1} us ({:6.1} TFLOP/s)", 2.0 * (rows * cols * n) as f64 / us / 1e6);
                }
            }
            eprintln!("{line}");
        }
    }
}

/// A random-weight model of SmolLM2-135M's exact shapes and formats (Q4_1
/// matrices, Q8_0 tied embedding): speed depends on shapes, not values, so
/// this times the reference model without carrying its file.
fn smollm2_shaped_model() -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let (d, n_layer, n_head, n_kv, ff, vocab) = (576usize, 30usize, 9usize, 3usize, 1536usize, 49152usize);
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
    w.metadata("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5));
    w.metadata("llama.rope.freq_base", MetaValue::F32(100000.0));
    let q = |rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize| {
        quantize(ty, &random_vec(rng, rows * cols, 1.5 / (cols as f32).sqrt())).unwrap()
    };
    let ones = |n: usize| quantize(GgmlType::F32, &vec![1.0; n]).unwrap();
    w.tensor("token_embd.weight", &[d as u64, vocab as u64], GgmlType::Q8_0, q(&mut rng, GgmlType::Q8_0, vocab, d));
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
        w.tensor(&format!("blk.{i}.attn_norm.weight"), &[d as u64], GgmlType::F32, ones(d));
        w.tensor(&format!("blk.{i}.ffn_norm.weight"), &[d as u64], GgmlType::F32, ones(d));
        for (name, rows, cols, bytes) in &layer {
            w.tensor(&format!("blk.{i}.{name}.weight"), &[*cols as u64, *rows as u64], GgmlType::Q4_1, bytes.clone());
        }
    }
    w.tensor("output_norm.weight", &[d as u64], GgmlType::F32, ones(d));
    w.to_bytes()
}

/// Decode speed, time to first token and prefill speed at SmolLM2-135M's shapes.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn smollm2_shaped_timings() {
    let _gpu = shared_gpu();
    let file = GgufFile::from_bytes(smollm2_shaped_model()).unwrap();
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let t = std::time::Instant::now();
    let mut gpu = CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let prompt: Vec<u32> = (0..512u32).map(|i| (i * 7919) % 49152).collect();
    let mut out = Vec::new();
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let prefill_ms = |gpu: &mut CudaBackend, n: usize, out: &mut Vec<f32>| {
        let mut v = Vec::new();
        for _ in 0..7 {
            gpu.begin_sequence(1024).unwrap();
            let t = std::time::Instant::now();
            gpu.forward(&prompt[..n], Logits::Last, out, None).unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e3);
            gpu.end_sequence();
        }
        median(v)
    };
    let p16 = prefill_ms(&mut gpu, 16, &mut out);
    let p64 = prefill_ms(&mut gpu, 64, &mut out);
    let p512 = prefill_ms(&mut gpu, 512, &mut out);
    let mut decode = |gpu: &mut CudaBackend, graphs: bool, start: usize| {
        gpu.set_decode_graphs(graphs);
        gpu.begin_sequence(1024).unwrap();
        gpu.forward(&prompt[..start], Logits::Last, &mut out, None).unwrap();
        for &t in &prompt[..4] {
            gpu.forward(&[t], Logits::Last, &mut out, None).unwrap();
        }
        let steps = 128;
        let t = std::time::Instant::now();
        for &t in &prompt[..steps] {
            gpu.forward(&[t], Logits::Last, &mut out, None).unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        gpu.end_sequence();
        steps as f64 / s
    };
    let tg = decode(&mut gpu, true, 16);
    let tg_long = decode(&mut gpu, true, 512);
    let tg_eager = decode(&mut gpu, false, 16);
    gpu.set_decode_graphs(true);
    eprintln!(
        "SmolLM2-shaped (Q4_1, Q8_0 embedding) on {}: load {load_ms:.0} ms; prefill 16 tokens {p16:.2} ms, 64: {p64:.2} ms ({:.0} tok/s), 512: {p512:.1} ms ({:.0} tok/s); decode after 16: {tg:.0} tok/s ({:.2} ms/token), after 512: {tg_long:.0} tok/s, without graphs: {tg_eager:.0} tok/s",
        gpu.device().name,
        64.0 / p64 * 1e3,
        512.0 / p512 * 1e3,
        1e3 / tg
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1052_backend_contract_cuda() {
    let _gpu = shared_gpu();
    for arch in ["llama", "qwen2"] {
        let file = Arc::new(GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, 7, 64)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let vocab = cfg.vocab_size;
        let mut gpu = CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        crate::backend::contract::check_backend_contract(&mut gpu, vocab);
    }
}

// ----------------------------------------------------------------- sampling

/// Logit vectors of `n` tokens for the sampling tests: spread like an LLM's
/// (a few high, a long tail), with many exact ties, and with -inf and NaN
/// entries.
fn sampling_logits(rng: &mut ChaCha8Rng, n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let llm: Vec<f32> = (0..n)
        .map(|_| {
            let x: f32 = rng.random();
            if rng.random::<f32>() < 0.01 {
                8.0 + 6.0 * x
            } else {
                10.0 * x - 5.0
            }
        })
        .collect();
    let ties: Vec<f32> = (0..n).map(|_| (rng.random_range(-20i32..20) as f32) / 4.0).collect();
    let mut holes = random_vec(rng, n, 6.0);
    for _ in 0..n.div_ceil(10) {
        let i = rng.random_range(0..n);
        holes[i] = if rng.random::<bool>() { f32::NEG_INFINITY } else { f32::NAN };
    }
    let flat = vec![0.5f32; n];
    vec![("llm", llm), ("ties", ties), ("-inf/NaN", holes), ("flat", flat)]
}

/// The parameter sets every sampling test runs: greedy, each filter alone,
/// and all combined.
fn sampling_params(n: usize) -> Vec<crate::sampling::SamplingParams> {
    use crate::sampling::SamplingParams;
    let t = |temperature| SamplingParams { temperature, seed: 7, ..SamplingParams::default() };
    vec![
        t(0.0),
        SamplingParams { repetition_penalty: 1.3, ..t(0.0) },
        t(1.0),
        t(0.8),
        SamplingParams { repetition_penalty: 0.7, ..t(1.0) },
        SamplingParams { top_k: 1, ..t(1.0) },
        SamplingParams { top_k: 40, ..t(1.0) },
        SamplingParams { top_k: n, ..t(1.0) },
        SamplingParams { top_p: 0.1, ..t(1.0) },
        SamplingParams { top_p: 0.9, ..t(1.0) },
        SamplingParams { min_p: 0.05, ..t(1.0) },
        SamplingParams { top_k: 40, top_p: 0.9, min_p: 0.05, repetition_penalty: 1.1, ..t(0.7) },
        SamplingParams { top_k: 200, top_p: 0.95, min_p: 0.01, repetition_penalty: 1.3, ..t(1.7) },
    ]
}

/// Identical logits on both sides: the GPU's choice equals `sampling::select`
/// for every parameter set and many draws `u` (away from cumulative
/// boundaries, where the GPU's fixed-point sums may round the other way).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_sampling_matches_cpu_select_on_random_logits() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    use crate::sampling::{draws_away_from_boundaries, select};
    let mut rng = ChaCha8Rng::seed_from_u64(40);
    let (mut checked, mut skipped) = (0usize, 0usize);
    for n in [49_152usize, 151_936, 1000, 33] {
        let mut s = DeviceSampler::new(&dev(), n).unwrap();
        for (kind, logits) in sampling_logits(&mut rng, n) {
            s.upload_logits(&logits).unwrap();
            let generated: Vec<u32> =
                (0..24).map(|_| rng.random_range(0..n as u32)).chain([0, 0, n as u32 + 5]).collect();
            for p in sampling_params(n) {
                let req = |uniform| SampleRequest { params: &p, generated: &generated, uniform, logprobs: 0 };
                if p.temperature == 0.0 {
                    let got = s.sample(&req(None)).unwrap().id;
                    assert_eq!(got, select(&logits, &generated, &p, None), "n {n} {kind} {p:?} greedy");
                    checked += 1;
                    continue;
                }
                let grid: Vec<f64> = (0..64).map(|_| rng.random::<f64>()).chain([0.0, 0.5]).collect();
                let draws = draws_away_from_boundaries(&logits, &generated, &p, grid.iter().copied(), 1e-7);
                skipped += grid.len() - draws.len();
                for u in draws {
                    let got = s.sample(&req(Some(u))).unwrap().id;
                    let want = select(&logits, &generated, &p, Some(u));
                    assert_eq!(got, want, "n {n} {kind} {p:?} u {u}");
                    checked += 1;
                }
            }
        }
    }
    // All -inf / NaN: the fallback to the raw argmax, drawn or not.
    let mut s = DeviceSampler::new(&dev(), 33).unwrap();
    let mut logits = vec![f32::NEG_INFINITY; 33];
    logits[3] = f32::NAN;
    s.upload_logits(&logits).unwrap();
    for p in sampling_params(33) {
        let req = SampleRequest {
            params: &p,
            generated: &[1, 2],
            uniform: (p.temperature > 0.0).then_some(0.3),
            logprobs: 0,
        };
        assert_eq!(s.sample(&req).unwrap().id, select(&logits, &[1, 2], &p, req.uniform), "{p:?}");
    }
    eprintln!("sampling: {checked} choices identical to the CPU's; {skipped} draws skipped near a boundary");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_sampling_logprobs_match_cpu_top_logprobs() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    use crate::sampling::{top_logprobs, SamplingParams};
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let p = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let mut worst = 0f32;
    for n in [151_936usize, 49_152, 1000, 33, 3] {
        let mut s = DeviceSampler::new(&dev(), n).unwrap();
        let mut cases = sampling_logits(&mut rng, n);
        let mut big = random_vec(&mut rng, n, 1.0);
        big[0] = 1000.0;
        cases.push(("large", big));
        for (kind, logits) in cases {
            s.upload_logits(&logits).unwrap();
            for k in [1usize, 2, 5, 20] {
                let got = s.sample(&SampleRequest { params: &p, generated: &[], uniform: None, logprobs: k }).unwrap();
                let want = top_logprobs(&logits, k);
                let ids = |v: &[crate::sampling::TokenLogprob]| v.iter().map(|t| t.id).collect::<Vec<_>>();
                assert_eq!(ids(&got.logprobs), ids(&want), "n {n} {kind} k {k}");
                for (g, c) in got.logprobs.iter().zip(&want) {
                    let e = (g.logprob - c.logprob).abs();
                    assert!(e <= 1e-5, "n {n} {kind} k {k}: logprob of {} is {} vs {}", g.id, g.logprob, c.logprob);
                    worst = worst.max(e);
                }
                assert_eq!(got.id, crate::sampling::argmax(&logits), "n {n} {kind}");
            }
        }
    }
    // Fewer finite tokens than asked for: only those are listed.
    let mut s = DeviceSampler::new(&dev(), 6).unwrap();
    let logits = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0, f32::INFINITY, -1.0];
    s.upload_logits(&logits).unwrap();
    let got = s.sample(&SampleRequest { params: &p, generated: &[], uniform: None, logprobs: 20 }).unwrap();
    assert_eq!(got.logprobs, top_logprobs(&logits, 20));
    eprintln!("sampling logprobs: max difference {worst:.2e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_sampling_is_deterministic() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let n = 151_936;
    let mut s = DeviceSampler::new(&dev(), n).unwrap();
    let generated: Vec<u32> = (0..50).map(|_| rng.random_range(0..n as u32)).collect();
    for (kind, logits) in sampling_logits(&mut rng, n) {
        s.upload_logits(&logits).unwrap();
        for p in sampling_params(n) {
            let uniform = (p.temperature > 0.0).then_some(0.618);
            let req = SampleRequest { params: &p, generated: &generated, uniform, logprobs: 20 };
            let first = s.sample(&req).unwrap();
            for run in 1..50 {
                assert_eq!(s.sample(&req).unwrap(), first, "{kind} {p:?}: run {run} differs from run 0");
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_sampling_refuses_bad_requests_before_launch() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    use crate::sampling::SamplingParams;
    assert!(DeviceSampler::new(&dev(), 0).is_err());
    let mut s = DeviceSampler::new(&dev(), 100).unwrap();
    assert!(s.upload_logits(&[0.0; 99]).is_err());
    s.upload_logits(&[0.0; 100]).unwrap();
    let p = SamplingParams::default();
    let req = |uniform, logprobs| SampleRequest { params: &p, generated: &[], uniform, logprobs };
    assert!(s.sample(&req(Some(0.5), 21)).is_err(), "more log-probabilities than the kernel returns");
    assert!(s.sample(&req(Some(1.0), 0)).is_err(), "a draw outside [0, 1)");
    assert!(s.sample(&req(Some(f64::NAN), 0)).is_err());
    assert_eq!(s.sample(&req(Some(0.5), 0)).unwrap().id, 50, "flat logits: the middle token at u = 0.5");
    // A backend samples only after a forward pass.
    let file = Arc::new(GgufFile::from_bytes(crate::model::synthetic::synthetic_llama("llama", 43, 64)).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let mut gpu = CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
    gpu.begin_sequence(8).unwrap();
    assert!(gpu.sample(&req(None, 0)).is_err());
}

/// 32 tokens at temperature 0.8 from one seed on both backends, each
/// sampling where its logits are (the GPU's never leave the device; decode
/// steps replay the graph). The GPU's choice is `sampling::select` on the
/// GPU's own logits (read back from the sampler's buffer for the check)
/// whenever the draw is not within 1e-7 of a cumulative boundary; the CPU's
/// and GPU's ids agree except where their logits differ enough to move a
/// boundary past the draw (reported, and at most 4 of 32). Both continue
/// from the CPU's token.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_sampling_generates_like_the_cpu_backend() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    use crate::sampling::{draws_away_from_boundaries, select, Sampler, SamplingParams};
    for (arch, seed) in [("llama", 44u64), ("qwen2", 45)] {
        let file = Arc::new(GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, seed, 512)).unwrap());
        let (mut cpu, mut gpu) = both_backends(file, &CudaLoadOptions::default());
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            repetition_penalty: 1.1,
            seed: 1234,
            ..Default::default()
        };
        let prompt = [1u32, 17, 42, 99, 5];
        cpu.begin_sequence(prompt.len() + 32).unwrap();
        gpu.begin_sequence(prompt.len() + 32).unwrap();
        let (mut c, mut none) = (Vec::new(), Vec::new());
        cpu.forward(&prompt, Logits::Last, &mut c, None).unwrap();
        gpu.forward(&prompt, Logits::None, &mut none, None).unwrap();
        let mut sampler = Sampler::new(p.clone());
        let (mut generated, mut differing, mut checked) = (Vec::new(), 0, 0);
        for step in 0..32 {
            let uniform = sampler.draw();
            let req = SampleRequest { params: &p, generated: &generated, uniform, logprobs: 5 };
            let want = cpu.sample(&req).unwrap();
            let got = gpu.sample(&req).unwrap();
            let g = gpu.sampler().download_logits().unwrap();
            assert!(rel_err(&g, &c) <= 1e-2, "{arch} step {step}: logits differ by {:e}", rel_err(&g, &c));
            if !draws_away_from_boundaries(&g, &generated, &p, uniform, 1e-7).is_empty() {
                assert_eq!(
                    got.id,
                    select(&g, &generated, &p, uniform),
                    "{arch} step {step}: GPU choice on its own logits"
                );
                checked += 1;
            }
            if got.id != want.id {
                eprintln!("{arch} step {step}: GPU {} vs CPU {} (u = {uniform:?}; the logits differ)", got.id, want.id);
                differing += 1;
            }
            assert_eq!(got.logprobs.len(), 5);
            generated.push(want.id);
            cpu.forward(&[want.id], Logits::Last, &mut c, None).unwrap();
            gpu.forward(&[want.id], Logits::None, &mut none, None).unwrap();
            assert!(none.is_empty());
        }
        assert!(gpu.decoding_with_graph(), "decode steps went through the graph");
        assert!(checked >= 30, "{arch}: only {checked} draws away from a boundary");
        assert!(differing <= 4, "{arch}: {differing} of 32 tokens differ");
        eprintln!("{arch}: 32 tokens sampled on the GPU, {differing} differing from the CPU's; ids {generated:?}");
    }
}

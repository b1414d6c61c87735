//! Whole models on both backends: every synthetic architecture with every format,
//! the reference model when present, memory accounting and KV limits, the
//! backend contract (M0-W-1052), and timings at SmolLM2-135M's shapes.

use super::*;
use crate::model::synthetic::{synthetic_model, SYNTHETIC_ARCHS};

/// Logits closer than this (nats) are a near tie: GPU and CPU may order them differently.
const NEAR_TIE_LOGIT: f32 = 0.05;

/// Prefill of `tokens[..n_prompt]` with logits at every position, then
/// teacher-forced decode of the rest one token at a time: GPU logits vs CPU
/// logits at every position. Returns the worst relative error.
pub(super) fn compare_sequence(
    cpu: &mut CpuBackend,
    gpu: &mut CudaBackend,
    tokens: &[u32],
    n_prompt: usize,
    what: &str,
) -> f64 {
    let vocab = cpu.config().vocab_size;
    let cpu_seq = cpu.open(tokens.len()).unwrap();
    let gpu_seq = gpu.open(tokens.len()).unwrap();
    let (mut c, mut g) = (Vec::new(), Vec::new());
    cpu.forward(cpu_seq, &tokens[..n_prompt], Logits::All, &mut c, None)
        .unwrap();
    gpu.forward(gpu_seq, &tokens[..n_prompt], Logits::All, &mut g, None)
        .unwrap();
    assert_eq!(g.len(), n_prompt * vocab);
    let mut worst = 0f64;
    let mut check = |g: &[f32], c: &[f32], pos: usize| {
        let e = rel_err(g, c);
        assert!(e <= 1e-2, "{what}: position {pos}: relative error {e:e}");
        // The same argmax, but at a near tie in the CPU's own logits (random
        // weights of real shapes give some), where rounding may pick either.
        let (ga, ca) = (argmax(g), argmax(c));
        assert!(
            ga == ca || c[ca] - c[ga] <= NEAR_TIE_LOGIT,
            "{what}: position {pos}: argmax {ga}, CPU {ca} ({} apart)",
            c[ca] - c[ga]
        );
        worst = worst.max(e);
    };
    for p in 0..n_prompt {
        check(
            &g[p * vocab..(p + 1) * vocab],
            &c[p * vocab..(p + 1) * vocab],
            p,
        );
    }
    for (i, &t) in tokens[n_prompt..].iter().enumerate() {
        cpu.forward(cpu_seq, &[t], Logits::Last, &mut c, None)
            .unwrap();
        gpu.forward(gpu_seq, &[t], Logits::Last, &mut g, None)
            .unwrap();
        check(&g, &c, n_prompt + i);
    }
    assert_eq!(gpu.len(gpu_seq), tokens.len());
    cpu.close(cpu_seq);
    gpu.close(gpu_seq);
    worst
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn synthetic_models_with_every_format_match_the_cpu_backend() {
    let _gpu = shared_gpu();
    for (arch, seed) in SYNTHETIC_ARCHS.into_iter().zip(10u64..) {
        let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, seed, 512)).unwrap());
        let opts = CudaLoadOptions {
            upload_chunk_bytes: 4096,
            ..Default::default()
        };
        let (mut cpu, mut gpu) = both_backends(file.clone(), &opts);
        let vocab = cpu.config().vocab_size as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let tokens: Vec<u32> = (0..80).map(|_| rng.random_range(0..vocab)).collect();
        let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 64, arch);
        // A prompt longer than mv's batch but not a whole gemm tile, and a short one.
        let e2 = compare_sequence(&mut cpu, &mut gpu, &tokens[..30], 9, arch);
        let e3 = compare_sequence(&mut cpu, &mut gpu, &tokens[..12], 3, arch);
        eprintln!(
            "synthetic {arch}: logits max relative error {:.2e}",
            e.max(e2).max(e3)
        );

        // Checkpoints record the same names as the CPU backend.
        let (mut cc, mut gc) = (Checkpoints::default(), Checkpoints::default());
        let (mut c, mut g) = (Vec::new(), Vec::new());
        let cpu_seq = cpu.open(8).unwrap();
        let gpu_seq = gpu.open(8).unwrap();
        cpu.forward(cpu_seq, &tokens[..5], Logits::Last, &mut c, Some(&mut cc))
            .unwrap();
        gpu.forward(gpu_seq, &tokens[..5], Logits::Last, &mut g, Some(&mut gc))
            .unwrap();
        let names = |cp: &Checkpoints| {
            cp.entries
                .iter()
                .map(|(n, _)| n.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&gc), names(&cc));
        for ((name, gv), (_, cv)) in gc.entries.iter().zip(&cc.entries) {
            let e = rel_err(gv, cv);
            assert!(e <= 1e-2, "checkpoint {name}: {e:e}");
        }

        // Every format was uploaded byte for byte, on 256-byte boundaries.
        let stats = gpu.upload_stats();
        assert!(
            stats.max_copy_bytes <= 4096,
            "no copy over the chunk size: {stats:?}"
        );
        assert_eq!(
            stats.total_bytes,
            file.tensor_bytes_total(),
            "all tensor bytes copied (vectors are F32)"
        );
        assert!(gpu.weight_buffers().iter().all(|b| b.ptr % 256 == 0));
        assert!(gpu.check_residency().unwrap());
    }
}

/// RoPE frequency factors on the GPU (their table, the magnitude factor,
/// decode steps replayed from a graph): Llama 3.1's `rope_freqs` and
/// Phi-3's LongRoPE against the CPU backend, prefill (cuBLAS-sized) and
/// decode.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rope_factor_models_match_the_cpu_backend() {
    let _gpu = shared_gpu();
    for (arch, seed) in [("llama", 40u64), ("phi3", 41)] {
        let bytes = crate::model::synthetic::synthetic_model_with(arch, seed, 512, true);
        let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let (mut cpu, mut gpu) = both_backends(file, &CudaLoadOptions::default());
        let vocab = cpu.config().vocab_size as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let tokens: Vec<u32> = (0..90).map(|_| rng.random_range(0..vocab)).collect();
        let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 70, arch);
        eprintln!("{arch} with RoPE factors: logits max relative error {e:.2e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn memory_accounting_kv_limits_and_vram_cap() {
    let _gpu = shared_gpu();
    let bytes = crate::model::synthetic::synthetic_llama("llama", 20, 4096);
    let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let opts = CudaLoadOptions {
        kv_cache_size_mb: Some(1),
        ..Default::default()
    };
    let mut gpu = CudaBackend::load(cfg.clone(), &file, &opts, &mut |_| {}).unwrap();
    let after_load = gpu.memory_use();
    assert!(
        after_load.weights >= file.tensor_bytes_total(),
        "{after_load:?}"
    );
    assert_eq!(after_load.kv_cache, 0, "{after_load:?}");
    // Scratch held from load on: batched steps' table and f16 block for a
    // few rows, reserved then so that no captured step allocates.
    let held = after_load.scratch;
    assert!(held < 1 << 20, "{after_load:?}");

    let gpu_seq = gpu.open(100).unwrap();
    let kv = CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 100);
    assert_eq!(gpu.memory_use().kv_cache, align_up(kv));
    let mut out = Vec::new();
    gpu.forward(
        gpu_seq,
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        Logits::All,
        &mut out,
        None,
    )
    .unwrap();
    assert_eq!(
        gpu.memory_use().scratch,
        held,
        "activations are freed when a step ends"
    );
    gpu.forward(gpu_seq, &[11], Logits::Last, &mut out, None)
        .unwrap();
    assert!(gpu.decoding_with_graph(gpu_seq));
    eprintln!(
        "during decode: {:?} (the decode graph's arena is scratch)",
        gpu.memory_use()
    );
    gpu.close(gpu_seq);
    assert_eq!(
        gpu.memory_use(),
        after_load,
        "back at the post-load value after a job"
    );

    // A sequence whose cache exceeds --kv-cache-size-mb is refused; the next one works.
    let too_long =
        (1 << 20) / CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 1) as usize + 1;
    assert!(matches!(
        gpu.open(too_long),
        Err(BackendError::OutOfMemory { .. })
    ));
    assert_eq!(gpu.memory_use(), after_load);
    let gpu_seq = gpu.open(16).unwrap();
    gpu.forward(gpu_seq, &[1, 2], Logits::Last, &mut out, None)
        .unwrap();
    gpu.close(gpu_seq);
    drop(gpu);

    // Under a cap below the model, the load fails before allocating.
    let capped = CudaLoadOptions {
        vram_cap_bytes: Some(file.tensor_bytes_total() / 2),
        ..Default::default()
    };
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
    let capped = CudaLoadOptions {
        vram_cap_bytes: Some(weights + (5 << 20)),
        ..Default::default()
    };
    let mut gpu = CudaBackend::load(cfg.clone(), &file, &capped, &mut |_| {}).unwrap();
    let post = gpu.memory_use();
    let ran_out = match gpu.open(512) {
        Err(BackendError::OutOfMemory { .. }) => true,
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(seq) => {
            // The cache fits; then a long prefill must run out.
            let long = vec![1u32; 512];
            let failed = gpu
                .forward(seq, &long, Logits::All, &mut out, None)
                .is_err();
            gpu.close(seq);
            failed
        }
    };
    assert!(ran_out, "a sequence past the cap runs out of memory");
    assert_eq!(gpu.memory_use(), post);
    let gpu_seq = gpu.open(8).unwrap();
    gpu.forward(gpu_seq, &[1, 2, 3], Logits::Last, &mut out, None)
        .unwrap();
    gpu.close(gpu_seq);
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn reference_model_matches_the_cpu_backend() {
    let _gpu = shared_gpu();
    let Some(path) = reference_model_or_skip() else {
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
            tokens.extend(
                case[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32),
            );
        }
    }
    assert!(tokens.len() >= 80);
    let e = compare_sequence(&mut cpu, &mut gpu, &tokens[..80], 64, "SmolLM2");
    eprintln!("SmolLM2-135M Q4_1: GPU vs CPU logits, 64 prefill + 16 decode positions: max relative error {e:.2e}, same argmax but at near ties");

    // Timing: time to first token for a 16-token prompt and decode speed.
    let mut out = Vec::new();
    let mut ttft = Vec::new();
    for _ in 0..10 {
        let gpu_seq = gpu.open(256).unwrap();
        let t = std::time::Instant::now();
        gpu.forward(gpu_seq, &tokens[..16], Logits::Last, &mut out, None)
            .unwrap();
        ttft.push(t.elapsed().as_secs_f64() * 1e3);
        gpu.close(gpu_seq);
    }
    ttft.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let gpu_seq = gpu.open(256).unwrap();
    gpu.forward(gpu_seq, &tokens[..16], Logits::Last, &mut out, None)
        .unwrap();
    let mut next = argmax(&out) as u32;
    for _ in 0..8 {
        gpu.forward(gpu_seq, &[next], Logits::Last, &mut out, None)
            .unwrap();
        next = argmax(&out) as u32;
    }
    let steps = 128;
    let t = std::time::Instant::now();
    for _ in 0..steps {
        gpu.forward(gpu_seq, &[next], Logits::Last, &mut out, None)
            .unwrap();
        next = argmax(&out) as u32;
    }
    let dt = t.elapsed().as_secs_f64();
    assert!(gpu.decoding_with_graph(gpu_seq));
    gpu.close(gpu_seq);
    // The same without graphs, for comparison.
    gpu.set_decode_graphs(false);
    let gpu_seq = gpu.open(256).unwrap();
    gpu.forward(gpu_seq, &tokens[..16], Logits::Last, &mut out, None)
        .unwrap();
    let t = std::time::Instant::now();
    for _ in 0..steps {
        gpu.forward(gpu_seq, &[next], Logits::Last, &mut out, None)
            .unwrap();
        next = argmax(&out) as u32;
    }
    let dt_eager = t.elapsed().as_secs_f64();
    gpu.close(gpu_seq);
    gpu.set_decode_graphs(true);
    let pp = {
        let gpu_seq = gpu.open(512).unwrap();
        let prompt: Vec<u32> = tokens.iter().cycle().take(512).copied().collect();
        gpu.forward(gpu_seq, &prompt, Logits::Last, &mut out, None)
            .unwrap();
        gpu.close(gpu_seq);
        let gpu_seq = gpu.open(512).unwrap();
        let t = std::time::Instant::now();
        gpu.forward(gpu_seq, &prompt, Logits::Last, &mut out, None)
            .unwrap();
        let s = t.elapsed().as_secs_f64();
        gpu.close(gpu_seq);
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

/// Gemma 3 270M (the real file, `WORKER_ORCD_GEMMA3_MODEL` or
/// `.models/gemma-3-270m-q4_k_m.gguf`): GPU vs CPU logits at every position
/// of a real-text sequence longer than its 512-position sliding window, so
/// that the local layers' window hides keys in prefill and in decode.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gemma3_matches_the_cpu_backend() {
    let _gpu = shared_gpu();
    let path = match std::env::var_os("WORKER_ORCD_GEMMA3_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => workspace_path(".models/gemma-3-270m-q4_k_m.gguf"),
    };
    if !path.exists() {
        assert!(std::env::var_os("CI").is_none(), "CI must fetch gemma3");
        eprintln!("skipping: {} is absent", path.display());
        return;
    }
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let (mut cpu, mut gpu) = both_backends(file.clone(), &CudaLoadOptions::default());
    assert_eq!(cpu.config().sliding_window, Some(512));
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_path("testdata/golden-gemma3/greedy.json")).unwrap(),
    )
    .unwrap();
    let mut text = Vec::new();
    for case in golden["cases"].as_array().unwrap() {
        for key in ["prompt_token_ids", "generated_token_ids"] {
            let ids = case[key].as_array().unwrap();
            text.extend(ids.iter().map(|v| v.as_u64().unwrap() as u32));
        }
    }
    let tokens: Vec<u32> = text.iter().cycle().take(560).copied().collect();
    let short = compare_sequence(&mut cpu, &mut gpu, &tokens[..48], 32, "Gemma 3");
    let long = compare_sequence(&mut cpu, &mut gpu, &tokens, 530, "Gemma 3 past the window");
    eprintln!("Gemma 3 270M Q4_K_M: GPU vs CPU logits, 32 + 16 and 530 + 30 positions: max relative error {:.2e} and {long:.2e}, same argmax", short);
}

/// The real Phi-3-mini-4k and GPT-2 124M shapes, as `harness synth-model`
/// writes them (Q4_K): GPU vs CPU logits at every position of a 32-token
/// prefill and 8 decode steps. The tokenizer sources are the reference model
/// and Gemma 3 (`WORKER_ORCD_REFERENCE_MODEL`, `WORKER_ORCD_GEMMA3_MODEL`, or
/// their `.models/` files).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn phi3_and_gpt2_shapes_match_the_cpu_backend() {
    use harness::synth;
    let _gpu = shared_gpu();
    let gemma = match std::env::var_os("WORKER_ORCD_GEMMA3_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => workspace_path(".models/gemma-3-270m-q4_k_m.gguf"),
    };
    let (Some(reference), true) = (reference_model_path(), gemma.exists()) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch both models"
        );
        eprintln!("skipping: the reference model or Gemma 3 is absent");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for name in ["gpt2", "phi3"] {
        let preset = synth::preset(name).unwrap();
        let opts = synth::Options {
            preset,
            format: synth::Format::from_name("Q4_K").unwrap(),
            seed: 0,
            threads: 16,
        };
        let path = dir.path().join(format!("{name}.gguf"));
        let source = synth::tokenizer_source(preset, &reference, &gemma);
        synth::write_file(&opts, source, &path).unwrap();
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let (mut cpu, mut gpu) = both_backends(file, &CudaLoadOptions::default());
        let vocab = cpu.config().vocab_size as u32;
        let tokens: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 11) % vocab).collect();
        let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 32, name);
        eprintln!("{name} shape Q4_K: GPU vs CPU logits at 40 positions: max relative error {e:.2e}, same argmax but at near ties");
        drop((cpu, gpu));
        std::fs::remove_file(&path).unwrap();
    }
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
            let gpu_seq = gpu.open(1024).unwrap();
            let t = std::time::Instant::now();
            gpu.forward(gpu_seq, &prompt[..n], Logits::Last, out, None)
                .unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e3);
            gpu.close(gpu_seq);
        }
        median(v)
    };
    let p16 = prefill_ms(&mut gpu, 16, &mut out);
    let p64 = prefill_ms(&mut gpu, 64, &mut out);
    let p512 = prefill_ms(&mut gpu, 512, &mut out);
    let mut decode = |gpu: &mut CudaBackend, graphs: bool, start: usize| {
        gpu.set_decode_graphs(graphs);
        let gpu_seq = gpu.open(1024).unwrap();
        gpu.forward(gpu_seq, &prompt[..start], Logits::Last, &mut out, None)
            .unwrap();
        for &t in &prompt[..4] {
            gpu.forward(gpu_seq, &[t], Logits::Last, &mut out, None)
                .unwrap();
        }
        let steps = 128;
        let t = std::time::Instant::now();
        for &t in &prompt[..steps] {
            gpu.forward(gpu_seq, &[t], Logits::Last, &mut out, None)
                .unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        gpu.close(gpu_seq);
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
        let file = Arc::new(
            GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, 7, 64)).unwrap(),
        );
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let vocab = cfg.vocab_size;
        let mut gpu =
            CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        crate::backend::contract::check_backend_contract(&mut gpu, vocab);
    }
}

/// Issue 42: the prefix cache changes no token on the GPU, with one
/// sequence (the pool made for it) and with four (batched decode steps)
/// (`contract::check_prefix_reuse`), for every synthetic architecture.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn a_cached_prefix_gives_the_same_tokens_as_a_computed_one_cuda() {
    let _gpu = shared_gpu();
    for arch in SYNTHETIC_ARCHS {
        for slots in [1, 4] {
            let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, 7, 2048)).unwrap());
            let cfg = ModelConfig::try_from(&file.metadata).unwrap();
            let vocab = cfg.vocab_size;
            // A tiny model's whole context is less than one 2 MiB block:
            // a budget of a few blocks leaves the cache room beside a job.
            let opts = CudaLoadOptions {
                kv_cache_size_mb: Some(16),
                ..CudaLoadOptions::default()
            };
            let mut gpu = CudaBackend::load(cfg, &file, &opts, &mut |_| {}).unwrap();
            gpu.set_max_sequences(slots).unwrap();
            eprintln!("{arch}, {slots} slots");
            crate::backend::contract::check_prefix_reuse(&mut gpu, vocab);
        }
    }
}

/// Issue 18: batched decode steps (`decode`, rows mode) for every
/// synthetic architecture, the reference model and Gemma 3 where present:
/// three sequences of different lengths, batched in any order and subset,
/// give each the bits it gives alone, and the choices of one-token
/// `forward` calls (`contract::check_slots`).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn batched_decode_is_batch_invariant_for_every_architecture() {
    let _gpu = shared_gpu();
    let mut files: Vec<(String, Arc<GgufFile>)> = SYNTHETIC_ARCHS
        .iter()
        .map(|arch| {
            let bytes = synthetic_model(arch, 7, 64);
            (
                arch.to_string(),
                Arc::new(GgufFile::from_bytes(bytes).unwrap()),
            )
        })
        .collect();
    let gemma = workspace_path(".models/gemma-3-270m-q4_k_m.gguf");
    for path in reference_model_path()
        .into_iter()
        .chain(gemma.exists().then_some(gemma))
    {
        files.push((
            path.display().to_string(),
            Arc::new(GgufFile::open(&path).unwrap()),
        ));
    }
    for (name, file) in files {
        eprintln!("batched decode: {name}");
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let mut gpu =
            CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        crate::backend::contract::check_slots(&mut gpu);
    }
}

/// Issue 45: every synthetic architecture whose heads are whole blocks, with
/// a q8_0 and a q4_0 cache on both backends: prefill and decode logits as
/// the CPU's, batched decode steps invariant and a cached prefix the same
/// as a computed one (the pool's blocks and the prefix copies of levels and
/// scales). An architecture whose heads are not whole blocks is refused at
/// load, naming the type.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn quantized_kv_caches_match_the_cpu_backend() {
    let _gpu = shared_gpu();
    for kv_type in [KvType::Q8_0, KvType::Q4_0] {
        for (arch, seed) in SYNTHETIC_ARCHS.into_iter().zip(30u64..) {
            let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, seed, 512)).unwrap());
            let cfg = ModelConfig::try_from(&file.metadata).unwrap();
            let opts = CudaLoadOptions {
                kv_type,
                kv_cache_size_mb: Some(16),
                ..Default::default()
            };
            if !cfg.head_dim.is_multiple_of(32) {
                let e = CudaBackend::load(cfg, &file, &opts, &mut |_| {})
                    .err()
                    .unwrap();
                assert!(e.to_string().contains(kv_type.as_str()), "{arch}: {e}");
                continue;
            }
            let (cpu, mut gpu) = both_backends(file.clone(), &opts);
            let mut cpu = cpu.with_kv_type(kv_type).unwrap();
            assert_eq!(gpu.kv_layout().kv_type, kv_type);
            let vocab = cpu.config().vocab_size;
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let tokens: Vec<u32> = (0..80).map(|_| rng.random_range(0..vocab as u32)).collect();
            let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 64, arch);
            eprintln!("synthetic {arch}, {kv_type} KV: logits max relative error {e:.2e}");
            gpu.set_max_sequences(4).unwrap();
            crate::backend::contract::check_slots(&mut gpu);
            crate::backend::contract::check_prefix_reuse(&mut gpu, vocab);
        }
    }
}

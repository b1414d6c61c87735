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
fn compare_sequence(
    cpu: &mut CpuBackend,
    gpu: &mut CudaBackend,
    tokens: &[u32],
    n_prompt: usize,
    what: &str,
) -> f64 {
    let vocab = cpu.config().vocab_size;
    cpu.begin_sequence(tokens.len()).unwrap();
    gpu.begin_sequence(tokens.len()).unwrap();
    let (mut c, mut g) = (Vec::new(), Vec::new());
    cpu.forward(&tokens[..n_prompt], Logits::All, &mut c, None)
        .unwrap();
    gpu.forward(&tokens[..n_prompt], Logits::All, &mut g, None)
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
        cpu.begin_sequence(8).unwrap();
        gpu.begin_sequence(8).unwrap();
        cpu.forward(&tokens[..5], Logits::Last, &mut c, Some(&mut cc))
            .unwrap();
        gpu.forward(&tokens[..5], Logits::Last, &mut g, Some(&mut gc))
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

    gpu.begin_sequence(100).unwrap();
    let kv = CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 100);
    assert_eq!(gpu.memory_use().kv_cache, align_up(kv));
    let mut out = Vec::new();
    gpu.forward(
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
    gpu.forward(&[11], Logits::Last, &mut out, None).unwrap();
    assert!(gpu.decoding_with_graph());
    eprintln!(
        "during decode: {:?} (the decode graph's arena is scratch)",
        gpu.memory_use()
    );
    gpu.end_sequence();
    assert_eq!(
        gpu.memory_use(),
        after_load,
        "back at the post-load value after a job"
    );

    // A sequence whose cache exceeds --kv-cache-size-mb is refused; the next one works.
    let too_long =
        (1 << 20) / CudaCache::bytes_for(cfg.n_layer, cfg.n_head_kv, cfg.head_dim, 1) as usize + 1;
    assert!(matches!(
        gpu.begin_sequence(too_long),
        Err(BackendError::OutOfMemory { .. })
    ));
    assert_eq!(gpu.memory_use(), after_load);
    gpu.begin_sequence(16).unwrap();
    gpu.forward(&[1, 2], Logits::Last, &mut out, None).unwrap();
    gpu.end_sequence();
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
    assert!(
        matches!(
            gpu.begin_sequence(512),
            Err(BackendError::OutOfMemory { .. })
        ) || {
            // The cache fits; then a long prefill must run out.
            gpu.forward(&vec![1u32; 512], Logits::All, &mut out, None)
                .is_err()
        }
    );
    gpu.end_sequence();
    assert_eq!(gpu.memory_use(), post);
    gpu.begin_sequence(8).unwrap();
    gpu.forward(&[1, 2, 3], Logits::Last, &mut out, None)
        .unwrap();
    gpu.end_sequence();
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn reference_model_matches_the_cpu_backend() {
    let _gpu = shared_gpu();
    let Some(path) = reference_model_path() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch the reference model"
        );
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
        gpu.begin_sequence(256).unwrap();
        let t = std::time::Instant::now();
        gpu.forward(&tokens[..16], Logits::Last, &mut out, None)
            .unwrap();
        ttft.push(t.elapsed().as_secs_f64() * 1e3);
        gpu.end_sequence();
    }
    ttft.sort_by(|a, b| a.partial_cmp(b).unwrap());
    gpu.begin_sequence(256).unwrap();
    gpu.forward(&tokens[..16], Logits::Last, &mut out, None)
        .unwrap();
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
    gpu.forward(&tokens[..16], Logits::Last, &mut out, None)
        .unwrap();
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

/// Router logits closer than this at the last chosen expert are a near tie:
/// GPU and CPU may choose different experts there (their hidden states
/// differ by rounding), and the position's output with them.
const MOE_NEAR_TIE: f32 = 2e-3;

/// The smallest margin, over layers, between the last chosen and the first
/// unchosen router logit at each position of `tokens`: the CPU backend a
/// token at a time, its checkpoints holding the position's
/// `ffn_moe_logits-<layer>`.
fn routing_margins(cpu: &mut CpuBackend, tokens: &[u32], used: usize) -> Vec<f32> {
    cpu.begin_sequence(tokens.len()).unwrap();
    let mut out = Vec::new();
    let margins = tokens
        .iter()
        .map(|&t| {
            let mut cp = crate::model::ops::Checkpoints::default();
            cpu.forward(&[t], Logits::Last, &mut out, Some(&mut cp))
                .unwrap();
            routing(&cp, used).1
        })
        .collect();
    cpu.end_sequence();
    margins
}

/// gpt-oss (attention sinks, a 128-position window on every other layer,
/// YaRN, experts in MXFP4 chosen on the device): the harness's small
/// gpt-oss preset (the real vocabulary and layout), GPU vs CPU logits at
/// every position of a prefill that runs past the window and of decode
/// steps after it, on the graph path; then decode steps with attention
/// split over the context (the sink in `attention_combine`). The tokens
/// are the first of a few fixed sequences whose routing has no near tie
/// (`MOE_NEAR_TIE`) at any position and layer.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpt_oss_matches_the_cpu_backend() {
    use harness::synth;
    let _gpu = shared_gpu();
    let Some(reference) = reference_model_path() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must fetch the reference model"
        );
        eprintln!("skipping: the reference model is absent");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let preset = synth::preset("gpt-oss").unwrap();
    let opts = synth::Options {
        preset,
        format: preset.default_format,
        seed: 0,
        threads: 16,
    };
    let path = dir.path().join("gpt-oss.gguf");
    synth::write_file(&opts, &reference, &path).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let (mut cpu, mut gpu) = both_backends(file, &CudaLoadOptions::default());
    let (vocab, used) = (
        cpu.config().vocab_size as u32,
        cpu.config().moe.unwrap().used,
    );
    let (tokens, margin) = (0..20u32)
        .map(|k| {
            let tokens: Vec<u32> = (0..160u32)
                .map(|i| (i * 7919 + 11 + k * 104_729) % vocab)
                .collect();
            let m = routing_margins(&mut cpu, &tokens, used);
            (tokens, m.into_iter().fold(f32::INFINITY, f32::min))
        })
        .find(|(_, m)| *m >= MOE_NEAR_TIE)
        .expect("one of 20 sequences routes without a near tie");
    let e = compare_sequence(&mut cpu, &mut gpu, &tokens, 150, "gpt-oss");
    gpu.cuda_device().kernels.set_split_min_context(0);
    let split = compare_sequence(
        &mut cpu,
        &mut gpu,
        &tokens[..40],
        30,
        "gpt-oss, split decode",
    );
    gpu.cuda_device()
        .kernels
        .set_split_min_context(kernels::SPLIT_MIN_CONTEXT);
    eprintln!(
        "gpt-oss: GPU vs CPU logits at 160 positions (smallest routing margin {margin:.2e}): max relative error {e:.2e}; split decode {split:.2e}"
    );
}

/// The experts each layer's router chose (its `used` highest logits) at
/// the last position of a pass, from the pass's checkpoints, and the
/// smallest margin between the last chosen and the first unchosen logit.
fn routing(cp: &crate::model::ops::Checkpoints, used: usize) -> (Vec<Vec<usize>>, f32) {
    let mut margin = f32::INFINITY;
    let chosen = cp
        .entries
        .iter()
        .filter(|(name, _)| name.starts_with("ffn_moe_logits-"))
        .map(|(_, l)| {
            let mut order: Vec<usize> = (0..l.len()).collect();
            order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
            margin = margin.min(l[order[used - 1]] - l[order[used]]);
            let mut top = order[..used].to_vec();
            top.sort_unstable();
            top
        })
        .collect();
    (chosen, margin)
}

/// gpt-oss-20b's real shapes (issue 14): GPU vs CPU logits at every
/// position of testdata/golden-synth/gpt-oss-20b-Q8_0.json's prompts, 1e-2
/// relative wherever the two routers chose the same experts in every layer
/// at this position and every one before it; where they did not, the CPU's
/// own margin must show a near tie. Each position is the last of a prefill
/// of its prefix (the GPU's grouped expert GEMM from 8 tokens on), so the
/// checkpoints hold its router logits on both backends.
///
/// The agreement with llama.cpp's log-probabilities on the same 12 GB file
/// (its CUDA build) is reported, not asserted: on this random-weight file
/// llama.cpp's CPU and CUDA builds agree with each other at 7 of 26
/// positions' top-1 (11 beyond a near tie; benches/results/h200-gpt-oss):
/// with 24 layers of 4-of-32 routing at small margins, llama.cpp's 8-bit
/// activations choose other experts, and the choice carries through
/// attention to every later position. The small gpt-oss preset's goldens
/// (2 layers) are asserted on the CPU (tests/golden_synth.rs).
/// The file is `harness synth-model`'s, kept in `HARNESS_MODEL_CACHE`.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpt_oss_20b_matches_the_cpu_backend() {
    use crate::model::ops::Checkpoints;
    use harness::golden::{Agreement, Golden};
    use harness::synth;
    let _gpu = shared_gpu();
    let golden = workspace_path("testdata/golden-synth/gpt-oss-20b-Q8_0.json");
    let (Some(reference), true) = (reference_model_path(), golden.exists()) else {
        eprintln!("skipping: the reference model or the gpt-oss-20b golden is absent");
        return;
    };
    let g = Golden::read(&golden).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = std::env::var_os("HARNESS_MODEL_CACHE").map(std::path::PathBuf::from);
    let path = cache
        .as_deref()
        .unwrap_or(dir.path())
        .join("synthetic-gpt-oss-20b.gguf");
    if !path.exists() {
        let preset = synth::preset(&g.preset).unwrap();
        let opts = synth::Options {
            preset,
            format: synth::Format::from_name(&g.format).unwrap(),
            seed: g.seed,
            threads: 16,
        };
        synth::write_file(&opts, &reference, &path).unwrap();
    }
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert_eq!(Some(bytes), g.file_bytes, "the file llama.cpp read");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let (mut cpu, mut gpu) = both_backends(file, &CudaLoadOptions::default());
    let (vocab, used) = (cpu.config().vocab_size, cpu.config().moe.unwrap().used);
    let mut agreement = Agreement::default();
    let (mut worst, mut flips) = (0f64, 0);
    for case in &g.cases {
        let ids = &case.prompt_ids;
        let mut all = vec![0f32; ids.len() * vocab];
        // Once a position routed differently, later ones attend to its K
        // and V: they are compared with llama.cpp's only.
        let mut flipped = false;
        for n in 1..=ids.len() {
            let pass = |b: &mut dyn Backend| {
                let (mut cp, mut logits) = (Checkpoints::default(), Vec::new());
                b.begin_sequence(n).unwrap();
                b.forward(&ids[..n], Logits::Last, &mut logits, Some(&mut cp))
                    .unwrap();
                b.end_sequence();
                (logits, routing(&cp, used))
            };
            let (c, (c_chosen, margin)) = pass(&mut cpu);
            let (gl, (g_chosen, _)) = pass(&mut gpu);
            let e = rel_err(&gl, &c);
            let same = c_chosen == g_chosen;
            eprintln!("{n} tokens: GPU vs CPU relative error {e:.2e}, same experts {same}, CPU routing margin {margin:.2e}");
            if same && !flipped {
                assert!(
                    e <= 1e-2,
                    "gpt-oss-20b: {n} tokens: GPU vs CPU relative error {e:e}"
                );
                worst = worst.max(e);
            } else if !same {
                flipped = true;
                assert!(
                    margin < MOE_FLIP_MARGIN,
                    "gpt-oss-20b: {n} tokens: the routers chose differently at a margin of {margin:e}"
                );
                flips += 1;
            }
            all[(n - 1) * vocab..n * vocab].copy_from_slice(&gl);
        }
        agreement.add_case("gpt-oss-20b on the GPU", case, &all, vocab);
    }
    let vs_llama = agreement.summary("gpt-oss-20b on the GPU vs llama.cpp (reported)");
    eprintln!("{vs_llama}");
    for f in &agreement.failures {
        eprintln!("  {f}");
    }
    eprintln!("gpt-oss-20b: GPU vs CPU max relative error {worst:.2e} where both routed alike; {flips} positions routed differently at a near tie (they and the positions after them not compared)");
}

/// A router margin under which 24 layers of rounding differences may choose
/// another expert (seen: 3.6e-3 on gpt-oss-20b's shapes).
const MOE_FLIP_MARGIN: f32 = 2e-2;

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
        gpu.forward(&prompt[..start], Logits::Last, &mut out, None)
            .unwrap();
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

/// Issue 18: batched decode steps (`decode_rows`, rows mode) for every
/// synthetic architecture, the reference model and Gemma 3 where present:
/// three sequences of different lengths, batched in any order and subset,
/// give each the bits it gives alone, and the choices of one-token
/// `forward` calls (`contract::check_slots`).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn decode_rows_is_batch_invariant_for_every_architecture() {
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
        eprintln!("decode_rows: {name}");
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let mut gpu =
            CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        crate::backend::contract::check_slots(&mut gpu);
    }
}

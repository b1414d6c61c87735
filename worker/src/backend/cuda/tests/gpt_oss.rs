//! gpt-oss on both backends: the synthetic mixture of experts and, where
//! present, the 20b file, compared position by position where the routers'
//! choices are not near ties.

use super::model::compare_sequence;
use super::*;

/// Router logits closer than this at the last chosen expert are a near tie:
/// GPU and CPU may choose different experts there (their hidden states
/// differ by rounding), and the position's output with them.
const MOE_NEAR_TIE: f32 = 2e-3;

/// The smallest margin, over layers, between the last chosen and the first
/// unchosen router logit at each position of `tokens`: the CPU backend a
/// token at a time, its checkpoints holding the position's
/// `ffn_moe_logits-<layer>`.
fn routing_margins(cpu: &mut CpuBackend, tokens: &[u32], used: usize) -> Vec<f32> {
    let cpu_seq = cpu.open(tokens.len()).unwrap();
    let mut out = Vec::new();
    let margins = tokens
        .iter()
        .map(|&t| {
            let mut cp = crate::model::ops::Checkpoints::default();
            cpu.forward(cpu_seq, &[t], Logits::Last, &mut out, Some(&mut cp))
                .unwrap();
            routing(&cp, used).1
        })
        .collect();
    cpu.close(cpu_seq);
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
    let Some(reference) = reference_model_or_skip() else {
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
                let b_seq = b.open(n).unwrap();
                b.forward(b_seq, &ids[..n], Logits::Last, &mut logits, Some(&mut cp))
                    .unwrap();
                b.close(b_seq);
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

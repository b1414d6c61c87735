//! Sampling on the GPU (M0-W-1421) against the CPU sampler.

use super::*;

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
    let ties: Vec<f32> = (0..n)
        .map(|_| (rng.random_range(-20i32..20) as f32) / 4.0)
        .collect();
    let mut holes = random_vec(rng, n, 6.0);
    for _ in 0..n.div_ceil(10) {
        let i = rng.random_range(0..n);
        holes[i] = if rng.random::<bool>() {
            f32::NEG_INFINITY
        } else {
            f32::NAN
        };
    }
    let flat = vec![0.5f32; n];
    vec![
        ("llm", llm),
        ("ties", ties),
        ("-inf/NaN", holes),
        ("flat", flat),
    ]
}

/// The parameter sets every sampling test runs: greedy, each filter alone,
/// and all combined.
fn sampling_params(n: usize) -> Vec<crate::sampling::SamplingParams> {
    use crate::sampling::SamplingParams;
    let t = |temperature| SamplingParams {
        temperature,
        seed: 7,
        ..SamplingParams::default()
    };
    vec![
        t(0.0),
        SamplingParams {
            repetition_penalty: 1.3,
            ..t(0.0)
        },
        t(1.0),
        t(0.8),
        SamplingParams {
            repetition_penalty: 0.7,
            ..t(1.0)
        },
        SamplingParams { top_k: 1, ..t(1.0) },
        SamplingParams {
            top_k: 40,
            ..t(1.0)
        },
        SamplingParams { top_k: n, ..t(1.0) },
        SamplingParams {
            top_p: 0.1,
            ..t(1.0)
        },
        SamplingParams {
            top_p: 0.9,
            ..t(1.0)
        },
        SamplingParams {
            min_p: 0.05,
            ..t(1.0)
        },
        SamplingParams {
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            ..t(0.7)
        },
        SamplingParams {
            top_k: 200,
            top_p: 0.95,
            min_p: 0.01,
            repetition_penalty: 1.3,
            ..t(1.7)
        },
    ]
}

/// The greedy choice without a penalty (`sample_argmax`, many blocks) is
/// `sampling::argmax`'s at vocabulary sizes around and past its block
/// layout (one block; a partial last block; more ids than its blocks cover
/// eight a thread), over ties, -inf and NaN, twice in a row (its ticket
/// counter is reset for the next launch).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn gpu_greedy_choice_matches_cpu_argmax_at_every_vocabulary_size() {
    let _gpu = shared_gpu();
    use crate::backend::SampleRequest;
    use crate::sampling::{argmax, SamplingParams};
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    for n in [
        1usize, 2, 33, 2047, 2048, 2049, 49_152, 151_936, 262_144, 600_001,
    ] {
        let mut s = DeviceSampler::new(&dev(), n).unwrap();
        let mut cases = sampling_logits(&mut rng, n);
        let mut nan = vec![f32::NAN; n];
        nan[n / 2] = f32::NEG_INFINITY;
        cases.push(("all NaN but one -inf", nan));
        cases.push(("all NaN", vec![f32::NAN; n]));
        for (kind, logits) in cases {
            s.upload_logits(&logits).unwrap();
            let req = SampleRequest {
                params: &greedy,
                generated: &[],
                uniform: None,
                logprobs: 0,
                mask: None,
                bias: &[],
            };
            let want = argmax(&logits);
            for call in 0..2 {
                let got = s.sample(&req).unwrap().id;
                assert_eq!(got, want, "n {n} {kind}, call {call}");
            }
        }
    }
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
            let generated: Vec<u32> = (0..24)
                .map(|_| rng.random_range(0..n as u32))
                .chain([0, 0, n as u32 + 5])
                .collect();
            for p in sampling_params(n) {
                let req = |uniform| SampleRequest {
                    params: &p,
                    generated: &generated,
                    uniform,
                    logprobs: 0,
                    mask: None,
                    bias: &[],
                };
                if p.temperature == 0.0 {
                    let got = s.sample(&req(None)).unwrap().id;
                    assert_eq!(
                        got,
                        select(&logits, &generated, &p, None),
                        "n {n} {kind} {p:?} greedy"
                    );
                    checked += 1;
                    continue;
                }
                let grid: Vec<f64> = (0..64)
                    .map(|_| rng.random::<f64>())
                    .chain([0.0, 0.5])
                    .collect();
                let draws =
                    draws_away_from_boundaries(&logits, &generated, &p, grid.iter().copied(), 1e-7);
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
            mask: None,
            bias: &[],
        };
        assert_eq!(
            s.sample(&req).unwrap().id,
            select(&logits, &[1, 2], &p, req.uniform),
            "{p:?}"
        );
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
    let p = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
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
                let got = s
                    .sample(&SampleRequest {
                        params: &p,
                        generated: &[],
                        uniform: None,
                        logprobs: k,
                        mask: None,
                        bias: &[],
                    })
                    .unwrap();
                let want = top_logprobs(&logits, k);
                let ids = |v: &[crate::sampling::TokenLogprob]| {
                    v.iter().map(|t| t.id).collect::<Vec<_>>()
                };
                assert_eq!(ids(&got.logprobs), ids(&want), "n {n} {kind} k {k}");
                for (g, c) in got.logprobs.iter().zip(&want) {
                    let e = (g.logprob - c.logprob).abs();
                    assert!(
                        e <= 1e-5,
                        "n {n} {kind} k {k}: logprob of {} is {} vs {}",
                        g.id,
                        g.logprob,
                        c.logprob
                    );
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
    let got = s
        .sample(&SampleRequest {
            params: &p,
            generated: &[],
            uniform: None,
            logprobs: 20,
            mask: None,
            bias: &[],
        })
        .unwrap();
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
            let req = SampleRequest {
                params: &p,
                generated: &generated,
                uniform,
                logprobs: 20,
                mask: None,
                bias: &[],
            };
            let first = s.sample(&req).unwrap();
            for run in 1..50 {
                assert_eq!(
                    s.sample(&req).unwrap(),
                    first,
                    "{kind} {p:?}: run {run} differs from run 0"
                );
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
    let req = |uniform, logprobs| SampleRequest {
        params: &p,
        generated: &[],
        uniform,
        logprobs,
        mask: None,
        bias: &[],
    };
    assert!(
        s.sample(&req(Some(0.5), 21)).is_err(),
        "more log-probabilities than the kernel returns"
    );
    assert!(
        s.sample(&req(Some(1.0), 0)).is_err(),
        "a draw outside [0, 1)"
    );
    assert!(s.sample(&req(Some(f64::NAN), 0)).is_err());
    assert_eq!(
        s.sample(&req(Some(0.5), 0)).unwrap().id,
        50,
        "flat logits: the middle token at u = 0.5"
    );
    // A backend samples only after a forward pass.
    let file = Arc::new(
        GgufFile::from_bytes(crate::model::synthetic::synthetic_llama("llama", 43, 64)).unwrap(),
    );
    let cfg = ModelConfig::try_from(&file.metadata).unwrap();
    let mut gpu = CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
    let seq = gpu.open(8).unwrap();
    assert!(gpu.sample(&[(seq, req(None, 0))]).is_err());
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
    use crate::backend::{sample_one, SampleRequest};
    use crate::sampling::{draws_away_from_boundaries, select, Sampler, SamplingParams};
    for (arch, seed) in [("llama", 44u64), ("qwen2", 45)] {
        let file = Arc::new(
            GgufFile::from_bytes(crate::model::synthetic::synthetic_llama(arch, seed, 512))
                .unwrap(),
        );
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
        let cs = cpu.open(prompt.len() + 32).unwrap();
        let gs = gpu.open(prompt.len() + 32).unwrap();
        let (mut c, mut none) = (Vec::new(), Vec::new());
        cpu.forward(cs, &prompt, Logits::Last, &mut c, None)
            .unwrap();
        gpu.forward(gs, &prompt, Logits::None, &mut none, None)
            .unwrap();
        let mut sampler = Sampler::new(p.clone());
        let (mut generated, mut differing, mut checked) = (Vec::new(), 0, 0);
        for step in 0..32 {
            let uniform = sampler.draw();
            let req = SampleRequest {
                params: &p,
                generated: &generated,
                uniform,
                logprobs: 5,
                mask: None,
                bias: &[],
            };
            let want = sample_one(&mut cpu, cs, &req).unwrap();
            let got = sample_one(&mut gpu, gs, &req).unwrap();
            let g = gpu.sampler(gs).unwrap().download_logits().unwrap();
            assert!(
                rel_err(&g, &c) <= 1e-2,
                "{arch} step {step}: logits differ by {:e}",
                rel_err(&g, &c)
            );
            if !draws_away_from_boundaries(&g, &generated, &p, uniform, 1e-7).is_empty() {
                assert_eq!(
                    got.id,
                    select(&g, &generated, &p, uniform),
                    "{arch} step {step}: GPU choice on its own logits"
                );
                checked += 1;
            }
            if got.id != want.id {
                eprintln!(
                    "{arch} step {step}: GPU {} vs CPU {} (u = {uniform:?}; the logits differ)",
                    got.id, want.id
                );
                differing += 1;
            }
            assert_eq!(got.logprobs.len(), 5);
            generated.push(want.id);
            cpu.forward(cs, &[want.id], Logits::Last, &mut c, None)
                .unwrap();
            gpu.forward(gs, &[want.id], Logits::None, &mut none, None)
                .unwrap();
            assert!(none.is_empty());
        }
        assert!(
            gpu.decoding_with_graph(gs),
            "decode steps went through the graph"
        );
        assert!(
            checked >= 30,
            "{arch}: only {checked} draws away from a boundary"
        );
        assert!(differing <= 4, "{arch}: {differing} of 32 tokens differ");
        eprintln!("{arch}: 32 tokens sampled on the GPU, {differing} differing from the CPU's; ids {generated:?}");
    }
}

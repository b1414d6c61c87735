//! Sampler tests. Expected values are written out by hand or come from the
//! straightforward reference below (full sort, sequential sums), never from
//! the code under test.

use super::*;
use std::collections::BTreeSet;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: 1234,
        ..SamplingParams::default()
    }
}

/// Runs steps 1–5 and returns the kept tokens with their renormalized
/// probabilities, sorted by id.
fn kept(s: &mut Sampler, logits: &[f32], generated: &[u32]) -> Vec<(u32, f64)> {
    let sel = &mut s.selector;
    sel.prepare(logits, generated, &s.params);
    sel.filter(&s.params);
    let total: f64 = sel.cands.iter().map(|&id| sel.weights[id as usize]).sum();
    let mut out: Vec<(u32, f64)> = sel
        .cands
        .iter()
        .map(|&id| (id, sel.weights[id as usize] / total))
        .collect();
    out.sort_by_key(|&(id, _)| id);
    out
}

fn kept_ids(s: &mut Sampler, logits: &[f32], generated: &[u32]) -> Vec<u32> {
    kept(s, logits, generated)
        .iter()
        .map(|&(id, _)| id)
        .collect()
}

fn assert_probs(got: &[(u32, f64)], expected: &[(u32, f64)], tol: f64) {
    assert_eq!(
        got.len(),
        expected.len(),
        "got {got:?}, expected {expected:?}"
    );
    for (g, e) in got.iter().zip(expected) {
        assert_eq!(g.0, e.0, "got {got:?}, expected {expected:?}");
        assert!(
            (g.1 - e.1).abs() < tol,
            "got {got:?}, expected {expected:?}"
        );
    }
}

/// Reference pipeline, written directly from M0-W-1421 with a full sort.
/// Returns the kept (id, probability) in rank order.
fn reference(logits: &[f32], generated: &[u32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let mut l: Vec<f32> = logits.iter().map(|&x| x / p.temperature).collect();
    let distinct: BTreeSet<u32> = generated.iter().copied().collect();
    if p.repetition_penalty != 1.0 {
        for &id in &distinct {
            let x = &mut l[id as usize];
            *x = if *x > 0.0 {
                *x / p.repetition_penalty
            } else {
                *x * p.repetition_penalty
            };
        }
    }
    let mut ids: Vec<u32> = (0..l.len() as u32).collect();
    ids.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    if p.top_k > 0 {
        ids.truncate(p.top_k);
    }
    let m = f64::from(l[ids[0] as usize]);
    let softmax = |ids: &[u32]| -> Vec<(u32, f64)> {
        let z: f64 = ids
            .iter()
            .map(|&i| (f64::from(l[i as usize]) - m).exp())
            .sum();
        ids.iter()
            .map(|&i| (i, (f64::from(l[i as usize]) - m).exp() / z))
            .collect()
    };
    let mut kept = softmax(&ids);
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let n = kept
            .iter()
            .position(|&(_, q)| {
                cum += q;
                cum >= f64::from(p.top_p)
            })
            .map_or(kept.len(), |i| i + 1);
        kept.truncate(n);
    }
    let top = kept[0].1;
    kept.retain(|&(_, q)| q >= f64::from(p.min_p) * top);
    let ids: Vec<u32> = kept.iter().map(|&(i, _)| i).collect();
    softmax(&ids)
}

/// Inverse CDF over `kept` (in rank order) at `u`.
fn walk(kept: &[(u32, f64)], u: f64) -> u32 {
    let mut cum = 0.0;
    for &(id, q) in kept {
        cum += q;
        if cum > u {
            return id;
        }
    }
    kept.last().unwrap().0
}

/// The job's draws, recomputed from an independent generator with the seed.
fn reference_draws(seed: u64, n: usize) -> Vec<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f64>()).collect()
}

fn by_id(mut v: Vec<(u32, f64)>) -> Vec<(u32, f64)> {
    v.sort_by_key(|&(id, _)| id);
    v
}

/// Pseudo-random test logits, spread like an LLM's (a few high, a long tail).
fn test_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x5eed);
    (0..n)
        .map(|_| {
            let x: f32 = rng.random();
            let y: f32 = rng.random();
            if y < 0.01 {
                8.0 + 6.0 * x
            } else {
                10.0 * x - 5.0
            }
        })
        .collect()
}

#[test]
fn default_params() {
    let d = SamplingParams::default();
    assert_eq!(
        (
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repetition_penalty,
            d.seed
        ),
        (1.0, 0, 1.0, 0.0, 1.0, 0)
    );
    let s = Sampler::new(params(0.7));
    assert_eq!(s.params(), &params(0.7));
}

#[test]
fn temperature_zero_is_argmax_without_draw() {
    let p = SamplingParams {
        top_k: 2,
        top_p: 0.3,
        min_p: 0.5,
        ..params(0.0)
    };
    let mut s = Sampler::new(p);
    let logits = [0.5, 2.0, -1.0, 2.0, f32::NAN];
    for _ in 0..5 {
        assert_eq!(s.sample(&logits, &[]), 1);
    }
    assert_eq!(
        s.sample(&[f32::NAN, f32::NEG_INFINITY], &[]),
        1,
        "NaN never wins"
    );
    assert_eq!(s.rng.get_word_pos(), 0, "greedy must not touch the PRNG");
}

#[test]
fn temperature_zero_applies_penalty_first() {
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..params(0.0)
    });
    // 3.0 / 2 = 1.5 < 2.0
    assert_eq!(s.sample(&[3.0, 2.0, 1.0], &[0]), 1);
    // -1.0 * 2 = -2.0 < -1.5
    assert_eq!(s.sample(&[-1.0, -1.5, -3.0], &[0, 0]), 1);
    assert_eq!(s.rng.get_word_pos(), 0);
}

#[test]
fn temperature_one_changes_nothing() {
    let logits = [1.0, 2.0, 0.5, -1.0];
    let mut s = Sampler::new(params(1.0));
    let got = kept(&mut s, &logits, &[]);
    assert_eq!(s.selector.logits, logits);
    let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
    let expected: Vec<(u32, f64)> = (0..4)
        .map(|i| (i as u32, f64::from(logits[i]).exp() / z))
        .collect();
    assert_probs(&got, &expected, 1e-12);
}

#[test]
fn temperature_reshapes_softmax() {
    let logits = [1.0, 0.0];
    // T = 0.5: logits [2, 0]: e^2 / (e^2 + 1)
    let got = kept(&mut Sampler::new(params(0.5)), &logits, &[]);
    assert_probs(
        &got,
        &[(0, 0.880_797_077_977_882_4), (1, 0.119_202_922_022_117_6)],
        1e-9,
    );
    // T = 2: logits [0.5, 0]: 1 / (1 + e^-0.5)
    let got = kept(&mut Sampler::new(params(2.0)), &logits, &[]);
    assert_probs(
        &got,
        &[(0, 0.622_459_331_201_854_6), (1, 0.377_540_668_798_145_4)],
        1e-9,
    );
    // Three tokens at T = 0.5, by the formula softmax(x / T).
    let logits = [0.3, -0.2, 1.1];
    let e: Vec<f64> = logits.iter().map(|&x| (f64::from(x) / 0.5).exp()).collect();
    let z: f64 = e.iter().sum();
    let got = kept(&mut Sampler::new(params(0.5)), &logits, &[]);
    assert_probs(&got, &[(0, e[0] / z), (1, e[1] / z), (2, e[2] / z)], 1e-6);
}

#[test]
fn repetition_penalty_divides_positive_multiplies_negative() {
    let logits = [2.0, -1.0, 0.5, 1.0, 0.0];
    // Repeats count once; ids outside the vocabulary are ignored.
    let generated = [0, 1, 0, 1, 4, 99];
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..params(1.0)
    });
    kept(&mut s, &logits, &generated);
    assert_eq!(s.selector.logits, [1.0, -2.0, 0.5, 1.0, 0.0]);
    assert!(
        s.selector.seen.iter().all(|&b| !b),
        "scratch must be cleared"
    );

    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 0.5,
        ..params(1.0)
    });
    kept(&mut s, &logits, &generated);
    assert_eq!(s.selector.logits, [4.0, -0.5, 0.5, 1.0, 0.0]);

    // With temperature 2: (2 / 2) / 2 and (-1 / 2) * 2.
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..params(2.0)
    });
    let got = kept(&mut s, &logits, &generated);
    assert_eq!(s.selector.logits, [0.5, -1.0, 0.25, 0.5, 0.0]);
    let e = [
        0.5f64.exp(),
        (-1.0f64).exp(),
        0.25f64.exp(),
        0.5f64.exp(),
        1.0,
    ];
    let z: f64 = e.iter().sum();
    let expected: Vec<(u32, f64)> = (0..5).map(|i| (i as u32, e[i] / z)).collect();
    assert_probs(&got, &expected, 1e-9);

    // Off at 1.0.
    let mut s = Sampler::new(params(1.0));
    kept(&mut s, &logits, &generated);
    assert_eq!(s.selector.logits, logits);
}

#[test]
fn top_k_keeps_the_k_largest() {
    let logits = [1.0, 5.0, 3.0, 4.0, 2.0];
    let mut s = Sampler::new(SamplingParams {
        top_k: 2,
        ..params(1.0)
    });
    let got = kept(&mut s, &logits, &[]);
    // softmax([5, 4]) = [1 / (1 + e^-1), e^-1 / (1 + e^-1)]
    assert_probs(
        &got,
        &[(1, 0.731_058_578_630_004_9), (3, 0.268_941_421_369_995_1)],
        1e-9,
    );
    // Ties at the cut go to the lower id.
    let mut s = Sampler::new(SamplingParams {
        top_k: 3,
        ..params(1.0)
    });
    assert_eq!(kept_ids(&mut s, &[1.0, 2.0, 1.0, 1.0, 0.0], &[]), [0, 1, 2]);
    // k = vocab keeps everything; k = 1 is greedy but still draws.
    let mut s = Sampler::new(SamplingParams {
        top_k: 5,
        ..params(1.0)
    });
    assert_eq!(kept_ids(&mut s, &logits, &[]), [0, 1, 2, 3, 4]);
    let mut s = Sampler::new(SamplingParams {
        top_k: 1,
        ..params(1.0)
    });
    assert_eq!(s.sample(&logits, &[]), 1);
    assert_eq!(s.rng.get_word_pos(), 2, "one u64 (two words) per token");
}

#[test]
fn top_p_boundary_reaching_vs_exceeding() {
    // Four equal logits: each 0.25, sums exact in binary.
    let uniform = [0.0f32; 4];
    let top_p = |p: f32| {
        let mut s = Sampler::new(SamplingParams {
            top_p: p,
            ..params(1.0)
        });
        kept_ids(&mut s, &uniform, &[])
    };
    assert_eq!(top_p(0.5), [0, 1], "0.25 + 0.25 reaches 0.5 exactly");
    assert_eq!(top_p(0.500_001), [0, 1, 2], "exceeding 0.5 needs a third");
    assert_eq!(top_p(0.75), [0, 1, 2]);
    assert_eq!(top_p(0.25), [0]);
    assert_eq!(top_p(0.0), [0], "always at least one");
    assert_eq!(top_p(1.0), [0, 1, 2, 3]);

    // Probabilities 0.5, 0.3, 0.2 (as logits ln p), ids scrambled.
    let logits = [0.3f32.ln(), 0.2f32.ln(), 0.5f32.ln()];
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.79,
        ..params(1.0)
    });
    assert_probs(&kept(&mut s, &logits, &[]), &[(0, 0.375), (2, 0.625)], 1e-6);
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.81,
        ..params(1.0)
    });
    assert_eq!(kept_ids(&mut s, &logits, &[]), [0, 1, 2]);
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.49,
        ..params(1.0)
    });
    assert_eq!(kept_ids(&mut s, &logits, &[]), [2]);
}

#[test]
fn min_p_drops_below_fraction_of_top() {
    // Ratios to the top: 1, 0.5, 0.25, 0.05.
    let logits = [1.0f32.ln(), 0.5f32.ln(), 0.25f32.ln(), 0.05f32.ln()];
    let min_p = |p: f32| {
        let mut s = Sampler::new(SamplingParams {
            min_p: p,
            ..params(1.0)
        });
        kept(&mut s, &logits, &[])
    };
    let expected = [(0, 1.0 / 1.75), (1, 0.5 / 1.75), (2, 0.25 / 1.75)];
    assert_probs(&min_p(0.2), &expected, 1e-6);
    assert_eq!(min_p(0.3).len(), 2);
    assert_eq!(min_p(1.0).len(), 1);
    assert_eq!(min_p(0.0).len(), 4);
    // Equal top logits both survive min_p = 1.
    let mut s = Sampler::new(SamplingParams {
        min_p: 1.0,
        ..params(1.0)
    });
    assert_eq!(kept_ids(&mut s, &[2.0, 1.0, 2.0], &[]), [0, 2]);
}

/// Hand-made case through every stage:
/// logits [2, 1, 0.5, 3, -1, 1.5, 0, 2.5], T = 0.5 → [4, 2, 1, 6, -2, 3, 0, 5];
/// penalty 1.5 on {3, 4} → [4, 2, 1, 4, -3, 3, 0, 5];
/// top-k 5 → ids 7, 0, 3, 5, 1 with weights 1, e^-1, e^-1, e^-2, e^-3,
/// probabilities .5206 .1915 .1915 .0705 .0259, cumulative .5206 .7121 .9036 .9741;
/// top-p 0.95 → 7, 0, 3, 5; min-p 0.2 drops 5 (e^-2 = .135 < .2) →
/// 7, 0, 3 with 1 / (1 + 2e^-1) = .576117 and e^-1 / (1 + 2e^-1) = .211942.
fn combined_case() -> ([f32; 8], [u32; 3], SamplingParams) {
    let p = SamplingParams {
        temperature: 0.5,
        top_k: 5,
        top_p: 0.95,
        min_p: 0.2,
        repetition_penalty: 1.5,
        seed: 99,
    };
    ([2.0, 1.0, 0.5, 3.0, -1.0, 1.5, 0.0, 2.5], [3, 3, 4], p)
}

#[test]
fn combined_pipeline_by_hand() {
    let (logits, generated, p) = combined_case();
    let mut s = Sampler::new(p.clone());
    let got = kept(&mut s, &logits, &generated);
    let expected = [
        (0, 0.211_941_557_617_085_4),
        (3, 0.211_941_557_617_085_4),
        (7, 0.576_116_884_765_829_1),
    ];
    assert_probs(&got, &expected, 1e-9);
    assert_probs(&got, &by_id(reference(&logits, &generated, &p)), 1e-12);
}

#[test]
fn combined_pipeline_draws_follow_the_seeded_stream() {
    let (logits, generated, p) = combined_case();
    let reference_kept = reference(&logits, &generated, &p);
    let mut s = Sampler::new(p.clone());
    let got: Vec<u32> = (0..300).map(|_| s.sample(&logits, &generated)).collect();
    let expected: Vec<u32> = reference_draws(p.seed, 300)
        .into_iter()
        .map(|u| walk(&reference_kept, u))
        .collect();
    assert_eq!(got, expected);
    assert!(got.contains(&7) && got.contains(&0) && got.contains(&3));
}

#[test]
fn matches_reference_over_parameter_grid() {
    let logits = test_logits(1000, 1);
    let generated: Vec<u32> = (0..1000).step_by(37).chain([5, 5, 999]).collect();
    let mut cases = 0;
    for &temperature in &[0.3f32, 1.0, 1.7] {
        for &top_k in &[0usize, 1, 40, 1000] {
            for &top_p in &[1.0f32, 0.9, 0.5] {
                for &min_p in &[0.0f32, 0.05] {
                    for &repetition_penalty in &[1.0f32, 1.3, 0.7] {
                        let p = SamplingParams {
                            temperature,
                            top_k,
                            top_p,
                            min_p,
                            repetition_penalty,
                            seed: cases,
                        };
                        check_against_reference(&logits, &generated, &p, 20);
                        cases += 1;
                    }
                }
            }
        }
    }
}

fn check_against_reference(logits: &[f32], generated: &[u32], p: &SamplingParams, n: usize) {
    let reference_kept = reference(logits, generated, p);
    let mut s = Sampler::new(p.clone());
    assert_probs(
        &kept(&mut s, logits, generated),
        &by_id(reference_kept.clone()),
        1e-9,
    );
    let mut s = Sampler::new(p.clone());
    let got: Vec<u32> = (0..n).map(|_| s.sample(logits, generated)).collect();
    let expected: Vec<u32> = reference_draws(p.seed, n)
        .into_iter()
        .map(|u| walk(&reference_kept, u))
        .collect();
    assert_eq!(got, expected, "{p:?}");
}

#[test]
fn large_vocabulary_matches_reference() {
    let logits = test_logits(151_936, 2);
    let generated = [17, 4242, 151_935];
    for p in [
        params(1.0),
        SamplingParams {
            top_p: 0.95,
            min_p: 0.01,
            ..params(0.8)
        },
        SamplingParams {
            top_k: 50,
            top_p: 0.9,
            repetition_penalty: 1.1,
            ..params(1.2)
        },
    ] {
        check_against_reference(&logits, &generated, &p, 10);
    }
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let logits = [0.0, 0.1, -0.1, 0.2, 0.05, -0.3, 0.0, 0.15];
    let run = |seed: u64| -> Vec<u32> {
        let mut s = Sampler::new(SamplingParams {
            seed,
            ..params(1.0)
        });
        (0..64).map(|_| s.sample(&logits, &[])).collect()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // Stream position is the token index: one u64 per sampled token.
    let mut s = Sampler::new(params(1.0));
    for i in 1..=10u128 {
        s.sample(&logits, &[]);
        assert_eq!(s.rng.get_word_pos(), 2 * i);
    }
}

#[test]
fn frequencies_pass_chi_square() {
    let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5];
    let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
    let n = 10_000;
    let mut counts = [0u32; 6];
    let mut s = Sampler::new(SamplingParams {
        seed: 2024,
        ..params(1.0)
    });
    for _ in 0..n {
        counts[s.sample(&logits, &[]) as usize] += 1;
    }
    let chi2: f64 = logits
        .iter()
        .zip(counts)
        .map(|(&x, observed)| {
            let expected = f64::from(n) * f64::from(x).exp() / z;
            (f64::from(observed) - expected).powi(2) / expected
        })
        .sum();
    // Critical value of chi-square with 5 degrees of freedom at 0.001.
    assert!(chi2 < 20.52, "chi2 = {chi2}, counts {counts:?}");
}

#[test]
fn degenerate_logits() {
    let mut s = Sampler::new(params(1.0));
    // No finite logit: falls back to argmax of the input, still one draw.
    assert_eq!(s.sample(&[f32::NAN, f32::NEG_INFINITY, f32::NAN], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, f32::NAN], &[]), 0);
    assert_eq!(s.rng.get_word_pos(), 4);
    // NaN and -inf are never drawn.
    for _ in 0..50 {
        let t = s.sample(&[f32::NAN, 0.0, f32::NEG_INFINITY, 0.0], &[]);
        assert!(t == 1 || t == 3);
    }
    // Penalty 0 sends positive seen logits to +inf: they share the mass.
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 0.0,
        ..params(1.0)
    });
    let got = kept(&mut s, &[1.0, 5.0, 2.0, -1.0], &[0, 2, 3]);
    assert_probs(&got, &[(0, 0.5), (2, 0.5)], 1e-12);
    // A vanishing temperature behaves like greedy.
    let mut s = Sampler::new(params(1e-30));
    assert_eq!(s.sample(&[1.0, 3.0, 2.0], &[]), 1);
    // Vocabulary size may change between calls without stale state.
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..params(1.0)
    });
    kept(&mut s, &[1.0; 10], &[9]);
    assert_eq!(kept_ids(&mut s, &[1.0, 1.0], &[9, 1]).len(), 2);
}

#[test]
fn draw_is_none_at_temperature_zero_and_one_uniform_per_token_otherwise() {
    let mut s = Sampler::new(params(0.0));
    assert_eq!(s.draw(), None);
    assert_eq!(s.rng.get_word_pos(), 0, "greedy must not touch the PRNG");
    let mut s = Sampler::new(params(0.7));
    let draws: Vec<f64> = (0..5).map(|_| s.draw().unwrap()).collect();
    assert_eq!(draws, reference_draws(1234, 5));
    assert_eq!(s.rng.get_word_pos(), 10);
}

/// `Sampler::sample` is `draw` then `select`: the split gives the same ids,
/// whoever does the selection with the job's draws.
#[test]
fn select_with_the_jobs_draws_equals_sample() {
    let logits = test_logits(1000, 3);
    let generated: Vec<u32> = (0..1000).step_by(41).collect();
    for p in [
        params(0.0),
        SamplingParams {
            repetition_penalty: 1.3,
            ..params(0.0)
        },
        params(1.0),
        SamplingParams {
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.2,
            ..params(0.8)
        },
    ] {
        let mut whole = Sampler::new(p.clone());
        let mut split = Sampler::new(p.clone());
        let mut selector = Selector::default();
        for _ in 0..30 {
            let u = split.draw();
            assert_eq!(u.is_some(), p.temperature > 0.0);
            let id = selector.select(&logits, &generated, &p, u);
            assert_eq!(whole.sample(&logits, &generated), id, "{p:?}");
            assert_eq!(
                select(&logits, &generated, &p, u),
                id,
                "a fresh selector agrees"
            );
        }
    }
    // Without a draw, selection is greedy whatever the temperature.
    assert_eq!(select(&[1.0, 3.0, 2.0], &[], &params(1.0), None), 1);
}

#[test]
fn kept_in_rank_order_lists_the_candidates_by_rank_with_weights() {
    let (logits, generated, p) = combined_case();
    let kept = Selector::default().kept_in_rank_order(&logits, &generated, &p);
    let ids: Vec<u32> = kept.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [7, 0, 3]);
    let e1 = (-1.0f64).exp();
    assert_probs(&kept, &[(7, 1.0), (0, e1), (3, e1)], 1e-12);
}

//! Greedy choice and log-probabilities over the raw logits.
//!
//! Both work on the whole vocabulary exactly as the backend produced it,
//! before any sampling filter (the OpenAI-style `logprobs` report the model's
//! distribution, not the truncated one the token was drawn from).

use super::select::{by_rank, cut_at_crossing, max_logit, Reach, Scratch, Target};

/// One entry of a top-logprobs list.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// Index of the largest logit; ties go to the lowest id; NaN never wins.
/// Returns 0 when no logit qualifies (empty slice or all NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (id, &x) in logits.iter().enumerate() {
        let better = match best {
            None => !x.is_nan(),
            Some((_, b)) => x > b,
        };
        if better {
            best = Some((id, x));
        }
    }
    best.map_or(0, |(id, _)| id as u32)
}

/// The k most likely tokens with natural-log softmax probabilities over the
/// whole vocabulary (before any sampling filter), sorted by logprob
/// descending, ties by lower id. Numerically stable (max-subtracted, f64
/// accumulation of the sum).
///
/// Tokens of probability zero (logit −∞ or NaN) are never listed, so the list
/// has `min(k, number of such finite-probability tokens)` entries. A `+∞`
/// logit is treated as `f32::MAX`.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<TokenLogprob> {
    let clean: Vec<f32> = logits.iter().map(|&x| clamp_logit(x)).collect();
    let max = max_logit(&clean);
    if k == 0 || max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let log_sum = log_sum_exp_shifted(&clean, max);
    let mut ids: Vec<u32> = (0..clean.len() as u32)
        .filter(|&id| clean[id as usize] > f32::NEG_INFINITY)
        .collect();
    if k < ids.len() {
        let (unit, target) = (|_| 1.0, Target::Weight(k as f64));
        let scratch = &mut Scratch::default();
        cut_at_crossing(&mut ids, &clean, max, unit, target, Reach::AtLeast, scratch);
    }
    ids.sort_unstable_by(|&a, &b| by_rank(&clean, a, b));
    ids.into_iter()
        .map(|id| TokenLogprob {
            id,
            logprob: (f64::from(clean[id as usize]) - f64::from(max) - log_sum) as f32,
        })
        .collect()
}

/// `ln Σ exp(x − max)`, summed in f64; at least 0 since the max term is 1.
fn log_sum_exp_shifted(logits: &[f32], max: f32) -> f64 {
    let max = f64::from(max);
    logits
        .iter()
        .map(|&x| (f64::from(x) - max).exp())
        .sum::<f64>()
        .ln()
}

fn clamp_logit(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent log-softmax in f64: ln(e^x_i / Σ e^x_j), shifted by the max.
    fn log_softmax(logits: &[f32]) -> Vec<f64> {
        let xs: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = xs.iter().map(|x| (x - m).exp()).sum();
        xs.iter().map(|x| (x - m) - z.ln()).collect()
    }

    #[test]
    fn argmax_picks_largest() {
        assert_eq!(argmax(&[0.1, 2.5, -3.0, 2.4]), 1);
        assert_eq!(argmax(&[-5.0]), 0);
        assert_eq!(argmax(&[-1.0, f32::INFINITY, 3.0]), 1);
    }

    #[test]
    fn argmax_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[0.0, 0.0]), 0);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    }

    #[test]
    fn argmax_nan_never_wins() {
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
        assert_eq!(argmax(&[1.0, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax(&[f32::NAN, -7.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn top_logprobs_match_log_softmax() {
        let logits = [1.0, 3.0, 2.0, 3.0, -1.0, 0.5];
        let expected = log_softmax(&logits);
        let top = top_logprobs(&logits, 3);
        let ids: Vec<u32> = top.iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 3, 2]); // 1 and 3 tie: lower id first
        for t in &top {
            assert!((f64::from(t.logprob) - expected[t.id as usize]).abs() < 1e-6);
            assert!(t.logprob <= 0.0);
        }
        assert!(top.iter().map(|t| t.logprob).sum::<f32>() <= 0.0);
    }

    #[test]
    fn top_logprobs_whole_vocab_is_a_distribution() {
        let logits = [0.3, -2.0, 4.0, 1.5, 1.5];
        let all = top_logprobs(&logits, 10); // k > vocab: everything
        assert_eq!(all.len(), 5);
        let ids: Vec<u32> = all.iter().map(|t| t.id).collect();
        assert_eq!(ids, [2, 3, 4, 0, 1]);
        let mass: f64 = all.iter().map(|t| f64::from(t.logprob).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-6);
        assert!(all.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }

    #[test]
    fn top_logprobs_on_a_large_vocabulary_match_a_full_sort() {
        // Many ties (only 97 distinct values), so the id tie-break matters.
        let logits: Vec<f32> = (0..20_000u32)
            .map(|i| ((i * 7919) % 97) as f32 / 9.0)
            .collect();
        let expected = log_softmax(&logits);
        let mut order: Vec<u32> = (0..20_000).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        for k in [1, 20, 1000] {
            let top = top_logprobs(&logits, k);
            let ids: Vec<u32> = top.iter().map(|t| t.id).collect();
            assert_eq!(ids, order[..k]);
            for t in &top {
                assert!((f64::from(t.logprob) - expected[t.id as usize]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn top_logprobs_is_stable_for_large_logits() {
        let logits = [1000.0, 999.0, 998.0, -1000.0];
        let expected = log_softmax(&logits);
        let top = top_logprobs(&logits, 4);
        for t in &top {
            assert!(t.logprob.is_finite());
            let e = expected[t.id as usize];
            assert!((f64::from(t.logprob) - e).abs() <= 1e-6 * e.abs().max(1.0));
        }
        // Hand value: -ln(1 + e^-1 + e^-2) = -0.40760596...
        assert!((f64::from(top[0].logprob) + 0.407_605_964).abs() < 1e-6);
    }

    #[test]
    fn top_logprobs_skips_zero_probability_and_handles_k_zero() {
        let logits = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0];
        let top = top_logprobs(&logits, 4);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].id, top[1].id), (1, 3));
        assert!((f64::from(top[0].logprob) - 0.5f64.ln()).abs() < 1e-7);
        assert!(top_logprobs(&logits, 0).is_empty());
        assert!(top_logprobs(&[], 3).is_empty());
    }
}

//! Token sampling: turns one step's logits into the next token id.
//!
//! The pipeline follows M0-W-1421 and runs, on a private copy of the logits,
//! in this order:
//!
//! 1. **temperature** — at `0` the job is greedy: only the repetition penalty
//!    is applied, then [`argmax`], and no random number is drawn. Otherwise
//!    every logit is divided by `T`.
//! 2. **repetition penalty** — llama.cpp's sampler chain (`penalties`
//!    sampler): for each *distinct* token generated so far in the job, a
//!    positive logit is divided by the penalty and a non-positive one is
//!    multiplied by it. Being a pure rescaling of the logit's magnitude it
//!    commutes with the temperature division, so applying it after step 1 (as
//!    M0-W-1421 orders it) gives the same numbers as llama.cpp's
//!    penalty-then-temperature.
//! 3. **top-k** — keep the `k` largest (0 = off).
//! 4. **top-p** — in descending probability order, keep the smallest prefix
//!    whose cumulative softmax probability over the tokens still kept reaches
//!    `top_p` (at least one token; 1.0 = off).
//! 5. **min-p** — drop tokens whose probability is below
//!    `min_p × the top probability` (0 = off).
//! 6. draw from the softmax of what is left.
//!
//! Removed tokens behave as if their logit were −∞: they are simply left out
//! of the candidate list, and a logit that is NaN (or −∞) is never a candidate.
//!
//! **Randomness.** Each job's [`Sampler`] owns a
//! `rand_chacha::ChaCha20Rng::seed_from_u64(seed)`. This is the single
//! host-side PRNG of the worker, used the same way whichever backend (CPU or
//! CUDA) produced the logits, and its stream depends only on the seed. Every
//! sampled token (temperature > 0) consumes exactly one `f64` uniform draw in
//! `[0, 1)` (`Rng::random::<f64>()`), taken before anything else, so the
//! position in the stream is the token's index in the job. The draw `u` picks
//! a token by inverse CDF over the kept tokens in rank order — logit
//! descending, ties by lower id — so the result never depends on hash or
//! iteration order: the chosen token is the first in that order whose
//! cumulative weight exceeds `u × total`.
//!
//! **Where the choice is made.** [`Sampler`] holds only the job's PRNG and
//! parameters: [`Sampler::draw`] gives each token's `u` (or `None` at
//! temperature 0). The choice itself, [`select`], is a pure function of the
//! logits, the tokens generated so far, the parameters and `u`, so a backend
//! can run it where its logits are (`Backend::sample`): the CPU backend calls
//! [`select`]; the CUDA backend runs the same pipeline in kernels and copies
//! back only the id. The random stream is the same whichever does it.
//!
//! **Cost.** Nothing here sorts the vocabulary. Top-k, top-p and the draw
//! are all one operation (`select::cut_at_crossing`): in rank order, find the
//! first token whose cumulative weight (1 per token for top-k,
//! `exp(logit − top)` otherwise) crosses a target, and keep it and the tokens
//! ranked above it, unordered. A histogram over logit buckets finds the
//! bucket holding the crossing, one branch-free pass isolates it, and a
//! weighted quickselect (`select_nth_unstable_by` by halves) finishes inside
//! it: linear in the number of candidates, a few cheap passes over a 150k
//! vocabulary, whether or not a filter is active. All buffers live in the
//! [`Sampler`] and are reused, so nothing is allocated per token after the
//! first one. (The cumulative sums are accumulated in f64 per bucket and per
//! half rather than one token at a time; the choice can differ from a
//! sequential walk only when `u × total` lies within f64 rounding of a
//! boundary.)

mod bias;
mod logprobs;
mod select;
#[cfg(test)]
mod tests;

pub use bias::{BiasState, LogitBias};
pub use logprobs::{argmax, top_logprobs, TokenLogprob};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use select::{cut_at_crossing, keep_top_k, max_logit, Reach, Scratch, Target};

/// Parameters of one job, already validated by the HTTP layer (ranges:
/// temperature 0..=2, top_p 0..=1, top_k 0..=vocab (0 = off), min_p 0..=1
/// (0 = off), repetition_penalty 0..=2 (1 = off)).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// Most log-probabilities a job may ask for per token (the HTTP layer's
/// limit, and the size of the CUDA backend's result buffer).
pub const MAX_LOGPROBS: usize = 20;

/// The random side of one job: its parameters and its PRNG. It draws the
/// uniform `u` of each token ([`Sampler::draw`]); the choice itself is made
/// by [`select`] (or a backend's equivalent) wherever the logits are.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Scratch of [`Sampler::sample`].
    selector: Selector,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha20Rng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            selector: Selector::default(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The draw for the next token: one `f64` uniform in `[0, 1)` at
    /// temperature > 0; `None` (and the PRNG untouched) at temperature 0.
    pub fn draw(&mut self) -> Option<f64> {
        (self.params.temperature > 0.0).then(|| self.rng.random())
    }

    /// Draws and picks the next token from host `logits` (whole vocabulary,
    /// untouched) given the tokens generated so far in this job: [`draw`]
    /// then [`select`].
    ///
    /// Panics if `logits` is empty.
    ///
    /// [`draw`]: Sampler::draw
    pub fn sample(&mut self, logits: &[f32], generated: &[u32]) -> u32 {
        let u = self.draw();
        self.selector.select(logits, generated, &self.params, u)
    }
}

/// Picks a token from `logits` (whole vocabulary, untouched) by the pipeline
/// above, given the tokens generated so far and the token's draw `u` (`None`
/// at temperature 0: greedy). A pure function of its arguments; see
/// [`Selector`] to reuse the buffers.
///
/// Panics if `logits` is empty. Ids in `generated` outside the vocabulary
/// are ignored by the penalty.
pub fn select(logits: &[f32], generated: &[u32], params: &SamplingParams, u: Option<f64>) -> u32 {
    Selector::default().select(logits, generated, params, u)
}

/// Of `candidates`, the draws `u` whose `u × total` lies further than
/// `margin × total` from every cumulative boundary of the tokens [`select`]
/// would draw from: where two implementations that round differently must
/// agree (for tests comparing backends).
#[cfg(test)]
pub(crate) fn draws_away_from_boundaries(
    logits: &[f32],
    generated: &[u32],
    params: &SamplingParams,
    candidates: impl IntoIterator<Item = f64>,
    margin: f64,
) -> Vec<f64> {
    let kept = Selector::default().kept_in_rank_order(logits, generated, params);
    let total: f64 = kept.iter().map(|&(_, w)| w).sum();
    let mut bounds = vec![0.0];
    let mut cum = 0.0;
    for &(_, w) in &kept {
        cum += w;
        bounds.push(cum / total);
    }
    candidates
        .into_iter()
        .filter(|&u| bounds.iter().all(|&b| (u - b).abs() > margin))
        .collect()
}

/// The buffers of [`select`], kept between calls so that nothing is
/// allocated per token.
#[derive(Debug, Default)]
pub struct Selector {
    /// Working copy of the logits (after temperature and penalty).
    logits: Vec<f32>,
    /// `exp(logit − top)` by token id; meaningful only for current candidates.
    weights: Vec<f64>,
    /// Token ids still kept.
    cands: Vec<u32>,
    /// Penalty scratch: all `false` between calls.
    seen: Vec<bool>,
    /// Largest working logit of the current token (the top candidate's).
    top: f32,
    /// Buffers of `select::cut_at_crossing`.
    scratch: Scratch,
}

impl Selector {
    /// [`select`] with this selector's buffers.
    pub fn select(
        &mut self,
        logits: &[f32],
        generated: &[u32],
        params: &SamplingParams,
        u: Option<f64>,
    ) -> u32 {
        assert!(!logits.is_empty(), "select: empty logits");
        let u = match u {
            Some(u) if params.temperature > 0.0 => u,
            _ => return self.greedy(logits, generated, params),
        };
        self.prepare(logits, generated, params);
        self.filter(params);
        // No finite logit left at all: nothing to weigh, fall back to greedy.
        self.draw(u).unwrap_or_else(|| argmax(logits))
    }

    /// The tokens steps 1 to 5 keep, with their weights `exp(logit − top)`,
    /// in rank order (for tests that compare another implementation's draw).
    #[cfg(test)]
    pub(crate) fn kept_in_rank_order(
        &mut self,
        logits: &[f32],
        generated: &[u32],
        params: &SamplingParams,
    ) -> Vec<(u32, f64)> {
        self.prepare(logits, generated, params);
        self.filter(params);
        let mut kept: Vec<u32> = self.cands.clone();
        kept.sort_unstable_by(|&a, &b| select::by_rank(&self.logits, a, b));
        kept.into_iter()
            .map(|id| (id, self.weights[id as usize]))
            .collect()
    }

    /// Temperature 0: penalty, then argmax on the raw values (so NaN never
    /// wins, exactly as in [`argmax`]); no draw.
    fn greedy(&mut self, logits: &[f32], generated: &[u32], params: &SamplingParams) -> u32 {
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        self.penalize(generated, params.repetition_penalty, |x| x);
        argmax(&self.logits)
    }

    /// Steps 1 and 2 for temperature > 0: copy divided by the temperature,
    /// then the repetition penalty, every value made safe for the softmax.
    fn prepare(&mut self, logits: &[f32], generated: &[u32], params: &SamplingParams) {
        let t = params.temperature;
        self.logits.clear();
        self.logits.extend(logits.iter().map(|&x| sanitize(x / t)));
        self.penalize(generated, params.repetition_penalty, sanitize);
    }

    /// Penalizes each distinct in-vocabulary id of `generated` once, passing
    /// the result through `fix`.
    fn penalize(&mut self, generated: &[u32], penalty: f32, fix: fn(f32) -> f32) {
        if penalty == 1.0 {
            return;
        }
        let n = self.logits.len();
        self.seen.resize(n, false);
        for id in in_vocab(generated, n) {
            if !self.seen[id] {
                self.seen[id] = true;
                self.logits[id] = fix(penalized(self.logits[id], penalty));
            }
        }
        for id in in_vocab(generated, n) {
            self.seen[id] = false;
        }
    }

    /// Steps 3 to 5: leaves the kept token ids in `cands`, their weights set.
    fn filter(&mut self, params: &SamplingParams) {
        let n = self.logits.len();
        self.top = max_logit(&self.logits);
        self.cands.clear();
        if self.top == f32::NEG_INFINITY {
            return; // no finite logit: nothing can be weighed
        }
        self.cands.extend(0..n as u32);
        keep_top_k(
            &mut self.cands,
            &self.logits,
            self.top,
            params.top_k,
            &mut self.scratch,
        );
        self.set_weights();
        self.keep_top_p(params.top_p);
        self.keep_min_p(params.min_p);
    }

    /// Sets `weights` to `exp(logit − top)` over the candidates (so the top
    /// one weighs exactly 1) and drops candidates of weight 0 (−∞ or
    /// underflow), which could never be drawn.
    fn set_weights(&mut self) {
        self.weights.resize(self.logits.len(), 0.0);
        let (logits, weights, top) = (&self.logits, &mut self.weights, f64::from(self.top));
        self.cands.retain(|&id| {
            let w = (f64::from(logits[id as usize]) - top).exp();
            weights[id as usize] = w;
            w > 0.0
        });
    }

    fn keep_top_p(&mut self, top_p: f32) {
        let top_p = f64::from(top_p);
        if top_p < 1.0 {
            self.cut(Target::Share(top_p), Reach::AtLeast);
        }
    }

    /// Weights are relative to the top candidate (weight 1), so the min-p
    /// test `p < min_p × p_top` is `weight < min_p`.
    fn keep_min_p(&mut self, min_p: f32) {
        let min_p = f64::from(min_p);
        if min_p <= 0.0 {
            return;
        }
        let weights = &self.weights;
        self.cands.retain(|&id| weights[id as usize] >= min_p);
    }

    /// Step 6: inverse CDF of the kept tokens' softmax at `u`; `None` when
    /// no candidate is left (no finite logit).
    fn draw(&mut self, u: f64) -> Option<u32> {
        self.cut(Target::Share(u), Reach::Beyond);
        self.cands.last().copied()
    }

    /// [`cut_at_crossing`] over the candidates with their softmax weights.
    fn cut(&mut self, target: Target, reach: Reach) {
        if self.cands.is_empty() {
            return;
        }
        let weights = &self.weights;
        let weight = |id: u32| weights[id as usize];
        let (cands, logits, top) = (&mut self.cands, &self.logits, self.top);
        cut_at_crossing(cands, logits, top, weight, target, reach, &mut self.scratch);
    }
}

/// llama.cpp's repetition penalty on one logit.
fn penalized(logit: f32, penalty: f32) -> f32 {
    if logit > 0.0 {
        logit / penalty
    } else {
        logit * penalty
    }
}

/// For the softmax path: NaN becomes −∞ (never kept); +∞ becomes `f32::MAX`
/// so that tokens that overflowed (tiny temperature, penalty 0) share the
/// mass equally instead of turning the softmax into NaN.
fn sanitize(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

fn in_vocab(ids: &[u32], n: usize) -> impl Iterator<Item = usize> + '_ {
    ids.iter().map(|&id| id as usize).filter(move |&id| id < n)
}

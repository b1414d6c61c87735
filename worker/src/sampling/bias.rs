//! OpenAI's additive adjustments of the logits (issue #43): `logit_bias`, a
//! fixed amount per token id, and the presence and frequency penalties, which
//! lower a token by `presence` once it has been generated and by `frequency`
//! for each time it was (OpenAI's formula: `logit[j] − c[j] × frequency −
//! (c[j] > 0) × presence` over the tokens generated so far, the prompt not
//! counted).
//!
//! [`BiasState`] turns them into one `(id, delta)` list per token, ids
//! ascending and distinct, which the backend adds to the logits before the
//! rest of the pipeline (`SampleRequest::bias`). The deltas are summed here
//! in f32, once, so that every backend adds the same number to the same
//! logit: the CPU's and the GPU's adjusted logits are bit-identical.

use std::collections::BTreeMap;

/// What a job asked for (validated: ids in the vocabulary and distinct,
/// values finite).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LogitBias {
    /// `logit_bias`: `(id, delta)`, ids ascending and distinct.
    pub fixed: Vec<(u32, f32)>,
    pub presence: f32,
    pub frequency: f32,
}

impl LogitBias {
    /// Whether the logits are left as they are.
    pub fn is_neutral(&self) -> bool {
        self.fixed.is_empty() && self.presence == 0.0 && self.frequency == 0.0
    }

    fn penalizes(&self) -> bool {
        self.presence != 0.0 || self.frequency != 0.0
    }
}

/// One job's running adjustments: the counts of the tokens it generated and
/// the list the next token's logits get.
#[derive(Clone, Debug, Default)]
pub struct BiasState {
    asked: LogitBias,
    counts: BTreeMap<u32, u32>,
    deltas: Vec<(u32, f32)>,
}

impl BiasState {
    pub fn new(asked: LogitBias) -> Self {
        let mut state = BiasState {
            asked,
            counts: BTreeMap::new(),
            deltas: Vec::new(),
        };
        state.rebuild();
        state
    }

    /// Counts a generated token (end-of-generation tokens that end the job
    /// never reach here).
    pub fn push(&mut self, id: u32) {
        if self.asked.penalizes() {
            *self.counts.entry(id).or_insert(0) += 1;
            self.rebuild();
        }
    }

    /// What the next token's logits get added: `(id, delta)`, ids ascending
    /// and distinct, no zero delta.
    pub fn deltas(&self) -> &[(u32, f32)] {
        &self.deltas
    }

    /// Merges the fixed biases with the penalties of the counted tokens, in
    /// id order.
    fn rebuild(&mut self) {
        let (presence, frequency) = (self.asked.presence, self.asked.frequency);
        let penalty = |count: u32| -(count as f32 * frequency + presence);
        let mut fixed = self.asked.fixed.iter().copied().peekable();
        let mut counts = self.counts.iter().map(|(&id, &c)| (id, c)).peekable();
        self.deltas.clear();
        loop {
            let next = match (fixed.peek().copied(), counts.peek().copied()) {
                (None, None) => break,
                (Some((a, bias)), Some((b, count))) if a == b => {
                    fixed.next();
                    counts.next();
                    (a, bias + penalty(count))
                }
                (Some((a, bias)), Some((b, _))) if a < b => {
                    fixed.next();
                    (a, bias)
                }
                (Some(f), None) => {
                    fixed.next();
                    f
                }
                (_, Some((b, count))) => {
                    counts.next();
                    (b, penalty(count))
                }
            };
            if next.1 != 0.0 {
                self.deltas.push(next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(fixed: &[(u32, f32)], presence: f32, frequency: f32) -> BiasState {
        BiasState::new(LogitBias {
            fixed: fixed.to_vec(),
            presence,
            frequency,
        })
    }

    #[test]
    fn fixed_biases_alone_are_the_list() {
        let s = state(&[(3, 5.0), (9, -100.0)], 0.0, 0.0);
        assert_eq!(s.deltas(), &[(3, 5.0), (9, -100.0)]);
    }

    #[test]
    fn penalties_follow_openais_formula_over_the_generated_tokens() {
        let mut s = state(&[], 0.5, 0.25);
        assert!(
            s.deltas().is_empty(),
            "nothing generated, nothing penalized"
        );
        for id in [7, 2, 7, 7] {
            s.push(id);
        }
        // id 2 once: −(0.25 + 0.5); id 7 three times: −(0.75 + 0.5).
        assert_eq!(s.deltas(), &[(2, -0.75), (7, -1.25)]);
    }

    #[test]
    fn a_bias_and_a_penalty_on_one_id_are_one_delta_in_id_order() {
        let mut s = state(&[(1, 1.0), (5, 2.0), (8, 3.0)], 1.0, 0.0);
        for id in [5, 0, 9] {
            s.push(id);
        }
        assert_eq!(
            s.deltas(),
            &[(0, -1.0), (1, 1.0), (5, 1.0), (8, 3.0), (9, -1.0)]
        );
    }

    #[test]
    fn a_delta_that_cancels_out_is_left_out_and_no_penalty_counts_nothing() {
        let mut s = state(&[(4, 2.0)], 2.0, 0.0);
        s.push(4);
        assert!(s.deltas().is_empty());
        let mut plain = state(&[(4, 2.0)], 0.0, 0.0);
        plain.push(4);
        assert!(plain.counts.is_empty());
        assert_eq!(plain.deltas(), &[(4, 2.0)]);
    }

    #[test]
    fn negative_penalties_favour_repeats() {
        let mut s = state(&[], -1.0, -0.5);
        s.push(3);
        s.push(3);
        assert_eq!(s.deltas(), &[(3, 2.0)]);
    }
}

//! llama.cpp's log-probabilities on `harness synth-model`'s files
//! (testdata/golden-synth, written by its `make_goldens.py` from llama-server
//! 0c1e57098): its top 10 after every prefix of each prompt, and the rule by
//! which another program's logits agree with them (issue #13): llama.cpp's
//! top-1 is theirs, except where llama.cpp itself has a near tie (its log-
//! probability of their token within [`NEAR_TIE_NATS`] of its top), and the
//! mean |theirs − llama.cpp| over every listed token is at most
//! [`MEAN_LOGPROB_DIFF`] nats.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// llama.cpp's top two closer than this (nats) are a near tie.
pub const NEAR_TIE_NATS: f64 = 0.25;
/// The most the mean |log-probability difference| over a golden file may be.
pub const MEAN_LOGPROB_DIFF: f64 = 0.1;

/// One golden file.
#[derive(Debug, Deserialize)]
pub struct Golden {
    pub preset: String,
    pub format: String,
    pub seed: u64,
    /// The size of the file llama.cpp read.
    #[serde(default)]
    pub file_bytes: Option<u64>,
    pub cases: Vec<Case>,
}

/// One prompt: its ids and llama.cpp's top 10 after each prefix.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub prompt_ids: Vec<u32>,
    pub positions: Vec<Position>,
}

#[derive(Debug, Deserialize)]
pub struct Position {
    /// The prefix's length: the logits of its last position.
    pub n_tokens: usize,
    pub top10: Vec<Candidate>,
}

#[derive(Debug, Deserialize)]
pub struct Candidate {
    pub id: u32,
    pub logprob: f64,
}

impl Golden {
    pub fn read(path: &Path) -> Result<Golden> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}

/// The agreement of one file's logits with its golden, position by position.
#[derive(Debug, Default)]
pub struct Agreement {
    pub positions: usize,
    pub top1: usize,
    total: f64,
    count: usize,
    pub worst: f64,
    /// Positions whose top-1 differs from llama.cpp's without a near tie.
    pub failures: Vec<String>,
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

impl Agreement {
    /// Adds one case: `logits` holds every position of its prompt, `vocab`
    /// values each, position-major.
    pub fn add_case(&mut self, name: &str, case: &Case, logits: &[f32], vocab: usize) {
        for pos in &case.positions {
            let row = &logits[(pos.n_tokens - 1) * vocab..pos.n_tokens * vocab];
            let ours = log_softmax(row);
            let best = (0..vocab)
                .max_by(|&a, &b| ours[a].total_cmp(&ours[b]))
                .unwrap_or(0) as u32;
            let theirs = &pos.top10[0];
            self.positions += 1;
            if best == theirs.id {
                self.top1 += 1;
            } else {
                // A near tie in llama.cpp's own numbers: its log-probability of
                // our token (listed or below its tenth) within NEAR_TIE_NATS of its top.
                let of_ours = pos.top10.iter().find(|c| c.id == best).map(|c| c.logprob);
                let gap = of_ours.map_or(f64::INFINITY, |l| theirs.logprob - l);
                if gap > NEAR_TIE_NATS {
                    self.failures.push(format!(
                        "{name}: {} tokens: top-1 {best}, llama.cpp {} (gap {gap:.3})",
                        pos.n_tokens, theirs.id
                    ));
                }
            }
            for c in &pos.top10 {
                let d = (ours[c.id as usize] - c.logprob).abs();
                self.worst = self.worst.max(d);
                self.total += d;
                self.count += 1;
            }
        }
    }

    /// The mean |log-probability difference| over every listed token.
    pub fn mean(&self) -> f64 {
        self.total / self.count.max(1) as f64
    }

    /// One line for a log.
    pub fn summary(&self, name: &str) -> String {
        format!(
            "{name}: top-1 {}/{}; |log-prob difference| mean {:.4}, max {:.4} nats",
            self.top1,
            self.positions,
            self.mean(),
            self.worst
        )
    }

    /// Whether it agrees: no top-1 failure, the mean within bounds.
    pub fn check(&self, name: &str) -> Result<(), String> {
        if !self.failures.is_empty() {
            return Err(self.failures.join("\n"));
        }
        if self.mean() > MEAN_LOGPROB_DIFF {
            return Err(format!(
                "{name}: mean {:.4} > {MEAN_LOGPROB_DIFF}",
                self.mean()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(n_tokens: usize, top: &[(u32, f64)]) -> Position {
        Position {
            n_tokens,
            top10: top
                .iter()
                .map(|&(id, logprob)| Candidate { id, logprob })
                .collect(),
        }
    }

    /// Logits whose log-softmax is `lp` (up to a constant): the logits themselves.
    fn logits_of(lp: &[f64]) -> Vec<f32> {
        lp.iter().map(|&v| v as f32).collect()
    }

    /// The same top-1 agrees; another top-1 within 0.25 nats of llama.cpp's
    /// is a near tie; beyond it (or unlisted) a failure; the mean over every
    /// listed token decides the rest.
    #[test]
    fn agreement_follows_the_near_tie_rule_and_the_mean() {
        let vocab = 4;
        // Two positions: token 0 then token 1 on top of ours.
        let ours_lp = [[-0.5, -1.5, -2.0, -3.0], [-1.0, -0.9, -3.0, -3.0]];
        let norm = |row: &[f64; 4]| {
            let s: f64 = row.iter().map(|v| v.exp()).sum();
            row.iter().map(|v| v - s.ln()).collect::<Vec<f64>>()
        };
        let (a, b) = (norm(&ours_lp[0]), norm(&ours_lp[1]));
        let mut logits = logits_of(&a);
        logits.extend(logits_of(&b));
        let case = |second_top: (u32, f64), second_next: (u32, f64)| Case {
            prompt_ids: vec![7, 8],
            positions: vec![
                position(1, &[(0, a[0]), (1, a[1])]),
                position(2, &[second_top, second_next]),
            ],
        };
        // llama.cpp's top at position 2 is token 0, ours token 1 within 0.1: a near tie.
        let mut near = Agreement::default();
        near.add_case("t", &case((0, b[0]), (1, b[0] - 0.1)), &logits, vocab);
        assert_eq!((near.positions, near.top1), (2, 1));
        assert!(near.failures.is_empty());
        // Ours 0.5 below llama.cpp's top: a failure, named.
        let mut far = Agreement::default();
        far.add_case("t", &case((0, b[0]), (1, b[0] - 0.5)), &logits, vocab);
        assert_eq!(far.failures.len(), 1);
        assert!(far.check("t").unwrap_err().contains("2 tokens"));
        // Our top-1 not listed at all: a failure.
        let mut unlisted = Agreement::default();
        unlisted.add_case("t", &case((0, b[0]), (2, b[2])), &logits, vocab);
        assert_eq!(unlisted.failures.len(), 1);
        // Identical numbers: mean 0, agreement.
        let mut same = Agreement::default();
        same.add_case("t", &case((1, b[1]), (0, b[0])), &logits, vocab);
        assert_eq!(same.top1, 2);
        assert!(same.mean() < 1e-6 && same.check("t").is_ok());
        // Every listed log-probability 0.2 away: the mean bound fails.
        let shifted = Case {
            prompt_ids: vec![7, 8],
            positions: vec![
                position(1, &[(0, a[0] + 0.2), (1, a[1] + 0.2)]),
                position(2, &[(1, b[1] + 0.2), (0, b[0] + 0.2)]),
            ],
        };
        let mut off = Agreement::default();
        off.add_case("t", &shifted, &logits, vocab);
        assert!((off.mean() - 0.2).abs() < 1e-5);
        assert!(off.check("t").unwrap_err().contains("mean"));
    }
}

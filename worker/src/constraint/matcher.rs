//! One job's constraint: the allowed tokens before each sample, and the
//! grammar's state after each chosen token.

use std::sync::Arc;

use llguidance::Matcher;

use crate::constraint::compile::{ConstraintError, Grammar};
use crate::constraint::numbers::NumberGuard;

/// A job's copy of a [`Grammar`], advanced token by token.
pub struct Constraint {
    matcher: Matcher,
    eog: Arc<[u32]>,
    end: u32,
    /// The latest mask: bit `id % 32` of word `id / 32` allows token `id`.
    bits: Vec<u32>,
    /// Tokens committed so far (for the error's position).
    committed: usize,
    /// A JSON Schema's numbers, kept readable.
    numbers: Option<NumberGuard>,
}

impl Constraint {
    /// A constraint at the grammar's start.
    pub fn new(grammar: &Grammar) -> Self {
        Constraint {
            matcher: grammar.start.deep_clone(),
            eog: grammar.eog.clone(),
            end: grammar.end,
            bits: vec![0; grammar.vocab.div_ceil(32)],
            committed: 0,
            numbers: grammar.numbers.clone().map(NumberGuard::new),
        }
    }

    /// The tokens the next step may choose, as bits over the model's
    /// logits: what the grammar allows next (for a JSON Schema, less the
    /// tokens that would write a number past a double's range: `numbers.rs`)
    /// and, where it may end (or has ended), every end-of-generation token.
    pub fn mask(&mut self) -> Result<&[u32], ConstraintError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.failed(e.to_string()))?;
        let words = allowed.as_slice();
        let n = self.bits.len().min(words.len());
        self.bits[..n].copy_from_slice(&words[..n]);
        self.bits[n..].fill(0);
        if let Some(g) = &self.numbers {
            g.narrow(&mut self.bits);
        }
        if allowed.is_allowed(self.end) {
            for &id in self.eog.iter() {
                self.bits[id as usize / 32] |= 1 << (id % 32);
            }
        }
        if self.bits.iter().all(|&w| w == 0) {
            return Err(self.failed("no token is allowed".into()));
        }
        Ok(&self.bits)
    }

    /// The latest mask (all zero before the first [`Constraint::mask`]).
    pub fn bits(&self) -> &[u32] {
        &self.bits
    }

    /// Follows the chosen token; an end-of-generation token is not part of
    /// the grammar's text and is not passed on.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstraintError> {
        if self.eog.contains(&id) {
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| self.failed(e.to_string()))?;
        if let Some(g) = self.numbers.as_mut() {
            g.follow(id);
        }
        self.committed += 1;
        Ok(())
    }

    fn failed(&self, reason: String) -> ConstraintError {
        ConstraintError::Failed {
            index: self.committed,
            reason: reason.lines().next().unwrap_or_default().to_string(),
        }
    }
}

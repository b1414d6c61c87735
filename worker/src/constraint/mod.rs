//! Constrained decoding (issue #43): a JSON Schema, a regular expression or a
//! Lark grammar turned into the set of tokens each step may choose, with
//! llguidance over the model's own vocabulary.
//!
//! [`Compiler`] (one per model, built at start-up) turns a [`Spec`] into a
//! [`Grammar`], refusing what cannot be compiled with the reason, and keeps
//! the compiled grammars of recent requests by hash. Each job starts its own
//! [`Constraint`] from a grammar: before every sample it gives the allowed
//! tokens as a bit mask ([`Constraint::mask`]), which the backend applies to
//! the logits before its sampling pipeline, and it follows every chosen
//! token ([`Constraint::commit`]). When the grammar is complete only
//! end-of-generation tokens are allowed, so a constrained job ends as any
//! other does, at its end-of-generation token.

mod compile;
mod formats;
mod matcher;
mod numbers;
mod vocab;

#[cfg(test)]
mod tests;

pub use compile::{Compiler, ConstraintError, Grammar, Spec, MAX_SPEC_BYTES};
pub use matcher::Constraint;

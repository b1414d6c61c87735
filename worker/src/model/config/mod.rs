//! Typed model configuration, read once from GGUF metadata.
//!
//! Required keys are checked up front so that a missing one fails the load
//! with an error naming it (M0-W-1211). Architecture-specific choices, such
//! as the rotary layout, are decided here and nowhere else: the architectures
//! in [`architecture`], the hyperparameters in [`hyperparams`], the attention's
//! shape in [`attention`], YaRN in [`rope`].

mod architecture;
mod attention;
mod error;
mod hyperparams;
mod rope;
#[cfg(test)]
pub(crate) mod tests;

pub use architecture::{Architecture, RopeStyle};
pub use error::ConfigError;
pub use hyperparams::{HyperLimits, ModelConfig, MoeConfig, HYPER_LIMITS};
pub use rope::Yarn;

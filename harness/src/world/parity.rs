//! The parity part of the World: evidence compared with references (llama.cpp's
//! goldens, the CPU backend) and the anti-cheat haiku.

use anyhow::{anyhow, Result};
use serde::Serialize;
use serde_json::Value;

use crate::client::Transcript;

/// The haiku of M0-W-1800 / EXT-005 and what was found about it (kept for the proof bundle).
#[derive(Debug, Clone, Serialize)]
pub struct Haiku {
    pub minute: u32,
    pub minute_words: String,
    pub nonce: String,
    pub request: Value,
    pub text: String,
    pub ids: Vec<i64>,
    pub minute_word_appears: bool,
    pub repeat_identical: Option<bool>,
    pub other_minute_ids_differ: Option<bool>,
    pub cpu_comparison: Option<Vec<String>>,
}

#[derive(Debug, Default)]
pub struct Parity {
    /// `(golden case index, transcript)` of each golden greedy case run.
    pub golden_runs: Vec<(usize, Transcript)>,
    /// The `greedy.json` those cases came from, when not the reference model's.
    pub golden_file: Option<std::path::PathBuf>,
    pub haiku: Option<Haiku>,
}

impl Parity {
    pub fn haiku(&mut self) -> Result<&mut Haiku> {
        self.haiku
            .as_mut()
            .ok_or_else(|| anyhow!("no haiku asked in this scenario"))
    }
}

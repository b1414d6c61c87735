//! The workspace part of the World: commands run in the source tree.

use std::path::PathBuf;

use anyhow::{anyhow, Result};

/// A command the scenario ran (cargo, nested harness runs).
#[derive(Debug, Clone)]
pub struct CommandOutcome {
    pub line: String,
    pub code: Option<i32>,
    pub output: String,
    /// The proof bundle a nested harness run printed.
    pub proof_dir: Option<PathBuf>,
}

#[derive(Debug, Default)]
pub struct Workspace {
    pub command: Option<CommandOutcome>,
}

impl Workspace {
    pub fn command(&self) -> Result<&CommandOutcome> {
        self.command
            .as_ref()
            .ok_or_else(|| anyhow!("no command ran"))
    }
}

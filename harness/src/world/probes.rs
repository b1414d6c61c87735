//! The probes part of the World: `/health` and `/metrics` readings kept for comparison.

use anyhow::{anyhow, Result};
use serde_json::Value;

#[derive(Debug, Default)]
pub struct Probes {
    /// The `/health` body of `I remember /health`.
    pub remembered_health: Option<Value>,
    /// Every `/metrics` text scraped, in order.
    pub scrapes: Vec<String>,
}

impl Probes {
    pub fn remembered(&self) -> Result<&Value> {
        self.remembered_health
            .as_ref()
            .ok_or_else(|| anyhow!("nothing remembered"))
    }

    pub fn last_scrape(&self) -> Result<&str> {
        self.scrapes
            .last()
            .map(String::as_str)
            .ok_or_else(|| anyhow!("no scrape"))
    }

    /// The last two scrapes, older first.
    pub fn last_two(&self) -> Result<(&str, &str)> {
        match self.scrapes.as_slice() {
            [.., a, b] => Ok((a, b)),
            s => Err(anyhow!("need two scrapes, have {}", s.len())),
        }
    }
}

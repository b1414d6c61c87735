//! The JSON lines `ci/gpu-bench` writes, one object per line with a `kind`:
//!
//! - `run`: one per run, first: `run` (id), `gpu`, `driver`, `clocks`,
//!   `worker_commit`, `llama_commit`, `backend`; more fields are kept as given.
//! - `figure`: one measured figure of one program on one model file: `run`,
//!   `gpu`, `model`, `program` (`worker-orcd` or `llama.cpp`), `figure` (`pp512`,
//!   `tg128`, `ttft_chat_ms`, ...), `unit`, `better` (`higher` or `lower`),
//!   `median`, `min`, `max` and `samples`.
//!
//! Lines of other kinds (raw llama-bench output, errors) are skipped, so the
//! tool can log everything it saw into the same file.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub const WORKER: &str = "worker-orcd";
pub const LLAMA: &str = "llama.cpp";

/// Which direction of a figure is an improvement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

/// One measured figure (`kind: figure`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub run: String,
    #[serde(default)]
    pub gpu: String,
    pub model: String,
    pub program: String,
    pub figure: String,
    pub unit: String,
    pub better: Better,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
}

impl Figure {
    /// `max - min`: the run-to-run spread of the repetitions.
    pub fn spread(&self) -> f64 {
        self.max - self.min
    }

    /// The spread as a fraction of the median (0 for a zero median).
    pub fn relative_spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            self.spread() / self.median.abs()
        }
    }
}

/// The header of one run (`kind: run`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run: String,
    #[serde(default)]
    pub gpu: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Every run header and figure of some JSON lines, in order.
#[derive(Clone, Debug, Default)]
pub struct Records {
    pub runs: Vec<RunInfo>,
    pub figures: Vec<Figure>,
}

impl Records {
    /// Parses JSON lines; blank lines and lines of other kinds are skipped.
    pub fn parse(text: &str) -> anyhow::Result<Records> {
        let mut recs = Records::default();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("line {}", i + 1))?;
            let kind = v.get("kind").and_then(|k| k.as_str()).map(str::to_owned);
            match kind.as_deref() {
                Some("run") => recs
                    .runs
                    .push(serde_json::from_value(v).with_context(|| format!("line {}", i + 1))?),
                Some("figure") => recs
                    .figures
                    .push(serde_json::from_value(v).with_context(|| format!("line {}", i + 1))?),
                _ => {}
            }
        }
        Ok(recs)
    }

    pub fn read(path: &Path) -> anyhow::Result<Records> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Records::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Run ids in order of first appearance (runs without a header included).
    pub fn run_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        let all = self
            .runs
            .iter()
            .map(|r| &r.run)
            .chain(self.figures.iter().map(|f| &f.run));
        for id in all {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// The figure of (`run`, `model`, `program`, `figure`), if measured.
    pub fn find(&self, run: &str, model: &str, program: &str, figure: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| {
            f.run == run && f.model == model && f.program == program && f.figure == figure
        })
    }

    /// The records of one run.
    pub fn only_run(&self, run: &str) -> Records {
        Records {
            runs: self.runs.iter().filter(|r| r.run == run).cloned().collect(),
            figures: self
                .figures
                .iter()
                .filter(|f| f.run == run)
                .cloned()
                .collect(),
        }
    }

    /// The last run's records (by order of appearance).
    pub fn last_run(&self) -> Option<Records> {
        self.run_ids().last().map(|id| self.only_run(id))
    }

    /// Distinct values of `key` over the figures, in order of appearance.
    pub fn distinct(&self, key: impl Fn(&Figure) -> &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for f in &self.figures {
            if !out.iter().any(|o| o == key(f)) {
                out.push(key(f).to_string());
            }
        }
        out
    }
}

/// A file name made of `s`'s letters, digits, dots and dashes (GPU names,
/// model names), other characters turned into `-`.
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '.' {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if !(c == '-' && (out.is_empty() || out.ends_with('-'))) {
            out.push(c);
        }
    }
    out.trim_end_matches('-').to_string()
}

/// Where `ci/gpu-bench` keeps the baseline of a GPU: `DIR/<slug of its name>.jsonl`.
pub fn baseline_path(dir: &Path, gpu: &str) -> PathBuf {
    dir.join(format!("{}.jsonl", slug(gpu)))
}

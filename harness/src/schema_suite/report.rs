//! The suite's figures: a tally per category and in total, the refused
//! schemas with the worker's reason, every invalid output with its seed, the
//! truncated ones, printed as a table and written as JSON and Markdown.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::ask::{Outcome, Verdict};

/// Counts of one category (or of all).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    pub schemas: usize,
    pub requests: usize,
    pub valid: usize,
    pub invalid: usize,
    pub truncated: usize,
    pub refused: usize,
    pub errors: usize,
    /// Completion tokens of the answered requests.
    pub tokens: u64,
    /// Seconds the answered requests took, summed (each from send to answer).
    pub request_seconds: f64,
}

impl Tally {
    fn add(&mut self, o: &Outcome) {
        self.requests += 1;
        self.tokens += o.tokens;
        self.request_seconds += o.seconds;
        match o.verdict {
            Verdict::Valid => self.valid += 1,
            Verdict::Invalid(_) => self.invalid += 1,
            Verdict::Truncated => self.truncated += 1,
            Verdict::Refused(_) => self.refused += 1,
            Verdict::Error(_) => self.errors += 1,
        }
    }

    /// Milliseconds per generated token as one client sees it (queueing
    /// and prefill included).
    fn ms_per_token(&self) -> f64 {
        match self.tokens {
            0 => 0.0,
            n => 1000.0 * self.request_seconds / n as f64,
        }
    }
}

/// A refused schema, once, with the worker's message.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub schema: String,
    pub reason: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The run's settings (model, backend, seeds, max_tokens, ...).
    pub settings: Value,
    pub wall_seconds: f64,
    pub total: Tally,
    pub categories: BTreeMap<String, Tally>,
    pub refused: Vec<Refusal>,
    /// Invalid outputs, truncated ones and errors, each with its schema and seed.
    pub invalid: Vec<Outcome>,
    pub truncated: Vec<Outcome>,
    pub errors: Vec<Outcome>,
}

impl Report {
    /// The report of `outcomes` (any order; sorted by schema then seed).
    pub fn new(settings: Value, mut outcomes: Vec<Outcome>, wall_seconds: f64) -> Self {
        outcomes.sort_by(|a, b| (&a.schema, a.seed).cmp(&(&b.schema, b.seed)));
        let mut categories: BTreeMap<String, Tally> = BTreeMap::new();
        let mut total = Tally::default();
        let mut schemas = BTreeSet::new();
        for o in &outcomes {
            let t = categories.entry(category(&o.schema)).or_default();
            t.add(o);
            total.add(o);
            if schemas.insert(o.schema.clone()) {
                t.schemas += 1;
                total.schemas += 1;
            }
        }
        let pick = |keep: fn(&Verdict) -> bool| -> Vec<Outcome> {
            outcomes
                .iter()
                .filter(|o| keep(&o.verdict))
                .cloned()
                .collect()
        };
        Report {
            settings,
            wall_seconds,
            total,
            categories,
            refused: refusals(&outcomes),
            invalid: pick(|v| matches!(v, Verdict::Invalid(_))),
            truncated: pick(|v| matches!(v, Verdict::Truncated)),
            errors: pick(|v| matches!(v, Verdict::Error(_))),
        }
    }

    /// The run fails on an invalid output or an error, and when no output
    /// at all was checked (everything refused or cut off proves nothing).
    pub fn failed(&self) -> bool {
        self.total.invalid > 0 || self.total.errors > 0 || self.total.valid == 0
    }

    /// The per-category table, as printed.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<18} {:>7} {:>8} {:>6} {:>7} {:>9} {:>7} {:>6} {:>7} {:>6}\n",
            "category",
            "schemas",
            "requests",
            "valid",
            "invalid",
            "truncated",
            "refused",
            "errors",
            "tokens",
            "ms/tok"
        );
        let rows = self.categories.iter().map(|(c, t)| (c.as_str(), t));
        for (name, t) in rows.chain([("total", &self.total)]) {
            let _ = writeln!(
                s,
                "{name:<18} {:>7} {:>8} {:>6} {:>7} {:>9} {:>7} {:>6} {:>7} {:>6.1}",
                t.schemas,
                t.requests,
                t.valid,
                t.invalid,
                t.truncated,
                t.refused,
                t.errors,
                t.tokens,
                t.ms_per_token()
            );
        }
        let _ = writeln!(
            s,
            "wall {:.1} s, {:.1} tokens/s in all",
            self.wall_seconds,
            self.total.tokens as f64 / self.wall_seconds.max(1e-9)
        );
        s
    }

    /// The report as Markdown: settings, the table, then each list.
    pub fn markdown(&self) -> String {
        let mut s = String::from("# Structured output schema suite\n\n");
        let settings = serde_json::to_string_pretty(&self.settings).unwrap_or_default();
        let _ = write!(
            s,
            "```json\n{settings}\n```\n\n```text\n{}```\n",
            self.table()
        );
        s.push_str("\n## Refused schemas\n\n");
        for r in &self.refused {
            let _ = writeln!(s, "- `{}`: {}", r.schema, r.reason);
        }
        list(&mut s, "Invalid outputs", &self.invalid);
        list(
            &mut s,
            "Truncated outputs (finish_reason length)",
            &self.truncated,
        );
        list(&mut s, "Errors", &self.errors);
        s
    }

    /// Writes the JSON report to `path` and the Markdown beside it (`.md`).
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        let md = path.with_extension("md");
        std::fs::write(&md, self.markdown()).with_context(|| format!("writing {}", md.display()))
    }
}

/// The category of a `category/name` id.
fn category(schema: &str) -> String {
    schema.split('/').next().unwrap_or(schema).to_string()
}

/// Each refused schema once, with the first message it was refused with.
fn refusals(outcomes: &[Outcome]) -> Vec<Refusal> {
    let mut seen = BTreeSet::new();
    outcomes
        .iter()
        .filter_map(|o| match &o.verdict {
            Verdict::Refused(reason) if seen.insert(o.schema.clone()) => Some(Refusal {
                schema: o.schema.clone(),
                reason: reason.clone(),
            }),
            _ => None,
        })
        .collect()
}

fn list(s: &mut String, title: &str, outcomes: &[Outcome]) {
    let _ = write!(s, "\n## {title}\n\n");
    for o in outcomes {
        let _ = writeln!(s, "- `{}` seed {}, {} tokens", o.schema, o.seed, o.tokens);
        match &o.verdict {
            Verdict::Invalid(errors) => errors.iter().for_each(|e| {
                let _ = writeln!(s, "  - {e}");
            }),
            Verdict::Error(e) => {
                let _ = writeln!(s, "  - {e}");
            }
            _ => {}
        }
        if !o.output.is_empty() {
            let _ = writeln!(s, "\n  ```json\n  {}\n  ```", o.output);
        }
    }
}

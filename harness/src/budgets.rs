//! Latency and throughput budgets per backend, read from `budgets.yaml`
//! (REQUIREMENTS.md section 12 and M0-W-1830). A measurement meets its budget
//! with the file's slack (10% unless set): a ceiling may be exceeded by the
//! slack, a floor undershot by it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
pub struct BudgetFile {
    #[serde(default = "default_slack")]
    pub slack: f64,
    pub backends: BTreeMap<String, Budgets>,
}

fn default_slack() -> f64 {
    0.10
}

/// One backend's budgets. Missing keys are reported as a failed check, not a pass.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    pub first_token_ms_p95: Option<f64>,
    pub inter_token_ms_p95: Option<f64>,
    pub health_ms_p99: Option<f64>,
    pub cancel_ms_p95: Option<f64>,
    pub startup_s: Option<f64>,
    pub shutdown_ms_max: Option<f64>,
    pub execute_parse_ms: Option<f64>,
    #[serde(default)]
    pub load_s: BTreeMap<String, f64>,
    #[serde(default)]
    pub decode_tok_s_min: BTreeMap<String, f64>,
}

/// Whether a budget is an upper or a lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    Ceiling,
    Floor,
}

/// One comparison, as it goes into the proof bundle.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub key: String,
    pub measured: f64,
    pub budget: f64,
    pub bound: Bound,
    pub slack: f64,
    pub met: bool,
}

impl BudgetFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading budgets {}", path.display()))?;
        let f: BudgetFile = serde_yaml::from_str(&text)
            .with_context(|| format!("parsing budgets {}", path.display()))?;
        if !(0.0..1.0).contains(&f.slack) {
            return Err(anyhow!("slack {} is not in [0, 1)", f.slack));
        }
        Ok(f)
    }

    pub fn backend(&self, name: &str) -> Result<&Budgets> {
        self.backends
            .get(name)
            .ok_or_else(|| anyhow!("budgets file has no entry for backend {name}"))
    }

    /// Looks a key up (`startup_s`, `load_s.<model>`, `decode_tok_s_min.<model>`, ...) and compares.
    pub fn check(&self, backend: &str, key: &str, measured: f64) -> Result<Verdict> {
        let b = self.backend(backend)?;
        let (budget, bound) = b
            .get(key)
            .ok_or_else(|| anyhow!("no budget {key} for backend {backend}"))?;
        let met = match bound {
            Bound::Ceiling => measured <= budget * (1.0 + self.slack),
            Bound::Floor => measured >= budget * (1.0 - self.slack),
        };
        Ok(Verdict {
            key: key.to_owned(),
            measured,
            budget,
            bound,
            slack: self.slack,
            met,
        })
    }
}

/// The key a model's budgets are filed under: the model file's stem, less the
/// `synthetic-` prefix of the suite's fixture files (`synthetic-llama-3-8b.gguf`
/// is budgeted as `llama-3-8b`, the real model it stands in for). Accepts a
/// path, a file name or a fixture name.
pub fn model_key(model: &str) -> String {
    let name = Path::new(model)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(model);
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    stem.strip_prefix("synthetic-").unwrap_or(stem).to_owned()
}

impl Budgets {
    pub fn get(&self, key: &str) -> Option<(f64, Bound)> {
        use Bound::*;
        let (head, model) = key
            .split_once('.')
            .map_or((key, None), |(h, m)| (h, Some(m)));
        let per_model = |table: &BTreeMap<String, f64>, m: &str| {
            table.get(m).or_else(|| table.get(&model_key(m))).copied()
        };
        match (head, model) {
            ("load_s", Some(m)) => per_model(&self.load_s, m).map(|v| (v, Ceiling)),
            ("decode_tok_s_min", Some(m)) => {
                per_model(&self.decode_tok_s_min, m).map(|v| (v, Floor))
            }
            ("first_token_ms_p95", None) => self.first_token_ms_p95.map(|v| (v, Ceiling)),
            ("inter_token_ms_p95", None) => self.inter_token_ms_p95.map(|v| (v, Ceiling)),
            ("health_ms_p99", None) => self.health_ms_p99.map(|v| (v, Ceiling)),
            ("cancel_ms_p95", None) => self.cancel_ms_p95.map(|v| (v, Ceiling)),
            ("startup_s", None) => self.startup_s.map(|v| (v, Ceiling)),
            ("shutdown_ms_max", None) => self.shutdown_ms_max.map(|v| (v, Ceiling)),
            ("execute_parse_ms", None) => self.execute_parse_ms.map(|v| (v, Ceiling)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "
slack: 0.1
backends:
  cpu:
    first_token_ms_p95: 100
    load_s: { smollm2: 10 }
    decode_tok_s_min: { smollm2: 20 }
";

    #[test]
    fn ceilings_and_floors_get_the_slack() {
        let f: BudgetFile = serde_yaml::from_str(YAML).unwrap();
        assert!(f.check("cpu", "first_token_ms_p95", 109.0).unwrap().met);
        assert!(!f.check("cpu", "first_token_ms_p95", 111.0).unwrap().met);
        assert!(
            f.check("cpu", "decode_tok_s_min.smollm2", 18.5)
                .unwrap()
                .met
        );
        assert!(
            !f.check("cpu", "decode_tok_s_min.smollm2", 17.0)
                .unwrap()
                .met
        );
        assert!(f.check("cpu", "load_s.other", 1.0).is_err());
        assert!(f.check("cuda", "startup_s", 1.0).is_err());
    }

    #[test]
    fn synthetic_fixtures_use_the_budgets_of_the_model_they_stand_in_for() {
        assert_eq!(model_key("synthetic-qwen2.5-0.5b"), "qwen2.5-0.5b");
        assert_eq!(
            model_key("/tmp/fixtures/synthetic-llama-3-8b.gguf"),
            "llama-3-8b"
        );
        assert_eq!(
            model_key(".models/smollm2-135m-instruct-q4_1.gguf"),
            "smollm2-135m-instruct-q4_1"
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../budgets.yaml");
        let f = BudgetFile::load(&path).unwrap();
        for (key, budget) in [
            ("decode_tok_s_min.synthetic-qwen2.5-0.5b", 60.0),
            ("load_s.synthetic-llama-3-8b.gguf", 60.0),
            ("decode_tok_s_min.llama-3-8b", 20.0),
        ] {
            assert_eq!(f.check("cuda", key, 1e9).unwrap().budget, budget, "{key}");
        }
        assert!(f.check("cuda", "load_s.synthetic-nope", 1.0).is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(
            serde_yaml::from_str::<BudgetFile>("backends: { cpu: { first_token_p95: 1 } }")
                .is_err()
        );
    }

    #[test]
    fn the_committed_budget_file_parses_and_has_every_key() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../budgets.yaml");
        let f = BudgetFile::load(&path).unwrap();
        for backend in ["cpu", "cuda"] {
            let b = f.backend(backend).unwrap();
            for key in [
                "first_token_ms_p95",
                "inter_token_ms_p95",
                "health_ms_p99",
                "cancel_ms_p95",
                "startup_s",
                "shutdown_ms_max",
                "execute_parse_ms",
                "load_s.smollm2-135m-instruct-q4_1",
                "decode_tok_s_min.smollm2-135m-instruct-q4_1",
            ] {
                assert!(b.get(key).is_some(), "{backend}: {key} missing");
            }
        }
    }
}

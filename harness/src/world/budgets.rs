//! The budgets part of the World: timing samples by name, compared with budgets.yaml.

use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct Budgets {
    samples: BTreeMap<String, Vec<f64>>,
}

impl Budgets {
    pub fn push(&mut self, key: &str, v: f64) {
        self.samples.entry(key.to_owned()).or_default().push(v);
    }

    /// The samples taken under `key` (none if never measured).
    pub fn samples(&self, key: &str) -> &[f64] {
        self.samples.get(key).map_or(&[], Vec::as_slice)
    }
}

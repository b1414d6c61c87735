//! Sample summaries for budgets: nearest-rank percentiles over a sample.

use serde::Serialize;

/// p50/p95/p99 and friends of one measured quantity.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// `None` for an empty sample.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Some(Summary {
            n: s.len(),
            min: s[0],
            p50: percentile(&s, 50.0),
            p95: percentile(&s, 95.0),
            p99: percentile(&s, 99.0),
            max: s[s.len() - 1],
            mean: s.iter().sum::<f64>() / s.len() as f64,
        })
    }

    /// The statistic a budget key names by its suffix (`_p95`, `_p99`, `_max`, `_min`).
    pub fn stat(&self, name: &str) -> f64 {
        match name {
            "p50" => self.p50,
            "p95" => self.p95,
            "p99" => self.p99,
            "max" => self.max,
            "min" => self.min,
            _ => self.mean,
        }
    }
}

/// Nearest-rank percentile of a sorted, non-empty sample.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!(
            (s.p50, s.p95, s.p99, s.max, s.min),
            (50.0, 95.0, 99.0, 100.0, 1.0)
        );
        assert_eq!(Summary::of(&[3.0]).unwrap().p99, 3.0);
        assert!(Summary::of(&[]).is_none());
    }
}

//! Summaries of measured values (lateness of runs) as percentiles.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentiles of `values` (in any order). All zero for no values.
pub fn percentiles(values: &mut [f64]) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| {
        let n = values.len();
        let idx = ((p / 100.0) * n as f64).ceil() as usize;
        values[idx.clamp(1, n) - 1]
    };
    Percentiles {
        count: values.len(),
        p50: rank(50.0),
        p90: rank(90.0),
        p99: rank(99.0),
        max: values[values.len() - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = percentiles(&mut v);
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(percentiles(&mut []).count, 0);
        assert_eq!(percentiles(&mut [7.0]).p99, 7.0);
    }
}

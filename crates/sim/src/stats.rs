//! Figures: what one run means for each priority class, and how runs of several seeds add up.
//!
//! Owns the definitions of the figures (wait, duration, slowdown, variance spread), the
//! averaging over seeds and the 95% confidence intervals. Must not simulate anything.
//!
//! Per run and priority class: the mean and 99th percentile (nearest rank) of the waits, the
//! mean duration (execution), the mean time at the server (from being handed to a server to
//! completion: the wait inside it plus execution, which the study the targets come from calls
//! a job's duration), the mean slowdown `W / (W + E)` (0 for a request with `W + E = 0`), and the
//! wait variance spread: for each server, the sample variance of the waits of the class's
//! requests that ran there (servers with at least 2 of them); the spread is the largest over
//! the smallest (the smallest positive one if the smallest is 0; 1 if all are 0; none with no
//! such server).

use crate::engine::Run;
use crate::trace::Trace;

/// One priority class in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassFigures {
    pub priority: i32,
    pub requests: usize,
    /// Seconds.
    pub mean_wait: f64,
    pub p99_wait: f64,
    pub mean_duration: f64,
    pub mean_at_server: f64,
    pub mean_slowdown: f64,
    pub variance_spread: Option<f64>,
    /// The share of its requests that started warm.
    pub warm_share: f64,
}

/// The figures of each priority class present in `trace`, lowest priority first.
pub fn class_figures(trace: &Trace, run: &Run, servers: u32) -> Vec<ClassFigures> {
    trace
        .classes()
        .into_iter()
        .map(|priority| {
            let mut waits = Vec::new();
            let mut per_server: Vec<Vec<f64>> = vec![Vec::new(); servers as usize];
            let (mut duration, mut at_server, mut slowdown, mut warm) = (0.0, 0.0, 0.0, 0usize);
            for (served, request) in run.served.iter().zip(trace.requests()) {
                if request.priority != priority {
                    continue;
                }
                let (w, e) = (served.wait.secs(), served.duration.secs());
                waits.push(w);
                if let Some(list) = per_server.get_mut(served.server as usize) {
                    list.push(w);
                }
                duration += e;
                at_server += served.local_wait.secs() + e;
                slowdown += if w + e > 0.0 { w / (w + e) } else { 0.0 };
                warm += usize::from(served.warm);
            }
            let n = waits.len().max(1) as f64;
            let mean_wait = waits.iter().sum::<f64>() / n;
            waits.sort_by(f64::total_cmp);
            let variances: Vec<f64> = per_server.iter().filter_map(|w| variance(w)).collect();
            ClassFigures {
                priority,
                requests: waits.len(),
                mean_wait,
                p99_wait: percentile(&waits, 0.99),
                mean_duration: duration / n,
                mean_at_server: at_server / n,
                mean_slowdown: slowdown / n,
                variance_spread: spread(&variances),
                warm_share: warm as f64 / n,
            }
        })
        .collect()
}

/// The sample variance, for 2 values or more.
pub fn variance(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    Some(values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0))
}

/// Nearest-rank percentile of sorted `values` (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Largest over smallest of `variances` (see the module's definition).
pub fn spread(variances: &[f64]) -> Option<f64> {
    let max = variances
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
    let min_positive = variances
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(f64::INFINITY, f64::min);
    if max <= 0.0 {
        return Some(1.0);
    }
    Some(max / min_positive)
}

/// The mean of `values` (0 when empty).
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// The 95% confidence interval of the mean of `values` (one per seed): `mean ± t × s / √n`
/// with Student's t at `n − 1` degrees of freedom. One value gives `[x, x]`.
pub fn ci95(values: &[f64]) -> [f64; 2] {
    let m = mean(values);
    let Some(var) = variance(values) else {
        return [m, m];
    };
    let half = t_975(values.len() - 1) * (var / values.len() as f64).sqrt();
    [m - half, m + half]
}

/// Student's t, two-sided 95% (the 0.975 quantile), for `df` degrees of freedom. Past 30 the
/// value of the nearest tabled df at or below it (slightly wide, never narrow).
pub fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        31..=39 => 2.042,
        40..=59 => 2.021,
        60..=119 => 2.000,
        _ => 1.980,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_variances() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[5.0], 0.99), 5.0);
        assert_eq!(variance(&[1.0, 3.0]), Some(2.0));
        assert_eq!(variance(&[1.0]), None);
    }

    #[test]
    fn spread_takes_the_smallest_positive() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[2.0, 8.0, 4.0]), Some(4.0));
        assert_eq!(spread(&[0.0, 8.0, 2.0]), Some(4.0));
        assert_eq!(spread(&[0.0, 0.0]), Some(1.0));
    }

    #[test]
    fn confidence_intervals_use_t() {
        assert_eq!(ci95(&[3.0]), [3.0, 3.0]);
        // Mean 2, s = 1, n = 3: 2 ± 4.303 / √3.
        let [lo, hi] = ci95(&[1.0, 2.0, 3.0]);
        let half = 4.303 / 3f64.sqrt();
        assert!((lo - (2.0 - half)).abs() < 1e-12 && (hi - (2.0 + half)).abs() < 1e-12);
        assert_eq!(t_975(4), 2.776);
        assert_eq!(t_975(99), 2.000);
    }
}

//! `deadlines`: how early the at-risk estimator (`sked_core::deadline::estimate`) warns, and
//! how often it warns for nothing, on a synthetic history.
//!
//! A chain of five jobs (A, then B, C and D each after the one before, then E, whose run waits
//! for D) runs once a day; each job's duration is drawn from a log-normal distribution with
//! its own median and spread. E must finish by a deadline set at a chosen quantile of the
//! chain's total, so that a known share of days miss it. Each simulated second, the estimator
//! is asked when E will end, exactly as the watcher asks it (E waiting on the chain above
//! it, the step that runs now running since it started, the ones after it expected), from the
//! last 50 durations of each job. The first second its estimate passes the deadline is the
//! warning. Reported per quantile of the estimator: the share of missed days warned before
//! the deadline (recall), how long before it (lead, p10 and p50), and the share of days on
//! time that were warned anyway (false alarms).
//!
//! Everything is deterministic for a `--seed`, and runs in a second: no server is involved.

use anyhow::Result;
use chrono::{TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sked_core::deadline::estimate::{finish, History, Stage, Step, HISTORY_RUNS};
use sked_core::Instant;
use std::collections::VecDeque;
use std::time::Duration;

/// Median duration of each job of the chain, in seconds, and the log-normal spread (sigma).
const MEDIANS: [f64; 5] = [360.0, 600.0, 240.0, 480.0, 720.0];
const SIGMA: f64 = 0.35;
/// Days of history before the days that are measured.
const WARM_UP: usize = 50;
/// The quantiles of past durations the estimator is tried with.
const QUANTILES: [f64; 4] = [0.5, 0.75, 0.9, 0.95];

pub struct Options {
    pub days: usize,
    pub seed: u64,
    /// The share of days on time: the deadline is this quantile of the chain's total.
    pub on_time: f64,
}

/// One log-normal draw with `median` and [`SIGMA`] (Box-Muller).
fn draw(rng: &mut StdRng, median: f64) -> f64 {
    let (u1, u2): (f64, f64) = (rng.gen::<f64>().max(f64::MIN_POSITIVE), rng.gen());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median * (SIGMA * z).exp()
}

fn day(rng: &mut StdRng) -> [f64; 5] {
    MEDIANS.map(|m| draw(rng, m))
}

/// What one quantile of the estimator did over the measured days.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub missed: usize,
    pub warned_missed: usize,
    pub on_time: usize,
    pub warned_on_time: usize,
    /// Seconds from each warning of a missed day to its deadline.
    pub leads: Vec<f64>,
}

impl Outcome {
    pub fn recall(&self) -> f64 {
        self.warned_missed as f64 / self.missed.max(1) as f64
    }

    pub fn false_alarms(&self) -> f64 {
        self.warned_on_time as f64 / self.on_time.max(1) as f64
    }
}

/// E's step at second `t` of a day whose jobs take `took` seconds, with each job's history.
fn step_at(t: f64, took: &[f64; 5], histories: &[History], start: Instant) -> Step {
    let at = |s: f64| start + chrono::Duration::milliseconds((s * 1000.0) as i64);
    // Job i starts when job i-1 ends (A at 0).
    let mut begins = [0.0; 5];
    for i in 1..5 {
        begins[i] = begins[i - 1] + took[i - 1];
    }
    let stage_of = |i: usize, upstream: Option<Step>| -> Stage {
        let ends = begins[i] + took[i];
        if t >= ends {
            Stage::Ended
        } else if t >= begins[i] {
            Stage::Running {
                started_at: at(begins[i]),
            }
        } else if i == 4 {
            Stage::Waiting {
                upstream: upstream.into_iter().collect(),
            }
        } else {
            Stage::Expected {
                upstream: upstream.into_iter().collect(),
            }
        }
    };
    let mut step: Option<Step> = None;
    for (i, history) in histories.iter().enumerate() {
        step = Some(Step {
            history: history.clone(),
            stage: stage_of(i, step),
        });
    }
    step.unwrap_or(Step {
        history: History::default(),
        stage: Stage::Ended,
    })
}

/// Simulates `options.days` days for each quantile.
pub fn simulate(options: &Options) -> (f64, Vec<(f64, Outcome)>) {
    let mut rng = StdRng::seed_from_u64(options.seed);
    // The deadline: the chosen quantile of the chain's total, from draws of its own.
    let mut totals: Vec<f64> = (0..20_000).map(|_| day(&mut rng).iter().sum()).collect();
    totals.sort_by(f64::total_cmp);
    let deadline = totals[((totals.len() as f64 * options.on_time) as usize).min(totals.len() - 1)];
    let mut past: Vec<VecDeque<Duration>> = vec![VecDeque::new(); 5];
    let remember = |past: &mut Vec<VecDeque<Duration>>, took: &[f64; 5]| {
        for (history, d) in past.iter_mut().zip(took) {
            history.push_back(Duration::from_secs_f64(*d));
            if history.len() > HISTORY_RUNS {
                history.pop_front();
            }
        }
    };
    for _ in 0..WARM_UP {
        let took = day(&mut rng);
        remember(&mut past, &took);
    }
    let start = Utc
        .with_ymd_and_hms(2026, 1, 1, 2, 0, 0)
        .single()
        .unwrap_or_default();
    let finish_by = start + chrono::Duration::milliseconds((deadline * 1000.0) as i64);
    let mut outcomes = vec![Outcome::default(); QUANTILES.len()];
    for _ in 0..options.days {
        let took = day(&mut rng);
        let histories: Vec<History> = past
            .iter()
            .map(|h| History::new(h.iter().copied().collect()))
            .collect();
        let total: f64 = took.iter().sum();
        let missed = total > deadline;
        for (q, outcome) in QUANTILES.iter().zip(outcomes.iter_mut()) {
            let mut warned_at = None;
            let mut t = 0.0;
            while t < deadline.min(total) {
                let now = start + chrono::Duration::milliseconds((t * 1000.0) as i64);
                let step = step_at(t, &took, &histories, start);
                if finish(&step, now, *q).is_some_and(|end| end > finish_by) {
                    warned_at = Some(t);
                    break;
                }
                t += 1.0;
            }
            if missed {
                outcome.missed += 1;
                if let Some(w) = warned_at {
                    outcome.warned_missed += 1;
                    outcome.leads.push(deadline - w);
                }
            } else {
                outcome.on_time += 1;
                if warned_at.is_some() {
                    outcome.warned_on_time += 1;
                }
            }
        }
        remember(&mut past, &took);
    }
    (deadline, QUANTILES.iter().copied().zip(outcomes).collect())
}

pub fn run(options: Options) -> Result<Value> {
    let (deadline, outcomes) = simulate(&options);
    let rows: Vec<Value> = outcomes
        .into_iter()
        .map(|(q, mut o)| {
            o.leads.sort_by(f64::total_cmp);
            let lead = |q: f64| {
                let rank = (q * o.leads.len() as f64).ceil() as usize;
                o.leads.get(rank.max(1) - 1).copied().unwrap_or_default()
            };
            json!({
                "quantile": q,
                "days_missed": o.missed,
                "recall": o.recall(),
                "lead_seconds": {"p10": lead(0.1), "p50": lead(0.5)},
                "days_on_time": o.on_time,
                "false_alarm_rate": o.false_alarms(),
            })
        })
        .collect();
    Ok(json!({
        "scenario": "deadlines",
        "days": options.days,
        "seed": options.seed,
        "chain_medians_seconds": MEDIANS,
        "sigma": SIGMA,
        "deadline_seconds_after_instant": deadline,
        "estimator": rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a deadline met 95 days in 100, the product's quantile warns of most misses well
    /// before them and seldom of a day on time; a higher quantile warns of more misses and
    /// more days on time. (The full figures are in BENCHMARKS.md.)
    #[test]
    fn the_estimator_warns_early_of_most_misses_and_seldom_falsely() {
        let (_, outcomes) = simulate(&Options {
            days: 300,
            seed: 7,
            on_time: 0.95,
        });
        let of = |q: f64| {
            outcomes
                .iter()
                .find(|(x, _)| *x == q)
                .map(|(_, o)| o.clone())
                .unwrap_or_default()
        };
        let chosen = of(sked_core::deadline::estimate::QUANTILE);
        assert!(chosen.missed > 15, "{chosen:?}");
        assert!(chosen.recall() >= 0.8, "{chosen:?}");
        assert!(chosen.false_alarms() <= 0.3, "{chosen:?}");
        let mut leads = chosen.leads.clone();
        assert!(
            sked_core::stats::percentiles(&mut leads).p50 >= 600.0,
            "{chosen:?}"
        );
        let higher = of(0.95);
        assert!(
            higher.recall() >= chosen.recall(),
            "{higher:?} vs {chosen:?}"
        );
        assert!(
            higher.false_alarms() > chosen.false_alarms(),
            "{higher:?} vs {chosen:?}"
        );
    }
}

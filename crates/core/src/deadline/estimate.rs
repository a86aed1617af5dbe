//! The finish a run is expected at, from its job's history and what it still waits for: what
//! `at_risk` compares with `finish_by`.
//!
//! The estimator, as docs/JOBS.md states it:
//!
//! - A job's *history* is the durations (first start to end) of its latest runs that
//!   succeeded. With fewer than [`MIN_HISTORY`] of them a step is taken to need no time, so a
//!   new job is never called at risk by a guess.
//! - Each step still to come adds the mean and the variance of its job's durations; the step
//!   that runs now adds those of what the past runs that lasted longer than it has so far took
//!   beyond that ("of the runs that took more than its 20 minutes, how much more"); a run longer
//!   than every past one adds nothing, as there is nothing to go by. A queued run adds the time
//!   until it is ready.
//! - A waiting run starts after its slowest upstream (each estimated the same way); an
//!   upstream job whose run is not recorded yet (it follows its own upstreams) comes after
//!   them, so a chain is walked to the run that is moving.
//! - The remaining time is taken as normal with the summed mean and variance, and the
//!   estimate is its [`QUANTILE`]: the finish three runs in four should beat.
//!
//! Summing each step's own high quantile instead would call almost every run of a long chain
//! at risk from its first second (three in four of each step is far more than three in four
//! of the sum); docs/BENCHMARKS.md, "Deadline warnings", measures both the warnings' lead and
//! their false alarms.

use super::{plus, span};
use crate::Instant;
use std::time::Duration;

/// Past durations a job needs before its runs are estimated.
pub const MIN_HISTORY: usize = 5;
/// Past durations read per job, the newest.
pub const HISTORY_RUNS: usize = 50;
/// The quantile of a run's remaining time the estimate is: a run is at risk once the chance
/// that it misses its `finish_by` passes one in four. Chosen on the measurements of
/// docs/BENCHMARKS.md ("Deadline warnings"): higher quantiles warn earlier and of more misses,
/// but of many more runs that end in time.
pub const QUANTILE: f64 = 0.75;

/// Durations of a job's latest succeeded runs, sorted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(Vec<Duration>);

/// A remaining time as a mean and a variance, in seconds and seconds squared.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Spread {
    mean: f64,
    var: f64,
}

impl Spread {
    fn of(seconds: impl Iterator<Item = f64> + Clone) -> Spread {
        let n = seconds.clone().count();
        if n == 0 {
            return Spread::default();
        }
        let mean = seconds.clone().sum::<f64>() / n as f64;
        let var = seconds.map(|s| (s - mean) * (s - mean)).sum::<f64>() / n as f64;
        Spread { mean, var }
    }

    fn then(self, other: Spread) -> Spread {
        Spread {
            mean: self.mean + other.mean,
            var: self.var + other.var,
        }
    }

    /// The `z` standard deviations above the mean, in seconds, never below zero.
    fn at(self, z: f64) -> f64 {
        (self.mean + z * self.var.sqrt()).max(0.0)
    }
}

impl History {
    pub fn new(mut durations: Vec<Duration>) -> History {
        durations.sort();
        History(durations)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn known(&self) -> bool {
        self.0.len() >= MIN_HISTORY
    }

    /// What a run of the job takes.
    fn whole(&self) -> Spread {
        if !self.known() {
            return Spread::default();
        }
        Spread::of(self.0.iter().map(Duration::as_secs_f64))
    }

    /// What a run that has run `elapsed` still takes: what the past runs longer than that took
    /// beyond it.
    fn beyond(&self, elapsed: Duration) -> Spread {
        if !self.known() {
            return Spread::default();
        }
        let elapsed = elapsed.as_secs_f64();
        Spread::of(
            self.0
                .iter()
                .map(Duration::as_secs_f64)
                .filter(move |d| *d > elapsed)
                .map(move |d| d - elapsed),
        )
    }
}

/// The standard normal quantile of `q` (Abramowitz and Stegun 26.2.23, within 5e-4).
fn z_of(q: f64) -> f64 {
    let q = q.clamp(1e-6, 1.0 - 1e-6);
    let tail = |p: f64| {
        let t = (-2.0 * p.ln()).sqrt();
        t - (2.515_517 + 0.802_853 * t + 0.010_328 * t * t)
            / (1.0 + 1.432_788 * t + 0.189_269 * t * t + 0.001_308 * t * t * t)
    };
    if q >= 0.5 {
        tail(1.0 - q)
    } else {
        -tail(q)
    }
}

/// Where one step of a chain stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Over: the steps after it no longer wait for it.
    Ended,
    Running {
        started_at: Instant,
    },
    /// Queued for a worker, not handed out before `ready_at`.
    Queued {
        ready_at: Instant,
    },
    /// Recorded, and waiting for these steps (upstream runs, or the job's earlier run).
    Waiting {
        upstream: Vec<Step>,
    },
    /// Not recorded yet: its run comes when these steps end (a job that follows its
    /// upstreams). Nothing is expected of it when none of them is pending.
    Expected {
        upstream: Vec<Step>,
    },
}

/// One run, or one run to come, of a chain: its job's history and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub history: History,
    pub stage: Stage,
}

/// When `step` is expected to end at `now`: the `q` quantile of its remaining time; `None`
/// when nothing is pending.
pub fn finish(step: &Step, now: Instant, q: f64) -> Option<Instant> {
    let z = z_of(q);
    let left = remaining(step, now, z)?;
    Some(plus(now, Duration::from_secs_f64(left.at(z))))
}

/// What is left of `step` from `now`.
fn remaining(step: &Step, now: Instant, z: f64) -> Option<Spread> {
    let history = &step.history;
    match &step.stage {
        Stage::Ended => None,
        Stage::Running { started_at } => Some(history.beyond(span(*started_at, now))),
        Stage::Queued { ready_at } => {
            let wait = Spread {
                mean: span(now, *ready_at).as_secs_f64(),
                var: 0.0,
            };
            Some(wait.then(history.whole()))
        }
        Stage::Waiting { upstream } => Some(
            slowest(upstream, now, z)
                .unwrap_or_default()
                .then(history.whole()),
        ),
        Stage::Expected { upstream } => Some(slowest(upstream, now, z)?.then(history.whole())),
    }
}

/// The upstream step expected to end last, by its quantile.
fn slowest(steps: &[Step], now: Instant, z: f64) -> Option<Spread> {
    steps
        .iter()
        .filter_map(|s| remaining(s, now, z))
        .max_by(|a, b| a.at(z).total_cmp(&b.at(z)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn t(m: u32) -> Instant {
        Utc.with_ymd_and_hms(2026, 3, 10, 6, m, 0).unwrap()
    }

    fn minutes(list: &[u64]) -> History {
        History::new(list.iter().map(|m| Duration::from_secs(m * 60)).collect())
    }

    #[test]
    fn a_short_history_predicts_nothing() {
        let step = Step {
            history: minutes(&[10, 10, 10, 10]),
            stage: Stage::Queued { ready_at: t(0) },
        };
        assert_eq!(finish(&step, t(5), 0.9), Some(t(5)));
    }

    #[test]
    fn the_normal_quantile_is_close() {
        assert!((z_of(0.9) - 1.2816).abs() < 1e-3);
        assert!((z_of(0.5)).abs() < 1e-3);
        assert!((z_of(0.1) + 1.2816).abs() < 1e-3);
    }

    #[test]
    fn a_running_run_takes_what_longer_runs_took_beyond_its_elapsed_time() {
        // Fast runs of 10 to 14 minutes and slow ones of 30 to 34.
        let h = minutes(&[10, 11, 12, 13, 14, 30, 31, 32, 33, 34]);
        let running = Step {
            history: h,
            stage: Stage::Running { started_at: t(0) },
        };
        // At 20 minutes only the slow runs are left: 12 more on average, spread 1.4.
        let at_20 = finish(&running, t(20), 0.5).unwrap();
        assert!((at_20 - t(32)).num_seconds().abs() <= 1, "{at_20}");
        let cautious = finish(&running, t(20), 0.9).unwrap();
        assert!(cautious > t(33) && cautious < t(34), "{cautious}");
        // At 5 minutes both kinds are left: the estimate covers the slow ones.
        let early = finish(&running, t(5), 0.9).unwrap();
        assert!(early > t(34), "{early}");
        // Longer than every past run: nothing to go by.
        assert_eq!(finish(&running, t(40), 0.9), Some(t(40)));
    }

    #[test]
    fn a_chain_is_walked_to_the_step_that_is_moving() {
        let ten = minutes(&[10; 10]);
        let running_a = Step {
            history: ten.clone(),
            stage: Stage::Running { started_at: t(0) },
        };
        let expected = |upstream: Step| Step {
            history: ten.clone(),
            stage: Stage::Expected {
                upstream: vec![upstream],
            },
        };
        // A runs (ends at 10), then B, C, D follow it; E waits for D.
        let d = expected(expected(expected(running_a)));
        let e = Step {
            history: ten.clone(),
            stage: Stage::Waiting { upstream: vec![d] },
        };
        assert_eq!(finish(&e, t(2), 0.9), Some(t(50)));
        // Once the chain above has ended, E starts now.
        let done = expected(expected(Step {
            history: ten.clone(),
            stage: Stage::Ended,
        }));
        let e = Step {
            history: ten,
            stage: Stage::Waiting {
                upstream: vec![done],
            },
        };
        assert_eq!(finish(&e, t(2), 0.9), Some(t(12)));
    }

    #[test]
    fn a_chains_spread_adds_up_less_than_its_steps_quantiles() {
        // Five steps of 8 or 12 minutes, half and half: each one's 0.9 quantile is 12, but
        // five of them rarely all take 12.
        let step = || minutes(&[8, 12, 8, 12, 8, 12, 8, 12, 8, 12]);
        let mut chain = Step {
            history: step(),
            stage: Stage::Queued { ready_at: t(0) },
        };
        for _ in 0..4 {
            chain = Step {
                history: step(),
                stage: Stage::Expected {
                    upstream: vec![chain],
                },
            };
        }
        let end = finish(&chain, t(0), 0.9).unwrap();
        // Mean 50 minutes, sd 2 * sqrt(5) = 4.47: 0.9 is about 55.7, well under 60.
        assert!(end > t(55) && end < t(56), "{end}");
    }

    #[test]
    fn a_waiting_run_starts_after_its_slowest_upstream() {
        let ten = minutes(&[10; 10]);
        let e = Step {
            history: ten.clone(),
            stage: Stage::Waiting {
                upstream: vec![
                    Step {
                        history: ten.clone(),
                        stage: Stage::Queued { ready_at: t(30) },
                    },
                    Step {
                        history: ten.clone(),
                        stage: Stage::Running { started_at: t(0) },
                    },
                ],
            },
        };
        assert_eq!(finish(&e, t(1), 0.9), Some(t(50)));
    }
}

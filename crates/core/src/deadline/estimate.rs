//! The finish a run is expected at, from its job's history and what it still waits for: what
//! `at_risk` compares with `finish_by`.
//!
//! The estimator, as docs/JOBS.md states it:
//!
//! - A job's *history* is the durations (first start to end) of its latest runs that
//!   succeeded. With fewer than [`MIN_HISTORY`] of them it predicts nothing beyond what has
//!   passed, so a new job is never called at risk by a guess.
//! - A running run ends at now plus the [`QUANTILE`] of how much longer the past runs that
//!   lasted longer than it has so far took ("it has run 20 minutes; of the runs that took more
//!   than 20, nine in ten were done within 12 more"). A run longer than every past one is
//!   expected to end now: there is nothing to go by.
//! - A queued run starts when it becomes ready (or now), and takes the quantile of its history.
//! - A waiting run starts when the last of its upstream runs is expected to end, each estimated
//!   the same way; an upstream job whose run is not recorded yet (it follows its own upstreams)
//!   is expected after them, so a chain is walked to the run that is moving.
//!
//! The quantile of each step is summed along a chain, which is pessimistic (nine in ten of
//! each is less than nine in ten of the sum): the measured cost is a few false alarms for
//! warnings that come earlier (docs/BENCHMARKS.md, "Deadline warnings").

use super::{plus, span};
use crate::Instant;
use std::time::Duration;

/// Past durations a job needs before its runs are estimated.
pub const MIN_HISTORY: usize = 5;
/// Past durations read per job, the newest.
pub const HISTORY_RUNS: usize = 50;
/// The quantile of past durations a step is expected to take.
pub const QUANTILE: f64 = 0.9;

/// Durations of a job's latest succeeded runs, sorted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(Vec<Duration>);

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

    /// The `q` quantile (nearest rank) of the durations; none with too short a history.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        (self.0.len() >= MIN_HISTORY).then(|| nearest_rank(&self.0, q))
    }

    /// How much longer a run that has run `elapsed` takes: the `q` quantile of what the past
    /// runs longer than that took beyond it. Zero with too short a history, or when no past
    /// run lasted this long.
    pub fn remaining(&self, elapsed: Duration, q: f64) -> Duration {
        if self.0.len() < MIN_HISTORY {
            return Duration::ZERO;
        }
        let beyond: Vec<Duration> = self
            .0
            .iter()
            .filter(|d| **d > elapsed)
            .map(|d| *d - elapsed)
            .collect();
        if beyond.is_empty() {
            Duration::ZERO
        } else {
            nearest_rank(&beyond, q)
        }
    }
}

/// `sorted` is sorted and not empty.
fn nearest_rank(sorted: &[Duration], q: f64) -> Duration {
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

/// When `step` is expected to end, at `now`; `None` when nothing is pending.
pub fn finish(step: &Step, now: Instant, q: f64) -> Option<Instant> {
    let takes = || step.history.quantile(q).unwrap_or_default();
    match &step.stage {
        Stage::Ended => None,
        Stage::Running { started_at } => {
            Some(plus(now, step.history.remaining(span(*started_at, now), q)))
        }
        Stage::Queued { ready_at } => Some(plus((*ready_at).max(now), takes())),
        Stage::Waiting { upstream } => {
            let start = latest(upstream, now, q).unwrap_or(now);
            Some(plus(start.max(now), takes()))
        }
        Stage::Expected { upstream } => {
            let start = latest(upstream, now, q)?;
            Some(plus(start.max(now), takes()))
        }
    }
}

/// The latest expected end among `steps`.
fn latest(steps: &[Step], now: Instant, q: f64) -> Option<Instant> {
    steps.iter().filter_map(|s| finish(s, now, q)).max()
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
        let h = minutes(&[10, 10, 10, 10]);
        assert_eq!(h.quantile(0.9), None);
        assert_eq!(h.remaining(Duration::from_secs(60), 0.9), Duration::ZERO);
        let step = Step {
            history: h,
            stage: Stage::Queued { ready_at: t(0) },
        };
        assert_eq!(finish(&step, t(5), 0.9), Some(t(5)));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let h = minutes(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(h.quantile(0.9), Some(Duration::from_secs(9 * 60)));
        assert_eq!(h.quantile(0.5), Some(Duration::from_secs(5 * 60)));
        assert_eq!(h.quantile(1.0), Some(Duration::from_secs(10 * 60)));
        assert_eq!(h.quantile(0.0), Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_running_run_takes_what_longer_runs_took_beyond_its_elapsed_time() {
        let h = minutes(&[10, 11, 12, 13, 14, 30, 31, 32, 33, 34]);
        let running = Step {
            history: h.clone(),
            stage: Stage::Running { started_at: t(0) },
        };
        // At 5 minutes every past run was longer: nine in ten ended within 28 more minutes.
        assert_eq!(finish(&running, t(5), 0.9), Some(t(33)));
        // At 20 minutes only the slow ones are left: nine in ten ended by 33 in all.
        assert_eq!(finish(&running, t(20), 0.9), Some(t(34)));
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

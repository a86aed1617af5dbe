//! Runs and attempts: their states, the legal transitions, and what follows an attempt's end.
//!
//! A run is one occurrence of a job, keyed by `(job, scheduled_for)`. An attempt is one execution
//! of a run on one worker, holding a lease with a fencing token.

use crate::policy::RetryPolicy;
use crate::Instant;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Held back: by its dependencies (`WaitReason::Dependencies`), or because an earlier run
    /// of the job is still active (overlap `buffer_*`, `WaitReason::Overlap`).
    Waiting,
    /// Ready for a worker from `ready_at` on.
    Queued,
    /// An attempt holds a lease on a worker.
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    Skipped,
}

string_enum!(RunState {
    Waiting => "waiting",
    Queued => "queued",
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
    TimedOut => "timed_out",
    Cancelled => "cancelled",
    Skipped => "skipped",
});

impl RunState {
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            RunState::Waiting | RunState::Queued | RunState::Running
        )
    }

    /// The legal moves of the state machine. Terminal states are final.
    pub fn can_become(self, next: RunState) -> bool {
        use RunState::*;
        match (self, next) {
            (Waiting, Queued | Cancelled | Skipped) => true,
            (Queued, Running | Cancelled | Skipped) => true,
            // Back to queued: a retry, or the attempt's worker died.
            (Running, Queued) => true,
            (Running, s) => s.is_terminal() && s != Skipped,
            _ => false,
        }
    }

    /// Whether a user may reopen a run that ended in this state (`POST /runs/{id}/retry`):
    /// the one way out of a terminal state, never taken by sked itself. The run stays the
    /// same occurrence (id, instant); its attempts keep their outcomes and the audit trail
    /// what it ended as. A success is final; a run that has not ended has nothing to retry.
    pub fn may_reopen(self) -> Result<(), &'static str> {
        match self {
            RunState::Succeeded => Err("it succeeded; a success is final"),
            s if !s.is_terminal() => Err("it has not ended"),
            _ => Ok(()),
        }
    }
}

/// Why a run was recorded as skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    Overlap,
    Paused,
    Misfire,
    /// An upstream run it waited for ended otherwise, and nothing else could meet the wait.
    UpstreamFailed,
    /// Its dependencies were not met within the job's `deps_timeout`.
    DependenciesTimedOut,
    /// Too many runs of the job, or of its namespace, were already waiting for a worker.
    Backlog,
    /// Its instant fell on a day its schedule's calendar closes (the run's `error` says why).
    Calendar,
    /// Its instant fell in one of its job's blackout windows (the run's `error` is the
    /// window's reason).
    Blackout,
}

string_enum!(SkipReason {
    Overlap => "overlap",
    Paused => "paused",
    Misfire => "misfire",
    UpstreamFailed => "upstream_failed",
    DependenciesTimedOut => "dependencies_timed_out",
    Backlog => "backlog",
    Calendar => "calendar",
    Blackout => "blackout",
});

/// What a waiting run waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Its job's `depends_on` is not met yet.
    Dependencies,
    /// An earlier run of its job is still active (overlap `buffer_one`, `buffer_all`).
    Overlap,
    /// A heartbeat job's run waits for a ping (`crate::heartbeat`).
    Ping,
}

string_enum!(WaitReason {
    Dependencies => "dependencies",
    Overlap => "overlap",
    Ping => "ping",
});

/// What made a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    Manual,
    /// An upstream run ended: the run of a job with `depends_on` and no schedule, at the
    /// upstream run's instant.
    Dependency,
    /// An event of the key the job's schedule names (`schedule: {event}`).
    Event,
    /// An instant of the job's schedule from before it was set, asked for by a backfill.
    Backfill,
}

string_enum!(Trigger {
    Schedule => "schedule",
    Manual => "manual",
    Dependency => "dependency",
    Event => "event",
    Backfill => "backfill",
});

/// How an attempt ended, as its worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

string_enum!(AttemptOutcome {
    Succeeded => "succeeded",
    Failed => "failed",
    TimedOut => "timed_out",
    Cancelled => "cancelled",
});

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    /// Its worker stopped heartbeating; the lease was taken away and the run re-queued.
    Lost,
}

string_enum!(AttemptState {
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
    TimedOut => "timed_out",
    Cancelled => "cancelled",
    Lost => "lost",
});

impl From<AttemptOutcome> for AttemptState {
    fn from(o: AttemptOutcome) -> Self {
        match o {
            AttemptOutcome::Succeeded => AttemptState::Succeeded,
            AttemptOutcome::Failed => AttemptState::Failed,
            AttemptOutcome::TimedOut => AttemptState::TimedOut,
            AttemptOutcome::Cancelled => AttemptState::Cancelled,
        }
    }
}

/// What becomes of a run once an attempt has ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AfterAttempt {
    /// Queue the run again, ready at this instant. The failure counts against the budget.
    Retry { ready_at: Instant },
    /// The run ends in this terminal state.
    Finish(RunState),
}

/// Decides the run's fate after an attempt reported `outcome`. `failures` counts the failed or
/// timed-out attempts of the run including this one; `cancel_requested` is set when a user asked
/// to cancel the run while the attempt ran. `unit_random` is uniform in [0, 1) for the jitter.
pub fn after_attempt(
    outcome: AttemptOutcome,
    failures: u32,
    retry: &RetryPolicy,
    cancel_requested: bool,
    now: Instant,
    unit_random: f64,
) -> AfterAttempt {
    let terminal = match outcome {
        AttemptOutcome::Succeeded => return AfterAttempt::Finish(RunState::Succeeded),
        AttemptOutcome::Cancelled => return AfterAttempt::Finish(RunState::Cancelled),
        _ if cancel_requested => return AfterAttempt::Finish(RunState::Cancelled),
        AttemptOutcome::Failed => RunState::Failed,
        AttemptOutcome::TimedOut => RunState::TimedOut,
    };
    if failures >= retry.max_attempts {
        return AfterAttempt::Finish(terminal);
    }
    let delay = retry.delay_after(failures, unit_random);
    let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
    AfterAttempt::Retry {
        ready_at: now.checked_add_signed(delay).unwrap_or(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn terminal_states_are_final() {
        for from in RunState::ALL.iter().copied().filter(|s| s.is_terminal()) {
            for to in RunState::ALL {
                assert!(!from.can_become(*to), "{from} -> {to}");
            }
        }
        assert!(RunState::Running.can_become(RunState::Queued));
        assert!(!RunState::Running.can_become(RunState::Skipped));
        assert!(!RunState::Queued.can_become(RunState::Succeeded));
    }

    #[test]
    fn only_runs_that_ended_otherwise_than_succeeded_reopen() {
        use RunState::*;
        for state in RunState::ALL {
            let reopens = matches!(state, Failed | TimedOut | Cancelled | Skipped);
            assert_eq!(state.may_reopen().is_ok(), reopens, "{state}");
        }
    }

    #[test]
    fn names_round_trip() {
        for s in RunState::ALL {
            assert_eq!(RunState::parse(s.as_str()), Some(*s));
        }
        for s in AttemptState::ALL {
            assert_eq!(AttemptState::parse(s.as_str()), Some(*s));
        }
    }

    #[test]
    fn failures_retry_until_the_budget_is_spent() {
        let now = Utc::now();
        let retry = RetryPolicy {
            max_attempts: 3,
            ..Default::default()
        };
        let first = after_attempt(AttemptOutcome::Failed, 1, &retry, false, now, 0.0);
        assert!(matches!(first, AfterAttempt::Retry { ready_at } if ready_at > now));
        assert!(matches!(
            after_attempt(AttemptOutcome::TimedOut, 2, &retry, false, now, 0.0),
            AfterAttempt::Retry { .. }
        ));
        assert_eq!(
            after_attempt(AttemptOutcome::Failed, 3, &retry, false, now, 0.0),
            AfterAttempt::Finish(RunState::Failed)
        );
        assert_eq!(
            after_attempt(AttemptOutcome::TimedOut, 3, &retry, false, now, 0.0),
            AfterAttempt::Finish(RunState::TimedOut)
        );
    }

    #[test]
    fn success_and_cancellation_end_the_run() {
        let now = Utc::now();
        let retry = RetryPolicy {
            max_attempts: 5,
            ..Default::default()
        };
        assert_eq!(
            after_attempt(AttemptOutcome::Succeeded, 0, &retry, true, now, 0.0),
            AfterAttempt::Finish(RunState::Succeeded)
        );
        assert_eq!(
            after_attempt(AttemptOutcome::Failed, 1, &retry, true, now, 0.0),
            AfterAttempt::Finish(RunState::Cancelled)
        );
    }
}

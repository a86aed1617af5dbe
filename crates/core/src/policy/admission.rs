//! Admission: whether a scheduled instant may queue one more run. A job whose runs are not
//! being taken (no worker, workers too slow) would otherwise pile up runs without end, and with
//! them the dispatcher's memory and the time to read them back at a restart. Past a cap the
//! instant is still recorded, as skipped with reason `backlog`, so nothing is dropped silently.

use crate::run::SkipReason;

/// The most runs that may wait in the queue at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogLimits {
    pub per_job: u64,
    pub per_namespace: u64,
}

impl Default for BacklogLimits {
    fn default() -> Self {
        BacklogLimits {
            per_job: 1_000,
            per_namespace: 100_000,
        }
    }
}

/// `None` when an instant may queue a run, given how many of its job's runs and of its
/// namespace's runs are queued now; `Some(Backlog)` when either is at its cap.
pub fn admit(
    queued_for_job: u64,
    queued_in_namespace: u64,
    limits: BacklogLimits,
) -> Option<SkipReason> {
    (queued_for_job >= limits.per_job || queued_in_namespace >= limits.per_namespace)
        .then_some(SkipReason::Backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_cap_turns_an_instant_into_a_backlog_skip() {
        let limits = BacklogLimits {
            per_job: 3,
            per_namespace: 10,
        };
        assert_eq!(admit(0, 0, limits), None);
        assert_eq!(admit(2, 9, limits), None);
        assert_eq!(admit(3, 0, limits), Some(SkipReason::Backlog));
        assert_eq!(admit(0, 10, limits), Some(SkipReason::Backlog));
    }
}

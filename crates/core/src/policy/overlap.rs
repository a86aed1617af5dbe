//! Overlap: an instant is due while an earlier run of the same job is still active.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Runs may overlap freely.
    #[default]
    Allow,
    /// The new run is recorded as skipped (reason `overlap`).
    Skip,
    /// The new run waits for the active one; at most one waits, later ones are skipped.
    BufferOne,
    /// Every new run waits its turn, in order.
    BufferAll,
    /// The active runs are cancelled and the new one is queued.
    CancelRunning,
}

impl OverlapPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::BufferOne => "buffer_one",
            OverlapPolicy::BufferAll => "buffer_all",
            OverlapPolicy::CancelRunning => "cancel_running",
        }
    }

    /// The policy a new run of `trigger` meets. A backfill asks for every instant of a range
    /// at once: a policy that would drop all but one of them (`skip`, `buffer_one`,
    /// `cancel_running`) makes them wait their turn instead, so each instant runs once.
    pub fn for_trigger(self, trigger: crate::run::Trigger) -> Self {
        match (trigger, self) {
            (crate::run::Trigger::Backfill, OverlapPolicy::Allow) => OverlapPolicy::Allow,
            (crate::run::Trigger::Backfill, _) => OverlapPolicy::BufferAll,
            _ => self,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Allow,
            Self::Skip,
            Self::BufferOne,
            Self::BufferAll,
            Self::CancelRunning,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// The job's runs that are not finished when a new instant fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActiveRuns {
    /// Runs queued or running.
    pub active: u32,
    /// Runs held back by an earlier overlap decision.
    pub waiting: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapDecision {
    /// Queue the new run for dispatch.
    Queue,
    /// Hold the new run until the active ones end.
    Wait,
    /// Record the new run as skipped, reason `overlap`.
    Skip,
    /// Cancel the active (and waiting) runs, then queue the new one.
    CancelActiveThenQueue,
}

pub fn decide(policy: OverlapPolicy, runs: ActiveRuns) -> OverlapDecision {
    let busy = runs.active + runs.waiting > 0;
    match policy {
        OverlapPolicy::Allow => OverlapDecision::Queue,
        _ if !busy => OverlapDecision::Queue,
        OverlapPolicy::Skip => OverlapDecision::Skip,
        OverlapPolicy::BufferOne if runs.waiting == 0 => OverlapDecision::Wait,
        OverlapPolicy::BufferOne => OverlapDecision::Skip,
        OverlapPolicy::BufferAll => OverlapDecision::Wait,
        OverlapPolicy::CancelRunning => OverlapDecision::CancelActiveThenQueue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OverlapDecision::*;

    #[test]
    fn a_backfill_drops_no_instant() {
        use crate::run::Trigger;
        for policy in [
            OverlapPolicy::Skip,
            OverlapPolicy::BufferOne,
            OverlapPolicy::BufferAll,
            OverlapPolicy::CancelRunning,
        ] {
            assert_eq!(
                policy.for_trigger(Trigger::Backfill),
                OverlapPolicy::BufferAll
            );
            assert_eq!(policy.for_trigger(Trigger::Schedule), policy);
        }
        assert_eq!(
            OverlapPolicy::Allow.for_trigger(Trigger::Backfill),
            OverlapPolicy::Allow
        );
    }

    fn runs(active: u32, waiting: u32) -> ActiveRuns {
        ActiveRuns { active, waiting }
    }

    #[test]
    fn an_idle_job_always_queues() {
        for p in [
            OverlapPolicy::Allow,
            OverlapPolicy::Skip,
            OverlapPolicy::BufferOne,
            OverlapPolicy::BufferAll,
            OverlapPolicy::CancelRunning,
        ] {
            assert_eq!(decide(p, runs(0, 0)), Queue, "{p:?}");
            assert_eq!(OverlapPolicy::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn a_busy_job_follows_its_policy() {
        assert_eq!(decide(OverlapPolicy::Allow, runs(3, 0)), Queue);
        assert_eq!(decide(OverlapPolicy::Skip, runs(1, 0)), Skip);
        assert_eq!(decide(OverlapPolicy::BufferOne, runs(1, 0)), Wait);
        assert_eq!(decide(OverlapPolicy::BufferOne, runs(1, 1)), Skip);
        assert_eq!(decide(OverlapPolicy::BufferAll, runs(1, 5)), Wait);
        assert_eq!(
            decide(OverlapPolicy::CancelRunning, runs(1, 0)),
            CancelActiveThenQueue
        );
    }
}

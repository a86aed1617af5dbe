//! Admission: whether a run may join the queue. A job whose runs are not being taken (no
//! worker, workers too slow) would otherwise pile up runs without end, and with them the
//! dispatcher's memory and the time to read them back at a restart. Past a cap the instant is
//! still recorded, as skipped with reason `backlog`, so nothing is dropped silently.
//!
//! One rule for every way a run comes to be: a schedule's instant (the firing loop), a
//! backfill's instants, and the runs an event starts (the store, as it records the event). A
//! write of several runs admits them one by one through [`Admission`], each counting against
//! the caps of the next, so a large write cannot pass a cap that a single one respects.
//!
//! And how a pool of slots shared by every namespace is shared ([`fair_part`]): a namespace
//! may take a slot while it holds fewer than its fair part, so one namespace never holds them
//! all while another waits.

use crate::run::SkipReason;
use std::collections::HashMap;

/// The most runs that may wait in the queue at once: the node's caps (`sked server
/// --max-queued-per-job`, `--max-queued-per-namespace`).
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

impl BacklogLimits {
    /// The caps for a namespace with its own cap on queued runs (`max_queued_runs`), which
    /// replaces the node's per-namespace cap.
    pub fn with_namespace_cap(self, cap: Option<u64>) -> BacklogLimits {
        BacklogLimits {
            per_namespace: cap.unwrap_or(self.per_namespace),
            ..self
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

/// What one run is weighed against: the runs of its job and of its namespace queued now, and
/// the caps that apply to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    pub job: u64,
    pub namespace: u64,
    pub limits: BacklogLimits,
}

/// Admits the runs of one write in turn: each run admitted counts in the backlog of the runs
/// after it, which the queue's own counts do not show until the write is done.
#[derive(Debug, Default)]
pub struct Admission {
    per_job: HashMap<i64, u64>,
    per_namespace: HashMap<String, u64>,
}

impl Admission {
    /// `None` when a run of job `job_id` in `namespace` may queue, given the `backlog` before
    /// this write; it then counts against the runs admitted after it.
    pub fn admit(&mut self, job_id: i64, namespace: &str, backlog: Backlog) -> Option<SkipReason> {
        let job = self.per_job.get(&job_id).copied().unwrap_or(0);
        let in_namespace = self.per_namespace.get(namespace).copied().unwrap_or(0);
        let refused = admit(
            backlog.job.saturating_add(job),
            backlog.namespace.saturating_add(in_namespace),
            backlog.limits,
        );
        if refused.is_none() {
            *self.per_job.entry(job_id).or_default() += 1;
            *self.per_namespace.entry(namespace.to_string()).or_default() += 1;
        }
        refused
    }
}

/// A namespace's fair part of a pool of `total` slots while `holders` namespaces hold some
/// (itself counted, whether it holds any yet or not): `total / (holders + 1)`, at least one.
/// Every holder kept under it leaves as much free for a namespace that holds none, so a
/// newcomer always finds a slot; a namespace alone may hold half the pool.
pub fn fair_part(total: usize, holders: usize) -> usize {
    (total / (holders.max(1) + 1)).max(1)
}

/// Whether a namespace holding `held` of a pool of `total` slots may take one more, while
/// `others` other namespaces hold some.
pub fn may_take_share(total: usize, held: usize, others: usize) -> bool {
    held < fair_part(total, others + 1)
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

    #[test]
    fn a_namespace_cap_replaces_the_nodes() {
        let node = BacklogLimits {
            per_job: 5,
            per_namespace: 100,
        };
        assert_eq!(node.with_namespace_cap(None), node);
        assert_eq!(node.with_namespace_cap(Some(20)).per_namespace, 20);
        assert_eq!(node.with_namespace_cap(Some(20)).per_job, 5);
    }

    #[test]
    fn a_write_of_many_runs_stops_at_the_cap_it_starts_under() {
        let limits = BacklogLimits {
            per_job: 1_000,
            per_namespace: 20,
        };
        let mut admission = Admission::default();
        let before = Backlog {
            job: 0,
            namespace: 5,
            limits,
        };
        let admitted = (0..10_000)
            .filter(|_| admission.admit(7, "team", before).is_none())
            .count();
        assert_eq!(admitted, 15, "20 less the 5 queued before");
        // Another job of the same namespace finds it full; another namespace does not.
        assert_eq!(
            admission.admit(8, "team", before),
            Some(SkipReason::Backlog)
        );
        let elsewhere = Backlog {
            namespace: 0,
            ..before
        };
        assert_eq!(admission.admit(9, "other", elsewhere), None);
        // The per-job cap counts the write's runs too.
        let mut admission = Admission::default();
        let small = Backlog {
            job: 1,
            namespace: 0,
            limits: BacklogLimits {
                per_job: 3,
                per_namespace: 100,
            },
        };
        let admitted = (0..10)
            .filter(|_| admission.admit(1, "a", small).is_none())
            .count();
        assert_eq!(admitted, 2);
    }

    #[test]
    fn a_shared_pool_always_leaves_room_for_a_namespace_holding_none() {
        assert_eq!(fair_part(10_000, 1), 5_000);
        assert_eq!(fair_part(10_000, 2), 3_333);
        assert_eq!(fair_part(3, 10), 1);
        assert!(may_take_share(10_000, 4_999, 0));
        assert!(!may_take_share(10_000, 5_000, 0));
        // However many namespaces fill their parts, a newcomer's part is free.
        for holders in 1..50usize {
            let part = fair_part(10_000, holders);
            let held = part * holders;
            assert!(10_000 - held >= fair_part(10_000, holders + 1));
            assert!(may_take_share(10_000, 0, holders));
        }
    }
}

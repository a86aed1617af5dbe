//! Changes other server nodes commit to a shared store, applied to what this node holds in
//! memory: a changed job reaches the firing loop (which ignores it unless this node holds the
//! job's partition), as does a changed calendar, runs queued elsewhere join this node's dispatch queue, runs started or
//! cancelled elsewhere leave it. When events may have been missed, both are rebuilt from the
//! store. A store that one node uses alone has no events, and this duty does not run.
//!
//! A run queued elsewhere joins this node's queue only once it has stayed queued for
//! [`FOREIGN_GRACE`]: the node that queued it hands it to its own workers first, and nearly
//! always starts it within that time, so this node neither reads it from the store nor hands
//! it out too (two nodes handing out one run make the second wait on the first's row lock
//! and drop it). A run its own node cannot start soon (no free worker there, or none that
//! may take it) still reaches every other node's workers, a grace later.
//!
//! Runs are announced just after their writes commit, so a node that stops in between takes
//! some announcements with it: the dispatcher's reconciliation (`crate::dispatch::reconcile`)
//! finds those runs a while later.

use crate::dispatch::Dispatcher;
use crate::firing::FiringHandle;
use sked_store::{Store, StoreEvent, StoreEvents};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a run queued by another node is left to that node's workers.
pub const FOREIGN_GRACE: Duration = Duration::from_millis(250);

pub async fn run(
    mut events: StoreEvents,
    store: Arc<dyn Store>,
    firing: FiringHandle,
    dispatcher: Arc<Dispatcher>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut pending = Pending::default();
    loop {
        let due = pending
            .next_due()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let first = tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() => None,
            event = events.recv() => match event {
                Some(event) => Some(event),
                None => {
                    tracing::error!("changes: the store stopped sending events");
                    return;
                }
            },
        };
        // Whatever else arrived meanwhile is applied together.
        let mut batch: Vec<StoreEvent> = first.into_iter().collect();
        while let Ok(more) = events.try_recv() {
            batch.push(more);
        }
        let now = Instant::now();
        let mut resync = false;
        for event in batch {
            match event {
                StoreEvent::JobChanged(id) => firing.reload(id),
                StoreEvent::RunsQueued(ids) => pending.announce(ids, now + FOREIGN_GRACE),
                StoreEvent::RunsDequeued(ids) => {
                    pending.forget(&ids);
                    dispatcher.remove(&ids);
                }
                StoreEvent::ScheduleRulesChanged => firing.rules_changed(),
                StoreEvent::Resync => resync = true,
            }
        }
        if resync {
            tracing::info!("changes: events may have been missed; reading everything again");
            pending = Pending::default();
            firing.resync();
            if let Some(runs) = crate::read_queued(&*store, None, &mut shutdown).await {
                dispatcher.replace(runs);
            }
            continue;
        }
        // One read for every run whose grace is over; those started meanwhile are not queued
        // any more and do not come back.
        let due = pending.due(Instant::now());
        if !due.is_empty() {
            if let Some(runs) = crate::read_queued(&*store, Some(&due), &mut shutdown).await {
                dispatcher.enqueue(runs);
            }
        }
    }
}

/// Runs announced as queued by other nodes, each waiting for its grace to end; the graces end
/// in announcement order, since each is the same length.
#[derive(Debug, Default)]
struct Pending {
    order: VecDeque<(Instant, i64)>,
    /// The runs still pending, with when their grace ends. An entry of `order` counts only
    /// while it matches: a run started (or cancelled) meanwhile is not here, and one queued
    /// again since has a later grace of its own.
    due: HashMap<i64, Instant>,
}

impl Pending {
    fn announce(&mut self, ids: Vec<i64>, due: Instant) {
        for id in ids {
            if let Entry::Vacant(slot) = self.due.entry(id) {
                slot.insert(due);
                self.order.push_back((due, id));
            }
        }
    }

    fn forget(&mut self, ids: &[i64]) {
        for id in ids {
            self.due.remove(id);
        }
        self.drop_forgotten();
    }

    /// Whether `order`'s entry `(at, id)` is the run's current one.
    fn current(&self, at: Instant, id: i64) -> bool {
        self.due.get(&id) == Some(&at)
    }

    /// When the next grace ends.
    fn next_due(&self) -> Option<Instant> {
        self.order.front().map(|(due, _)| *due)
    }

    /// The runs whose grace ended by `now`, taken out.
    fn due(&mut self, now: Instant) -> Vec<i64> {
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.order.front() {
            if at > now {
                break;
            }
            self.order.pop_front();
            if self.current(at, id) {
                self.due.remove(&id);
                due.push(id);
            }
        }
        self.drop_forgotten();
        due
    }

    /// Drops forgotten runs from the front, so `next_due` names a run still pending.
    fn drop_forgotten(&mut self) {
        while let Some(&(at, id)) = self.order.front() {
            if self.current(at, id) {
                break;
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_due_after_its_grace_unless_it_was_started_meanwhile() {
        let t0 = Instant::now();
        let grace = Duration::from_millis(250);
        let mut pending = Pending::default();
        pending.announce(vec![1, 2, 3], t0 + grace);
        pending.announce(vec![4, 2], t0 + grace * 2);
        assert_eq!(pending.next_due(), Some(t0 + grace));
        assert!(pending.due(t0).is_empty(), "nothing before its grace ends");
        // Started on the node that queued it: never read here.
        pending.forget(&[1, 3]);
        assert_eq!(pending.due(t0 + grace), vec![2]);
        assert_eq!(pending.next_due(), Some(t0 + grace * 2));
        pending.forget(&[4]);
        assert_eq!(pending.next_due(), None, "nothing left pending");
        assert!(pending.due(t0 + grace * 3).is_empty());
    }

    #[test]
    fn a_run_queued_again_after_it_started_waits_a_whole_new_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_millis(250);
        let mut pending = Pending::default();
        pending.announce(vec![1, 2], t0 + grace);
        // Run 2 started, then failed and was queued again for a retry.
        pending.forget(&[2]);
        pending.announce(vec![2], t0 + grace * 2);
        assert_eq!(pending.due(t0 + grace), vec![1], "not due on its old grace");
        assert_eq!(pending.due(t0 + grace * 2), vec![2]);
    }

    #[test]
    fn a_run_announced_again_keeps_its_first_grace() {
        let t0 = Instant::now();
        let mut pending = Pending::default();
        pending.announce(vec![7], t0);
        pending.announce(vec![7], t0 + Duration::from_secs(1));
        assert_eq!(pending.due(t0), vec![7]);
        assert!(pending.due(t0 + Duration::from_secs(2)).is_empty());
    }
}

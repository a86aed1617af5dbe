//! Changes other server nodes commit to a shared store, applied to what this node holds in
//! memory: a changed job reaches the firing loop (which ignores it unless this node holds the
//! job's partition), runs queued elsewhere join this node's dispatch queue, runs started or
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
//! some announcements with it. Every [`SWEEP_EVERY`] this node pages through the ids of the
//! store's queued runs and takes those queued for longer than [`SWEEP_AGE`] that it does not
//! hold: no run stays queued unseen for longer than that.

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
/// How often the store's queued runs are swept for runs no announcement brought here.
pub const SWEEP_EVERY: Duration = Duration::from_secs(15);
/// How long a run must have been ready before a sweep takes it: announced runs have long
/// arrived by then.
pub const SWEEP_AGE: Duration = Duration::from_secs(5);
/// How many run ids one page of a sweep reads.
const SWEEP_PAGE: u32 = 5_000;

pub async fn run(
    mut events: StoreEvents,
    store: Arc<dyn Store>,
    firing: FiringHandle,
    dispatcher: Arc<Dispatcher>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut pending = Pending::default();
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; the dispatcher has just read every queued run.
    sweep.tick().await;
    loop {
        let due = pending
            .next_due()
            .map(|at| at.saturating_duration_since(Instant::now()));
        let first = tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() => None,
            _ = sweep.tick() => {
                sweep_queued(&*store, &dispatcher, SWEEP_PAGE, &mut shutdown).await;
                continue;
            }
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

/// Takes the store's runs ready for longer than [`SWEEP_AGE`] that this node does not hold,
/// reading their ids `page_size` at a time and the details of the missing ones alone. A page
/// that fails ends this sweep; the next one starts over.
pub(crate) async fn sweep_queued(
    store: &dyn Store,
    dispatcher: &Dispatcher,
    page_size: u32,
    shutdown: &mut watch::Receiver<bool>,
) {
    let before = chrono::Utc::now() - SWEEP_AGE;
    let mut after = 0;
    let mut unseen = 0;
    loop {
        let page = match store.queued_before(before, after, page_size).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!("changes: cannot sweep the queued runs: {e}");
                break;
            }
        };
        let missing = dispatcher.unheld(&page);
        if !missing.is_empty() {
            let Some(runs) = crate::read_queued(store, Some(&missing), shutdown).await else {
                return;
            };
            unseen += dispatcher.enqueue_unheld(runs);
        }
        match page.last() {
            Some(&last) if page.len() == page_size as usize && !*shutdown.borrow() => after = last,
            _ => break,
        }
    }
    if unseen > 0 {
        tracing::info!("changes: {unseen} queued runs no announcement brought here were found");
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
    use crate::metrics::Metrics;
    use sked_store::Fire;

    /// A run whose announcement never came (its node stopped between commit and announcing)
    /// is found by the sweep once it has been ready for a while, and only then.
    #[tokio::test]
    async fn a_sweep_takes_runs_queued_long_ago_that_no_announcement_brought() {
        let dir = tempfile::tempdir().unwrap();
        let store = sked_store::SqliteStore::open(&dir.path().join("sked.db")).unwrap();
        let now = chrono::Utc::now();
        let job = sked_store::contract::job(
            "swept",
            serde_json::json!({"schedule": {"every": "1h"}, "target": {"shell": {"command": "true"}}}),
            now,
        );
        let (_, job) = store
            .put_job("default", &job, sked_store::PutMode::Upsert, now)
            .await
            .unwrap();
        let long_ago = now - chrono::Duration::from_std(SWEEP_AGE * 2).unwrap();
        let fire = |at| Fire {
            job_id: job.id,
            scheduled_for: at,
            trigger: sked_core::run::Trigger::Manual,
            skip: None,
            ready_at: at,
            advance: None,
        };
        let older = long_ago - chrono::Duration::seconds(1);
        let fired = store
            .record_fires(&[fire(older), fire(long_ago), fire(now)], now)
            .await
            .unwrap();
        let ids: Vec<i64> = fired.runs.iter().map(|run| run.run_id).collect();
        let (held, old, new) = (ids[0], ids[1], ids[2]);

        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        dispatcher.enqueue(store.queued_runs(Some(&[held])).await.unwrap());
        let (_stop, mut shutdown) = watch::channel(false);
        // One id a page: the sweep reads on past a page of runs it already holds.
        sweep_queued(&store, &dispatcher, 1, &mut shutdown).await;
        assert!(dispatcher.holds(old), "the old run was taken");
        assert!(
            !dispatcher.holds(new),
            "a run ready just now is left to its announcement"
        );
        // A run already held is not taken twice.
        assert_eq!(
            dispatcher.enqueue_unheld(store.queued_runs(None).await.unwrap()),
            1,
            "only the new run was not held"
        );
    }

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

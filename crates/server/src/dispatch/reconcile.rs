//! Reconciliation: every [`EVERY`], this node's queue is compared with the store's queued
//! runs, and made to agree.
//!
//! - A run the store has queued, ready for longer than [`AGE`], that the node does not hold
//!   is taken: its announcement was lost (a node stopped between its commit and announcing
//!   it), or the node's own read-back after a commit failed.
//! - A run the node holds that the store no longer has queued is dropped: it was started,
//!   cancelled or ended by a path that did not tell this node (another node's change whose
//!   notification was lost, a job's delete, an overlap policy's cancel). Such a run would be
//!   refused at its start anyway, but one that no worker can take would otherwise stay, and
//!   be counted in `sked_queue_depth` and in admission, until a restart.
//!
//! Only runs the node held before the store was read are judged, and each is read once more
//! before it is dropped, so a run queued meanwhile is never lost from the queue. Runs are
//! read a page of ids at a time, so a pass stays cheap however long the queue is.

use super::Dispatcher;
use sked_store::Store;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the queue is compared with the store.
pub const EVERY: Duration = Duration::from_secs(15);
/// How long a run must have been ready before a pass takes it: announced runs and the node's
/// own have long arrived by then.
pub const AGE: Duration = Duration::from_secs(5);
/// How many run ids one page of a pass reads.
const PAGE: u32 = 5_000;

/// What one pass changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Runs queued in the store that the node did not hold, now held.
    pub taken: usize,
    /// Runs the node held that the store no longer has queued, now dropped.
    pub dropped: usize,
}

pub async fn run(
    store: Arc<dyn Store>,
    dispatcher: Arc<Dispatcher>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; the dispatcher has just read every queued run.
    every.tick().await;
    loop {
        tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = every.tick() => {}
        }
        match pass(&*store, &dispatcher, PAGE, &mut shutdown).await {
            Ok(Reconciled { taken, dropped }) => {
                if taken > 0 {
                    tracing::info!(
                        "dispatch: {taken} queued runs no announcement brought here were found"
                    );
                }
                if dropped > 0 {
                    tracing::info!(
                        "dispatch: {dropped} runs no longer queued in the store left the queue"
                    );
                }
            }
            Err(e) => tracing::warn!("dispatch: cannot compare the queue with the store: {e}"),
        }
    }
}

/// One comparison, reading run ids `page_size` at a time. A read that fails ends the pass;
/// the next one starts over.
pub(crate) async fn pass(
    store: &dyn Store,
    dispatcher: &Dispatcher,
    page_size: u32,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Reconciled, sked_store::StoreError> {
    let held_before = dispatcher.lock().queue.stamp();
    let now = chrono::Utc::now();
    let ready_before = now - AGE;
    // Every queued run, whatever its `ready_at`.
    let everything = now + chrono::Duration::days(365 * 100);
    let mut queued = HashSet::new();
    let mut after = 0;
    loop {
        let page = store.queued_before(everything, after, page_size).await?;
        queued.extend(page.iter().copied());
        match page.last() {
            Some(&last) if page.len() == page_size as usize && !*shutdown.borrow() => after = last,
            _ => break,
        }
    }
    if *shutdown.borrow() {
        return Ok(Reconciled::default());
    }
    let mut done = Reconciled::default();
    let missing = dispatcher.unheld(&queued.iter().copied().collect::<Vec<_>>());
    for ids in missing.chunks(page_size as usize) {
        let runs = store.queued_runs(Some(ids)).await?;
        done.taken +=
            dispatcher.enqueue_unheld(runs.into_iter().filter(|run| run.ready_at < ready_before));
    }
    let stale: Vec<i64> = {
        let state = dispatcher.lock();
        state
            .queue
            .held_since(held_before)
            .into_iter()
            .filter(|id| !queued.contains(id))
            .collect()
    };
    for ids in stale.chunks(page_size as usize) {
        // Read again: one queued since the page that would have listed it still stays.
        let still: HashSet<i64> = store
            .queued_runs(Some(ids))
            .await?
            .into_iter()
            .map(|run| run.run_id)
            .collect();
        let gone: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !still.contains(id))
            .collect();
        done.dropped += gone.len();
        dispatcher.remove(&gone);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use sked_store::{Audit, Fire, Store};

    /// A run whose announcement never came (its node stopped between commit and announcing)
    /// is found once it has been ready for a while, and only then; a run held here that the
    /// store no longer has queued (cancelled with no word to this node) leaves the queue.
    #[tokio::test]
    async fn a_pass_takes_old_unheld_runs_and_drops_those_no_longer_queued() {
        let dir = tempfile::tempdir().unwrap();
        let store = sked_store::SqliteStore::open(&dir.path().join("sked.db")).unwrap();
        let now = chrono::Utc::now();
        let job = sked_store::contract::job(
            "swept",
            serde_json::json!({"schedule": {"every": "1h"}, "target": {"shell": {"command": "true"}}}),
            now,
        );
        let (_, job) = store
            .put_job(
                "default",
                &job,
                sked_store::PutMode::Upsert,
                now,
                Audit::none(),
            )
            .await
            .unwrap();
        let long_ago = now - chrono::Duration::from_std(AGE * 2).unwrap();
        let fire = |at| Fire {
            job_id: job.id,
            scheduled_for: at,
            trigger: sked_core::run::Trigger::Manual,
            skip: None,
            ready_at: at,
            advance: None,
            nominal_for: None,
            why: None,
        };
        let older = long_ago - chrono::Duration::seconds(1);
        let oldest = older - chrono::Duration::seconds(1);
        let fired = store
            .record_fires(
                &[fire(oldest), fire(older), fire(long_ago), fire(now)],
                now,
                Audit::none(),
            )
            .await
            .unwrap();
        let ids: Vec<i64> = fired.runs.iter().map(|run| run.run_id).collect();
        let (cancelled, held, old, new) = (ids[0], ids[1], ids[2], ids[3]);

        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        dispatcher.enqueue(store.queued_runs(Some(&[cancelled, held])).await.unwrap());
        store
            .cancel_run(cancelled, now, Audit::none())
            .await
            .unwrap();
        let (_stop, mut shutdown) = watch::channel(false);
        // One id a page: the pass reads on past a page of runs it already holds.
        let done = pass(&store, &dispatcher, 1, &mut shutdown).await.unwrap();
        assert_eq!(
            done,
            Reconciled {
                taken: 1,
                dropped: 1
            }
        );
        assert!(dispatcher.holds(old), "the old run was taken");
        assert!(dispatcher.holds(held));
        assert!(
            !dispatcher.holds(cancelled),
            "the cancelled run was dropped"
        );
        assert!(
            !dispatcher.holds(new),
            "a run ready just now is left to its announcement"
        );
        assert_eq!(dispatcher.lock().queue.depth(), 2);
        // A run already held is not taken twice.
        assert_eq!(
            dispatcher.enqueue_unheld(store.queued_runs(None).await.unwrap()),
            1,
            "only the new run was not held"
        );
        // A run queued after the pass began is never judged by it.
        let again = pass(&store, &dispatcher, 1, &mut shutdown).await.unwrap();
        assert_eq!(again, Reconciled::default());
    }
}

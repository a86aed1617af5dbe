//! Background duties that keep the ledger healthy: the reaper (expired leases, dead workers),
//! dependency timeouts (runs that waited too long for their upstreams), ping deadlines
//! (heartbeat runs whose ping did not come), blackout stops (running runs a window with
//! `cancel_running` stops), the deadline watcher (runs that missed, or are about to miss,
//! their job's `deadline`) and retention (old finished runs). Each is a loop with the same
//! shape, [`every`], and runs only while this node holds the maintenance lease (always, on a
//! single node).

pub mod blackout_stops;
pub mod deadlines;
pub mod dependency_timeouts;
pub mod ping_deadlines;
pub mod reaper;
pub mod retention;

use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// Runs `duty` after `first_delay`, then every `interval` while `elected` is true, until
/// shutdown.
pub async fn every<F, Fut>(
    first_delay: Duration,
    interval: Duration,
    elected: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    mut duty: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut wait = first_delay;
    loop {
        tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if *elected.borrow() {
            duty().await;
        }
        wait = interval;
    }
}

/// Runs ended by one call of a deadline duty, and the dependant runs that queued.
pub struct Expired {
    pub ended: usize,
    pub queued: Vec<i64>,
}

/// Calls `expire` (a store call ending at most `batch` runs whose deadline passed) until it
/// ends fewer, handing the runs it queued to the dispatcher; `what` names the duty in errors.
pub async fn expire_in_batches<F, Fut>(
    state: &crate::AppState,
    what: &str,
    batch: u32,
    mut expire: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = sked_store::Result<Expired>>,
{
    loop {
        let expired = match expire().await {
            Ok(expired) => expired,
            Err(e) => {
                tracing::error!("{what}: {e}");
                return;
            }
        };
        if !expired.queued.is_empty() {
            match state.store.queued_runs(Some(&expired.queued)).await {
                Ok(runs) => state.dispatcher.enqueue(runs),
                Err(e) => tracing::error!("{what}: cannot read released runs: {e}"),
            }
        }
        if expired.ended < batch as usize {
            return;
        }
    }
}

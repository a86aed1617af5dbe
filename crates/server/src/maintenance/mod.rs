//! Background duties that keep the ledger healthy: the reaper (expired leases, dead workers),
//! dependency timeouts (runs that waited too long for their upstreams), ping deadlines
//! (heartbeat runs whose ping did not come) and retention (old finished runs). Each is a loop with the same shape, [`every`], and runs
//! only while this node holds the maintenance lease (always, on a single node).

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

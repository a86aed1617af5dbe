//! The reaper: declares dead the workers that stopped heartbeating and takes their attempts'
//! leases away. Those runs go back to the queue without spending their retry budget; the
//! worker, if it is alive after all, learns at its next heartbeat and stops them.

use crate::AppState;
use chrono::Utc;
use tokio::sync::watch;

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    let config = state.config.clone();
    // Workers heartbeat to a server that just started only from now on: give them one full
    // timeout before judging them, so a restart does not kill healthy workers' attempts.
    let first = config.heartbeat_timeout;
    super::every(
        first,
        config.heartbeat_interval,
        state.maintenance.clone(),
        shutdown,
        || reap_once(&state),
    )
    .await;
}

async fn reap_once(state: &AppState) {
    let now = Utc::now();
    let silent_since =
        now - chrono::Duration::from_std(state.config.heartbeat_timeout).unwrap_or_default();
    let outcome = match state.store.reap(silent_since, now).await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!("reaper: {e}");
            return;
        }
    };
    for worker in &outcome.dead_workers {
        tracing::warn!(%worker, "reaper: a worker missed its heartbeats and is declared dead");
        // Or `known_worker` would still let it lease and complete from memory.
        state.dispatcher.forget_worker(worker);
    }
    state
        .metrics
        .workers_declared_dead
        .inc_by(outcome.dead_workers.len() as u64);
    state
        .metrics
        .attempts_lost
        .inc_by((outcome.requeued.len() + outcome.cancelled.len()) as u64);
    if !outcome.failed.is_empty() {
        tracing::warn!(
            runs = ?outcome.failed,
            "reaper: broadcast shards failed: their worker was lost before they ran"
        );
        state.dispatcher.remove(&outcome.failed);
    }
    if outcome.requeued.is_empty() {
        return;
    }
    match state.store.queued_runs(Some(&outcome.requeued)).await {
        Ok(runs) => state.dispatcher.enqueue(runs),
        Err(e) => tracing::error!("reaper: cannot read re-queued runs: {e}"),
    }
}

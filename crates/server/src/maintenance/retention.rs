//! Retention: deletes finished runs, with their attempts and output, once they are older than
//! the configured retention. Active runs are never touched.

use crate::metrics::Metrics;
use crate::AppState;
use chrono::Utc;
use std::time::Duration;
use tokio::sync::watch;

const BATCH: u32 = 5000;

pub async fn run(state: AppState, mut shutdown: watch::Receiver<bool>) {
    let Some(retention) = state.config.retention else {
        // Nothing to delete, ever; a duty still lasts until shutdown (`serve` stops the node
        // when one ends earlier).
        return crate::stopped(&mut shutdown).await;
    };
    let first = Duration::from_secs(60);
    let interval = Duration::from_secs(600);
    super::every(first, interval, state.maintenance.clone(), shutdown, || {
        delete_old(&state, retention)
    })
    .await;
}

async fn delete_old(state: &AppState, retention: Duration) {
    let before = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
    loop {
        match state.store.delete_finished_runs(before, BATCH).await {
            Ok(deleted) => {
                Metrics::add(&state.metrics.runs_deleted, deleted);
                if deleted < u64::from(BATCH) {
                    return;
                }
            }
            Err(e) => {
                tracing::error!("retention: {e}");
                return;
            }
        }
    }
}

//! Retention: deletes finished runs, with their attempts and output, once they are older than
//! the configured retention, and workers declared dead once they have been silent for the
//! worker retention. Active runs and live workers are never touched.

use crate::metrics::Metrics;
use crate::AppState;
use chrono::Utc;
use std::time::Duration;
use tokio::sync::watch;

const BATCH: u32 = 5000;

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    let first = Duration::from_secs(60);
    let interval = Duration::from_secs(600);
    super::every(
        first,
        interval,
        state.maintenance.clone(),
        shutdown,
        || async {
            if let Some(retention) = state.config.retention {
                delete_old(&state, retention).await;
            }
            delete_dead_workers(&state).await;
        },
    )
    .await;
}

async fn delete_dead_workers(state: &AppState) {
    let retention = chrono::Duration::from_std(state.config.worker_retention).unwrap_or_default();
    let before = Utc::now() - retention;
    loop {
        match state.store.delete_dead_workers(before, BATCH).await {
            Ok(deleted) if deleted < u64::from(BATCH) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::error!("retention of dead workers: {e}");
                return;
            }
        }
    }
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

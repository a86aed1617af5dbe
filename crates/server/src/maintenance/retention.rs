//! Retention: deletes finished runs, with their attempts and output, once they are older than
//! the configured retention, workers declared dead once they have been silent for the worker
//! retention, audit entries older than the audit retention, and events older than the run
//! retention (but never younger than the longest window or dependency timeout may look back,
//! so no wait misses an event retention took), and notifications sent or given up once older
//! than the run retention. Active runs and live workers are never
//! touched.

use crate::AppState;
use chrono::Utc;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

const BATCH: u32 = 5000;
/// Events are kept at least this long: a waiting run is judged up to its `deps_timeout` after
/// its instant, looking a window back from it; both at their longest, and a day more.
const EVENT_FLOOR: Duration = Duration::from_secs(
    sked_core::dependency::MAX_WINDOW.as_secs()
        + sked_core::dependency::MAX_DEPS_TIMEOUT.as_secs()
        + 24 * 3600,
);

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
                delete_old_notifications(&state, retention).await;
                delete_old_events(&state, retention.max(EVENT_FLOOR)).await;
            }
            delete_dead_workers(&state).await;
            if let Some(retention) = state.config.audit_retention {
                delete_old_audit(&state, retention).await;
            }
        },
    )
    .await;
}

async fn delete_dead_workers(state: &AppState) {
    let retention = chrono::Duration::from_std(state.config.worker_retention).unwrap_or_default();
    let before = Utc::now() - retention;
    in_batches("dead workers", || {
        state.store.delete_dead_workers(before, BATCH)
    })
    .await;
}

async fn delete_old_audit(state: &AppState, retention: Duration) {
    let before = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
    in_batches("the audit trail", || {
        state.store.delete_audit_before(before, BATCH)
    })
    .await;
}

async fn delete_old_events(state: &AppState, retention: Duration) {
    let before = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
    in_batches("events", || state.store.delete_events_before(before, BATCH)).await;
}

async fn delete_old_notifications(state: &AppState, retention: Duration) {
    let before = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
    in_batches("notifications", || {
        state.store.delete_notifications_before(before, BATCH)
    })
    .await;
}

async fn delete_old(state: &AppState, retention: Duration) {
    let before = Utc::now() - chrono::Duration::from_std(retention).unwrap_or_default();
    let deleted = in_batches("runs", || state.store.delete_finished_runs(before, BATCH)).await;
    state.metrics.runs_deleted.inc_by(deleted);
}

/// Calls `delete` until it deletes less than a whole batch (or fails); returns how many rows
/// went.
async fn in_batches<F, Fut>(what: &str, mut delete: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = sked_store::Result<u64>>,
{
    let mut total = 0;
    loop {
        match delete().await {
            Ok(deleted) => {
                total += deleted;
                if deleted < u64::from(BATCH) {
                    return total;
                }
            }
            Err(e) => {
                tracing::error!("retention of {what}: {e}");
                return total;
            }
        }
    }
}

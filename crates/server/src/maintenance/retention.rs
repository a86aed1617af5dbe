//! Retention: deletes finished runs, with their attempts and output, once they are older than
//! the configured retention, workers declared dead once they have been silent for the worker
//! retention, audit entries older than the audit retention, and events older than the run
//! retention (but never younger than the longest window or dependency timeout may look back,
//! so no wait misses an event retention took), and notifications sent or given up once older
//! than the run retention; rate keys idle for a minute whatever the retention (their state
//! is then the same as none). Active runs and live workers are never
//! touched.
//!
//! On a store that partitions runs by instant (PostgreSQL), a retention pass first drops the
//! partitions whose runs have all expired, then deletes what is left row by row. Time
//! partitions, a quarter of the run retention each ([`partition_width`]), are made ahead of
//! the clock only with `partition_runs` (experimental), by a duty that also keeps the
//! statistics of those filling up to date; a run in one is kept for at least the retention and
//! at most a partition and a retention pass longer (longer still while its drop fails, since a
//! failed drop keeps the pass from deleting runs row by row).

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

/// How often partitions of runs are made ahead of the clock and their statistics refreshed.
/// Each pass makes what the next two partition widths need, so a node that holds maintenance
/// only now and then still keeps them ahead; the pass is this short for the statistics, which
/// a partition that has just started filling needs within seconds.
const PARTITION_PASS: Duration = Duration::from_secs(15);
/// The shortest partition: retention passes come every ten minutes, so a thinner partition
/// would not go any sooner.
const PARTITION_MIN: Duration = Duration::from_secs(600);

/// How many instants one partition of runs spans under `retention`: a quarter of it, so that
/// about six partitions are live at a time (a lookup by run id visits each).
pub fn partition_width(retention: Duration) -> Duration {
    (retention / 4).max(PARTITION_MIN)
}

/// Makes partitions of runs ahead of the clock, each [`partition_width`] of `retention` long,
/// and refreshes the statistics of those filling; a duty only while a run retention is set
/// (without one, nothing would drop them).
pub async fn prepare_partitions(
    state: AppState,
    retention: Duration,
    shutdown: watch::Receiver<bool>,
) {
    super::every(
        Duration::ZERO,
        PARTITION_PASS,
        state.maintenance.clone(),
        shutdown,
        || async {
            match state
                .store
                .prepare_run_partitions(Utc::now(), partition_width(retention))
                .await
            {
                Ok(0) => {}
                Ok(made) => tracing::info!("made {made} partitions of runs ahead of the clock"),
                Err(e) => tracing::error!("making partitions of runs: {e}"),
            }
        },
    )
    .await;
}

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
            sweep_rate_keys(&state).await;
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

/// Rate keys whose arrival time is past say nothing a missing row would not; a minute's
/// margin keeps those a start batch may be moving right now.
async fn sweep_rate_keys(state: &AppState) {
    match state
        .store
        .sweep_rate_keys(Utc::now() - chrono::Duration::minutes(1))
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::debug!("retention forgot {n} idle rate keys"),
        Err(e) => tracing::error!("retention of idle rate keys (kept until the next pass): {e}"),
    }
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
    match state.store.drop_expired_run_partitions(before).await {
        Ok(0) => {}
        Ok(dropped) => {
            tracing::info!("retention dropped partitions holding {dropped} runs");
            state.metrics.runs_deleted.inc_by(dropped);
        }
        // An expired partition left standing would be deleted below row by row, millions of
        // dead rows where a drop leaves none: the next pass tries the drop again instead.
        Err(e) => {
            tracing::error!("retention of partitions of runs (runs kept until the next pass): {e}");
            return;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_a_quarter_of_the_retention_and_never_thinner_than_a_pass() {
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(
            partition_width(30 * day),
            Duration::from_secs(30 * 6 * 3600)
        );
        assert_eq!(partition_width(day), Duration::from_secs(6 * 3600));
        assert_eq!(partition_width(Duration::from_secs(300)), PARTITION_MIN);
    }
}

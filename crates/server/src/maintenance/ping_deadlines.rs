//! Ping deadlines: a heartbeat job's run still waiting for a ping once its grace has passed
//! ends `failed` (or `succeeded`, when a ping kept from just before its instant credits it),
//! and its dependants are settled in the same transaction (`Store::expire_ping_waits`).
//! Checked once a second, so a missing ping is known within about a second of its deadline.

use crate::AppState;
use chrono::Utc;
use std::time::Duration;
use tokio::sync::watch;

const INTERVAL: Duration = Duration::from_secs(1);
/// Runs ended per store transaction; a larger backlog is worked off batch after batch.
const BATCH: u32 = 500;

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    super::every(
        INTERVAL,
        INTERVAL,
        state.maintenance.clone(),
        shutdown,
        || expire(&state),
    )
    .await;
}

async fn expire(state: &AppState) {
    super::expire_in_batches(state, "ping deadlines", BATCH, || async {
        let expired = state.store.expire_ping_waits(Utc::now(), BATCH).await?;
        if !expired.failed.is_empty() {
            tracing::info!(
                "{} heartbeat runs got no ping within their grace and failed",
                expired.failed.len()
            );
        }
        Ok(super::Expired {
            ended: expired.failed.len() + expired.succeeded.len(),
            queued: expired.queued,
        })
    })
    .await;
}

//! Dependency timeouts: a run still waiting for its dependencies past its job's `deps_timeout`
//! is skipped (`dependencies_timed_out`), and its own dependants are settled in the same
//! transaction (`Store::expire_dependency_waits`). Checked once a second, so a timeout is
//! honoured within about a second.

use crate::AppState;
use chrono::Utc;
use std::time::Duration;
use tokio::sync::watch;

const INTERVAL: Duration = Duration::from_secs(1);
/// Runs skipped per store transaction; a larger backlog is worked off batch after batch.
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
    super::expire_in_batches(state, "dependency timeouts", BATCH, || async {
        let expired = state
            .store
            .expire_dependency_waits(Utc::now(), BATCH)
            .await?;
        if !expired.skipped.is_empty() {
            tracing::info!(
                "{} runs waited for their dependencies past their timeout and were skipped",
                expired.skipped.len()
            );
        }
        Ok(super::Expired {
            ended: expired.skipped.len(),
            queued: expired.queued,
        })
    })
    .await;
}

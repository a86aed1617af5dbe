//! Blackout windows that stop running runs: once a second, the runs of the jobs a window with
//! `cancel_running` covers (a job's own window, or its namespace's) that were already running
//! when it opened are asked to stop (`Store::stop_runs`), as a user's cancel asks, with the
//! window's reason as their error once they end; each worker hears of it at its next
//! heartbeat. Which runs is `sked_core::schedule::blackout::stops`' verdict, from a run's start
//! and the time now alone, and a run asked once is not found again: so the elected node that
//! runs this asks each run once, and a node elected after a failover asks the rest.

use crate::AppState;
use chrono::Utc;
use sked_core::schedule::blackout::stops;
use sked_core::schedule::Blackouts;
use sked_store::StoreError;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

const INTERVAL: Duration = Duration::from_secs(1);
/// Running runs judged per store read; more are read page after page.
const PAGE: u32 = 500;

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    super::every(
        INTERVAL,
        INTERVAL,
        state.maintenance.clone(),
        shutdown,
        || async {
            if let Err(e) = stop_runs_under_windows(&state).await {
                tracing::error!("blackout windows: cannot stop the runs they cover: {e}");
            }
        },
    )
    .await;
}

async fn stop_runs_under_windows(state: &AppState) -> Result<(), StoreError> {
    let now = Utc::now();
    // The namespaces with a window that stops runs; one whose windows no longer check is
    // said loudly where its schedules are read (`schedule_rules`).
    let namespaces: HashMap<String, Blackouts> = state
        .store
        .list_namespaces()
        .await?
        .into_iter()
        .filter_map(|record| match record.spec.blackout_windows() {
            Ok(Some(windows)) if windows.stops_running() => Some((record.name, windows)),
            _ => None,
        })
        .collect();
    let names: Vec<String> = namespaces.keys().cloned().collect();
    let mut after = 0;
    loop {
        let page = state.store.runs_under_windows(&names, after, PAGE).await?;
        let mut asked = Vec::new();
        for run in &page {
            let windows = match Blackouts::compile(&run.blackouts) {
                Ok(windows) => windows,
                Err(e) => {
                    tracing::error!(
                        "job {}/{} has blackout windows that no longer check: {e}",
                        run.namespace,
                        run.job
                    );
                    Blackouts::default()
                }
            };
            let verdict = stops(
                run.trigger,
                run.started_at,
                now,
                &windows,
                namespaces.get(&run.namespace),
            );
            if let Some(reason) = verdict {
                asked.push((run.run_id, reason));
            }
        }
        // Said for the runs this call asked: one line a run, whichever node asks.
        let stopped = match asked.is_empty() {
            true => Vec::new(),
            false => state.store.stop_runs(&asked).await?,
        };
        for id in stopped {
            let run = page.iter().find(|run| run.run_id == id);
            let reason = asked.iter().find(|(asked, _)| *asked == id);
            if let (Some(run), Some((_, reason))) = (run, reason) {
                tracing::info!("run {id} of {}/{}: {reason}", run.namespace, run.job);
            }
        }
        match page.last() {
            Some(last) if page.len() == PAGE as usize => after = last.run_id,
            _ => return Ok(()),
        }
    }
}

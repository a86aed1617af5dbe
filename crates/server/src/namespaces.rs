//! This node's copy of the namespace settings the hot path reads: each namespace's own cap on
//! queued runs, which admission weighs every instant against, and its weight in the fair
//! share of worker slots, which every dispatch match reads. Read at start, again every
//! [`REFRESH`] (so a change made through another node applies here within it) and at once
//! after a change through this node. The store holds the settings; this is only a copy.
//!
//! The other settings (shell targets, the job cap) are applied by the store inside each job
//! write and need no copy.

use crate::{stopped, AppState};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

/// How long a change made through another node may take to apply here.
pub const REFRESH: Duration = Duration::from_secs(2);

async fn refresh(state: &AppState) -> Result<(), sked_store::StoreError> {
    let mut caps: HashMap<String, u64> = HashMap::new();
    let mut weights: HashMap<String, u32> = HashMap::new();
    for namespace in state.store.list_namespaces().await? {
        if let Some(cap) = namespace.spec.max_queued_runs {
            caps.insert(namespace.name.clone(), cap);
        }
        if let Some(weight) = namespace.spec.weight {
            weights.insert(namespace.name, weight);
        }
    }
    state.dispatcher.set_namespace_settings(caps, weights);
    Ok(())
}

/// After a change through this node: a failure is left to the next periodic read.
pub async fn refresh_now(state: &AppState) {
    if let Err(e) = refresh(state).await {
        tracing::warn!("cannot read namespace settings (read again within {REFRESH:?}): {e}");
    }
}

pub async fn run(state: AppState, mut shutdown: watch::Receiver<bool>) {
    loop {
        refresh_now(&state).await;
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(REFRESH) => {}
        }
    }
}

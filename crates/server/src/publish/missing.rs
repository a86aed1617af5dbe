//! The start's look for jobs that name a broker connection this node does not have: a job
//! written on a node with the connection (or before a restart without it) whose runs no
//! publisher here can take. A job routed to worker labels is left out: its workers bring their
//! own connections. The look runs once, beside the start, and only warns.

use sked_core::publish::BrokerConnection;
use sked_store::{JobQuery, JobSort, Store};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most jobs the look reads: past it, it says it stopped.
const MAX_JOBS: usize = 100_000;
/// Jobs read a page at a time.
const PAGE: u32 = 1000;

/// Logs one warning per missing connection, with how many jobs name it and a few of them.
pub async fn warn_missing_connections(store: Arc<dyn Store>, connections: Vec<BrokerConnection>) {
    match missing(store.as_ref(), &connections).await {
        Ok((missing, complete)) => {
            for (connection, jobs) in &missing {
                let shown: Vec<&str> = jobs.iter().take(5).map(String::as_str).collect();
                tracing::warn!(
                    connection = connection.as_str(),
                    jobs = jobs.len(),
                    "{} job(s) publish through broker connection {connection:?}, which this \
                     server does not have (--broker {connection}=URL), so their runs wait: {}{}",
                    jobs.len(),
                    shown.join(", "),
                    if jobs.len() > shown.len() {
                        ", ..."
                    } else {
                        ""
                    }
                );
            }
            if !complete {
                tracing::info!(
                    "the look for jobs naming missing broker connections stopped after \
                     {MAX_JOBS} jobs"
                );
            }
        }
        Err(e) => tracing::warn!("cannot look for jobs naming missing broker connections: {e}"),
    }
}

/// The connections named by jobs routed to no labels that `connections` lacks, each with its
/// jobs (`namespace/name`), and whether every job was read.
async fn missing(
    store: &dyn Store,
    connections: &[BrokerConnection],
) -> sked_store::Result<(BTreeMap<String, Vec<String>>, bool)> {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut read = 0;
    for namespace in store.job_namespaces(u32::MAX).await? {
        let mut cursor = None;
        loop {
            let query = JobQuery {
                namespace: namespace.clone(),
                search: None,
                state: None,
                kind: None,
                last: None,
                label: None,
                sort: JobSort::Name,
                descending: false,
                limit: PAGE,
                cursor,
            };
            let page = store.list_jobs(&query).await?;
            read += page.items.len();
            for job in &page.items {
                let Some(destination) = job.spec.target.destination() else {
                    continue;
                };
                let known = connections.iter().any(|c| c.name == destination.connection);
                if !known && job.spec.routing.labels.is_empty() {
                    missing
                        .entry(destination.connection.to_string())
                        .or_default()
                        .push(format!("{}/{}", job.namespace, job.name));
                }
            }
            if read >= MAX_JOBS {
                return Ok((missing, false));
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    Ok((missing, true))
}

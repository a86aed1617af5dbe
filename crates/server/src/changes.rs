//! Changes other server nodes commit to a shared store, applied to what this node holds in
//! memory: a changed job reaches the firing loop (which ignores it unless this node holds the
//! job's partition), runs queued elsewhere join this node's dispatch queue, runs started or
//! cancelled elsewhere leave it. When events may have been missed, both are rebuilt from the
//! store. A store that one node uses alone has no events, and this duty does not run.

use crate::dispatch::Dispatcher;
use crate::firing::FiringHandle;
use sked_store::{Store, StoreEvent, StoreEvents};
use std::sync::Arc;
use tokio::sync::watch;

pub async fn run(
    mut events: StoreEvents,
    store: Arc<dyn Store>,
    firing: FiringHandle,
    dispatcher: Arc<Dispatcher>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            event = events.recv() => match event {
                Some(event) => event,
                None => {
                    tracing::error!("changes: the store stopped sending events");
                    return;
                }
            },
        };
        // Whatever else arrived meanwhile is applied together: one read for all queued runs.
        let mut batch = vec![first];
        while let Ok(more) = events.try_recv() {
            batch.push(more);
        }
        let mut queued = Vec::new();
        let mut resync = false;
        for event in batch {
            match event {
                StoreEvent::JobChanged(id) => firing.reload(id),
                StoreEvent::RunsQueued(ids) => queued.extend(ids),
                StoreEvent::RunsDequeued(ids) => dispatcher.remove(&ids),
                StoreEvent::Resync => resync = true,
            }
        }
        if resync {
            tracing::info!("changes: events may have been missed; reading everything again");
            firing.resync();
            if let Some(runs) = crate::read_queued(&*store, None, &mut shutdown).await {
                dispatcher.replace(runs);
            }
        } else if !queued.is_empty() {
            if let Some(runs) = crate::read_queued(&*store, Some(&queued), &mut shutdown).await {
                dispatcher.enqueue(runs);
            }
        }
    }
}

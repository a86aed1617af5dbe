//! This node's admission: what each new run is weighed against before it may queue — the runs
//! of its job and of its namespace in this node's queue, the namespace's own cap
//! (`max_queued_runs`) or else the node's (`--max-queued-per-namespace`), and the node's cap
//! per job (`--max-queued-per-job`). The rule is `sked_core::policy::admission`'s; every way
//! a run comes to be goes through it: the firing loop's instants, a backfill's instants, and
//! the runs an event starts (the store asks through [`sked_store::BacklogSource`] while it
//! records the event).

use crate::dispatch::Dispatcher;
use sked_core::policy::admission::Backlog;
use sked_core::policy::BacklogLimits;
use std::sync::Arc;

/// The backlog of this node's queue, under the node's caps.
pub struct NodeBacklog {
    dispatcher: Arc<Dispatcher>,
    limits: BacklogLimits,
    /// Writes of many runs at once (backfills) decide and queue in turn: the queue's counts
    /// show a write's runs only once it has queued them, so two deciding together would each
    /// find room for the same runs.
    turn: tokio::sync::Mutex<()>,
}

impl NodeBacklog {
    pub fn new(dispatcher: Arc<Dispatcher>, limits: BacklogLimits) -> NodeBacklog {
        NodeBacklog {
            dispatcher,
            limits,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// What a run of job `job_id` in `namespace` is weighed against now.
    pub fn of(&self, job_id: i64, namespace: &str) -> Backlog {
        let by_job = self.dispatcher.backlog(job_id);
        let (in_namespace, cap) = self.dispatcher.namespace_backlog(namespace);
        Backlog {
            job: by_job.job,
            namespace: in_namespace.max(by_job.namespace),
            limits: self.limits.with_namespace_cap(cap.or(by_job.namespace_cap)),
        }
    }

    /// Held by a write of many runs from its first decision until its runs are queued.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }
}

impl sked_store::BacklogSource for NodeBacklog {
    fn backlog(&self, job_id: i64, namespace: &str) -> Backlog {
        self.of(job_id, namespace)
    }
}

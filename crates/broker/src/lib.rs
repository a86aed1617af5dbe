//! Broker clients: one open connection per named broker connection (`--broker NAME=URL`), a
//! publish that returns only once the broker confirmed the message (an AMQP ack with nothing
//! returned, a JetStream ack, an `XADD` entry id), and a probe of each connection.
//!
//! Both executors of broker targets use it: the server's publisher (jobs routed to no labels)
//! and a worker started with `--broker` (jobs routed to its labels). This crate owns the
//! broker protocols and nothing else: it keeps no ledger, no health record and no timeouts;
//! its callers bound every call and decide what an outcome means for the run.
//!
//!
//! For Celery targets it also follows a task in a Redis result backend and revokes it; how
//! long to follow is the caller's, and only the revoke after giving up has a bound of its own.
//!
//! One module per broker (`amqp.rs`, `nats.rs`, `redis.rs`) owns its connection and its
//! publish.

mod amqp;
mod nats;
mod redis;

use sked_core::celery::{self, CeleryTarget, Followed, TaskState};
use sked_core::publish::{BrokerConnection, BrokerKind, RunContext};
use sked_core::TargetSpec;
use std::collections::HashMap;

/// Why a message was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker could not be reached, or the connection broke.
    #[error("{0}")]
    Unreachable(String),
    /// The broker answered and did not take the message (unroutable, nack, no stream).
    #[error("{0}")]
    Refused(String),
    /// The target names a connection this process does not have, or one of another kind.
    #[error("{0}")]
    NoConnection(String),
}

enum Link {
    Amqp(amqp::Amqp),
    Nats(nats::Nats),
    Redis(redis::Redis),
}

/// This process's broker connections, by name; each is opened on first use and again after
/// it breaks.
pub struct Brokers {
    links: HashMap<String, Link>,
}

impl Brokers {
    pub fn new(connections: &[BrokerConnection]) -> Brokers {
        let links = connections
            .iter()
            .map(|c| {
                let link = match c.kind {
                    BrokerKind::Amqp => Link::Amqp(amqp::Amqp::new(&c.url)),
                    BrokerKind::Nats => Link::Nats(nats::Nats::new(&c.url)),
                    BrokerKind::Redis => Link::Redis(redis::Redis::new(&c.url)),
                };
                (c.name.clone(), link)
            })
            .collect();
        Brokers { links }
    }

    /// The names of the connections, for a worker's lease requests and for probing.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.links.keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether connection `name` works: the open connection still does, or a new one opens.
    pub async fn probe(&self, name: &str) -> Result<(), PublishError> {
        match self.links.get(name) {
            Some(Link::Amqp(b)) => b.probe().await,
            Some(Link::Nats(b)) => b.probe().await,
            Some(Link::Redis(b)) => b.probe().await,
            None => Err(no_connection(name)),
        }
    }

    /// Publishes `run`'s message for `target` and waits for the broker's confirm.
    pub async fn publish(
        &self,
        target: &TargetSpec,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let Some(destination) = target.destination() else {
            return Err(PublishError::NoConnection(
                "not a broker target: a worker runs it".to_string(),
            ));
        };
        let name = destination.connection;
        match (self.links.get(name), target) {
            (Some(Link::Amqp(b)), TargetSpec::Amqp(t)) => b.publish(t, run).await,
            (Some(Link::Nats(b)), TargetSpec::Nats(t)) => b.publish(t, run).await,
            (Some(Link::Redis(b)), TargetSpec::RedisStream(t)) => b.publish(t, run).await,
            (Some(Link::Amqp(b)), TargetSpec::Celery(t)) => b.publish_celery(t, run).await,
            (Some(Link::Redis(b)), TargetSpec::Celery(t)) => b.publish_celery(t, run).await,
            (None, _) => Err(no_connection(name)),
            (Some(_), _) => Err(PublishError::NoConnection(format!(
                "connection {name:?} is of another kind than the target"
            ))),
        }
    }
}

impl Brokers {
    /// Follows the Celery task of `run` in `target`'s result backend until it ends, and says
    /// how. A state still going (`PENDING`, `STARTED`, `RETRY`) is read again after a pause
    /// that grows to [`CELERY_POLL_MAX`]; so is a backend that cannot be read for a while. The
    /// caller bounds the wait (the job's timeout) and revokes the task when it gives up.
    pub async fn follow_celery(
        &self,
        target: &CeleryTarget,
        run: &RunContext<'_>,
    ) -> Result<TaskState, PublishError> {
        let Some(backend) = target.result_backend.as_deref() else {
            return Err(PublishError::NoConnection(
                "the target names no result_backend to follow".to_string(),
            ));
        };
        let Some(Link::Redis(redis)) = self.links.get(backend) else {
            return Err(PublishError::NoConnection(format!(
                "no Redis connection named {backend:?} here (--broker) for Celery's results"
            )));
        };
        let task_id = celery::task_id(run);
        let mut pause = CELERY_POLL_MIN;
        loop {
            match redis.celery_task_state(&task_id).await {
                Ok(TaskState::Going { .. }) => {}
                Ok(ended) => return Ok(ended),
                Err(e) => tracing::debug!("reading Celery task {task_id}: {e}"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CELERY_POLL_MAX);
        }
    }

    /// Follows the task of `run` (see [`Brokers::follow_celery`]) for at most `limit`, or
    /// until `stop` resolves; giving up revokes the task, waiting at most [`REVOKE_TIMEOUT`]
    /// for the broker to take the revoke.
    pub async fn follow_celery_until(
        &self,
        target: &CeleryTarget,
        run: &RunContext<'_>,
        limit: std::time::Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> Followed {
        let timed_out = tokio::select! {
            followed = tokio::time::timeout(limit, self.follow_celery(target, run)) => {
                match followed {
                    Ok(Ok(state)) => return Followed::Ended(state),
                    Ok(Err(e)) => return Followed::Unfollowable(e.to_string()),
                    Err(_) => true,
                }
            }
            () = stop => false,
        };
        let revoke =
            match tokio::time::timeout(REVOKE_TIMEOUT, self.revoke_celery(target, run)).await {
                Ok(revoked) => revoked.map_err(|e| e.to_string()),
                Err(_) => Err(format!("not confirmed within {REVOKE_TIMEOUT:?}")),
            };
        if timed_out {
            Followed::TimedOut { limit, revoke }
        } else {
            Followed::Stopped { revoke }
        }
    }

    /// Broadcasts Celery's `revoke` (with terminate) of the task of `run` through `target`'s
    /// connection, so a worker that has it drops or stops it.
    pub async fn revoke_celery(
        &self,
        target: &CeleryTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let task_id = celery::task_id(run);
        match self.links.get(&target.connection) {
            Some(Link::Amqp(amqp)) => amqp.revoke_celery(&task_id).await,
            Some(Link::Redis(redis)) => redis.revoke_celery(&task_id).await,
            Some(Link::Nats(_)) => Err(PublishError::NoConnection(format!(
                "connection {:?} is a NATS connection, not Celery's broker",
                target.connection
            ))),
            None => Err(no_connection(&target.connection)),
        }
    }
}

/// The first and the longest pause between two reads of a Celery task's state.
pub const CELERY_POLL_MIN: std::time::Duration = std::time::Duration::from_millis(100);
pub const CELERY_POLL_MAX: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a revoke may take to be taken by the broker.
pub const REVOKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn no_connection(name: &str) -> PublishError {
    PublishError::NoConnection(format!(
        "no broker connection named {name:?} here (--broker)"
    ))
}

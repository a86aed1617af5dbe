//! Broker clients: one open connection per named broker connection (`--broker NAME=URL`), a
//! publish that returns only once the broker confirmed the message (an AMQP ack with nothing
//! returned, a JetStream ack, an `XADD` entry id), and a probe of each connection.
//!
//! Both executors of broker targets use it: the server's publisher (jobs routed to no labels)
//! and a worker started with `--broker` (jobs routed to its labels). This crate owns the
//! broker protocols and nothing else: it keeps no ledger, no health record and no timeouts;
//! its callers bound every call and decide what an outcome means for the run.
//!
//! One module per broker (`amqp.rs`, `nats.rs`, `redis.rs`) owns its connection and its
//! publish.

mod amqp;
mod nats;
mod redis;

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
            (None, _) => Err(no_connection(name)),
            (Some(_), _) => Err(PublishError::NoConnection(format!(
                "connection {name:?} is of another kind than the target"
            ))),
        }
    }
}

fn no_connection(name: &str) -> PublishError {
    PublishError::NoConnection(format!(
        "no broker connection named {name:?} here (--broker)"
    ))
}

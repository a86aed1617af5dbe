//! The server's publisher: this node executes broker targets itself, with no worker in
//! between. It is a worker like any other to the rest of the server — registered in the store,
//! heartbeating, taking runs from the dispatcher (broker targets only, and only it takes them:
//! `sked_core::dispatch::eligible`), starting and completing attempts through
//! `crate::attempts` — so leases, fencing, retries and a dead node's re-queued runs work as
//! they do for every worker.
//!
//! An attempt succeeds only when its broker confirmed the message (an AMQP ack with nothing
//! returned, a JetStream ack, an `XADD` entry id). A broker that is down never holds up the
//! firing loop: instants are still recorded, and each attempt fails (bounded by the job's
//! timeout, or [`DEFAULT_TIMEOUT`]) and is retried by the job's policy.
//!
//! One module per broker (`amqp.rs`, `nats.rs`, `redis.rs`) owns its connection and its
//! publish; this module owns the loop and touches no broker API.

mod amqp;
mod nats;
mod redis;

use crate::metrics::Metrics;
use crate::{attempts, stopped, AppState};
use chrono::Utc;
use sked_core::dispatch::WorkerLoad;
use sked_core::protocol::LeasedAttempt;
use sked_core::publish::{BrokerConnection, BrokerKind, RunContext};
use sked_core::run::AttemptOutcome;
use sked_core::TargetSpec;
use sked_store::{AttemptReport, NewWorker};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Messages being published at once by one node.
const SLOTS: u32 = 4096;
/// How long a publish may wait for its broker when the job sets no `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one poll of the dispatcher waits for runs.
const POLL_WAIT: Duration = Duration::from_secs(1);

/// Why a message was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker could not be reached, or the connection broke.
    #[error("{0}")]
    Unreachable(String),
    /// The broker answered and did not take the message (unroutable, nack, no stream).
    #[error("{0}")]
    Refused(String),
}

enum Broker {
    Amqp(amqp::Amqp),
    Nats(nats::Nats),
    Redis(redis::Redis),
}

/// This node's connections, by name.
struct Brokers(HashMap<String, Broker>);

impl Brokers {
    fn new(connections: &[BrokerConnection]) -> Brokers {
        let brokers = connections
            .iter()
            .map(|c| {
                let broker = match c.kind {
                    BrokerKind::Amqp => Broker::Amqp(amqp::Amqp::new(&c.url)),
                    BrokerKind::Nats => Broker::Nats(nats::Nats::new(&c.url)),
                    BrokerKind::Redis => Broker::Redis(redis::Redis::new(&c.url)),
                };
                (c.name.clone(), broker)
            })
            .collect();
        Brokers(brokers)
    }

    async fn publish(&self, target: &TargetSpec, run: &RunContext<'_>) -> Result<(), String> {
        let destination = target
            .destination()
            .ok_or("not a broker target: a worker runs it")?;
        let name = destination.connection;
        let broker = self.0.get(name).ok_or_else(|| {
            format!("this server has no broker connection named {name:?} (sked server --broker)")
        })?;
        let published = match (broker, target) {
            (Broker::Amqp(b), TargetSpec::Amqp(t)) => b.publish(t, run).await,
            (Broker::Nats(b), TargetSpec::Nats(t)) => b.publish(t, run).await,
            (Broker::Redis(b), TargetSpec::RedisStream(t)) => b.publish(t, run).await,
            _ => {
                return Err(format!(
                    "connection {name:?} is of another kind than the target"
                ))
            }
        };
        published.map_err(|e| format!("connection {name}: {e}"))
    }
}

/// Publishes one attempt's message and says how it went.
async fn publish_one(
    brokers: Arc<Brokers>,
    attempt: LeasedAttempt,
    worker_id: String,
) -> AttemptReport {
    let run = RunContext {
        namespace: &attempt.namespace,
        job: &attempt.job,
        run_id: attempt.run_id,
        attempt: attempt.attempt,
        scheduled_for: attempt.scheduled_for,
    };
    let timeout = attempt
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TIMEOUT);
    let (outcome, error) =
        match tokio::time::timeout(timeout, brokers.publish(&attempt.target, &run)).await {
            Ok(Ok(())) => (AttemptOutcome::Succeeded, None),
            Ok(Err(why)) => (AttemptOutcome::Failed, Some(why)),
            Err(_) => (
                AttemptOutcome::TimedOut,
                Some(format!("no confirm from the broker within {timeout:?}")),
            ),
        };
    AttemptReport {
        attempt_id: attempt.attempt_id,
        token: attempt.token,
        worker_id,
        outcome,
        exit_code: None,
        http_status: None,
        error,
    }
}

/// Registers the publisher as a worker of this node; retried until it works or shutdown.
async fn register(state: &AppState, shutdown: &mut watch::Receiver<bool>) -> Option<String> {
    let id = format!("publisher-{}-{:08x}", state.node.id, rand::random::<u32>());
    let worker = NewWorker {
        id: id.clone(),
        name: format!("publisher of {}", state.node.id),
        labels: BTreeMap::new(),
        slots: SLOTS,
        namespaces: vec![sked_core::auth::ALL_NAMESPACES.to_string()],
        token_id: None,
    };
    loop {
        match state.store.register_worker(&worker, Utc::now()).await {
            Ok(()) => return Some(id),
            Err(e) => tracing::warn!("the publisher cannot register, retrying: {e}"),
        }
        tokio::select! {
            _ = stopped(shutdown) => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Runs until shutdown; without broker connections, it only waits for it.
pub async fn run(state: AppState, mut shutdown: watch::Receiver<bool>) {
    if state.config.brokers.is_empty() {
        stopped(&mut shutdown).await;
        return;
    }
    for connection in &state.config.brokers {
        tracing::info!("broker connection {}", connection.display());
    }
    let brokers = Arc::new(Brokers::new(&state.config.brokers));
    let Some(mut id) = register(&state, &mut shutdown).await else {
        return;
    };
    let mut publishing: JoinSet<AttemptReport> = JoinSet::new();
    let mut running: HashSet<i64> = HashSet::new();
    // Reports the store has not taken yet (it failed); sent again at the next heartbeat.
    let mut unreported: Vec<AttemptReport> = Vec::new();
    let mut heartbeat = tokio::time::interval(state.config.heartbeat_interval);
    loop {
        let load = WorkerLoad {
            id: id.clone(),
            labels: BTreeMap::new(),
            slots: SLOTS,
            running: running.len() as u32,
            warm_keys: Vec::new(),
            namespaces: vec![sked_core::auth::ALL_NAMESPACES.to_string()],
            publisher: true,
        };
        let free = load.free_slots() > 0;
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            handout = state.dispatcher.poll(load, POLL_WAIT), if free => {
                if handout.runs().is_empty() {
                    continue;
                }
                match attempts::start(&state, &id, handout).await {
                    Ok(started) => {
                        for attempt in started {
                            running.insert(attempt.attempt_id);
                            publishing.spawn(publish_one(brokers.clone(), attempt, id.clone()));
                        }
                    }
                    Err(e) => tracing::warn!("the publisher cannot start attempts: {}", e.message),
                }
            }
            Some(done) = publishing.join_next() => {
                let mut reports = Vec::new();
                let mut next = Some(done);
                while let Some(done) = next {
                    match done {
                        Ok(report) => reports.push(report),
                        Err(e) => tracing::error!("a publish task ended abnormally: {e}"),
                    }
                    next = publishing.try_join_next();
                }
                for report in &reports {
                    running.remove(&report.attempt_id);
                }
                count(&state, &reports);
                unreported.extend(reports);
                report(&state, &mut unreported).await;
            }
            _ = heartbeat.tick() => {
                report(&state, &mut unreported).await;
                if !beat(&state, &id, &running, &unreported).await {
                    // Declared dead (this node stalled past the heartbeat timeout): its
                    // attempts were taken back; start again under a new id.
                    running.clear();
                    unreported.clear();
                    publishing.abort_all();
                    match register(&state, &mut shutdown).await {
                        Some(new_id) => id = new_id,
                        None => break,
                    }
                }
            }
        }
    }
    // On shutdown, messages already handed to a broker get a bounded time to be confirmed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, publishing.join_next()).await {
        if let Ok(report) = done {
            unreported.push(report);
        }
    }
    report(&state, &mut unreported).await;
}

fn count(state: &AppState, reports: &[AttemptReport]) {
    let confirmed = reports
        .iter()
        .filter(|r| r.outcome == AttemptOutcome::Succeeded)
        .count() as u64;
    Metrics::add(&state.metrics.messages_published, confirmed);
    Metrics::add(
        &state.metrics.messages_failed,
        reports.len() as u64 - confirmed,
    );
}

/// Sends the reports the store has not taken; keeps them on failure.
async fn report(state: &AppState, unreported: &mut Vec<AttemptReport>) {
    if unreported.is_empty() {
        return;
    }
    match attempts::complete(state, unreported).await {
        Ok(_) => unreported.clear(),
        Err(e) => tracing::warn!(
            "cannot record {} publish outcomes yet: {}",
            unreported.len(),
            e.message
        ),
    }
}

/// Heartbeats the publisher's attempts (those published and not yet recorded are still its
/// own); false when the store no longer knows it.
async fn beat(
    state: &AppState,
    id: &str,
    running: &HashSet<i64>,
    unreported: &[AttemptReport],
) -> bool {
    let held: Vec<i64> = running
        .iter()
        .copied()
        .chain(unreported.iter().map(|r| r.attempt_id))
        .collect();
    let now = Utc::now();
    let forgotten_before = attempts::forgotten_before(state, now);
    match state
        .store
        .heartbeat(
            id,
            &held,
            now,
            attempts::lease_until(state),
            forgotten_before,
        )
        .await
    {
        Ok(outcome) => outcome.known,
        Err(e) => {
            tracing::warn!("the publisher cannot heartbeat: {e}");
            true
        }
    }
}

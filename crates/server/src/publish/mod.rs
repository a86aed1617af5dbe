//! The server's publisher: this node executes broker targets itself, with no worker in
//! between. It is a worker like any other to the rest of the server — registered in the store,
//! heartbeating, taking runs from the dispatcher (broker targets of jobs routed to no labels,
//! and nothing else: `sked_core::dispatch::executes`), starting and completing attempts through
//! `crate::attempts` — so leases, fencing, retries and a dead node's re-queued runs work as
//! they do for every worker.
//!
//! An attempt succeeds only when its broker confirmed the message (an AMQP ack with nothing
//! returned, a JetStream ack, an `XADD` entry id). A broker that is down never holds up the
//! firing loop: instants are still recorded, and each attempt fails (bounded by the job's
//! timeout, or [`DEFAULT_PUBLISH_TIMEOUT`]) and is retried by the job's policy.
//!
//! A target with `await_completion` carries a completion address and token in its envelope
//! (`crate::completion`); once confirmed, its attempt stays running, held and heartbeated
//! here, until the consumer's report ends it (on any node) or its timeout does
//! (`DEFAULT_AWAIT_TIMEOUT` without one). A cancel reaches such a run when its lease runs
//! out: this node stops holding an attempt the store asks it to stop.
//!
//! A Celery target with `await_result` stays held after the confirm while its task is
//! followed in the app's result backend; its task is revoked when the run is cancelled or
//! times out.
//!
//! The broker protocols are `sked_broker`'s; this module owns the loop, and what a publish's
//! outcome means for the connection's health and for the run.

mod health;
mod missing;
mod shares;

pub use health::BrokerHealth;
pub use missing::warn_missing_connections;

use crate::metrics::Metrics;
use crate::{attempts, stopped, AppState};
use chrono::Utc;
use sked_broker::{Brokers, PublishError};
use sked_core::dispatch::WorkerLoad;
use sked_core::protocol::{LeasedAttempt, DEFAULT_AWAIT_TIMEOUT};
use sked_core::publish::{BrokerConnection, RunContext};
use sked_core::run::AttemptOutcome;
use sked_core::TargetSpec;
use sked_store::{AttemptReport, NewWorker};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

/// Messages being published at once by one node.
const SLOTS: u32 = 4096;
/// Runs one node holds while they wait for their consumers' reports; past it, further runs
/// that await completion stay queued until some end (each is listed in every heartbeat).
/// Shared between namespaces ([`shares`]): one holds at most its fair part while others wait.
const MAX_AWAITING: usize = 10_000;

/// How long one poll of the dispatcher waits for runs.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// How long runs and outcomes are gathered into one ledger write when they come one by one.
const LINGER: Duration = Duration::from_millis(10);
/// A handout at least this large is followed by the next poll at once.
const FULL_HANDOUT: usize = 256;
/// How long a probe of a connection may take before it counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// This node's connections, and what it learns of their health.
struct Connections {
    brokers: Brokers,
    health: Arc<BrokerHealth>,
}

impl Connections {
    fn new(connections: &[BrokerConnection], health: Arc<BrokerHealth>) -> Connections {
        Connections {
            brokers: Brokers::new(connections),
            health,
        }
    }

    /// Records how a publish or probe through connection `name` went.
    fn note(&self, name: &str, result: &Result<(), PublishError>) {
        match result {
            // A broker that refused a message answered: the connection works.
            Ok(()) | Err(PublishError::Refused(_)) => self.health.reached(name),
            Err(PublishError::Unreachable(why)) => self.health.unreachable(name, why),
            // Not this connection's doing: the target named one of another kind.
            Err(PublishError::NoConnection(_)) => {}
        }
    }

    /// Checks every connection once (opening those not open yet), so an outage shows in
    /// `/readyz` and `/metrics` before a job needs the broker, and its end without one.
    async fn probe(&self) {
        for name in self.brokers.names() {
            let probed = tokio::time::timeout(PROBE_TIMEOUT, self.brokers.probe(&name))
                .await
                .unwrap_or_else(|_| {
                    Err(PublishError::Unreachable(format!(
                        "no answer within {PROBE_TIMEOUT:?}"
                    )))
                });
            self.note(&name, &probed);
        }
    }

    async fn publish(&self, target: &TargetSpec, run: &RunContext<'_>) -> Result<(), String> {
        let published = self.brokers.publish(target, run).await;
        match target.destination() {
            Some(destination) => {
                self.note(destination.connection, &published);
                published.map_err(|e| format!("connection {}: {e}", destination.connection))
            }
            None => published.map_err(|e| e.to_string()),
        }
    }
}

/// How a publish went: an outcome to record, or a message confirmed whose run now waits for
/// its consumer's report until `deadline`.
enum Published {
    Report(AttemptReport),
    Awaiting {
        attempt_id: i64,
        token: i64,
        deadline: tokio::time::Instant,
        timeout: Duration,
    },
}

/// Publishes one attempt's message and says how it went. A Celery target that awaits its
/// result is followed in its result backend until it ends, its timeout passes, or `cancel`
/// fires (its run was cancelled): the last two revoke the task.
async fn publish_one(
    brokers: Arc<Connections>,
    metrics: Arc<Metrics>,
    attempt: LeasedAttempt,
    worker_id: String,
    cancel: Option<oneshot::Receiver<()>>,
) -> Published {
    let started = tokio::time::Instant::now();
    let run = attempt.run_context();
    let awaits = attempt.completion.is_some();
    let job_timeout = attempt.timeout_ms.map(Duration::from_millis);
    let publish_limit = attempt.publish_limit();
    let confirmed =
        tokio::time::timeout(publish_limit, brokers.publish(&attempt.target, &run)).await;
    if let Ok(Ok(())) = confirmed {
        metrics.published(&attempt.namespace, Utc::now() - attempt.scheduled_for);
    }
    let (outcome, error) = match confirmed {
        Ok(Ok(())) if awaits => {
            let timeout = job_timeout.unwrap_or(DEFAULT_AWAIT_TIMEOUT);
            return Published::Awaiting {
                attempt_id: attempt.attempt_id,
                token: attempt.token,
                deadline: started + timeout,
                timeout,
            };
        }
        Ok(Ok(())) => match sked_core::celery::follows_result(&attempt.target) {
            Some(celery) => {
                let limit = job_timeout
                    .unwrap_or(DEFAULT_AWAIT_TIMEOUT)
                    .saturating_sub(started.elapsed());
                follow_celery(&brokers.brokers, celery, &run, limit, cancel).await
            }
            None => (AttemptOutcome::Succeeded, None),
        },
        Ok(Err(why)) => (AttemptOutcome::Failed, Some(why)),
        Err(_) => (
            AttemptOutcome::TimedOut,
            Some(format!(
                "no confirm from the broker within {publish_limit:?}"
            )),
        ),
    };
    Published::Report(AttemptReport {
        attempt_id: attempt.attempt_id,
        token: attempt.token,
        worker_id,
        outcome,
        exit_code: None,
        http_status: None,
        error,
    })
}

/// Follows a confirmed Celery task to its end (see [`publish_one`]).
async fn follow_celery(
    brokers: &Brokers,
    celery: &sked_core::celery::CeleryTarget,
    run: &RunContext<'_>,
    limit: Duration,
    cancel: Option<oneshot::Receiver<()>>,
) -> (AttemptOutcome, Option<String>) {
    let cancelled = async {
        match cancel {
            Some(cancel) => {
                let _ = cancel.await;
            }
            None => std::future::pending().await,
        }
    };
    brokers
        .follow_celery_until(celery, run, limit, cancelled)
        .await
        .outcome()
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
        publisher: true,
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
    let brokers = Arc::new(Connections::new(
        &state.config.brokers,
        state.brokers.clone(),
    ));
    tokio::spawn(probe(
        brokers.clone(),
        state.config.heartbeat_interval,
        shutdown.clone(),
    ));
    let Some(mut id) = register(&state, &mut shutdown).await else {
        return;
    };
    let mut publishing: JoinSet<Published> = JoinSet::new();
    // Attempts being published, and those whose message was confirmed and whose consumer has
    // not reported yet: this node holds both, and heartbeats them.
    let mut running: HashSet<i64> = HashSet::new();
    let mut awaiting: HashMap<i64, Awaiting> = HashMap::new();
    // Attempts whose Celery task is followed, and how to tell them their run was cancelled.
    let mut cancels: HashMap<i64, oneshot::Sender<()>> = HashMap::new();
    // Which namespaces hold the awaiting slots (attempts awaiting, or being published to).
    let mut shares = shares::Shares::new(MAX_AWAITING);
    // Outcomes go to the store in batches of their own, so recording them never holds up
    // taking and publishing runs; until recorded, they are held (and heartbeated) too.
    let recording = Arc::new(Mutex::new(HashSet::new()));
    let (outcomes, reports) = mpsc::unbounded_channel();
    let recorder = tokio::spawn(record(state.clone(), reports, recording.clone()));
    let send = |report: AttemptReport| {
        let attempt_id = report.attempt_id;
        lock(&recording).insert(attempt_id);
        if outcomes.send(report).is_err() {
            // The recorder is gone (it panicked): no longer holding the attempt lets its lease
            // run out, and the reaper queues its run again, rather than keep it running forever.
            lock(&recording).remove(&attempt_id);
            tracing::error!("the publisher cannot record the outcome of attempt {attempt_id}");
        }
    };
    // After a small handout, the next poll waits a moment, so runs falling due one by one are
    // started (a ledger write) in batches rather than each alone.
    let mut linger: Option<tokio::time::Instant> = None;
    let mut heartbeat = tokio::time::interval(state.config.heartbeat_interval);
    let connections = brokers.brokers.names();
    loop {
        let (full, room) = shares.limits();
        // A namespace at its part of the awaiting slots is passed over ("!name" never names
        // a namespace); a handout brings no more than any other namespace has room for.
        let mut namespaces = vec![sked_core::auth::ALL_NAMESPACES.to_string()];
        namespaces.extend(full.into_iter().map(|n| format!("!{n}")));
        let load = WorkerLoad {
            running: running.len() as u32,
            publisher: true,
            brokers: connections.clone(),
            cap: u32::try_from(room).unwrap_or(u32::MAX),
            namespaces,
            ..WorkerLoad::idle(id.clone(), SLOTS)
        };
        let free = load.free_slots() > 0 && room > 0 && linger.is_none();
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            () = sleep_until(linger), if linger.is_some() => linger = None,
            handout = state.dispatcher.poll(load, POLL_WAIT), if free => {
                let taken = handout.runs().len();
                if taken == 0 {
                    continue;
                }
                if taken < FULL_HANDOUT {
                    linger = Some(tokio::time::Instant::now() + LINGER);
                }
                match attempts::start(&state, &id, handout).await {
                    Ok(started) => {
                        for attempt in started {
                            running.insert(attempt.attempt_id);
                            if attempt.completion.is_some() {
                                shares.hold(attempt.attempt_id, &attempt.namespace);
                            }
                            let cancel = sked_core::celery::follows_result(&attempt.target)
                                .map(|_| {
                                    let (cancel, cancelled) = oneshot::channel();
                                    cancels.insert(attempt.attempt_id, cancel);
                                    cancelled
                                });
                            publishing.spawn(publish_one(
                                brokers.clone(),
                                state.metrics.clone(),
                                attempt,
                                id.clone(),
                                cancel,
                            ));
                        }
                    }
                    Err(e) => tracing::warn!("the publisher cannot start attempts: {}", e.message),
                }
            }
            Some(done) = publishing.join_next() => {
                let mut next = Some(done);
                while let Some(done) = next {
                    match done {
                        Ok(Published::Report(report)) => {
                            running.remove(&report.attempt_id);
                            cancels.remove(&report.attempt_id);
                            shares.release(report.attempt_id);
                            count(&state, &report);
                            send(report);
                        }
                        Ok(Published::Awaiting { attempt_id, token, deadline, timeout }) => {
                            running.remove(&attempt_id);
                            state.metrics.messages_published.inc();
                            awaiting.insert(attempt_id, Awaiting { token, deadline, timeout });
                        }
                        Err(e) => tracing::error!("a publish task ended abnormally: {e}"),
                    }
                    next = publishing.try_join_next();
                }
            }
            _ = heartbeat.tick() => {
                for report in overdue(&mut awaiting, &id) {
                    shares.release(report.attempt_id);
                    send(report);
                }
                let held: Vec<i64> = running
                    .iter()
                    .chain(awaiting.keys())
                    .chain(lock(&recording).iter())
                    .copied()
                    .collect();
                match beat(&state, &id, &held).await {
                    Some(stop) => {
                        // An awaiting attempt the store no longer has running was reported
                        // by its consumer (or cancelled): it is no longer this node's.
                        for attempt_id in stop {
                            if awaiting.remove(&attempt_id).is_some() {
                                shares.release(attempt_id);
                            }
                            // A Celery task followed for a run that was cancelled: revoked.
                            if let Some(cancel) = cancels.remove(&attempt_id) {
                                let _ = cancel.send(());
                            }
                        }
                    }
                    None => {
                        // Declared dead (this node stalled past the heartbeat timeout): its
                        // attempts were taken back, and outcomes still to record will be
                        // refused; start again under a new id.
                        running.clear();
                        awaiting.clear();
                        cancels.clear();
                        shares.clear();
                        publishing.abort_all();
                        match register(&state, &mut shutdown).await {
                            Some(new_id) => id = new_id,
                            None => break,
                        }
                    }
                }
            }
        }
    }
    // On shutdown, messages already handed to a broker get a bounded time to be confirmed,
    // and their outcomes to be recorded. Runs awaiting their consumers stay running: once this
    // node's heartbeats stop, they are taken back and published again (their consumers'
    // reports of the old attempt are refused).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, publishing.join_next()).await {
        if let Ok(Published::Report(report)) = done {
            count(&state, &report);
            send(report);
        }
    }
    drop(outcomes);
    let _ = tokio::time::timeout_at(deadline + Duration::from_secs(5), recorder).await;
    // A clean stop: listed as stopped, not lost, and its awaiting runs are taken back now.
    let stop = state.store.deregister_worker(&id, Utc::now());
    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(2), stop).await {
        tracing::warn!("the publisher could not record its stop: {e}");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn sleep_until(until: Option<tokio::time::Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

/// Records outcomes in batches: whatever arrived within [`LINGER`] of the first, up to
/// [`SLOTS`]; a batch the store did not take is sent again. Ends once the sender is gone and
/// everything is recorded (or the store keeps failing past the caller's bound).
async fn record(
    state: AppState,
    mut reports: mpsc::UnboundedReceiver<AttemptReport>,
    recording: Arc<Mutex<HashSet<i64>>>,
) {
    let mut batch: Vec<AttemptReport> = Vec::new();
    let mut open = true;
    while open || !batch.is_empty() {
        if batch.is_empty() {
            match reports.recv().await {
                Some(report) => batch.push(report),
                None => return,
            }
        }
        let until = tokio::time::Instant::now() + LINGER;
        while open && batch.len() < SLOTS as usize {
            match tokio::time::timeout_at(until, reports.recv()).await {
                Ok(Some(report)) => batch.push(report),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        match attempts::complete(&state, &batch).await {
            Ok(_) => {
                let mut held = lock(&recording);
                for report in batch.drain(..) {
                    held.remove(&report.attempt_id);
                }
            }
            Err(e) => {
                tracing::warn!(
                    "cannot record {} publish outcomes yet: {}",
                    batch.len(),
                    e.message
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// A run whose message was confirmed, waiting for its consumer's report.
struct Awaiting {
    token: i64,
    deadline: tokio::time::Instant,
    timeout: Duration,
}

/// Times out the awaiting runs whose consumer did not report in time.
fn overdue(awaiting: &mut HashMap<i64, Awaiting>, worker_id: &str) -> Vec<AttemptReport> {
    let now = tokio::time::Instant::now();
    let late: Vec<i64> = awaiting
        .iter()
        .filter(|(_, a)| a.deadline <= now)
        .map(|(id, _)| *id)
        .collect();
    late.into_iter()
        .filter_map(|attempt_id| {
            let a = awaiting.remove(&attempt_id)?;
            Some(AttemptReport {
                attempt_id,
                token: a.token,
                worker_id: worker_id.to_string(),
                outcome: AttemptOutcome::TimedOut,
                exit_code: None,
                http_status: None,
                error: Some(format!(
                    "published, but no consumer reported an outcome within {:?}",
                    a.timeout
                )),
            })
        })
        .collect()
}

/// Probes the connections every `every` until shutdown.
async fn probe(brokers: Arc<Connections>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tick.tick() => brokers.probe().await,
        }
    }
}

fn count(state: &AppState, report: &AttemptReport) {
    if report.outcome == AttemptOutcome::Succeeded {
        state.metrics.messages_published.inc();
    } else {
        state.metrics.messages_failed.inc();
    }
}

/// Heartbeats the attempts the publisher holds; the attempts among them the store no longer
/// has running, or `None` when it no longer knows the publisher.
async fn beat(state: &AppState, id: &str, held: &[i64]) -> Option<Vec<i64>> {
    let now = Utc::now();
    let forgotten_before = attempts::forgotten_before(state, now);
    match state
        .store
        .heartbeat(
            id,
            held,
            now,
            attempts::lease_renewal(state),
            forgotten_before,
        )
        .await
    {
        Ok(outcome) => outcome.known.then_some(outcome.stop),
        Err(e) => {
            tracing::warn!("the publisher cannot heartbeat: {e}");
            Some(Vec::new())
        }
    }
}

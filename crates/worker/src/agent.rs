//! The worker's protocol loop: register, heartbeat, lease, stream output, report completions
//! (retried across servers), re-register when forgotten, and shut down within a bound. Owns the
//! worker's bookkeeping of its attempts (which execute, which wait to be reported); it must not
//! execute targets itself (`executor/` does) nor assume anything of the server beyond
//! `sked_core::protocol` and its HTTP statuses.

use crate::client::{segment, CallError, ProtocolClient};
use crate::executor::{self, stop_channel, ExecOptions, ExecResult, StopHandle};
use crate::output::OutputBuffer;
use crate::{error_chain, WorkerConfig, WorkerError};
use rand::Rng;
use sked_broker::Brokers;
use sked_core::egress::EgressPolicy;
use sked_core::limits::Capability;
use sked_core::protocol::{
    CompleteRequest, CompleteResponse, Completion, HeartbeatRequest, HeartbeatResponse,
    LeaseRequest, LeaseResponse, LeasedAttempt, RegisterRequest, RegisterResponse,
};
use sked_core::HumanDuration;
use sked_egress::{SharedPolicy, TargetClient};

/// What HTTP targets' requests say they come from.
const USER_AGENT: &str = concat!("sked-worker/", env!("CARGO_PKG_VERSION"));
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::{sleep, timeout, Instant};
use tracing::Instrument;

/// Largest output chunk sent at once (the server takes up to 8 MiB per request).
const MAX_CHUNK: usize = 512 * 1024;
/// Largest batch of completions per request (the server takes up to 1 MiB of JSON).
const MAX_BATCH: usize = 200;
/// Final output that the server keeps failing to take (5xx) is given up after this many tries,
/// so the completion can still be reported.
const MAX_FINAL_FLUSH_FAILURES: u32 = 5;
/// Heartbeat interval when the server's makes no sense.
const FALLBACK_HEARTBEAT: Duration = Duration::from_secs(2);

/// Runs the worker until `shutdown` resolves: registers, then leases and executes attempts and
/// reports them. At shutdown it stops leasing, stops its running attempts (they end
/// `cancelled`, each process group given `kill_grace`), flushes their output and reports them
/// (for at most `shutdown_timeout`), then returns.
///
/// Returns an error only for what retrying cannot fix: an invalid configuration, or a server
/// that refuses the registration with a 4xx. Unreachable servers are retried until shutdown.
pub async fn run(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    let config = config.validated()?;
    let client = ProtocolClient::new(&config)?;
    // Replaced by the server's policy at registration, before any attempt runs.
    let http_policy = SharedPolicy::new(EgressPolicy::default());
    let exec_http =
        TargetClient::new(http_policy.clone(), USER_AGENT).map_err(WorkerError::HttpClient)?;
    // Set by the shutdown signal, or by the server asking this worker to drain.
    let stopping = Arc::new(watch::channel(false).0);
    let on_signal = stopping.clone();
    let shutdown_task = tokio::spawn(async move {
        shutdown.await;
        on_signal.send_replace(true);
    });
    let result = serve(config, client, exec_http, stopping).await;
    shutdown_task.abort();
    result
}

async fn serve(
    config: WorkerConfig,
    client: ProtocolClient,
    exec_http: TargetClient,
    stopping: Arc<watch::Sender<bool>>,
) -> Result<(), WorkerError> {
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let brokers = Arc::new(Brokers::new(&config.brokers));
    let hosting = Hosting::prepare(&config).await?;
    let agent = Arc::new(Agent {
        hosting,
        config,
        client,
        exec_http: Mutex::new(exec_http),
        brokers,
        session: watch::channel(Session::default()).0,
        register_lock: tokio::sync::Mutex::new(()),
        attempts: Mutex::new(HashMap::new()),
        recent_keys: Mutex::new(Vec::new()),
        slot_freed: Notify::new(),
        finished: finished_tx,
        stopping,
    });
    let Some(session) = agent.register(true).await? else {
        return Ok(());
    };
    tracing::info!(
        "registered with {} as worker {} ({} slots; HTTP targets: {})",
        agent.client.current(),
        session.worker_id,
        agent.config.slots,
        agent.exec_client().policy().current().summary()
    );
    for connection in &agent.config.brokers {
        tracing::info!("broker connection {}", connection.display());
    }
    agent.session.send_replace(session);

    let (done_tx, done) = watch::channel(false);
    let (drain_tx, drained) = watch::channel(false);
    let heartbeats = tokio::spawn(agent.clone().heartbeat_loop(done.clone()));
    let flusher = tokio::spawn(agent.clone().flush_loop(done.clone()));
    let homing = tokio::spawn(agent.clone().home_loop(done.clone()));
    let mut reporter = tokio::spawn(agent.clone().report_loop(finished_rx, drained));

    agent.lease_loop().await;

    // Shutdown. First a drain: nothing new is leased, while heartbeats keep the running
    // attempts' leases and their reports go out as they end, for at most the grace.
    let running = agent.executing();
    if running > 0 && !agent.config.drain_grace.is_zero() {
        tracing::info!(
            "draining: {running} running attempts may finish within {}",
            HumanDuration(agent.config.drain_grace)
        );
        let deadline = Instant::now() + agent.config.drain_grace;
        while agent.executing() > 0 && Instant::now() < deadline {
            sleep(Duration::from_millis(20)).await;
        }
    }
    // Then stop what still runs, wait for it to end, report it.
    let stopped = agent.stop_all("the worker is shutting down");
    if stopped > 0 {
        tracing::info!("shutting down: stopping {stopped} running attempts");
    }
    let bound = agent.config.kill_grace + agent.config.output_drain + Duration::from_secs(3);
    let deadline = Instant::now() + bound;
    while agent.executing() > 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    let left = agent.executing();
    if left > 0 {
        tracing::warn!("{left} attempts did not end in time; they will not be reported");
    }
    drain_tx.send_replace(true);
    if timeout(agent.config.shutdown_timeout, &mut reporter)
        .await
        .is_err()
    {
        reporter.abort();
        let unreported = agent.lock_attempts().len();
        tracing::warn!(
            "gave up reporting {unreported} attempts at shutdown: no server took them in time"
        );
    }
    done_tx.send_replace(true);
    for mut task in [heartbeats, flusher, homing] {
        if timeout(Duration::from_secs(1), &mut task).await.is_err() {
            task.abort();
        }
    }
    agent.deregister().await;
    Ok(())
}

/// Who the worker is for the servers right now.
#[derive(Debug, Clone, Default)]
struct Session {
    worker_id: String,
    heartbeat_interval: Duration,
    /// How long the server keeps this worker's leases after a heartbeat it received; `None`
    /// from a server that does not say.
    heartbeat_timeout: Option<Duration>,
}

impl Session {
    /// How long without a confirmed heartbeat before this worker stops its attempts: one
    /// interval short of the server's timeout, so that they are stopped before the server
    /// declares the worker dead and hands their runs to another worker.
    fn fence_after(&self) -> Option<Duration> {
        let timeout = self.heartbeat_timeout?;
        Some(sked_core::protocol::worker_fence_after(
            timeout,
            self.heartbeat_interval,
        ))
    }
}

/// One attempt the worker holds: executing, or ended and waiting to be reported. Heartbeats
/// list all of them so the server keeps their leases until the report is in.
struct Entry {
    token: i64,
    executing: bool,
    /// Stopped because its lease lapsed unconfirmed: its end is not reported, and heartbeats
    /// stop listing it, so the server ends its lease and queues its run again without
    /// spending a retry (a stop reported as the attempt's result would spend one).
    abandoned: bool,
    /// When it started, and whether it is an HTTP request: what the stall gauge counts.
    started: tokio::time::Instant,
    http: bool,
    stop: StopHandle,
    output: OutputBuffer,
    /// Serializes sending this attempt's output, so chunks arrive in order.
    send_lock: Arc<tokio::sync::Mutex<()>>,
}

/// An ended attempt on its way to the server.
struct Finished {
    completion: Completion,
    output: OutputBuffer,
    send_lock: Arc<tokio::sync::Mutex<()>>,
    output_sent: bool,
    flush_failures: u32,
}

enum Flush {
    /// Everything buffered was sent (or is of no use to anyone).
    Done,
    /// Not sent; try again later.
    Failed { transient_server_error: bool },
}

/// How many HTTP attempts in flight (their start times) are stalled: those in flight longer
/// than `after`, and, with `over`, those beyond the oldest `over` — a target that serves
/// `over` requests at once makes the rest wait, however short they are.
fn stall_gauge(
    mut started: Vec<tokio::time::Instant>,
    now: tokio::time::Instant,
    after: Duration,
    over: Option<u32>,
) -> u32 {
    started.sort_unstable();
    let beyond = over.map_or(usize::MAX, |n| n as usize);
    let stalled = started
        .iter()
        .enumerate()
        .filter(|(i, start)| *i >= beyond || now.saturating_duration_since(**start) > after)
        .count();
    u32::try_from(stalled).unwrap_or(u32::MAX)
}

/// What this host offers attempts beyond plain processes and requests: a cgroup per attempt,
/// a container engine, and the capabilities they add up to.
struct Hosting {
    /// The server that forks shell attempts' supervisors, with `config.supervisor`.
    supervisor: Option<executor::supervisor::client::SupervisorServer>,
    cgroups: Option<executor::cgroup::Cgroups>,
    engine: Option<executor::container::Engine>,
    capabilities: Vec<Capability>,
}

impl Hosting {
    /// Finds them, and removes what a worker of this name killed before left behind: its
    /// attempts' cgroups and containers, whose runs another worker has by now.
    async fn prepare(config: &WorkerConfig) -> Result<Hosting, WorkerError> {
        let root = nix::unistd::geteuid().is_root();
        let supervised = config.supervisor.is_some();
        let cgroups = if root && supervised {
            executor::cgroup::Cgroups::detect()
        } else {
            None
        };
        if let Some(cgroups) = &cgroups {
            let removed = cgroups.reap_orphans();
            if removed > 0 {
                tracing::info!("removed {removed} cgroups of attempts that ended with a worker");
            }
        }
        let engine = match config.container_runtime.as_deref() {
            Some("none") => None,
            named => executor::container::Engine::detect(named, &config.name)
                .await
                .map_err(WorkerError::Config)?,
        };
        if let Some(engine) = &engine {
            match engine.reap_orphans().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    "removed {n} containers left by an earlier run of worker {:?}",
                    config.name
                ),
                Err(e) => tracing::warn!("cannot remove leftover containers: {e}"),
            }
        }
        let mut capabilities = Vec::new();
        if engine.is_some() {
            capabilities.push(Capability::Container);
        }
        if root && supervised {
            capabilities.push(Capability::RunAs);
        }
        if supervised {
            capabilities.push(Capability::Limits);
        }
        tracing::info!(
            "can run: {}; limits through {}",
            if capabilities.is_empty() {
                "plain targets".to_string()
            } else {
                capabilities
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            cgroups.as_ref().map_or("rlimits", |c| c.describe())
        );
        let supervisor = match &config.supervisor {
            None => None,
            Some(executable) => {
                let server = executor::supervisor::client::SupervisorServer::new(executable);
                server
                    .prepare()
                    .await
                    .map_err(|e| WorkerError::Config(e.to_string()))?;
                Some(server)
            }
        };
        Ok(Hosting {
            supervisor,
            cgroups,
            engine,
            capabilities,
        })
    }
}

struct Agent {
    config: WorkerConfig,
    /// How this host runs containers and binds processes, found at start.
    hosting: Hosting,
    client: ProtocolClient,
    /// HTTP targets' client, rebuilt when a registration brings another policy; its
    /// [`SharedPolicy`] is the one in force.
    exec_http: Mutex<TargetClient>,
    /// Broker targets' connections (`--broker`), opened on first use.
    brokers: Arc<Brokers>,
    session: watch::Sender<Session>,
    /// One registration at a time.
    register_lock: tokio::sync::Mutex<()>,
    attempts: Mutex<HashMap<i64, Entry>>,
    /// Affinity keys of its latest attempts, newest last: reported as warm.
    recent_keys: Mutex<Vec<String>>,
    slot_freed: Notify,
    finished: mpsc::UnboundedSender<Finished>,
    /// True once shutdown (a drain) has begun.
    stopping: Arc<watch::Sender<bool>>,
}

impl Agent {
    fn lock_attempts(&self) -> MutexGuard<'_, HashMap<i64, Entry>> {
        self.attempts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn exec_client(&self) -> TargetClient {
        self.exec_http
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Puts the HTTP target policy a server sent at registration in force. Re-registration
    /// after a failover may bring another one (nodes configured apart); a new client then
    /// drops the connections pooled under the old one.
    fn adopt_http_policy(&self, policy: EgressPolicy) {
        let client = self.exec_client();
        if !client.policy().replace(policy) {
            return;
        }
        tracing::info!("HTTP targets: {}", client.policy().current().summary());
        match TargetClient::new(client.policy().clone(), USER_AGENT) {
            Ok(fresh) => {
                *self
                    .exec_http
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
            }
            // The old client reads the same cell, so the new policy applies to it as well.
            Err(e) => tracing::warn!(
                "cannot build a new client for HTTP targets ({}); the previous one enforces \
                 the new policy but keeps its pooled connections",
                error_chain(&e)
            ),
        }
    }

    fn executing(&self) -> usize {
        self.lock_attempts()
            .values()
            .filter(|e| e.executing)
            .count()
    }

    /// The stall gauge over this worker's HTTP attempts in flight ([`stall_gauge`]).
    fn stalled(&self) -> u32 {
        let started: Vec<tokio::time::Instant> = self
            .lock_attempts()
            .values()
            .filter(|e| e.executing && e.http)
            .map(|e| e.started)
            .collect();
        stall_gauge(
            started,
            tokio::time::Instant::now(),
            self.config.stall_after,
            self.config.stall_over,
        )
    }

    fn warm_keys(&self) -> Vec<String> {
        self.recent_keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// The server asked this worker to drain: it shuts down as on a signal.
    fn drain_asked(&self) {
        if !self.stopping.send_replace(true) {
            tracing::info!("the server asked this worker to drain");
        }
    }

    /// Resolves when shutdown has begun.
    async fn stopped(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// Sleeps, unless shutdown begins first. True if it slept the whole time.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = sleep(delay) => true,
            () = self.stopped() => false,
        }
    }

    fn worker_id(&self) -> String {
        self.session.borrow().worker_id.clone()
    }

    // --- registration ---------------------------------------------------------------------

    /// Registers, retrying while no server answers. `None` if shutdown came first. A 4xx is
    /// an error when `refusal_is_fatal` (at start), otherwise retried too.
    async fn register(&self, refusal_is_fatal: bool) -> Result<Option<Session>, WorkerError> {
        let request = RegisterRequest {
            name: self.config.name.clone(),
            labels: self.config.labels.clone(),
            slots: self.config.slots,
        };
        let mut backoff = Backoff::new(&self.config);
        let mut failures = 0u32;
        loop {
            let call = self.client.post_json::<_, RegisterResponse>(
                "/api/v1/workers",
                &request,
                self.config.request_timeout,
            );
            let result = tokio::select! {
                result = call => result,
                () = self.stopped() => return Ok(None),
            };
            match result {
                Ok(answer) => {
                    self.adopt_http_policy(answer.http_target_policy);
                    let interval = Duration::from_millis(answer.heartbeat_interval_ms);
                    let interval = if interval.is_zero() {
                        FALLBACK_HEARTBEAT
                    } else {
                        interval.clamp(Duration::from_millis(50), Duration::from_secs(60))
                    };
                    let timeout = Duration::from_millis(answer.heartbeat_timeout_ms);
                    return Ok(Some(Session {
                        worker_id: answer.worker_id,
                        heartbeat_interval: interval,
                        heartbeat_timeout: (!timeout.is_zero()).then_some(timeout),
                    }));
                }
                Err(CallError::Status {
                    server,
                    status,
                    message,
                    ..
                }) if refusal_is_fatal
                    && (400..500).contains(&status)
                    && status != 408
                    && status != 429 =>
                {
                    return Err(WorkerError::Registration {
                        server,
                        status,
                        message,
                    });
                }
                Err(e) => {
                    failures += 1;
                    if worth_logging(failures) {
                        tracing::warn!("cannot register (try {failures}): {e}");
                    }
                }
            }
            if !self.pause(backoff.next()).await {
                return Ok(None);
            }
        }
    }

    /// The server said it does not know `stale`: stop every attempt (their leases are gone)
    /// and register again. Several loops may notice at once; one registers.
    async fn reregister(&self, stale: &str) {
        let _one_at_a_time = self.register_lock.lock().await;
        if self.worker_id() != stale {
            return;
        }
        let stopped = self.stop_all("the server no longer knows this worker");
        tracing::warn!(
            "the server no longer knows worker {stale}; stopped {stopped} attempts, registering again"
        );
        if self.is_stopping() {
            return;
        }
        if let Ok(Some(session)) = self.register(false).await {
            tracing::info!("registered again as worker {}", session.worker_id);
            self.session.send_replace(session);
        }
    }

    // --- attempts -------------------------------------------------------------------------

    fn stop_attempt(&self, attempt_id: i64, why: &str) {
        let attempts = self.lock_attempts();
        if let Some(entry) = attempts.get(&attempt_id).filter(|e| e.executing) {
            tracing::info!("stopping attempt {attempt_id}: {why}");
            entry.stop.stop();
        }
    }

    /// Stops every executing attempt without reporting its end (see `Entry::abandoned`);
    /// returns how many.
    fn abandon_all(&self, why: &str) -> usize {
        let mut attempts = self.lock_attempts();
        let mut n = 0;
        for (id, entry) in attempts.iter_mut().filter(|(_, e)| e.executing) {
            tracing::debug!("abandoning attempt {id}: {why}");
            entry.abandoned = true;
            entry.stop.stop();
            n += 1;
        }
        n
    }

    /// Stops every executing attempt; returns how many.
    fn stop_all(&self, why: &str) -> usize {
        let attempts = self.lock_attempts();
        let mut n = 0;
        for (id, entry) in attempts.iter().filter(|(_, e)| e.executing) {
            tracing::debug!("stopping attempt {id}: {why}");
            entry.stop.stop();
            n += 1;
        }
        n
    }

    fn start(self: &Arc<Self>, leased: LeasedAttempt) {
        let (stop, signal) = stop_channel();
        let output = OutputBuffer::new(self.config.max_buffered_output);
        let send_lock = Arc::new(tokio::sync::Mutex::new(()));
        {
            let mut attempts = self.lock_attempts();
            if attempts.contains_key(&leased.attempt_id) {
                tracing::warn!("attempt {} was leased twice; ignoring", leased.attempt_id);
                return;
            }
            attempts.insert(
                leased.attempt_id,
                Entry {
                    token: leased.token,
                    executing: true,
                    abandoned: false,
                    started: tokio::time::Instant::now(),
                    http: matches!(leased.target, sked_core::TargetSpec::Http(_)),
                    stop,
                    output: output.clone(),
                    send_lock,
                },
            );
        }
        if let Some(key) = &leased.affinity_key {
            sked_core::dispatch::remember_key(
                &mut self
                    .recent_keys
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
                key,
            );
        }
        // Every line logged about this attempt, here or while it runs, carries these fields;
        // with the run's trace id (when the server exports traces) a log store links its lines
        // to the trace.
        let trace_id = leased
            .traceparent
            .as_deref()
            .and_then(|t| sked_core::trace::TraceParent::parse(t).ok())
            .map(|t| t.trace_id.to_string());
        let span = tracing::info_span!(
            "attempt",
            attempt_id = leased.attempt_id,
            run_id = leased.run_id,
            namespace = %leased.namespace,
            job = %leased.job,
            trace_id = trace_id.as_deref(),
        );
        tracing::info!(parent: &span, "attempt starts");
        let options = ExecOptions {
            timeout: leased.timeout_ms.map(Duration::from_millis),
            kill_grace: self.config.kill_grace,
            output_drain: self.config.output_drain,
            http_body_cap: self.config.http_body_cap,
            supervisor: self.hosting.supervisor.clone(),
            cgroups: self.hosting.cgroups.clone(),
            container_engine: self.hosting.engine.clone(),
        };
        let agent = self.clone();
        tokio::spawn(
            async move {
                let (attempt_id, token) = (leased.attempt_id, leased.token);
                let targets = executor::Targets {
                    http: agent.exec_client(),
                    brokers: agent.brokers.clone(),
                };
                let out = output.clone();
                let execution = tokio::spawn(async move {
                    executor::execute(&leased, &targets, &options, signal, &out).await
                });
                let result = match execution.await {
                    Ok(result) => result,
                    Err(e) => ExecResult::failed(format!("the worker's executor crashed: {e}")),
                };
                agent.finish(attempt_id, token, result);
            }
            .instrument(span),
        );
    }

    /// An attempt ended: free its slot and queue its report.
    fn finish(&self, attempt_id: i64, token: i64, result: ExecResult) {
        tracing::info!(
            outcome = %result.outcome,
            error = result.error.as_deref(),
            "attempt ended"
        );
        {
            let mut attempts = self.lock_attempts();
            let Some(entry) = attempts.get_mut(&attempt_id) else {
                return;
            };
            if entry.abandoned {
                attempts.remove(&attempt_id);
                tracing::info!(
                    "attempt {attempt_id} is not reported: its lease lapsed, and its run goes to \
                     another worker"
                );
                drop(attempts);
                self.slot_freed.notify_one();
                return;
            }
            entry.executing = false;
            let finished = Finished {
                completion: result.into_completion(attempt_id, token),
                output: entry.output.clone(),
                send_lock: entry.send_lock.clone(),
                output_sent: false,
                flush_failures: 0,
            };
            if self.finished.send(finished).is_err() {
                attempts.remove(&attempt_id);
            }
        }
        self.slot_freed.notify_one();
    }

    // --- lease ----------------------------------------------------------------------------

    /// Asks for work whenever a slot is free, until shutdown.
    async fn lease_loop(self: &Arc<Self>) {
        let mut backoff = Backoff::new(&self.config);
        let mut failures = 0u32;
        let slots = self.config.slots as usize;
        while !self.is_stopping() {
            let free = slots.saturating_sub(self.executing());
            if free == 0 {
                tokio::select! {
                    () = self.slot_freed.notified() => {}
                    () = self.stopped() => break,
                }
                continue;
            }
            let worker_id = self.worker_id();
            let request = LeaseRequest {
                max: u32::try_from(free).unwrap_or(u32::MAX),
                wait_ms: u64::try_from(self.config.lease_wait.as_millis()).unwrap_or(u64::MAX),
                brokers: self.brokers.names(),
                capabilities: self.hosting.capabilities.clone(),
            };
            let asked = Instant::now();
            let path = format!("/api/v1/workers/{}/lease", segment(&worker_id));
            let call = self.client.post_json::<_, LeaseResponse>(
                &path,
                &request,
                self.config.lease_wait + self.config.request_timeout,
            );
            let mut call = std::pin::pin!(call);
            let result = tokio::select! {
                result = &mut call => result,
                () = self.stopped() => {
                    // The node may be starting attempts for this poll right now: dropping its
                    // answer would leave them to the reaper. A draining heartbeat makes the
                    // node answer the poll at once; whatever it holds is then run.
                    if let Err(e) = self.heartbeat(&worker_id).await {
                        tracing::warn!(
                            "draining: could not tell the server (its open poll ends on its own \
                             time): {e}"
                        );
                    }
                    match timeout(self.config.request_timeout, call).await {
                        Ok(result) => result,
                        Err(_) => {
                            // Attempts it may still hand this poll go to the reaper and are
                            // run again elsewhere, without spending a retry.
                            tracing::warn!(
                                "draining: the open lease poll did not end within {}; leaving it",
                                HumanDuration(self.config.request_timeout)
                            );
                            break;
                        }
                    }
                }
            };
            match result {
                Ok(answer) => {
                    if failures > 0 {
                        tracing::info!("leasing works again");
                    }
                    failures = 0;
                    backoff.reset();
                    if answer.attempts.len() > free {
                        tracing::warn!(
                            "asked for at most {free} attempts and got {}; running them all",
                            answer.attempts.len()
                        );
                    }
                    let empty = answer.attempts.is_empty();
                    for attempt in answer.attempts {
                        self.start(attempt);
                    }
                    if answer.drain {
                        self.drain_asked();
                    }
                    // A server that answers at once with nothing must not make this spin.
                    if empty && asked.elapsed() < Duration::from_millis(100) {
                        self.pause(Duration::from_millis(100)).await;
                    }
                }
                Err(e) if e.is_unknown_worker() => self.reregister(&worker_id).await,
                Err(e) => {
                    failures += 1;
                    if worth_logging(failures) {
                        tracing::warn!("cannot lease attempts (try {failures}): {e}");
                    }
                    self.pause(backoff.next()).await;
                }
            }
        }
    }

    // --- heartbeat ------------------------------------------------------------------------

    async fn heartbeat_loop(self: Arc<Self>, mut done: watch::Receiver<bool>) {
        let mut failures = 0u32;
        // When the last heartbeat a server answered was sent (at first: registration).
        let mut confirmed = Instant::now();
        let mut fenced = false;
        loop {
            let interval = self.session.borrow().heartbeat_interval;
            tokio::select! {
                () = sleep(interval) => {}
                _ = done.wait_for(|d| *d) => return,
            }
            let worker_id = self.worker_id();
            let sent = Instant::now();
            match self.heartbeat(&worker_id).await {
                Ok(answer) => {
                    if failures > 0 {
                        tracing::info!("heartbeats go through again");
                    }
                    failures = 0;
                    confirmed = sent;
                    fenced = false;
                    for attempt_id in answer.stop {
                        self.stop_attempt(attempt_id, "the server asked to stop it");
                    }
                    if answer.drain {
                        self.drain_asked();
                    }
                }
                Err(e) if e.is_unknown_worker() => {
                    self.reregister(&worker_id).await;
                    confirmed = Instant::now();
                }
                Err(e) => {
                    failures += 1;
                    if worth_logging(failures) {
                        tracing::warn!("heartbeat failed (try {failures}): {e}");
                    }
                    // Cut off from every server: its leases are about to end there and its
                    // runs to go to another worker, so its attempts stop now rather than
                    // running on beside their successors.
                    let fence_after = self.session.borrow().fence_after();
                    if fence_after.is_some_and(|after| !fenced && confirmed.elapsed() >= after) {
                        fenced = true;
                        let stopped = self.abandon_all("no server confirmed its lease");
                        tracing::warn!(
                            "no server has confirmed this worker's leases for {} ms; stopped \
                             {stopped} attempts, which the servers will give to other workers",
                            confirmed.elapsed().as_millis()
                        );
                    }
                }
            }
        }
    }

    /// Tells the server this worker stopped cleanly, once everything is reported: it is then
    /// listed `stopped`, not lost. Tried once; a server that does not answer declares the
    /// worker dead after the heartbeat timeout, as before.
    async fn deregister(&self) {
        let worker_id = self.session.borrow().worker_id.clone();
        let path = format!("/api/v1/workers/{}/deregister", segment(&worker_id));
        let sent = self
            .client
            .post_json::<_, serde_json::Value>(
                &path,
                &serde_json::json!({}),
                self.config.request_timeout.min(Duration::from_secs(3)),
            )
            .await;
        match sent {
            Ok(_) => tracing::info!("worker {worker_id} stopped"),
            Err(e) => tracing::warn!("could not tell the server this worker stopped: {e}"),
        }
    }

    /// One heartbeat: the attempts running, the load, and whether this worker is draining.
    async fn heartbeat(&self, worker_id: &str) -> Result<HeartbeatResponse, CallError> {
        let mut running: Vec<i64> = self.lock_attempts().keys().copied().collect();
        running.sort_unstable();
        let request = HeartbeatRequest {
            running,
            warm_keys: self.warm_keys(),
            stall: self.stalled(),
            overload: self.config.overload,
            draining: self.is_stopping(),
        };
        self.client
            .post_json::<_, HeartbeatResponse>(
                &format!("/api/v1/workers/{}/heartbeat", segment(worker_id)),
                &request,
                self.config.request_timeout,
            )
            .await
    }

    // --- home server ----------------------------------------------------------------------

    /// After a failover, goes back to the first server of the list once it is ready again, so
    /// that a node that returns gets its workers back instead of the survivors keeping them.
    /// A lease poll already waiting elsewhere finishes there; the next one goes home.
    async fn home_loop(self: Arc<Self>, mut done: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                () = sleep(self.config.home_check_interval) => {}
                _ = done.wait_for(|d| *d) => return,
            }
            self.client
                .return_home_if_ready(self.config.request_timeout)
                .await;
        }
    }

    // --- output ---------------------------------------------------------------------------

    async fn flush_loop(self: Arc<Self>, mut done: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.output_flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = done.wait_for(|d| *d) => return,
            }
            let due: Vec<_> = self
                .lock_attempts()
                .iter()
                .filter(|(_, e)| e.executing && !e.output.is_empty())
                .map(|(id, e)| (*id, e.token, e.output.clone(), e.send_lock.clone()))
                .collect();
            let flushes = due
                .iter()
                .map(|(id, token, output, lock)| self.flush(*id, *token, output, lock));
            futures_util::future::join_all(flushes).await;
        }
    }

    /// Sends what the attempt's output holds, in order.
    async fn flush(
        &self,
        attempt_id: i64,
        token: i64,
        output: &OutputBuffer,
        send_lock: &tokio::sync::Mutex<()>,
    ) -> Flush {
        let _in_order = send_lock.lock().await;
        loop {
            let chunk = output.take(MAX_CHUNK);
            if chunk.is_empty() {
                return Flush::Done;
            }
            let path = format!(
                "/api/v1/attempts/{attempt_id}/log?token={token}&worker={}",
                segment(&self.worker_id())
            );
            let result = self
                .client
                .post_bytes(&path, chunk.clone(), self.config.request_timeout)
                .await;
            match result {
                Ok(()) => {}
                Err(CallError::Status { status: 409, .. }) => {
                    // The lease is gone: nobody will read this output, and the attempt must stop.
                    output.discard();
                    self.stop_attempt(attempt_id, "its lease was taken away (output fenced)");
                    return Flush::Done;
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!("cannot send output of attempt {attempt_id}: {e}");
                    output.restore(chunk);
                    return Flush::Failed {
                        transient_server_error: !matches!(e, CallError::Unreachable(_)),
                    };
                }
                Err(e) => {
                    tracing::warn!(
                        "the server refused {} bytes of output of attempt {attempt_id}; dropping them: {e}",
                        chunk.len()
                    );
                }
            }
        }
    }

    // --- completions ----------------------------------------------------------------------

    /// Reports ended attempts, batched, retried with backoff until a server answers. Ends once
    /// `drained` is set and nothing is left to report.
    async fn report_loop(
        self: Arc<Self>,
        mut finished: mpsc::UnboundedReceiver<Finished>,
        mut drained: watch::Receiver<bool>,
    ) {
        let mut pending: Vec<Finished> = Vec::new();
        let mut backoff = Backoff::new(&self.config);
        let mut failures = 0u32;
        loop {
            if pending.is_empty() {
                tokio::select! {
                    next = finished.recv() => match next {
                        Some(f) => pending.push(f),
                        None => return,
                    },
                    _ = drained.wait_for(|d| *d) => {}
                }
            }
            while let Ok(f) = finished.try_recv() {
                pending.push(f);
            }
            if pending.is_empty() {
                // Only reached once drained: every attempt has ended and been reported.
                return;
            }
            match self.report(&mut pending).await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!("completions go through again");
                    }
                    failures = 0;
                    backoff.reset();
                }
                Err(e) => {
                    failures += 1;
                    if worth_logging(failures) {
                        tracing::warn!(
                            "cannot report {} completions (try {failures}): {e}",
                            pending.len()
                        );
                    }
                    sleep(backoff.next()).await;
                }
            }
        }
    }

    /// One round: send the remaining output of the pending attempts, then complete those whose
    /// output is sent. Error: nothing could be completed, try again later.
    async fn report(&self, pending: &mut Vec<Finished>) -> Result<(), CallError> {
        for f in pending.iter_mut().filter(|f| !f.output_sent) {
            let id = f.completion.attempt_id;
            match self
                .flush(id, f.completion.token, &f.output, &f.send_lock)
                .await
            {
                Flush::Done => f.output_sent = true,
                Flush::Failed {
                    transient_server_error,
                } => {
                    f.flush_failures += 1;
                    if transient_server_error && f.flush_failures >= MAX_FINAL_FLUSH_FAILURES {
                        tracing::warn!(
                            "giving up on the output of attempt {id}: the server keeps failing"
                        );
                        f.output.discard();
                        f.output_sent = true;
                    } else {
                        // Output goes before completions; without it, nothing to complete.
                        break;
                    }
                }
            }
        }
        let batch: Vec<Completion> = pending
            .iter()
            .filter(|f| f.output_sent)
            .take(MAX_BATCH)
            .map(|f| f.completion.clone())
            .collect();
        if batch.is_empty() {
            return Err(CallError::Unreachable(
                "the output of the ended attempts could not be sent".to_string(),
            ));
        }
        let ids: Vec<i64> = batch.iter().map(|c| c.attempt_id).collect();
        let worker_id = self.worker_id();
        let result = self
            .client
            .post_json::<_, CompleteResponse>(
                &format!("/api/v1/workers/{}/complete", segment(&worker_id)),
                &CompleteRequest { completions: batch },
                self.config.request_timeout,
            )
            .await;
        match result {
            Ok(answer) => {
                for r in answer.results {
                    if r.accepted {
                        tracing::debug!("completion of attempt {} accepted", r.attempt_id);
                    } else {
                        tracing::warn!(
                            "completion of attempt {} rejected ({}); dropping it",
                            r.attempt_id,
                            r.reason.as_deref().unwrap_or("no reason given")
                        );
                    }
                }
            }
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                tracing::error!("the server refused completions {ids:?}; dropping them: {e}");
            }
        }
        pending.retain(|f| !ids.contains(&f.completion.attempt_id));
        let mut attempts = self.lock_attempts();
        for id in &ids {
            attempts.remove(id);
        }
        Ok(())
    }
}

/// Exponential backoff with jitter (each delay is 50-100% of the nominal one).
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &WorkerConfig) -> Self {
        Backoff {
            initial: config.retry_initial,
            max: config.retry_max,
            next: config.retry_initial,
        }
    }

    fn next(&mut self) -> Duration {
        let nominal = self.next;
        self.next = (self.next * 2).min(self.max);
        nominal.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Repeated failures are logged the first time and every 30th time after, not every time.
fn worth_logging(failures: u32) -> bool {
    // Not `is_multiple_of`: the workspace supports Rust 1.80.
    failures == 1 || failures.checked_rem(30) == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_worker_stops_its_attempts_one_interval_before_the_server_gives_up_on_it() {
        let session = |interval: u64, timeout: Option<u64>| Session {
            worker_id: "w".into(),
            heartbeat_interval: Duration::from_millis(interval),
            heartbeat_timeout: timeout.map(Duration::from_millis),
        };
        let ms = Duration::from_millis;
        assert_eq!(session(2000, Some(10_000)).fence_after(), Some(ms(8000)));
        assert_eq!(session(300, Some(2000)).fence_after(), Some(ms(1700)));
        // A timeout under two intervals still leaves the worker one interval to hear back.
        assert_eq!(session(2000, Some(3000)).fence_after(), Some(ms(2000)));
        assert_eq!(session(2000, None).fence_after(), None);
    }

    #[test]
    fn the_stall_gauge_counts_slow_requests_and_those_beyond_the_targets_concurrency() {
        let now = tokio::time::Instant::now() + Duration::from_secs(100);
        let ago = |s: u64| now - Duration::from_secs(s);
        let started = vec![ago(1), ago(30), ago(2), ago(3), ago(0)];
        let after = Duration::from_secs(10);
        assert_eq!(
            stall_gauge(started.clone(), now, after, None),
            1,
            "one past 10 s"
        );
        // A target serving 3 at once: the two newest wait, and the oldest is slow.
        assert_eq!(stall_gauge(started.clone(), now, after, Some(3)), 3);
        assert_eq!(stall_gauge(started.clone(), now, after, Some(0)), 5);
        assert_eq!(stall_gauge(Vec::new(), now, after, Some(0)), 0);
    }
}

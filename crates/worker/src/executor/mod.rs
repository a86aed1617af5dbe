//! Executors: run one attempt's target and say how it ended. This module owns what they share
//! (what the job sees of its run, the options, the stop signal, the result) and picks the
//! executor for a target. Executors must not speak the worker protocol nor touch the agent's
//! bookkeeping: they write output to an [`OutputBuffer`] and return an [`ExecResult`].

pub mod bind;
pub mod broker;
pub mod cgroup;
pub mod container;
pub mod http;
mod pipes;
pub mod shell;
pub mod supervisor;

use crate::output::OutputBuffer;
use chrono::SecondsFormat;
use sked_broker::Brokers;
use sked_core::event::RunEvent;
use sked_core::protocol::{Completion, CompletionAddress, LeasedAttempt, DEFAULT_AWAIT_TIMEOUT};
use sked_core::{AttemptOutcome, Instant, TargetSpec};
use sked_egress::TargetClient;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What a job sees of its run (environment for shell, headers for HTTP).
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The attempt's own id: what its cgroup and its container are named after.
    pub attempt_id: i64,
    pub run_id: i64,
    /// 1 for the first attempt of the run.
    pub attempt: u32,
    pub scheduled_for: Instant,
    pub job: String,
    /// Where an HTTP target with `callback` has its endpoint report the outcome.
    pub completion: Option<CompletionAddress>,
    /// The event that started the run: `SKED_EVENT_*` for shell, the body for HTTP.
    pub event: Option<RunEvent>,
    /// For a run of a sharded job: `SKED_SHARD`/`SKED_SHARDS`, or their headers.
    pub shard: Option<sked_core::shard::Shard>,
    /// The HTTP target's headers whose values were secrets: never sent to another origin.
    pub secret_headers: Vec<String>,
    /// The parameters a manual trigger gave the run: `SKED_PARAM_<NAME>` for shell; an HTTP
    /// target is sent none.
    pub params: std::collections::BTreeMap<String, String>,
    /// The attempt's W3C trace context: `TRACEPARENT` for shell and containers, the
    /// `traceparent` header for HTTP.
    pub traceparent: Option<String>,
}

impl RunInfo {
    pub fn of(attempt: &LeasedAttempt) -> Self {
        RunInfo {
            attempt_id: attempt.attempt_id,
            run_id: attempt.run_id,
            attempt: attempt.attempt,
            scheduled_for: attempt.scheduled_for,
            job: attempt.job.clone(),
            completion: attempt.completion.clone(),
            event: attempt.event.clone(),
            shard: attempt.shard,
            params: attempt.params.clone(),
            secret_headers: attempt.secret_headers.clone(),
            traceparent: attempt.traceparent.clone(),
        }
    }

    /// The `SKED_*` variables that describe the run to a process (or a container): its ids,
    /// instant, job, parameters, shard and event.
    pub fn env(&self) -> Vec<(String, String)> {
        use sked_core::protocol::{
            ENV_ATTEMPT, ENV_EVENT_ID, ENV_EVENT_KEY, ENV_EVENT_PAYLOAD, ENV_JOB, ENV_RUN_ID,
            ENV_SCHEDULED_FOR, ENV_SHARD, ENV_SHARDS, ENV_TRACEPARENT,
        };
        let mut env = vec![
            (ENV_RUN_ID.to_string(), self.run_id.to_string()),
            (ENV_ATTEMPT.to_string(), self.attempt.to_string()),
            (ENV_SCHEDULED_FOR.to_string(), self.scheduled_for_rfc3339()),
            (ENV_JOB.to_string(), self.job.clone()),
        ];
        for (name, value) in &self.params {
            env.push((
                sked_core::flow::trigger::param_env_name(name),
                value.clone(),
            ));
        }
        if let Some(shard) = self.shard {
            env.push((ENV_SHARD.to_string(), shard.index.to_string()));
            env.push((ENV_SHARDS.to_string(), shard.count.to_string()));
        }
        if let Some(event) = &self.event {
            env.push((ENV_EVENT_KEY.to_string(), event.key.clone()));
            env.push((ENV_EVENT_ID.to_string(), event.id.clone()));
            env.push((ENV_EVENT_PAYLOAD.to_string(), event.payload_text()));
        }
        if let Some(traceparent) = &self.traceparent {
            env.push((ENV_TRACEPARENT.to_string(), traceparent.clone()));
        }
        env
    }

    /// `SKED_SCHEDULED_FOR`: RFC 3339 in UTC, e.g. `2026-01-01T00:00:00Z`.
    pub fn scheduled_for_rfc3339(&self) -> String {
        self.scheduled_for
            .to_rfc3339_opts(SecondsFormat::AutoSi, true)
    }
}

/// How to execute: limits and grace periods.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOptions {
    /// The attempt's timeout; `None` runs until the target ends or a stop.
    pub timeout: Option<Duration>,
    /// Shell: between SIGTERM and SIGKILL of the process group.
    pub kill_grace: Duration,
    /// Shell: after the main process exits, how long leftovers may hold its output open.
    pub output_drain: Duration,
    /// HTTP: the part of the response body that goes to the output.
    pub http_body_cap: usize,
    /// Shell: the server that forks each attempt's [`supervisor`] (the `sked` binary itself,
    /// started once). Without one, an attempt runs in a process group of its own, which ends
    /// with cancels and timeouts but not with the worker, and not past `setsid`.
    pub supervisor: Option<supervisor::client::SupervisorServer>,
    /// Where attempts get a cgroup of their own for their limits; `None` where this worker
    /// cannot make one (then shell limits fall back to rlimits).
    pub cgroups: Option<cgroup::Cgroups>,
    /// The container engine, for container targets; `None`: this worker takes none.
    pub container_engine: Option<container::Engine>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            timeout: None,
            kill_grace: Duration::from_secs(5),
            output_drain: Duration::from_secs(2),
            http_body_cap: 64 * 1024,
            supervisor: None,
            cgroups: None,
            container_engine: None,
        }
    }
}

/// How an attempt ended, as reported in its [`Completion`].
#[derive(Debug, Clone, PartialEq)]
pub struct ExecResult {
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub http_status: Option<u16>,
    /// A short human-readable reason when it did not succeed.
    pub error: Option<String>,
}

impl ExecResult {
    pub fn failed(error: impl Into<String>) -> Self {
        ExecResult {
            outcome: AttemptOutcome::Failed,
            exit_code: None,
            http_status: None,
            error: Some(error.into()),
        }
    }

    /// The kernel killed in the attempt's cgroup for memory: reason `out_of_memory`, first in
    /// the error so that it can be matched.
    pub(crate) fn out_of_memory(
        limit: sked_core::limits::ByteSize,
        exit_code: Option<i32>,
    ) -> Self {
        ExecResult {
            exit_code,
            ..ExecResult::failed(format!(
                "{}: the kernel killed a process of the job over its memory limit of {limit}",
                sked_core::limits::OUT_OF_MEMORY
            ))
        }
    }

    pub(crate) fn ended(outcome: AttemptOutcome, error: impl Into<String>) -> Self {
        ExecResult {
            outcome,
            exit_code: None,
            http_status: None,
            error: Some(error.into()),
        }
    }

    pub fn into_completion(self, attempt_id: i64, token: i64) -> Completion {
        Completion {
            attempt_id,
            token,
            outcome: self.outcome,
            exit_code: self.exit_code,
            http_status: self.http_status,
            error: self.error,
        }
    }
}

/// Asks a running attempt to stop (it then ends `cancelled`).
#[derive(Debug)]
pub struct StopHandle(watch::Sender<bool>);

/// The executor's side of a [`StopHandle`].
#[derive(Debug, Clone)]
pub struct StopSignal(watch::Receiver<bool>);

pub fn stop_channel() -> (StopHandle, StopSignal) {
    let (tx, rx) = watch::channel(false);
    (StopHandle(tx), StopSignal(rx))
}

impl StopHandle {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl StopSignal {
    /// Whether a stop has been asked for.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once a stop is asked for; never if the handle is dropped without asking.
    pub async fn requested(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What executors reach targets with: the HTTP client (under the server's HTTP target policy)
/// and this worker's broker connections.
#[derive(Clone)]
pub struct Targets {
    pub http: TargetClient,
    pub brokers: Arc<Brokers>,
}

/// Executes a leased attempt with the executor for its target.
pub async fn execute(
    attempt: &LeasedAttempt,
    targets: &Targets,
    options: &ExecOptions,
    stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let info = RunInfo::of(attempt);
    match &attempt.target {
        TargetSpec::Shell(target) => shell::run(target, &info, options, stop, output).await,
        TargetSpec::Http(target) => {
            http::run(&targets.http, target, &info, options, stop, output).await
        }
        TargetSpec::Container(target) => container::run(target, &info, options, stop, output).await,
        TargetSpec::Amqp(_)
        | TargetSpec::Nats(_)
        | TargetSpec::RedisStream(_)
        | TargetSpec::Celery(_) => {
            broker::run(&targets.brokers, attempt, options, stop, output).await
        }
        // The server never hands one out: its runs wait for pings. Should one come (a server
        // of another version), it fails rather than pretend to have run.
        TargetSpec::Heartbeat(_) => {
            ExecResult::failed("a heartbeat target runs nothing: its runs wait for pings")
        }
    }
}

/// The target took the work and its consumer or endpoint reports the outcome to the run's
/// completion address: the attempt stays running, holding its slot, until the server asks the
/// worker to stop it (the report came, and the run is no longer this attempt's) or the job's
/// timeout, counted from `started`, passes. `taken` says how the target took it.
pub(crate) async fn await_report(
    taken: &str,
    options: &ExecOptions,
    started: tokio::time::Instant,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    output.write(format!("[sked-worker: {taken}; waiting for the report]\n").as_bytes());
    let limit = options.timeout.unwrap_or(DEFAULT_AWAIT_TIMEOUT);
    tokio::select! {
        () = tokio::time::sleep_until(started + limit) => ExecResult::ended(
            AttemptOutcome::TimedOut,
            format!("{taken}, but no report of the outcome within {}", human(limit)),
        ),
        // The report is recorded by the server; what this says is refused there unless the
        // run was cancelled instead.
        () = stop.requested() => {
            ExecResult::ended(AttemptOutcome::Cancelled, "stopped while waiting for the report")
        }
    }
}

/// `1.5s`, `30s`, `250ms`: for messages.
pub(crate) fn human(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else if d.as_secs() == 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Sleeps for `timeout`, or forever when there is none.
pub(crate) async fn expire(timeout: Option<Duration>) {
    match timeout {
        Some(t) => tokio::time::sleep(t).await,
        None => std::future::pending().await,
    }
}

//! The worker protocol: the JSON messages between the server and any worker, over HTTP.
//!
//! `POST /api/v1/workers` registers; `POST /api/v1/workers/{id}/heartbeat` keeps the worker and
//! the leases of its attempts alive; `POST /api/v1/workers/{id}/lease` long-polls for a batch of
//! attempts; `POST /api/v1/attempts/{id}/log?token=T` appends output; `POST
//! /api/v1/workers/{id}/complete` reports a batch of results. Every report about an attempt
//! carries its fencing token; a report whose attempt lost its lease is rejected.

use crate::egress::EgressPolicy;
use crate::run::AttemptOutcome;
use crate::target::TargetSpec;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a server waits for a request's headers, from a connection's opening or its previous
/// response, by default: idle keep-alive connections are closed after it.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sked's own clients (the worker, the command line) keep a pooled connection idle:
/// well under the server's header timeout, so a request never races the server closing it.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a job sees of its run: environment variables for shell targets...
pub const ENV_RUN_ID: &str = "SKED_RUN_ID";
pub const ENV_ATTEMPT: &str = "SKED_ATTEMPT";
pub const ENV_SCHEDULED_FOR: &str = "SKED_SCHEDULED_FOR";
pub const ENV_JOB: &str = "SKED_JOB";
/// For a run of a sharded job (`crate::shard`): its shard, 0 to N-1, and N.
pub const ENV_SHARD: &str = "SKED_SHARD";
pub const ENV_SHARDS: &str = "SKED_SHARDS";
/// For a run an event started: the event's key, id and payload (a string payload as it is,
/// anything else as JSON).
pub const ENV_EVENT_KEY: &str = "SKED_EVENT_KEY";
pub const ENV_EVENT_ID: &str = "SKED_EVENT_ID";
pub const ENV_EVENT_PAYLOAD: &str = "SKED_EVENT_PAYLOAD";
/// The W3C trace context of the attempt (`crate::trace`), when the server exports traces: a
/// process's own spans name it as their parent. HTTP targets and broker messages get it as the
/// `traceparent` header.
pub const ENV_TRACEPARENT: &str = "TRACEPARENT";
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// ...and headers for HTTP targets.
pub const HEADER_RUN_ID: &str = "X-Sked-Run-Id";
pub const HEADER_ATTEMPT: &str = "X-Sked-Attempt";
pub const HEADER_SCHEDULED_FOR: &str = "X-Sked-Scheduled-For";
pub const HEADER_JOB: &str = "X-Sked-Job";
pub const HEADER_EVENT_KEY: &str = "X-Sked-Event-Key";
pub const HEADER_EVENT_ID: &str = "X-Sked-Event-Id";
pub const HEADER_SHARD: &str = "X-Sked-Shard";
pub const HEADER_SHARDS: &str = "X-Sked-Shards";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub name: String,
    /// At most [`MAX_WORKER_LABELS`], of [`MAX_WORKER_LABEL_BYTES`] in all.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
}

/// The most labels one worker may carry. A pool is told apart by a handful (zone, pool, gpu,
/// os, ...); every label is stored with the worker, listed with it and matched against every
/// run it asks for.
pub const MAX_WORKER_LABELS: usize = 64;
/// The most bytes a worker's labels may take, keys and values together.
pub const MAX_WORKER_LABEL_BYTES: usize = 8 * 1024;

/// How long a worker goes on without a confirmed heartbeat before it stops its attempts: one
/// interval short of the server's timeout (at least one interval), so that they are stopped
/// before the server hands their runs to another worker.
pub fn worker_fence_after(heartbeat_timeout: Duration, heartbeat_interval: Duration) -> Duration {
    heartbeat_timeout
        .saturating_sub(heartbeat_interval)
        .max(heartbeat_interval)
}

/// How long before its end a lease may still be left as it is by a heartbeat: as long as it
/// outlasts the worker's fence ([`worker_fence_after`]) by half an interval, so that a worker
/// that stops hearing back stops its attempts before any of their leases ends. Zero (renew
/// every lease at every heartbeat) when the timeout leaves no such room.
pub fn lease_renewal_slack(heartbeat_timeout: Duration, heartbeat_interval: Duration) -> Duration {
    heartbeat_timeout.saturating_sub(
        worker_fence_after(heartbeat_timeout, heartbeat_interval) + heartbeat_interval / 2,
    )
}

/// Whether a worker's labels are within bounds; the reason when they are not.
pub fn check_worker_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_WORKER_LABELS {
        return Err(format!(
            "{} labels; a worker carries at most {MAX_WORKER_LABELS}",
            labels.len()
        ));
    }
    if labels.keys().any(String::is_empty) {
        return Err("a label has an empty key".into());
    }
    let bytes: usize = labels.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_WORKER_LABEL_BYTES {
        return Err(format!(
            "labels of {bytes} bytes; at most {MAX_WORKER_LABEL_BYTES} in all"
        ));
    }
    Ok(())
}

/// How a worker pool is guarded against overload (`sked worker --overload`), as a worker
/// registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverloadSetting {
    pub policy: crate::dispatch::Overload,
    /// The stall gauge above which the worker counts as overloaded.
    pub trip: u32,
    /// The stall gauge at or below which it has recovered; below `trip`.
    pub reset: u32,
}

impl OverloadSetting {
    /// The overload control it sets up, or why its thresholds cannot work.
    pub fn control(self) -> Result<crate::dispatch::OverloadControl, String> {
        let limits = crate::dispatch::StallLimits::new(self.trip, self.reset)?;
        Ok(crate::dispatch::OverloadControl::new(self.policy, limits))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub worker_id: String,
    /// How often the worker should heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Silence longer than this and the worker is declared dead.
    pub heartbeat_timeout_ms: u64,
    /// What HTTP targets may reach: the worker checks every request against it after DNS
    /// resolution. A server that sends none (older than the setting) restricts nothing.
    #[serde(default)]
    pub http_target_policy: EgressPolicy,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// Attempts the worker is executing.
    #[serde(default)]
    pub running: Vec<i64>,
    /// Affinity keys the worker holds warm (at most `dispatch::MAX_WARM_KEYS`).
    #[serde(default)]
    pub warm_keys: Vec<String>,
    /// Work waiting inside the worker: its HTTP attempts in flight longer than its
    /// `--stall-after`, or beyond its `--stall-over`. Overload control reads it.
    #[serde(default)]
    pub stall: u32,
    /// The worker's pool's overload control; the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadSetting>,
    /// The worker is draining on its own (it was signalled): the node hands it nothing more
    /// and answers its open lease poll now, so that an answer already on its way is taken
    /// rather than dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Attempts the worker must stop: cancelled by a user, or no longer leased to it.
    pub stop: Vec<i64>,
    /// The worker was asked to drain: lease nothing more, let the running attempts finish
    /// (within its drain grace), then exit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// At most this many attempts.
    pub max: u32,
    /// Hold the request this long when nothing is ready (long poll).
    #[serde(default)]
    pub wait_ms: u64,
    /// The broker connections this worker can publish through (`sked worker --broker`): it
    /// may then take broker targets of jobs routed to its labels. At most [`MAX_WORKER_BROKERS`].
    #[serde(default)]
    pub brokers: Vec<String>,
    /// What this worker can execute beyond plain shell and HTTP targets: it is handed
    /// container targets, and shell targets with `run_as` or `limits`, only when it says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::limits::Capability>,
}

/// How many broker connections a worker may name in a lease request.
pub const MAX_WORKER_BROKERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseResponse {
    pub attempts: Vec<LeasedAttempt>,
    /// As in [`HeartbeatResponse`]: the worker was asked to drain, and gets nothing more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

/// An attempt handed to a worker: everything it needs to execute and report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeasedAttempt {
    pub attempt_id: i64,
    /// The fencing token: every report about this attempt carries it.
    pub token: i64,
    pub run_id: i64,
    /// 1 for the first attempt of the run.
    pub attempt: u32,
    pub namespace: String,
    pub job: String,
    pub scheduled_for: Instant,
    pub target: TargetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// For a target that awaits completion (an HTTP target with `callback`, a broker target
    /// with `await_completion`): where the outcome is reported, and with what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<CompletionAddress>,
    /// The event that started the run (trigger `event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<crate::event::RunEvent>,
    /// The job's affinity key: the worker reports the keys of its recent attempts as warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_key: Option<String>,
    /// For a run of a sharded job: which shard of its instant it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::Shard>,
    /// The names of the target's headers whose values were secrets (sealed or a namespace
    /// secret), opened for this attempt: a redirect never carries them to another origin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_headers: Vec<String>,
    /// The parameters a manual trigger gave the run: a shell target finds each in
    /// `SKED_PARAM_<NAME>` (`crate::flow::trigger::param_env_name`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// The attempt's W3C `traceparent` (`crate::trace`), when the server exports traces: the
    /// target's spans are the attempt span's children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl LeasedAttempt {
    /// What a broker target's message says of its run.
    pub fn run_context(&self) -> crate::publish::RunContext<'_> {
        crate::publish::RunContext {
            namespace: &self.namespace,
            job: &self.job,
            run_id: self.run_id,
            attempt: self.attempt,
            scheduled_for: self.scheduled_for,
            completion: self.completion.as_ref(),
            event: self.event.as_ref(),
            shard: self.shard,
            traceparent: self.traceparent.as_deref(),
        }
    }

    /// How long publishing a broker target's message may wait for the broker's confirm: the
    /// job's timeout, or [`DEFAULT_PUBLISH_TIMEOUT`]. When the run awaits its consumer's
    /// report the timeout bounds that whole wait, and the publish part of it is no longer
    /// than any publish.
    pub fn publish_limit(&self) -> Duration {
        match self.timeout_ms.map(Duration::from_millis) {
            Some(t) if self.completion.is_some() => t.min(DEFAULT_PUBLISH_TIMEOUT),
            Some(t) => t,
            None => DEFAULT_PUBLISH_TIMEOUT,
        }
    }
}

/// How long a run that awaits completion waits for its report, from the start of the attempt,
/// when its job sets no `timeout`.
pub const DEFAULT_AWAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long publishing a broker target's message may wait for the broker's confirm when its
/// job sets no `timeout`.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the outcome of a run that awaits completion is reported: `POST url` with
/// `{"token": ..., "outcome": ...}`. The token is a credential: `Debug` leaves it out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionAddress {
    pub url: String,
    pub token: String,
}

impl std::fmt::Debug for CompletionAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletionAddress({}, token: [hidden])", self.url)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    pub completions: Vec<Completion>,
}

/// The result of one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Completion {
    pub attempt_id: i64,
    pub token: i64,
    pub outcome: AttemptOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// A short human-readable reason for a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompleteResponse {
    pub results: Vec<CompletionResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResult {
    pub attempt_id: i64,
    pub accepted: bool,
    /// Why it was rejected: `fenced` (the token is not the attempt's, or its lease was taken
    /// away), `already_reported` (the attempt's outcome is already recorded) or
    /// `unknown_attempt` (no such attempt). A rejection is final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_left_alone_outlasts_the_workers_fence() {
        let ms = Duration::from_millis;
        for (timeout, interval, slack) in [
            (10_000, 2_000, 1_000),
            (60_000, 1_000, 500),
            (2_000, 300, 150),
            // No room: every lease is renewed at every heartbeat.
            (3_000, 2_000, 0),
            (2_000, 2_000, 0),
        ] {
            let (timeout, interval) = (ms(timeout), ms(interval));
            let left = lease_renewal_slack(timeout, interval);
            assert_eq!(left, ms(slack), "{timeout:?} {interval:?}");
            // A lease not renewed still has this long to run, past the worker's fence.
            let kept = timeout - left;
            if !left.is_zero() {
                assert!(kept >= worker_fence_after(timeout, interval) + interval / 2);
            }
        }
    }

    #[test]
    fn worker_labels_are_bounded_in_count_and_bytes() {
        let labels = |n: usize, value: usize| -> BTreeMap<String, String> {
            (0..n)
                .map(|i| (format!("k{i}"), "v".repeat(value)))
                .collect()
        };
        assert!(check_worker_labels(&labels(3, 10)).is_ok());
        assert!(check_worker_labels(&labels(MAX_WORKER_LABELS, 100)).is_ok());
        assert!(check_worker_labels(&labels(MAX_WORKER_LABELS + 1, 1))
            .unwrap_err()
            .contains("at most 64"));
        assert!(check_worker_labels(&labels(2, 5_000))
            .unwrap_err()
            .contains("bytes"));
        let empty: BTreeMap<String, String> = [(String::new(), "x".into())].into();
        assert!(check_worker_labels(&empty).is_err());
    }
}

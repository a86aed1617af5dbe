//! What the store keeps and the API shows: jobs with their firing state, runs, attempts, workers.

use crate::job::{JobSpec, JobState};
use crate::policy::MisfirePolicy;
use crate::run::{AttemptState, RunState, SkipReason, Trigger, WaitReason};
use crate::schedule::ScheduleSpec;
use crate::stats::Percentiles;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: i64,
    pub namespace: String,
    pub name: String,
    pub spec: JobSpec,
    pub state: JobState,
    /// The priority its runs get: `priority`, or for `auto` the number of jobs downstream of
    /// it, as of the last change to the graph around it.
    pub rank: i32,
    /// The next instant the schedule owes; `None` for manual or used-up schedules.
    pub next_fire_at: Option<Instant>,
    /// Instants produced so far by the current schedule.
    pub fired_count: u64,
    /// When the current schedule was set; its first instant is strictly after this.
    pub schedule_epoch: Instant,
    pub created_at: Instant,
    pub updated_at: Instant,
    /// Its definition's number: 1 when created, one more with each change (`JobVersion`).
    pub version: u32,
}

/// One definition a job has had, kept when it was replaced (`GET /jobs/{name}/versions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobVersion {
    pub version: u32,
    pub spec: JobSpec,
    /// When this definition was written.
    pub created_at: Instant,
}

/// What the firing loop needs of a job whose schedule still owes an instant: the schedule and
/// its firing state, without the rest of the definition (target, routing, retries), which a
/// node holding a million schedules should not keep in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledJob {
    pub id: i64,
    pub namespace: String,
    pub schedule: Option<ScheduleSpec>,
    pub schedule_epoch: Instant,
    pub fired_count: u64,
    pub next_fire_at: Instant,
    pub paused: bool,
    pub misfire: MisfirePolicy,
    /// The job's blackout windows.
    pub blackouts: Vec<crate::schedule::BlackoutSpec>,
}

impl ScheduledJob {
    /// The scheduled part of `job`; `None` when its schedule owes nothing more.
    pub fn of(job: JobRecord) -> Option<ScheduledJob> {
        Some(ScheduledJob {
            id: job.id,
            namespace: job.namespace,
            next_fire_at: job.next_fire_at?,
            schedule: job.spec.schedule,
            schedule_epoch: job.schedule_epoch,
            fired_count: job.fired_count,
            paused: job.spec.paused,
            misfire: job.spec.misfire,
            blackouts: job.spec.blackouts,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: i64,
    pub namespace: String,
    pub job: String,
    pub job_id: i64,
    /// The instant this run is for: with the job, the run's identity in the ledger.
    pub scheduled_for: Instant,
    /// The instant its schedule named, when a calendar moved the run from a closed day to
    /// `scheduled_for`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal_for: Option<Instant>,
    pub trigger: Trigger,
    pub state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SkipReason>,
    /// While `waiting`: what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<WaitReason>,
    /// While waiting for dependencies: each entry of the job's `depends_on` not met yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// While waiting for dependencies: when it ends `skipped` (`dependencies_timed_out`)
    /// should they still be unmet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<Instant>,
    /// The event that started it (trigger `event`): its key and id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    pub priority: i32,
    /// Not handed to a worker before this (retry backoff, jitter).
    pub ready_at: Instant,
    /// When the ledger row was written.
    pub created_at: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Instant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Instant>,
    /// Attempts started, lost ones included.
    pub attempts: u32,
    /// Attempts that failed or timed out: what the retry budget counts.
    pub failures: u32,
    pub cancel_requested: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The job's definition version it was recorded under (`None` for runs recorded before
    /// versions were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_version: Option<u32>,
    /// For a run of a sharded job: which of its instant's shards it is (`crate::shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::Shard>,
    /// For a shard of a broadcast: the one worker it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_worker: Option<String>,
    /// Its deadlines, from its job's `deadline` (`crate::deadline`), once the deadline watcher
    /// has seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<crate::deadline::RunDeadline>,
    /// The deadlines it missed, and by how much.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deadline_missed: Vec<crate::deadline::Miss>,
    /// When it was predicted to miss its `finish_by`, before it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_risk: Option<crate::deadline::AtRisk>,
    /// The parameters a manual trigger gave it (the newest, for a debounced run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<crate::flow::Params>,
    /// For a debounced run: the triggers or events it absorbed (`crate::flow::trigger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absorbed: Option<crate::flow::Absorbed>,
    /// The trace it joined, as the store keeps it (`crate::trace::Joined`); `None` for a run
    /// with a trace of its own. Not shown as is: the API names the trace by its id.
    #[serde(skip)]
    pub trace_parent: Option<String>,
}

/// A recorded event (`crate::event`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub namespace: String,
    pub key: String,
    pub id: String,
    #[serde(default)]
    pub payload: serde_json::Value,
    /// When sked recorded it: the instant of the runs it starts, and where windows look.
    pub occurred_at: Instant,
    /// The run whose success emitted it (`on_success`); `None` for a posted event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emitted_by_run: Option<i64>,
    /// The trace the runs it starts join (`crate::trace::Joined`, as text): its poster's, or
    /// the emitting run's, with that run's root as their parent.
    #[serde(skip)]
    pub trace_parent: Option<String>,
}

impl RunRecord {
    /// Firing lateness: from the instant to the ledger row, in milliseconds.
    pub fn lateness_ms(&self) -> f64 {
        (self.created_at - self.scheduled_for)
            .num_microseconds()
            .unwrap_or(i64::MAX) as f64
            / 1000.0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub id: i64,
    pub run_id: i64,
    /// 1 for the run's first attempt.
    pub number: u32,
    pub worker_id: String,
    /// The fencing token; not shown by the API.
    #[serde(skip)]
    pub token: i64,
    pub state: AttemptState,
    pub started_at: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Instant>,
    pub lease_expires_at: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes of output kept.
    pub output_bytes: u64,
    /// Output went past the cap; what came after it was dropped.
    pub output_truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    /// Attempts it holds leases for.
    pub running: u32,
    pub registered_at: Instant,
    pub last_heartbeat_at: Instant,
    pub alive: bool,
    /// Asked to drain: it is handed no new attempts, and it exits once those it runs end.
    #[serde(default)]
    pub draining: bool,
    /// The namespaces whose runs it may take (`["*"]`: all), from the token it registered
    /// with.
    pub namespaces: Vec<String>,
    /// The token it registered with: only that token may speak for it. `None` on an open
    /// development server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<i64>,
    /// Where it stands: what `alive`, `draining` and a clean stop say together.
    #[serde(default)]
    pub state: WorkerState,
    /// A server node's own publisher of broker targets, not a worker process: shown apart
    /// from the workers, and its slots (messages published at once) are no worker pool's.
    #[serde(default)]
    pub publisher: bool,
}

/// Where a worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Heartbeating and handed attempts.
    #[default]
    Active,
    /// Heartbeating, handed nothing new, and exiting once what it runs ends.
    Draining,
    /// It stopped cleanly and said so (`POST /workers/{id}/deregister`): nothing was lost.
    Stopped,
    /// It stopped heartbeating and was declared dead: its attempts were lost.
    Lost,
}

impl WorkerState {
    /// The state of a worker row: `stopped` is a clean stop the worker reported.
    pub fn of(alive: bool, draining: bool, stopped: bool) -> WorkerState {
        match (alive, draining, stopped) {
            (true, false, _) => WorkerState::Active,
            (true, true, _) => WorkerState::Draining,
            (false, _, true) => WorkerState::Stopped,
            (false, _, false) => WorkerState::Lost,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Active => "active",
            WorkerState::Draining => "draining",
            WorkerState::Stopped => "stopped",
            WorkerState::Lost => "lost",
        }
    }
}

/// A server node of the cluster, as the lease tables see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    /// The address it listens on, as it was started with.
    pub address: String,
    pub started_at: Instant,
    /// Its last membership round.
    pub seen_at: Instant,
    /// Partitions it holds an unexpired lease on.
    pub partitions: u32,
    /// Whether it holds the unexpired maintenance lease.
    pub maintenance: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStats {
    pub runs: u64,
    /// Runs by state name.
    pub by_state: BTreeMap<String, u64>,
    /// Skipped runs by their reason (`paused`, `overlap`, `misfire`, `backlog`, …).
    pub skipped_by_reason: BTreeMap<String, u64>,
    pub succeeded: u64,
    pub failed: u64,
    /// Attempts that followed a failed or timed-out attempt of the same run, over all runs:
    /// what the retry policy spent.
    pub retries: u64,
    /// Attempts lost with their worker (it stopped heartbeating, or never received them):
    /// their runs were re-queued without spending the retry budget.
    pub lost: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunRecord>,
    /// Firing lateness of recent runs, milliseconds.
    pub lateness_ms: Percentiles,
    /// From the instant to the first attempt's start, milliseconds.
    pub start_lateness_ms: Percentiles,
}

/// One change (or refused authentication) in the audit trail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: Instant,
    /// The token's name; `anonymous` on an open development server.
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<i64>,
    /// The peer address the request came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// What was done, e.g. `job.put`, `run.cancel`, `token.create`, `auth.failed`.
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object acted on: a job's name, a run's id, a token's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The definition before and after the change, secrets redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub id: i64,
    #[serde(flatten)]
    pub entry: AuditEntry,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_stop_is_stopped_and_silence_is_lost() {
        assert_eq!(WorkerState::of(true, false, false), WorkerState::Active);
        assert_eq!(WorkerState::of(true, true, false), WorkerState::Draining);
        assert_eq!(WorkerState::of(false, true, true), WorkerState::Stopped);
        assert_eq!(WorkerState::of(false, false, true), WorkerState::Stopped);
        assert_eq!(WorkerState::of(false, true, false), WorkerState::Lost);
        assert_eq!(
            serde_json::to_value(WorkerState::Stopped).ok(),
            Some(serde_json::json!("stopped"))
        );
    }
}

//! sked's durable state: the [`Store`] trait and its implementations.
//!
//! The store owns the database schema, migrations and every query. It applies sked's rules by
//! calling `sked-core` (overlap decisions, retry decisions, firing state) inside its transactions,
//! so that a rule is written once and each decision commits atomically with its effects.
//! It knows nothing of HTTP, of timers or of workers' processes.
//!
//! Two implementations: [`SqliteStore`] (one file, for a single node) and [`PgStore`]
//! (PostgreSQL, shared by a cluster of server nodes). Both pass the same contract suite
//! ([`contract`]).

pub mod calendars;
pub mod contract;
pub mod cursor;
pub mod deadlines;
pub mod flow;
pub mod graph;
pub mod grid;
pub mod postgres;
pub mod shared;
pub mod sqlite;
pub mod traces;
pub mod transfer;

use async_trait::async_trait;
use sked_core::auth::{Grant, TokenRecord};
use sked_core::job::Routing;
use sked_core::job::{JobState, ValidJob};
use sked_core::namespace::{NamespaceRecord, NamespaceRefusal, NamespaceSpec, SecretRecord};
use sked_core::records::{
    AttemptRecord, AuditEntry, AuditRecord, EventRecord, JobRecord, JobStats, JobVersion,
    NodeRecord, RunRecord, ScheduledJob, WorkerRecord,
};
use sked_core::run::{AttemptOutcome, RunState, SkipReason, Trigger};
use sked_core::schedule::ScheduleKind;
use sked_core::target::TargetSpec;
use sked_core::Instant;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use calendars::{CalendarDeletion, CalendarStore};
pub use deadlines::{DeadlineJob, DeadlineMark, DeadlineStore, NewMarks};
pub use flow::{FlowClaim, FlowStore, KeyHolder, LimitDeletion, LimitRecord, NotStarted};
pub use graph::{GraphStore, MAX_NAMESPACE_EDGES};
pub use grid::{GridQuery, GridRun, GridStore};
pub use postgres::PgStore;
pub use sqlite::{CheckReport, SqliteStore};
pub use traces::{EndedCursor, EndedRun, TraceStore};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A create met an existing job of that name.
    #[error("{0} already exists")]
    Conflict(String),
    #[error("database error: {0}")]
    Database(String),
    /// The database cannot be reached, or cannot take writes right now (a connection refused
    /// or broken, a server shutting down, a primary demoted by a failover): worth trying again,
    /// on this node later or on another node now.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A row that cannot be read back (a spec that no longer parses, an unknown state name).
    #[error("stored data cannot be read: {0}")]
    Corrupt(String),
    #[error("cannot open the store: {0}")]
    Open(String),
    /// A page cursor that no page of this store handed out.
    #[error("{0:?} is not a cursor this listing handed out")]
    InvalidCursor(String),
    /// A namespace's settings refuse the change (nothing was written).
    #[error(transparent)]
    Refused(#[from] NamespaceRefusal),
    /// A definition that only the store can refuse: it names an upstream job that does not
    /// exist, or closes a cycle of dependencies (nothing was written).
    #[error(transparent)]
    Invalid(#[from] sked_core::SpecError),
    /// A job that others depend on was to be deleted without `force` (nothing was written).
    #[error("job {job:?} is depended on by {}", dependants.join(", "))]
    DependedOn {
        job: String,
        dependants: Vec<String>,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The audit trail's entries for one change, made from what the change did and written in the
/// change's own transaction: the change and its entries commit together, or neither does.
/// [`Audit::none`] for a write nobody is accountable for (the firing loop, tests).
pub struct Audit<T>(Option<Arc<AuditFn<T>>>);

type AuditFn<T> = dyn Fn(&T) -> Vec<AuditEntry> + Send + Sync;

impl<T: 'static> Audit<T> {
    /// No entry: the write is not audited.
    pub fn none() -> Self {
        Audit(None)
    }

    /// The entries `make` says the change's outcome calls for (none, one, or several).
    pub fn new(make: impl Fn(&T) -> Vec<AuditEntry> + Send + Sync + 'static) -> Self {
        Audit(Some(Arc::new(make)))
    }

    /// The entries for `outcome`. It may be asked more than once: a transaction that is run
    /// again (PostgreSQL rolled it back) writes them again.
    pub fn entries(&self, outcome: &T) -> Vec<AuditEntry> {
        self.0
            .as_ref()
            .map(|make| make(outcome))
            .unwrap_or_default()
    }
}

impl<R: 'static> Audit<(PutOutcome, R)> {
    /// The same entries for a put that changed something, and none for one that did not.
    pub fn of_changes(self) -> Self {
        Audit::new(move |outcome: &(PutOutcome, R)| match outcome.0 {
            PutOutcome::Unchanged => Vec::new(),
            _ => self.entries(outcome),
        })
    }
}

impl<T> Clone for Audit<T> {
    fn clone(&self) -> Self {
        Audit(self.0.clone())
    }
}

/// Told how every write transaction of a store ended, for readiness (`/readyz`): a commit,
/// or a failure of the database itself (a full disk, a lost connection). A write the store
/// refused for what it asked (a conflict, a namespace's cap) is neither: it says nothing about
/// whether the store commits.
pub trait WriteObserver: Send + Sync + 'static {
    fn committed(&self);
    fn failed(&self, error: &StoreError);
}

/// Tells `observer` how a write ended.
pub(crate) fn observe_write<T>(observer: Option<&dyn WriteObserver>, result: &Result<T>) {
    let Some(observer) = observer else { return };
    match result {
        Ok(_) => observer.committed(),
        Err(e @ (StoreError::Database(_) | StoreError::Unavailable(_) | StoreError::Open(_))) => {
            observer.failed(e)
        }
        Err(_) => {}
    }
}

/// What [`Store::apply`] writes in one transaction: calendars first, then jobs (upstreams
/// first), so a job may name a calendar of the same batch.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub calendars: Vec<NamedCalendar>,
    pub jobs: Vec<ValidJob>,
}

/// A calendar of a [`Batch`], with the name it is written under.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedCalendar {
    pub name: String,
    pub spec: sked_core::calendar::CalendarSpec,
}

/// What [`Store::apply`] did (or, for a dry run, would do) to each calendar and each job, in
/// the batch's order.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub calendars: Vec<(PutOutcome, sked_core::calendar::CalendarRecord)>,
    pub jobs: Vec<(PutOutcome, JobRecord)>,
}

impl Applied {
    /// Whether a calendar was created or changed.
    pub fn calendars_changed(&self) -> bool {
        self.calendars
            .iter()
            .any(|(outcome, _)| *outcome != PutOutcome::Unchanged)
    }
}

/// A running run that a blackout window with `cancel_running` may stop
/// ([`Store::runs_under_windows`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunUnderWindows {
    pub run_id: i64,
    pub namespace: String,
    pub job: String,
    pub trigger: Trigger,
    pub started_at: Instant,
    /// Its job's blackout windows.
    pub blackouts: Vec<sked_core::schedule::BlackoutSpec>,
}

/// Which item of a [`Batch`] a refusal is about, by its index in its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchItem {
    Calendar(usize),
    Job(usize),
}

impl BatchItem {
    /// The item at `position` of the batch's calendars followed by its jobs.
    pub fn at(batch: &Batch, position: usize) -> BatchItem {
        match position.checked_sub(batch.calendars.len()) {
            None => BatchItem::Calendar(position),
            Some(job) => BatchItem::Job(job),
        }
    }
}

/// Why [`Store::apply`] wrote nothing: the item `at` was refused, or, with none, the batch's
/// transaction failed.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct BatchRefusal {
    pub at: Option<BatchItem>,
    pub error: StoreError,
}

impl BatchRefusal {
    /// `error`, met by a write of `batch` that had reached `position` (its calendars, then its
    /// jobs), or `usize::MAX` once past every item.
    pub(crate) fn reached(batch: &Batch, position: usize, error: StoreError) -> Self {
        BatchRefusal {
            at: (position != usize::MAX).then(|| BatchItem::at(batch, position)),
            error,
        }
    }
}

impl From<StoreError> for BatchRefusal {
    fn from(error: StoreError) -> Self {
        BatchRefusal { at: None, error }
    }
}

/// How `put_job` treats an existing job of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Create or replace (`PUT /jobs/{name}`, `sked job apply`).
    Upsert,
    /// Create only; an existing name is a [`StoreError::Conflict`] (`POST /jobs`).
    CreateOnly,
}

/// What `put_job` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PutOutcome {
    Created,
    Updated,
    Unchanged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobSort {
    #[default]
    Name,
    CreatedAt,
    UpdatedAt,
}

/// A page request over a namespace's jobs.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    pub namespace: String,
    /// Case-insensitive substring of the name or description.
    pub search: Option<String>,
    pub state: Option<JobState>,
    /// Only jobs whose schedule is of this kind.
    pub kind: Option<ScheduleKind>,
    /// Only jobs whose newest run (by instant) is in this state: a correlated seek per job
    /// looked at, on the index `GET /runs?job=` uses.
    pub last: Option<RunState>,
    /// Only jobs whose routing asks for this label (`routing.labels`) with this value.
    pub label: Option<(String, String)>,
    pub sort: JobSort,
    pub descending: bool,
    pub limit: u32,
    /// From a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Present when more items follow; pass it back as `cursor`.
    pub next_cursor: Option<String>,
}

/// A page request over runs, newest instant first.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub namespace: String,
    /// Runs of this job name only (all jobs of that name, deleted ones included).
    pub job: Option<String>,
    pub state: Option<RunState>,
    /// Only the runs that missed a deadline (`sked_core::deadline`).
    pub deadline_missed: bool,
    /// Only the runs that were called at risk of missing their `finish_by`.
    pub at_risk: bool,
    pub limit: u32,
    pub cursor: Option<String>,
}

/// One instant the firing loop (or a manual trigger) hands to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct Fire {
    pub job_id: i64,
    pub scheduled_for: Instant,
    pub trigger: Trigger,
    /// Decided before the store looks: record the run as skipped for this reason (paused,
    /// misfire). `None`: the run is to run, subject to the job's overlap policy (manual runs
    /// ignore overlap).
    pub skip: Option<SkipReason>,
    /// Not handed out before this (the instant plus the schedule's jitter).
    pub ready_at: Instant,
    /// How the job's firing state moves with this instant; `None` leaves it alone (manual).
    pub advance: Option<Advance>,
    /// The instant the schedule named, when a calendar moved the run to `scheduled_for`.
    pub nominal_for: Option<Instant>,
    /// Why a run recorded skipped was skipped, in words (a calendar's holiday): kept as the
    /// run's `error`, as other skips' explanations are.
    pub why: Option<String>,
}

/// The job's firing state after an instant. Applied only while the stored state still is the
/// one the firing loop started from (`epoch` and `fired_before` match), so a definition changed
/// meanwhile is never overwritten by a stale loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Advance {
    pub epoch: Instant,
    pub fired_before: u64,
    pub next_fire_at: Option<Instant>,
}

/// What became of one [`Fire`].
#[derive(Debug, Clone, PartialEq)]
pub struct FiredRun {
    pub run_id: i64,
    pub state: RunState,
    /// False when the ledger already had a run for this instant (nothing was written).
    pub inserted: bool,
    /// Whether the advance was applied (false: the definition changed meanwhile).
    pub advanced: bool,
    /// For a sharded job's instant written now: the runs of shards 1 to N-1, in order
    /// (`run_id` is shard 0's), all in `state`.
    pub other_shards: Vec<i64>,
    /// The job's runs are placed (sharded, or a broadcast pinned to workers): each carries
    /// its place, so none may be made from another's template.
    pub placed: bool,
}

impl FiredRun {
    /// A fire of a job deleted since its instant was computed: nothing is owed any more.
    pub(crate) fn gone() -> Self {
        FiredRun {
            run_id: 0,
            state: RunState::Cancelled,
            inserted: false,
            advanced: false,
            other_shards: Vec::new(),
            placed: false,
        }
    }

    /// The instant's runs: `run_id`, then the other shards' when its job is sharded.
    pub fn all_runs(&self) -> impl Iterator<Item = i64> + '_ {
        std::iter::once(self.run_id).chain(self.other_shards.iter().copied())
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FireOutcome {
    /// One per fire, in order.
    pub runs: Vec<FiredRun>,
    /// Running runs asked to stop by an overlap `cancel_running`; their workers are told on
    /// their next heartbeat.
    pub cancel_requested: Vec<i64>,
    /// Runs of other jobs queued because of these instants: dependants whose wait a skipped
    /// instant settled (`depends_on` with `state: finished`).
    pub released: Vec<i64>,
}

/// A deleted job, and the jobs that depended on it, now paused (`force`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeletedJob {
    pub job: JobRecord,
    /// The jobs that depended on it, as they are now (paused).
    pub paused_dependants: Vec<JobRecord>,
    /// Its runs that were queued or waiting, cancelled with it.
    pub cancelled: Vec<i64>,
}

/// A posted event and what recording it did.
#[derive(Debug, Clone, PartialEq)]
pub struct PostedEvent {
    pub event: EventRecord,
    /// False when the event was recorded before (same namespace, key and id): nothing else
    /// happened.
    pub created: bool,
    /// Runs it started (jobs with `schedule: {event}`), whatever their state.
    pub started: Vec<i64>,
    /// Runs now queued because of it, for the dispatcher.
    pub queued: Vec<i64>,
    /// Running runs an overlap `cancel_running` asked to stop.
    pub cancel_requested: Vec<i64>,
    /// Jobs whose run it did not start because of their debounce or dedup, with the run it
    /// went to.
    pub flowed: Vec<FlowedRun>,
}

/// A manual trigger of a job (`POST /api/v1/jobs/{name}/trigger`), for
/// [`Store::trigger_run`].
#[derive(Debug, Clone, PartialEq)]
pub struct ManualTrigger {
    pub job_id: i64,
    /// The run's instant: the moment of the request (moved on by a microsecond at a time
    /// while the job has a run at it).
    pub scheduled_for: Instant,
    /// The trigger's parameters (`sked_core::flow::trigger`), checked by the caller.
    pub params: Option<sked_core::flow::Params>,
    /// The trace the caller's request was part of (`sked_core::trace::Joined`, as text):
    /// a new run joins it. A run the trigger is deduplicated to or absorbed into keeps its own.
    pub trace_parent: Option<String>,
}

/// How a trigger or an event met its job's debounce and dedup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowOutcome {
    /// A new run was recorded.
    Recorded,
    /// The dedup key names a run recorded within its window: that run, nothing new.
    Deduplicated,
    /// A debounced run with the key had not started: the trigger was absorbed into it, its
    /// `ready_at` moved and its parameters (or event) replaced.
    Absorbed,
}

/// What [`Store::trigger_run`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggeredRun {
    /// The run recorded (`inserted`), or the one the trigger was deduplicated to or absorbed
    /// into (`inserted` false).
    pub run: FiredRun,
    pub outcome: FlowOutcome,
}

/// A job an event did not start a new run of, because of its debounce or dedup: the run
/// the event went to instead.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FlowedRun {
    pub job: String,
    pub run_id: i64,
    pub outcome: FlowOutcome,
}

/// Which recorded events to list, newest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventQuery {
    pub namespace: String,
    pub key: Option<String>,
    /// Only events before this instant (the previous page's last `occurred_at`).
    pub before: Option<Instant>,
    pub limit: u32,
}

/// Which side of a job's dependency edges to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    /// What the jobs wait for.
    Upstream,
    /// What waits for the jobs.
    Downstream,
}

/// A dependency between two jobs of a namespace: `job` waits for `upstream`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DependencyEdge {
    pub job: String,
    pub upstream: String,
}

/// What ending overdue dependency waits did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpiredWaits {
    /// Runs skipped with reason `dependencies_timed_out`.
    pub skipped: Vec<i64>,
    /// Runs of their dependants queued as a result (a wait for `finished` upstreams).
    pub queued: Vec<i64>,
}

/// What a heartbeat job's ping did (`sked_core::heartbeat`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingOutcome {
    /// It answered the oldest run waiting for a ping, which ended `succeeded`; `released`:
    /// dependant runs now queued.
    Answered { run_id: i64, released: Vec<i64> },
    /// No run waited for one: it is kept for the next run to credit.
    Kept,
    /// The job's target is not `heartbeat`.
    NotHeartbeat,
}

/// What passing ping deadlines did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpiredPings {
    /// Runs that ended `failed`: no ping came.
    pub failed: Vec<i64>,
    /// Runs that ended `succeeded` by a ping kept from before they were recorded.
    pub succeeded: Vec<i64>,
    /// Dependant runs now queued.
    pub queued: Vec<i64>,
}

/// A queued run with what the dispatcher needs to hand it out.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRun {
    pub run_id: i64,
    pub job_id: i64,
    pub namespace: String,
    pub job: String,
    pub scheduled_for: Instant,
    pub priority: i32,
    pub ready_at: Instant,
    pub target: TargetSpec,
    pub timeout: Option<Duration>,
    pub routing: Routing,
    /// The event that started the run (trigger `event`), payload included.
    pub event: Option<sked_core::event::RunEvent>,
    /// Its job's `priority` is `auto`: the rank follows the dependency graph, so no copy of
    /// it may be kept for later runs.
    pub graph_ranked: bool,
    /// For a run of a sharded job: which shard of its instant it is.
    pub shard: Option<sked_core::shard::Shard>,
    /// For a shard of a broadcast: the one worker that may take it.
    pub pinned_worker: Option<String>,
    /// The concurrency and rate keys it must pass to start (`sked_core::flow`), rendered
    /// from its job's definition and the run.
    pub gates: sked_core::flow::Gates,
    /// The parameters its manual trigger gave it.
    pub params: Option<sked_core::flow::Params>,
    /// The trace it joined (`RunRecord::trace_parent`): its attempts' trace context is named
    /// from it.
    pub trace_parent: Option<String>,
}

impl QueuedRun {
    /// What its keys are rendered from.
    pub fn key_context(&self) -> sked_core::flow::KeyContext<'_> {
        sked_core::flow::KeyContext {
            namespace: &self.namespace,
            job: &self.job,
            shard: self.shard.map(|s| s.index),
            event: self.event.as_ref(),
            params: self.params.as_ref(),
        }
    }

    /// The run with its keys rendered from its job's definition `spec`.
    pub fn gated_by(mut self, spec: &sked_core::JobSpec) -> QueuedRun {
        let flow = spec.flow();
        if !flow.concurrency.is_empty() || !flow.rate_limit.is_empty() {
            self.gates = flow.gates(&self.key_context());
        }
        self
    }
}

/// What became of one start of a batch.
pub type StartOutcome = std::result::Result<StartedAttempt, NotStarted>;

/// The dispatcher's choice for one queued run.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptStart {
    pub run_id: i64,
    pub worker_id: String,
    pub token: i64,
    pub lease_expires_at: Instant,
    /// The keys the run must pass to start; `None` for a run without any.
    pub flow: Option<FlowClaim>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartedAttempt {
    pub attempt_id: i64,
    /// 1 for the run's first attempt.
    pub number: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewWorker {
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    /// The namespaces whose runs it may take (`["*"]`: all).
    pub namespaces: Vec<String>,
    /// The token it registered with; `None` on an open development server.
    pub token_id: Option<i64>,
    /// A server node's broker publisher (`WorkerRecord::publisher`).
    pub publisher: bool,
}

/// A token to keep: what it grants, and the hash of its secret. The secret itself is never
/// stored; a request's token is found by hashing it the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct NewToken {
    pub name: String,
    pub grant: Grant,
    /// SHA-256 of the secret, lowercase hex.
    pub hash: String,
    pub expires_at: Option<Instant>,
}

/// A page request over a namespace's notifications, newest first.
#[derive(Debug, Clone, Default)]
pub struct NotificationQuery {
    pub namespace: String,
    pub job: Option<String>,
    pub state: Option<sked_core::notify::NotificationState>,
    pub limit: u32,
    pub cursor: Option<String>,
}

/// How a node's send of a claimed notification went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReport {
    pub id: i64,
    /// The claim it was sent under (`NotificationRecord::claim`).
    pub claim: i64,
    pub outcome: sked_core::notify::SendOutcome,
}

/// A page request over the audit trail, newest entry first.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// The caller's view: only entries of these namespaces (entries without a namespace, such
    /// as token changes, are then left out). `None`: every entry.
    pub visible: Option<Vec<String>>,
    pub namespace: Option<String>,
    pub object: Option<String>,
    /// The actor's token name.
    pub actor: Option<String>,
    /// Only entries at or after this instant.
    pub since: Option<Instant>,
    /// Only entries before this instant.
    pub until: Option<Instant>,
    pub limit: u32,
    pub cursor: Option<String>,
}

/// How a heartbeat extends the leases of a worker's running attempts: those that end before
/// `renew_before` now end at `until`, and the others are left as they are, so that a worker
/// holding thousands of attempts does not have every one rewritten at each beat. A
/// `renew_before` at or past `until` renews them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRenewal {
    pub until: Instant,
    pub renew_before: Instant,
}

impl LeaseRenewal {
    /// Every running attempt's lease ends at `until`.
    pub fn all(until: Instant) -> LeaseRenewal {
        LeaseRenewal {
            until,
            renew_before: until,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct HeartbeatOutcome {
    /// False when the worker is unknown or was declared dead: it must stop everything and
    /// register again.
    pub known: bool,
    /// Attempts among those reported running that the worker must stop.
    pub stop: Vec<i64>,
    /// Attempts the worker did not report, whose lease was ended (see `Store::heartbeat`).
    pub forgotten: Vec<i64>,
    /// The worker was asked to drain (`Store::drain_worker`).
    pub draining: bool,
}

/// A worker asked to drain, and whether this request is the one that did it.
#[derive(Debug, Clone, PartialEq)]
pub struct Drained {
    pub worker: WorkerRecord,
    pub newly: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReapOutcome {
    pub dead_workers: Vec<String>,
    /// Runs queued again: those whose attempt was lost (their retry budget untouched), and
    /// runs released from `waiting`: because a lost attempt's run ended cancelled, or because
    /// nothing of their job is active any more.
    pub requeued: Vec<i64>,
    /// Runs whose attempt was lost while a cancel was pending: now cancelled.
    pub cancelled: Vec<i64>,
    /// Broadcast shards that had not run when their worker was lost: now failed.
    pub failed: Vec<i64>,
}

/// A worker's report about one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptReport {
    pub attempt_id: i64,
    pub token: i64,
    /// The worker reporting: a report about another worker's attempt is refused.
    pub worker_id: String,
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CompletionEffect {
    /// The report was recorded.
    Accepted {
        run_id: i64,
        /// The run's state afterwards: terminal, or `Queued` for a retry.
        run_state: RunState,
        /// Runs newly queued by this completion: the retry of this run, a run of the same
        /// job released from `waiting`, or dependants' runs whose dependencies are now met
        /// (for a batch, those released by all its completions are listed with its last
        /// accepted report: the batch's runs are settled together).
        requeued: Vec<i64>,
        /// The run's namespace and when the attempt started: what the server's metrics
        /// label and time the attempt by.
        namespace: String,
        started_at: Instant,
        /// The job's name when it asked for metrics by name (`job_metrics`).
        job_label: Option<String>,
    },
    /// Nothing was written: the attempt is unknown, already reported, or no longer holds the
    /// run's lease (`fenced`).
    Rejected { reason: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum AppendOutcome {
    /// `kept` bytes were stored; `truncated` once the attempt's output reached the cap.
    Accepted { kept: u64, truncated: bool },
    /// The attempt is unknown or fenced; nothing was stored.
    Rejected,
}

/// What a cancel request did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The run was queued or waiting and is now cancelled. `released` are runs of the same job
    /// that waited behind it (overlap `buffer_*`) and are queued now.
    Cancelled { run: RunRecord, released: Vec<i64> },
    /// The run is running: its worker is told to stop, and the run ends `cancelled` when it
    /// reports.
    Requested(RunRecord),
    /// The run had already ended; nothing changed.
    AlreadyFinished(RunRecord),
}

/// What a retry of a run did.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// The run is open again: queued, or waiting for its dependencies.
    Retried {
        run: RunRecord,
        /// How it had ended.
        was: RunState,
        /// Runs now queued: the run itself when it is.
        queued: Vec<i64>,
        /// Runs of its dependants, skipped because it had failed, waiting for it again.
        reopened: Vec<i64>,
    },
    /// Nothing changed, and why.
    Refused { run: RunRecord, reason: String },
}

/// A server node taking part in a membership round.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Unique per process start.
    pub id: String,
    pub address: String,
    pub started_at: Instant,
}

/// What a server node holds after a membership round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Membership {
    /// The partitions whose schedules this node fires, ascending.
    pub partitions: Vec<u32>,
    /// Whether this node runs the maintenance duties (reaping, retention).
    pub maintenance: bool,
}

/// A change another server node committed to a store they share, for nodes that keep a copy
/// in memory (the firing loop's schedules, the dispatcher's queue).
#[derive(Debug, Clone, PartialEq)]
pub enum StoreEvent {
    /// A job was created, changed, paused, resumed or deleted.
    JobChanged(i64),
    /// Runs became queued (fired, retried, released, re-queued after a lost attempt). Run
    /// events are sent just after the write commits, so one is lost if its node stops in
    /// between: a node holding queued runs must also look for them in the store now and then.
    RunsQueued(Vec<i64>),
    /// Runs stopped being queued (an attempt started, or they were cancelled).
    RunsDequeued(Vec<i64>),
    /// A calendar or a namespace's settings were written or deleted: schedules must read
    /// again what they meet (calendars, namespaces' blackout windows).
    ScheduleRulesChanged,
    /// Events may have been missed (the connection carrying them was lost and is back):
    /// everything held in memory must be read again.
    Resync,
}

/// A namespace secret: `(namespace, name)`.
pub type SecretName = (String, String);

/// One stored column that may hold sealed values, and where it is. What the values are bound
/// to follows from it: a job's (`job` is `Some`) or its namespace's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealedColumn {
    /// `jobs.spec` of the job with this id.
    JobSpec(i64),
    /// `jobs.notify`, the copy of its `notify` rules.
    JobNotify(i64),
    /// `job_versions.spec` of `(job id, version)`.
    JobVersion(i64, i64),
    /// `namespaces.spec` of the namespace.
    NamespaceSpec(String),
    /// `namespaces.notify`, the copy of its default `notify` rules.
    NamespaceNotify(String),
    /// `secrets.sealed` of `(namespace, name)`.
    Secret(String, String),
    /// `notifications.channel` of the notification with this id.
    Notification(i64),
}

/// A stored text that holds sealed values (see [`Store::sealed_texts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSeal {
    pub column: SealedColumn,
    pub namespace: String,
    /// The job a job's definition, version or notification belongs to.
    pub job: Option<String>,
    pub text: String,
}

/// Changes committed by other server nodes: job changes in commit order, run events in the
/// order each node made them.
pub type StoreEvents = tokio::sync::mpsc::UnboundedReceiver<StoreEvent>;

/// Where the store learns what is queued when it starts a run by itself (the runs an event
/// starts, as the event is recorded): the server's dispatcher holds the queue, and the store
/// weighs each such run with `sked_core::policy::admission` against it, as the firing loop
/// weighs a schedule's instants. A run past a cap is recorded skipped (`backlog`).
pub trait BacklogSource: Send + Sync {
    /// The runs of job `job_id` and of `namespace` queued now, and the caps on them.
    fn backlog(&self, job_id: i64, namespace: &str) -> sked_core::policy::admission::Backlog;
}

/// A shared slot for the [`BacklogSource`] a server gives its store once it has a queue; until
/// then (and in tools with no queue) every run is admitted. Clones of a store share it.
#[derive(Default, Clone)]
#[allow(clippy::type_complexity)]
pub(crate) struct BacklogSlot(
    std::sync::Arc<std::sync::RwLock<Option<std::sync::Arc<dyn BacklogSource>>>>,
);

impl BacklogSlot {
    pub(crate) fn set(&self, source: std::sync::Arc<dyn BacklogSource>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    pub(crate) fn get(&self) -> Option<std::sync::Arc<dyn BacklogSource>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[async_trait]
pub trait Store:
    CalendarStore
    + DeadlineStore
    + FlowStore
    + GraphStore
    + GridStore
    + TraceStore
    + Send
    + Sync
    + 'static
{
    /// From now on, runs the store starts by itself are admitted against `source`'s queue.
    fn admit_through(&self, source: std::sync::Arc<dyn BacklogSource>);

    // --- jobs --------------------------------------------------------------------------------

    /// Creates or replaces a job; its firing state follows
    /// [`sked_core::job::firing_state_after_put`].
    async fn put_job(
        &self,
        namespace: &str,
        job: &ValidJob,
        mode: PutMode,
        now: Instant,
        audit: Audit<(PutOutcome, JobRecord)>,
    ) -> Result<(PutOutcome, JobRecord)>;
    /// Creates or replaces each calendar of `batch` (as [`CalendarStore::put_calendar`]
    /// would), then each of its jobs in that order, upstreams first (as [`Store::put_job`]
    /// with [`PutMode::Upsert`] would), in one transaction: all are written, or, when one is
    /// refused, none ([`BatchRefusal`] says which). With `dry_run` every check is made and
    /// every outcome answered, and nothing is written. The batch's audit entries are written
    /// in its transaction (none for a dry run); a changed calendar is announced as a change of
    /// schedule rules ([`StoreEvent::ScheduleRulesChanged`]) before the changed jobs are.
    async fn apply(
        &self,
        namespace: &str,
        batch: &Batch,
        now: Instant,
        dry_run: bool,
        audit: Audit<Applied>,
    ) -> Result<Applied, BatchRefusal>;
    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>>;
    async fn get_job_by_id(&self, id: i64) -> Result<Option<JobRecord>>;
    /// The definitions the job has had, newest first (its current one included), back to
    /// [`shared::KEPT_VERSIONS`] versions; `None` when there is no such job.
    async fn job_versions(&self, namespace: &str, name: &str) -> Result<Option<Vec<JobVersion>>>;
    async fn list_jobs(&self, query: &JobQuery) -> Result<Page<JobRecord>>;
    /// Deletes a job. Its runs stay readable; its queued and waiting runs are cancelled and
    /// its running ones asked to stop. A job others depend on is refused
    /// ([`StoreError::DependedOn`]) unless `force`, which pauses them.
    async fn delete_job(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        now: Instant,
        audit: Audit<Option<DeletedJob>>,
    ) -> Result<Option<DeletedJob>>;
    /// Pauses or resumes. A completed job stays completed.
    async fn set_paused(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
        now: Instant,
        audit: Audit<Option<JobRecord>>,
    ) -> Result<Option<JobRecord>>;
    /// The dependency edges of namespace `namespace` on the `toward` side of `jobs`: those
    /// whose dependant (upstream side) or whose upstream (downstream side) is one of them.
    /// An edge names a job by name, and may name one deleted with `force`.
    async fn dependency_edges(
        &self,
        namespace: &str,
        jobs: &[String],
        toward: Toward,
    ) -> Result<Vec<DependencyEdge>>;
    /// A page of the jobs whose schedule still owes an instant (`next_fire_at` set), for the
    /// firing loop: up to `limit` in id order after `after_id`, of the given partitions only
    /// (`sked_core::cluster::partition_of`) or of all.
    async fn scheduled_jobs(
        &self,
        partitions: Option<&[u32]>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<ScheduledJob>>;

    // --- the ledger ---------------------------------------------------------------------------

    /// Writes a batch of instants in one transaction: one run per `(job, scheduled_for)` (a
    /// second insert is a no-op), the overlap policy applied, firing states advanced.
    async fn record_fires(
        &self,
        fires: &[Fire],
        now: Instant,
        audit: Audit<FireOutcome>,
    ) -> Result<FireOutcome>;
    /// Records a manual run of a job, under its `dedup` and `debounce` in the same
    /// transaction: a dedup key recorded within its window answers with its run; a debounced
    /// run with the same key that has not started absorbs the trigger (`ready_at` moved to
    /// `sked_core::flow::trigger::debounced_ready_at`, the newest parameters kept, the trigger
    /// counted and kept on the run); otherwise a run is recorded (a debounced one ready a
    /// period from now). Two triggers with one key make one run, on any number of nodes.
    async fn trigger_run(
        &self,
        trigger: &ManualTrigger,
        now: Instant,
        audit: Audit<TriggeredRun>,
    ) -> Result<TriggeredRun>;
    /// Queued runs with their dispatch details: the given ones, or all when `ids` is `None`.
    async fn queued_runs(&self, ids: Option<&[i64]>) -> Result<Vec<QueuedRun>>;
    /// The ids of queued runs ready before `ready_before`, ascending, at most `limit` of those
    /// above `after_id`: a page of a sweep. A cluster node sweeps these for runs no
    /// announcement brought it; ids alone keep each page cheap however long the queue is.
    async fn queued_before(
        &self,
        ready_before: Instant,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<i64>>;
    /// Starts attempts for queued runs in one transaction, in the order given: a run whose
    /// keys admit it (`FlowStore`'s rule) starts and holds them; one that is no longer queued
    /// (cancelled meanwhile, or started by another node) or that a key holds back does not.
    async fn start_attempts(
        &self,
        starts: &[AttemptStart],
        now: Instant,
    ) -> Result<Vec<StartOutcome>>;
    /// Skips, with reason `dependencies_timed_out`, up to `limit` runs still waiting for their
    /// dependencies past their job's `deps_timeout`, and settles their dependants.
    async fn expire_dependency_waits(&self, now: Instant, limit: u32) -> Result<ExpiredWaits>;
    /// Records a batch of attempt results in one transaction, deciding retries by the job's
    /// retry policy; a run that ends releases (or skips) its dependants' waiting runs in the
    /// same transaction.
    async fn complete_attempts(
        &self,
        reports: &[AttemptReport],
        now: Instant,
    ) -> Result<Vec<CompletionEffect>>;
    async fn cancel_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<CancelOutcome>>,
    ) -> Result<Option<CancelOutcome>>;
    /// Running runs not yet asked to stop, started by their schedule (`schedule`,
    /// `backfill`), of jobs that have a blackout window with `cancel_running` or of one of
    /// `namespaces`; each with its job's windows. By id, those after `after`, at most `limit`.
    async fn runs_under_windows(
        &self,
        namespaces: &[String],
        after: i64,
        limit: u32,
    ) -> Result<Vec<RunUnderWindows>>;
    /// Asks each run of `stops` (id, reason) that is still running and not yet asked to stop
    /// to stop, as a user's cancel does; once it ends cancelled, the reason is its error. The
    /// runs asked, by id.
    async fn stop_runs(&self, stops: &[(i64, String)]) -> Result<Vec<i64>>;
    /// Reopens a run that ended otherwise than succeeded (`RunState::may_reopen`), with a fresh
    /// retry budget: queued at once (overlap does not hold back what a user asked for), or
    /// waiting when its own dependencies are unmet (refused when they can no longer be met).
    /// Its dependants' runs skipped because it failed wait for it again while their
    /// `deps_timeout`, counted from when they were recorded, lasts; and theirs in turn.
    async fn retry_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<RetryOutcome>>,
    ) -> Result<Option<RetryOutcome>>;
    async fn get_run(&self, run_id: i64) -> Result<Option<(RunRecord, Vec<AttemptRecord>)>>;
    async fn list_runs(&self, query: &RunQuery) -> Result<Page<RunRecord>>;
    /// Counts and lateness percentiles over the job's runs (all jobs of that name).
    async fn job_stats(&self, namespace: &str, name: &str) -> Result<Option<JobStats>>;

    // --- events -------------------------------------------------------------------------------

    /// Records an event once per `(namespace, key, id)` and, in the same transaction, starts
    /// a run of each job whose schedule names its key and settles the runs waiting for it.
    /// A second post of the same event returns the first, with `created` false.
    async fn post_event(
        &self,
        namespace: &str,
        event: &sked_core::event::EventSpec,
        now: Instant,
        audit: Audit<PostedEvent>,
    ) -> Result<PostedEvent>;
    /// Recorded events of a namespace, newest first.
    async fn list_events(&self, query: &EventQuery) -> Result<Vec<EventRecord>>;

    // --- output -------------------------------------------------------------------------------

    /// Appends output of a running attempt held by `worker_id` under `token`, keeping at most
    /// `cap` bytes per attempt.
    async fn append_output(
        &self,
        attempt_id: i64,
        token: i64,
        worker_id: &str,
        bytes: &[u8],
        cap: u64,
    ) -> Result<AppendOutcome>;
    /// Output of an attempt from byte `offset` on.
    async fn read_output(&self, attempt_id: i64, offset: u64) -> Result<Vec<u8>>;

    // --- workers ------------------------------------------------------------------------------

    async fn register_worker(&self, worker: &NewWorker, now: Instant) -> Result<()>;
    /// Records a heartbeat and extends the leases of the worker's running attempts among
    /// `running` as `lease` says. An attempt the store has running on this worker, started
    /// before `forgotten_before` and absent from `running`, never reached the worker (its
    /// lease response was lost with a server): its lease ends `now`, for the reaper to
    /// re-queue its run as it does any expired lease.
    async fn heartbeat(
        &self,
        worker_id: &str,
        running: &[i64],
        now: Instant,
        lease: LeaseRenewal,
        forgotten_before: Instant,
    ) -> Result<HeartbeatOutcome>;
    /// A worker's clean stop: it is no longer alive and is `stopped`, not lost; the attempts
    /// it still holds lose their lease now, so the reaper queues their runs again without
    /// spending their retry budget. `None` when it is unknown or no longer alive.
    async fn deregister_worker(&self, id: &str, now: Instant) -> Result<Option<WorkerRecord>>;
    /// Registered workers in id order, a page of at most `limit` after `cursor`.
    async fn list_workers(&self, limit: u32, cursor: Option<&str>) -> Result<Page<WorkerRecord>>;
    /// One worker by id.
    async fn get_worker(&self, id: &str) -> Result<Option<WorkerRecord>>;
    /// Asks a live worker to drain: no new attempts for it, which its next heartbeat tells it
    /// (`HeartbeatOutcome::draining`). The worker as it is now; `None` when it is unknown or
    /// declared dead. Asking again changes nothing (`Drained::newly` is false).
    async fn drain_worker(
        &self,
        id: &str,
        audit: Audit<Option<Drained>>,
    ) -> Result<Option<Drained>>;
    /// Deletes up to `limit` workers declared dead whose last heartbeat was before `before`,
    /// and says how many. Their attempts keep the worker's id.
    async fn delete_dead_workers(&self, before: Instant, limit: u32) -> Result<u64>;
    /// Declares dead the workers silent since before `silent_since`, and takes away every
    /// attempt lease that expired before `now`: those runs are queued again without spending
    /// their retry budget. Also releases runs held back by overlap whose job has nothing
    /// active any more (left by a policy that changed while they waited).
    async fn reap(&self, silent_since: Instant, now: Instant) -> Result<ReapOutcome>;

    // --- the cluster --------------------------------------------------------------------------

    /// One membership round of server node `node`: records it alive, extends its leases to
    /// `now + lease`, gives back partitions above its fair share
    /// (`sked_core::cluster::fair_share` over the nodes seen within `lease`), takes free or
    /// expired ones up to it, and keeps or takes the maintenance lease when it is free.
    async fn renew_membership(
        &self,
        node: &NodeInfo,
        now: Instant,
        lease: Duration,
    ) -> Result<Membership>;
    /// Gives up every lease of `node` at once (a clean shutdown), so others take over without
    /// waiting for the leases to expire.
    async fn leave_cluster(&self, node: &str) -> Result<()>;
    /// The server nodes seen recently, with what they hold at `now`.
    async fn cluster_nodes(&self, now: Instant) -> Result<Vec<NodeRecord>>;
    /// Changes other server nodes commit from now on; `None` for a store only one node uses.
    async fn subscribe(&self) -> Result<Option<StoreEvents>>;
    /// Tells `observer` how each write transaction ends from now on (a second observer is
    /// ignored).
    fn observe_writes(&self, observer: Arc<dyn WriteObserver>);

    // --- tokens and the audit trail -----------------------------------------------------------

    /// Keeps a new token. A token of the same name is a [`StoreError::Conflict`].
    async fn create_token(
        &self,
        token: &NewToken,
        now: Instant,
        audit: Audit<TokenRecord>,
    ) -> Result<TokenRecord>;
    /// The token whose secret hashes to `hash`, expired or not.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// Every token, by name.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>>;
    /// Deletes the token named `name` and returns it; nothing it authenticated before is
    /// undone.
    async fn revoke_token(
        &self,
        name: &str,
        audit: Audit<Option<TokenRecord>>,
    ) -> Result<Option<TokenRecord>>;
    /// Ends the console sessions of token `token_id` made at or before `at` (a logout); an
    /// earlier instant than the one kept is ignored. False when there is no such token.
    async fn end_sessions(&self, token_id: i64, at: Instant) -> Result<bool>;
    /// Records when tokens were last used; an earlier instant than the one kept is ignored.
    async fn touch_tokens(&self, used: &[(i64, Instant)]) -> Result<()>;
    /// Appends entries to the audit trail, in one transaction.
    async fn append_audit(&self, entries: &[AuditEntry]) -> Result<()>;
    /// A page of the audit trail, newest first.
    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>>;

    // --- namespaces and their secrets ---------------------------------------------------------

    /// The settings of namespace `name`, if an administrator set any.
    async fn get_namespace(&self, name: &str) -> Result<Option<NamespaceRecord>>;
    /// Every namespace with settings, by name.
    async fn list_namespaces(&self) -> Result<Vec<NamespaceRecord>>;
    /// The names of the namespaces that hold jobs, in order, at most `limit` (one index seek
    /// each, however many jobs they hold).
    async fn job_namespaces(&self, limit: u32) -> Result<Vec<String>>;
    /// Sets a namespace's settings and returns the previous ones with the new. Refused
    /// ([`StoreError::Refused`]) while forbidding shell targets would leave shell jobs there,
    /// and past [`sked_core::namespace::MAX_CONFIGURED_NAMESPACES`].
    async fn put_namespace(
        &self,
        name: &str,
        spec: &NamespaceSpec,
        now: Instant,
        audit: Audit<(Option<NamespaceRecord>, NamespaceRecord)>,
    ) -> Result<(Option<NamespaceRecord>, NamespaceRecord)>;
    /// Forgets a namespace's settings (its jobs stay, under the defaults).
    async fn delete_namespace(
        &self,
        name: &str,
        audit: Audit<Option<NamespaceRecord>>,
    ) -> Result<Option<NamespaceRecord>>;
    /// Keeps a secret's sealed value (the server seals it; the store never sees it in clear).
    /// Returns whether it was created, and its record. Refused past
    /// [`sked_core::namespace::MAX_SECRETS_PER_NAMESPACE`] secrets in the namespace.
    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        sealed: &str,
        now: Instant,
        audit: Audit<(bool, SecretRecord)>,
    ) -> Result<(bool, SecretRecord)>;
    /// The secrets of a namespace, by name, without their values.
    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>>;
    async fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
        audit: Audit<Option<SecretRecord>>,
    ) -> Result<Option<SecretRecord>>;
    /// The sealed values of the secrets `(namespace, name)` that exist, for the attempts being
    /// handed out.
    async fn sealed_secrets(&self, wanted: &[SecretName]) -> Result<BTreeMap<SecretName, String>>;

    // --- sealed values in an older format ------------------------------------------------------

    /// Every stored text that contains `marker` (a sealed format's prefix such as `v1:`, with no
    /// `%` or `_`): job definitions and their versions, the copies of `notify` rules, namespace
    /// settings, namespace secrets and notifications' channels. Read at start, to seal again
    /// what an older format sealed.
    async fn sealed_texts(&self, marker: &str) -> Result<Vec<StoredSeal>>;
    /// Writes `text` where `stored` was read, if it still holds `stored.text` (a write since
    /// wins); whether it did.
    async fn replace_sealed(&self, stored: &StoredSeal, text: &str) -> Result<bool>;

    // --- heartbeats -----------------------------------------------------------------------------

    /// A ping of heartbeat job `job_id`; `None` when there is no such job.
    async fn ping(&self, job_id: i64, now: Instant) -> Result<Option<PingOutcome>>;
    /// Ends the runs whose ping deadline passed before `now`, at most `limit`: `succeeded` when
    /// a kept ping credits them, else `failed`; settles their dependants.
    async fn expire_ping_waits(&self, now: Instant, limit: u32) -> Result<ExpiredPings>;

    // --- notifications ------------------------------------------------------------------------
    //
    // A run's end records what its job's `notify` rules raise in the transaction that ends it,
    // once per (run, event, rule): see `sked_core::notify`.

    /// Records a `late` notification for every run not started `late_after` past its instant
    /// (or running, having started past it) of every job with a `late` rule; returns how many
    /// are new.
    async fn record_late_notifications(&self, now: Instant) -> Result<u64>;
    /// Claims up to `limit` due notifications for sending, oldest due first: each is due again
    /// `lease` from now unless its send is reported first, so a node that dies mid-send leaves
    /// it to another. Two nodes never hold a claim on one notification at once.
    async fn claim_notifications(
        &self,
        now: Instant,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<sked_core::notify::NotificationRecord>>;
    /// Records how sends went (`sked_core::notify::after_send`); a report under a claim that
    /// is no longer the notification's changes nothing.
    async fn finish_notifications(&self, reports: &[SendReport], now: Instant) -> Result<()>;
    /// A namespace's notifications, newest first.
    async fn list_notifications(
        &self,
        query: &NotificationQuery,
    ) -> Result<Page<sked_core::notify::NotificationRecord>>;

    // --- maintenance --------------------------------------------------------------------------

    /// Deletes up to `limit` finished runs (and their attempts and output) that ended before
    /// `before`, and says how many. A store that partitions runs by instant leaves alone those
    /// in partitions still within retention: [`Store::drop_expired_run_partitions`] removes
    /// them whole later.
    async fn delete_finished_runs(&self, before: Instant, limit: u32) -> Result<u64>;
    /// Makes the partitions runs up to `now + 2 × width` will need, each `width` of instants
    /// long, and says how many it made; keeps the planner's view of those filling up to date.
    /// A store that does not partition runs makes none.
    async fn prepare_run_partitions(&self, _now: Instant, _width: Duration) -> Result<u32> {
        Ok(0)
    }
    /// Drops every partition of runs (with their attempts and output) whose span ended
    /// before `before` and whose runs have all finished before it; says how many runs went.
    async fn drop_expired_run_partitions(&self, _before: Instant) -> Result<u64> {
        Ok(0)
    }
    /// Deletes up to `limit` audit entries recorded before `before`, and says how many.
    async fn delete_audit_before(&self, before: Instant, limit: u32) -> Result<u64>;
    /// Deletes up to `limit` events recorded before `before`, and says how many. A run
    /// started by one keeps its key and id.
    async fn delete_events_before(&self, before: Instant, limit: u32) -> Result<u64>;
    /// Deletes up to `limit` notifications that are no longer pending and were recorded before
    /// `before`, and says how many.
    async fn delete_notifications_before(&self, before: Instant, limit: u32) -> Result<u64>;
}

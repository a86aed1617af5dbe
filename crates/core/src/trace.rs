//! A run's trace: the W3C trace context that follows it from its instant to its end, and the
//! spans it is told as once it ended.
//!
//! Nothing here is recorded while a run is under way. A run's trace id is derived from its id
//! (under the server's trace key, so two installations do not share ids) unless the run
//! joined a trace it was given; each part's span id is derived from the trace id and the
//! part, so every node names a run's attempt span the same way without asking any other. The
//! spans are built after the run ended, from the ledger's own timestamps ([`run_spans`]), and
//! kept or dropped by [`Sampling`]: a ratio of traces, decided on the trace id so every node
//! and every target agrees, plus a tail rule that keeps every run that failed, started late
//! or missed (or risked missing) a deadline.
//!
//! This module holds plain data and pure functions; exporting spans is the server's.

use crate::records::{AttemptRecord, RunRecord};
use crate::run::{AttemptState, RunState};
use crate::Instant;
use sha2::{Digest, Sha256};
use std::fmt;
use std::time::Duration;

/// 16 bytes naming a trace; never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// 8 bytes naming a span within a trace; never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The longest `traceparent` value read; a longer one is refused unread (a later version may
/// add fields, but not kilobytes of them).
pub const MAX_TRACEPARENT_LEN: usize = 256;

/// A W3C `traceparent`: the trace a message belongs to, the span that sent it, and whether
/// that trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub parent_id: SpanId,
    pub sampled: bool,
}

/// Why a `traceparent` was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    #[error("traceparent is longer than {MAX_TRACEPARENT_LEN} characters")]
    TooLong,
    #[error("traceparent is not version-traceid-parentid-flags in lowercase hex")]
    Malformed,
    #[error("traceparent version ff is invalid")]
    BadVersion,
    #[error("traceparent has an all-zero trace id or parent id")]
    ZeroId,
}

impl TraceParent {
    /// Reads a `traceparent` header as W3C Trace Context level 1 says: version 00 is exactly
    /// 55 characters; a later version may carry more after a dash, which is ignored.
    pub fn parse(text: &str) -> Result<TraceParent, TraceParentError> {
        if text.len() > MAX_TRACEPARENT_LEN {
            return Err(TraceParentError::TooLong);
        }
        let bytes = text.as_bytes();
        if bytes.len() < 55 {
            return Err(TraceParentError::Malformed);
        }
        let version = lower_hex::<1>(&bytes[0..2]).ok_or(TraceParentError::Malformed)?[0];
        if version == 0xff {
            return Err(TraceParentError::BadVersion);
        }
        let well_formed_tail = match (version, bytes.len()) {
            (0, 55) => true,
            (0, _) => false,
            (_, 55) => true,
            (_, _) => bytes[55] == b'-',
        };
        if !well_formed_tail || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(TraceParentError::Malformed);
        }
        let trace_id = lower_hex::<16>(&bytes[3..35]).ok_or(TraceParentError::Malformed)?;
        let parent_id = lower_hex::<8>(&bytes[36..52]).ok_or(TraceParentError::Malformed)?;
        let flags = lower_hex::<1>(&bytes[53..55]).ok_or(TraceParentError::Malformed)?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return Err(TraceParentError::ZeroId);
        }
        Ok(TraceParent {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            sampled: flags & 1 == 1,
        })
    }
}

/// The header's text, version 00.
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = u8::from(self.sampled);
        write!(f, "00-{}-{}-{flags:02x}", self.trace_id, self.parent_id)
    }
}

/// `N` bytes from `2 * N` lowercase hex digits.
fn lower_hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    fn nibble(d: u8) -> Option<u8> {
        match d {
            b'0'..=b'9' => Some(d - b'0'),
            b'a'..=b'f' => Some(d - b'a' + 10),
            _ => None,
        }
    }
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// The key trace ids are derived under. Every node of a cluster needs the same one; the
/// server derives it from its secret key when it has one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TraceKey(pub [u8; 32]);

impl fmt::Debug for TraceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TraceKey(..)")
    }
}

impl TraceKey {
    /// The key of a server with no secret key: trace ids then follow from run ids alone.
    pub const UNKEYED: TraceKey = TraceKey([0; 32]);
}

/// The parts of a run that are spans, each with an id of its own within the run's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The run from its instant to its end: the trace's root, or the child of the span it
    /// joined.
    Run,
    /// From the instant to the ledger row: the firing node's lateness.
    RecordFire,
    /// From the ledger row to the first attempt (or the end of a run that never started).
    Queued,
    /// One attempt, by its id: the span a target's own spans are children of.
    Attempt(i64),
}

/// Where a run joined a trace, as the store keeps it (`runs.trace_parent`) without knowing
/// the trace key: the trace (one given by a caller, or run R's own, derived under the key)
/// and the span the run's root is a child of (one given, or run U's root span). A dependant's
/// run joins the trace of the upstream run that made or released it, as a child of that
/// run's root, so a pipeline is one trace; the store writes it as text, in SQL, from the
/// upstream's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    pub trace: TraceOrigin,
    pub parent: ParentOrigin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOrigin {
    Given(TraceId),
    /// The trace run R started (it joined none).
    OfRun(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentOrigin {
    Given(SpanId),
    /// Run U's root span.
    RunRoot(i64),
}

impl Joined {
    /// A caller's `traceparent`, as the store keeps it.
    pub fn given(parent: TraceParent) -> Joined {
        Joined {
            trace: TraceOrigin::Given(parent.trace_id),
            parent: ParentOrigin::Given(parent.parent_id),
        }
    }

    /// Reads the stored text: `t:<32 hex>` or `r:<run id>`, a slash, `s:<16 hex>` or
    /// `r:<run id>`. Anything else is `None` (the run then has a trace of its own).
    pub fn parse(text: &str) -> Option<Joined> {
        let (trace, parent) = text.split_once('/')?;
        let trace = match trace.split_once(':')? {
            ("t", hex) => TraceOrigin::Given(TraceId(lower_hex::<16>(hex.as_bytes())?)),
            ("r", id) => TraceOrigin::OfRun(id.parse().ok()?),
            _ => return None,
        };
        let parent = match parent.split_once(':')? {
            ("s", hex) => ParentOrigin::Given(SpanId(lower_hex::<8>(hex.as_bytes())?)),
            ("r", id) => ParentOrigin::RunRoot(id.parse().ok()?),
            _ => return None,
        };
        Some(Joined { trace, parent })
    }
}

impl fmt::Display for Joined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.trace {
            TraceOrigin::Given(id) => write!(f, "t:{id}/")?,
            TraceOrigin::OfRun(run) => write!(f, "r:{run}/")?,
        }
        match self.parent {
            ParentOrigin::Given(id) => write!(f, "s:{id}"),
            ParentOrigin::RunRoot(run) => write!(f, "r:{run}"),
        }
    }
}

/// A run's place in tracing: its trace, and the span its root is a child of when it joined
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: TraceId,
    pub joined: Option<SpanId>,
    /// The span it joined is another process's (a caller's), not a run's that sked tells.
    pub joined_remote: bool,
    pub run_id: i64,
}

impl RunTrace {
    /// The trace of run `run_id`: the one it joined, or its own, derived from its id.
    pub fn of(key: &TraceKey, run_id: i64, joined: Option<Joined>) -> RunTrace {
        let Some(joined) = joined else {
            return RunTrace {
                trace_id: own_trace(key, run_id),
                joined: None,
                joined_remote: false,
                run_id,
            };
        };
        let trace_id = match joined.trace {
            TraceOrigin::Given(id) => id,
            TraceOrigin::OfRun(root) => own_trace(key, root),
        };
        let parent = match joined.parent {
            ParentOrigin::Given(span) => span,
            ParentOrigin::RunRoot(upstream) => RunTrace {
                trace_id,
                joined: None,
                joined_remote: false,
                run_id: upstream,
            }
            .span_id(Part::Run),
        };
        RunTrace {
            trace_id,
            joined: Some(parent),
            joined_remote: matches!(joined.parent, ParentOrigin::Given(_)),
            run_id,
        }
    }

    /// [`RunTrace::of`] with what the store keeps (`runs.trace_parent`); text it cannot read
    /// leaves the run a trace of its own.
    pub fn stored(key: &TraceKey, run_id: i64, trace_parent: Option<&str>) -> RunTrace {
        RunTrace::of(key, run_id, trace_parent.and_then(Joined::parse))
    }

    /// The span id of `part` of this run. A run that joined another's trace shares its trace
    /// id, so the run id is part of what names its spans.
    pub fn span_id(&self, part: Part) -> SpanId {
        let (tag, n): (&[u8], i64) = match part {
            Part::Run => (b"run", 0),
            Part::RecordFire => (b"record-fire", 0),
            Part::Queued => (b"queued", 0),
            Part::Attempt(id) => (b"attempt", id),
        };
        let digest = Sha256::new()
            .chain_update(b"sked span id v1\0")
            .chain_update(self.trace_id.0)
            .chain_update(self.run_id.to_be_bytes())
            .chain_update(tag)
            .chain_update(n.to_be_bytes())
            .finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        SpanId(non_zero(id))
    }

    /// What a target of attempt `attempt_id` is handed: its spans are the attempt's children.
    pub fn for_attempt(&self, attempt_id: i64, sampling: &Sampling) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            parent_id: self.span_id(Part::Attempt(attempt_id)),
            sampled: sampling.by_ratio(self.trace_id),
        }
    }
}

/// The trace a run that joined none starts: derived from its id under `key`.
fn own_trace(key: &TraceKey, run_id: i64) -> TraceId {
    let digest = Sha256::new()
        .chain_update(b"sked trace id v1\0")
        .chain_update(key.0)
        .chain_update(run_id.to_be_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    TraceId(non_zero(id))
}

/// All-zero ids are invalid; a digest that happens to be zero gets a one at its end.
fn non_zero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    if id.iter().all(|b| *b == 0) {
        id[N - 1] = 1;
    }
    id
}

/// Which runs' traces are kept: a share of them by trace id, and every run the tail rule
/// keeps whatever the share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// From 0 (only what the tail rule keeps) to 1 (every run).
    pub ratio: f64,
    /// A run that started this long after its instant was late, and is always kept.
    pub late_after: Duration,
}

/// Why a run's trace was kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Its trace id fell in the sampled share.
    Ratio,
    /// It ended failed or timed out.
    Failed,
    /// It took more than one attempt: one failed, timed out or was lost with its worker.
    Retried,
    /// It started (or ended unstarted) later than `late_after` after its instant.
    Late,
    /// It missed a deadline or was at risk of missing its `finish_by`.
    Deadline,
}

impl Kept {
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::Ratio => "ratio",
            Kept::Failed => "failed",
            Kept::Retried => "retried",
            Kept::Late => "late",
            Kept::Deadline => "deadline",
        }
    }
}

impl Sampling {
    /// Whether `trace_id` is in the sampled share: its last 8 bytes, read as a number, below
    /// the ratio's share of their range, as OpenTelemetry's `TraceIdRatioBased` decides, so
    /// a target's SDK with the same ratio agrees.
    pub fn by_ratio(&self, trace_id: TraceId) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 || self.ratio.is_nan() {
            return false;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id.0[8..]);
        let bound = (self.ratio * (1u64 << 63) as f64) as u64;
        (u64::from_be_bytes(low) >> 1) < bound
    }

    /// Whether an ended run's trace is kept, and why, from the few facts of it the tail rule
    /// reads (the exporter reads the rest only of the runs kept); the tail rule first, so a
    /// kept failure says it failed.
    pub fn keep(&self, trace: &RunTrace, run: &EndFacts) -> Option<Kept> {
        if matches!(run.state, RunState::Failed | RunState::TimedOut) {
            return Some(Kept::Failed);
        }
        if run.attempts > 1 || run.failures > 0 {
            return Some(Kept::Retried);
        }
        if run.deadline_marked {
            return Some(Kept::Deadline);
        }
        if run.start_lateness() > self.late_after {
            return Some(Kept::Late);
        }
        self.by_ratio(trace.trace_id).then_some(Kept::Ratio)
    }
}

/// What the tail rule reads of an ended run.
#[derive(Debug, Clone, PartialEq)]
pub struct EndFacts {
    pub state: RunState,
    pub attempts: u32,
    pub failures: u32,
    pub scheduled_for: Instant,
    pub started_at: Option<Instant>,
    pub finished_at: Option<Instant>,
    /// It missed a deadline, or was called at risk of missing its `finish_by`.
    pub deadline_marked: bool,
}

impl EndFacts {
    pub fn of(run: &RunRecord) -> EndFacts {
        EndFacts {
            state: run.state,
            attempts: run.attempts,
            failures: run.failures,
            scheduled_for: run.scheduled_for,
            started_at: run.started_at,
            finished_at: run.finished_at,
            deadline_marked: !run.deadline_missed.is_empty() || run.at_risk.is_some(),
        }
    }

    /// How long after its instant the run started: until its end when it never started.
    pub fn start_lateness(&self) -> Duration {
        let due = self.scheduled_for;
        let started = self.started_at.or(self.finished_at).unwrap_or(due);
        (started - due).to_std().unwrap_or_default()
    }
}

/// What kind of work a span is, as OpenTelemetry names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// sked's own work, and a process or container it runs.
    Internal,
    /// An attempt that calls an HTTP endpoint.
    Client,
    /// An attempt that publishes a message.
    Producer,
}

/// What an attempt's span says of its target: its kind of span, and the attributes that name
/// where it went in OpenTelemetry's semantic conventions (`messaging.*`, `http.*`,
/// `container.*`), from the definition's names only, never a value that may hold a secret (a
/// URL, a command, a header, a payload), and templates unrendered, so their cardinality is the
/// jobs'.
pub fn target_facts(target: &crate::TargetSpec) -> (SpanKind, Vec<(&'static str, Value)>) {
    use crate::TargetSpec;
    let text = |s: &str| Value::Str(s.to_string());
    let kind = |k: &str| ("sked.target.kind", text(k));
    match target {
        TargetSpec::Shell(_) => (SpanKind::Internal, vec![kind("shell")]),
        TargetSpec::Heartbeat(_) => (SpanKind::Internal, vec![kind("heartbeat")]),
        TargetSpec::Container(c) => (
            SpanKind::Internal,
            vec![kind("container"), ("container.image.name", text(&c.image))],
        ),
        TargetSpec::Http(h) => (
            SpanKind::Client,
            vec![
                kind("http"),
                ("http.request.method", text(&h.method.to_ascii_uppercase())),
            ],
        ),
        TargetSpec::Amqp(a) => (
            SpanKind::Producer,
            vec![
                kind("amqp"),
                ("messaging.system", text("rabbitmq")),
                ("messaging.operation.type", text("send")),
                ("messaging.destination.name", text(&a.exchange)),
                (
                    "messaging.rabbitmq.destination.routing_key",
                    text(&a.routing_key),
                ),
            ],
        ),
        TargetSpec::Nats(n) => (
            SpanKind::Producer,
            vec![
                kind("nats"),
                ("messaging.system", text("nats")),
                ("messaging.operation.type", text("send")),
                ("messaging.destination.name", text(&n.subject)),
            ],
        ),
        TargetSpec::RedisStream(r) => (
            SpanKind::Producer,
            vec![
                kind("redis_stream"),
                ("messaging.system", text("redis")),
                ("messaging.operation.type", text("send")),
                ("messaging.destination.name", text(&r.stream)),
            ],
        ),
        TargetSpec::Celery(c) => {
            let mut facts = vec![
                kind("celery"),
                ("messaging.operation.type", text("send")),
                ("sked.celery.task", text(&c.task)),
            ];
            if let Some(queue) = &c.queue {
                facts.push(("messaging.destination.name", text(queue)));
            }
            (SpanKind::Producer, facts)
        }
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// One span of a run, plain data the server maps to its exporter's type.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: Option<SpanId>,
    /// The parent is another process's span (a caller's), as OTLP's flags tell it.
    pub parent_remote: bool,
    pub name: String,
    pub kind: SpanKind,
    pub start: Instant,
    pub end: Instant,
    pub attributes: Vec<(&'static str, Value)>,
    /// Named instants within the span.
    pub events: Vec<(&'static str, Instant)>,
    /// `Some` when the span's work failed, with why (bounded by [`MAX_ERROR_LEN`]).
    pub error: Option<String>,
}

/// The most bytes of an error message a span carries.
pub const MAX_ERROR_LEN: usize = 512;

/// The spans of a run: the run itself, the fire's recording, its time queued, and each
/// attempt; what has not ended yet ends at `until` (the exporter tells ended runs only; the
/// console draws open ones up to now). Attributes carry names and numbers only (namespace,
/// job, ids, states, exit codes), never a definition's values, so nothing secret is exported
/// and cardinality stays that of the jobs.
pub fn run_spans(
    trace: &RunTrace,
    run: &RunRecord,
    attempts: &[AttemptRecord],
    target: Option<&crate::TargetSpec>,
    until: Instant,
) -> Vec<Span> {
    let (attempt_kind, target_attributes) = target
        .map(target_facts)
        .unwrap_or((SpanKind::Internal, Vec::new()));
    let end = run.finished_at.unwrap_or(until).max(run.scheduled_for);
    let root = trace.span_id(Part::Run);
    let mut root_attributes = vec![
        ("sked.namespace", Value::Str(run.namespace.clone())),
        ("sked.job", Value::Str(run.job.clone())),
        ("sked.run.id", Value::Int(run.id)),
        (
            "sked.run.trigger",
            Value::Str(run.trigger.as_str().to_string()),
        ),
        ("sked.run.state", Value::Str(run.state.as_str().to_string())),
        (
            "sked.run.scheduled_for",
            Value::Str(
                run.scheduled_for
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
        ),
        ("sked.run.attempts", Value::Int(i64::from(run.attempts))),
        (
            "sked.fire.lateness_ms",
            Value::Int(millis(run.created_at - run.scheduled_for)),
        ),
        (
            "sked.start.lateness_ms",
            Value::Int(EndFacts::of(run).start_lateness().as_millis() as i64),
        ),
    ];
    if let Some(reason) = run.skip_reason {
        root_attributes.push((
            "sked.run.skip_reason",
            Value::Str(reason.as_str().to_string()),
        ));
    }
    if let Some(shard) = &run.shard {
        root_attributes.push(("sked.run.shard", Value::Int(i64::from(shard.index))));
    }
    if let Some(key) = &run.event_key {
        root_attributes.push(("sked.event.key", Value::Str(key.clone())));
    }
    let run_error = matches!(run.state, RunState::Failed | RunState::TimedOut)
        .then(|| bounded(run.error.as_deref().unwrap_or(run.state.as_str())));
    let mut spans = vec![Span {
        trace_id: trace.trace_id,
        span_id: root,
        parent: trace.joined,
        parent_remote: trace.joined_remote,
        name: format!("run {}/{}", run.namespace, run.job),
        kind: SpanKind::Internal,
        start: run.scheduled_for,
        end,
        attributes: root_attributes,
        events: Vec::new(),
        error: run_error,
    }];
    spans.push(Span {
        trace_id: trace.trace_id,
        span_id: trace.span_id(Part::RecordFire),
        parent: Some(root),
        parent_remote: false,
        name: "record-fire".to_string(),
        kind: SpanKind::Internal,
        start: run.scheduled_for,
        end: run.created_at.max(run.scheduled_for),
        attributes: Vec::new(),
        events: Vec::new(),
        error: None,
    });
    let first_start = attempts.iter().map(|a| a.started_at).min();
    let queued_start = run.created_at.max(run.scheduled_for);
    let mut queued_events = Vec::new();
    if run.ready_at > queued_start {
        queued_events.push(("ready", run.ready_at));
    }
    spans.push(Span {
        trace_id: trace.trace_id,
        span_id: trace.span_id(Part::Queued),
        parent: Some(root),
        parent_remote: false,
        name: "queued".to_string(),
        kind: SpanKind::Internal,
        start: queued_start,
        end: first_start.unwrap_or(end).max(queued_start),
        attributes: Vec::new(),
        events: queued_events,
        error: None,
    });
    for attempt in attempts {
        let mut attributes = vec![
            ("sked.attempt.id", Value::Int(attempt.id)),
            ("sked.attempt.number", Value::Int(i64::from(attempt.number))),
            (
                "sked.attempt.state",
                Value::Str(attempt.state.as_str().to_string()),
            ),
            ("sked.worker.id", Value::Str(attempt.worker_id.clone())),
            ("sked.lease.fencing_token", Value::Int(attempt.token)),
        ];
        attributes.extend(target_attributes.iter().cloned());
        if let Some(code) = attempt.exit_code {
            attributes.push(("process.exit.code", Value::Int(i64::from(code))));
        }
        if let Some(status) = attempt.http_status {
            attributes.push(("http.response.status_code", Value::Int(i64::from(status))));
        }
        let failed = matches!(
            attempt.state,
            AttemptState::Failed | AttemptState::TimedOut | AttemptState::Lost
        );
        let attempt_end = attempt.finished_at.unwrap_or(end).max(attempt.started_at);
        spans.push(Span {
            trace_id: trace.trace_id,
            span_id: trace.span_id(Part::Attempt(attempt.id)),
            parent: Some(root),
            parent_remote: false,
            name: format!("attempt {}", attempt.number),
            kind: attempt_kind,
            start: attempt.started_at,
            end: attempt_end,
            attributes,
            events: vec![("lease", attempt.started_at)],
            error: failed
                .then(|| bounded(attempt.error.as_deref().unwrap_or(attempt.state.as_str()))),
        });
    }
    spans
}

fn millis(d: chrono::Duration) -> i64 {
    d.num_milliseconds().max(0)
}

/// `text` cut to [`MAX_ERROR_LEN`] bytes at a character boundary.
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_ERROR_LEN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_reads_and_writes_back() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        assert!(parent.sampled);
        assert_eq!(
            parent.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.parent_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(parent.to_string(), EXAMPLE);
    }

    #[test]
    fn malformed_headers_are_refused_with_why() {
        let cases = [
            ("", TraceParentError::Malformed),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                TraceParentError::Malformed,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceParentError::BadVersion,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceParentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceParentError::ZeroId,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
                TraceParentError::Malformed,
            ),
        ];
        for (text, why) in cases {
            assert_eq!(TraceParent::parse(text), Err(why), "{text:?}");
        }
        assert_eq!(
            TraceParent::parse(&"0".repeat(5_000)),
            Err(TraceParentError::TooLong)
        );
    }

    #[test]
    fn a_later_version_may_carry_more_after_a_dash() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert!(TraceParent::parse(later).is_ok());
        let glued = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(TraceParent::parse(glued), Err(TraceParentError::Malformed));
    }

    #[test]
    fn a_runs_ids_depend_on_the_key_and_the_run_and_nothing_else() {
        let key = TraceKey([7; 32]);
        let a = RunTrace::of(&key, 42, None);
        assert_eq!(a, RunTrace::of(&key, 42, None));
        assert_ne!(a.trace_id, RunTrace::of(&key, 43, None).trace_id);
        assert_ne!(
            a.trace_id,
            RunTrace::of(&TraceKey::UNKEYED, 42, None).trace_id
        );
        let parts = [
            Part::Run,
            Part::RecordFire,
            Part::Queued,
            Part::Attempt(1),
            Part::Attempt(2),
        ];
        let ids: std::collections::HashSet<_> = parts.iter().map(|p| a.span_id(*p)).collect();
        assert_eq!(ids.len(), parts.len());
    }

    #[test]
    fn a_run_that_joined_a_trace_is_a_child_of_the_span_it_was_given() {
        let given = TraceParent::parse(EXAMPLE).unwrap();
        let joined = RunTrace::of(&TraceKey::UNKEYED, 9, Some(Joined::given(given)));
        assert_eq!(joined.trace_id, given.trace_id);
        assert_eq!(joined.joined, Some(given.parent_id));
        // Two runs in one trace still name their spans apart.
        let other = RunTrace::of(&TraceKey::UNKEYED, 10, Some(Joined::given(given)));
        assert_ne!(joined.span_id(Part::Run), other.span_id(Part::Run));
    }

    #[test]
    fn a_pipeline_is_one_trace_each_step_a_child_of_the_step_before() {
        let key = TraceKey([9; 32]);
        let first = RunTrace::of(&key, 100, None);
        // The second step joined run 100's trace; the third, made by the second, keeps the
        // trace's origin and names the second as its parent — the text the store writes.
        let second_text = "r:100/r:100";
        let second = RunTrace::stored(&key, 200, Some(second_text));
        let third = RunTrace::stored(&key, 300, Some("r:100/r:200"));
        assert_eq!(second.trace_id, first.trace_id);
        assert_eq!(third.trace_id, first.trace_id);
        assert_eq!(second.joined, Some(first.span_id(Part::Run)));
        assert_eq!(third.joined, Some(second.span_id(Part::Run)));
        assert_eq!(Joined::parse(second_text).unwrap().to_string(), second_text);
        let given = Joined::given(TraceParent::parse(EXAMPLE).unwrap());
        assert_eq!(Joined::parse(&given.to_string()), Some(given));
        for bad in ["", "r:1", "r:x/r:1", "t:00/s:11", "q:1/r:1", "r:1/s:zz"] {
            assert_eq!(Joined::parse(bad), None, "{bad}");
            assert_eq!(
                RunTrace::stored(&key, 5, Some(bad)),
                RunTrace::of(&key, 5, None)
            );
        }
    }

    fn sampling(ratio: f64) -> Sampling {
        Sampling {
            ratio,
            late_after: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_ratio_keeps_about_its_share_of_runs() {
        let key = TraceKey([3; 32]);
        for ratio in [0.01, 0.1, 0.5] {
            let kept = (0..100_000)
                .filter(|id| sampling(ratio).by_ratio(RunTrace::of(&key, *id, None).trace_id))
                .count() as f64
                / 100_000.0;
            assert!(
                (kept - ratio).abs() < ratio * 0.1 + 0.002,
                "{ratio}: {kept}"
            );
        }
        assert!(sampling(1.0).by_ratio(TraceId([0xff; 16])));
        assert!(!sampling(0.0).by_ratio(TraceId([0; 16])));
    }

    fn instant(s: &str) -> Instant {
        chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn run(state: RunState, started: &str) -> RunRecord {
        let mut run: RunRecord = serde_json::from_value(serde_json::json!({
            "id": 5, "namespace": "default", "job": "nightly", "job_id": 1,
            "scheduled_for": "2026-11-30T00:00:00Z", "trigger": "schedule",
            "state": state.as_str(), "priority": 0,
            "ready_at": "2026-11-30T00:00:00Z", "created_at": "2026-11-30T00:00:00.002Z",
            "attempts": 1, "failures": 0, "cancel_requested": false
        }))
        .unwrap();
        run.started_at = Some(instant(started));
        run.finished_at = Some(instant("2026-11-30T00:00:05Z"));
        run
    }

    fn attempt(id: i64, state: AttemptState, start: &str, end: &str) -> AttemptRecord {
        AttemptRecord {
            id,
            run_id: 5,
            number: id as u32,
            worker_id: "w1".into(),
            token: 77,
            state,
            started_at: instant(start),
            finished_at: Some(instant(end)),
            lease_expires_at: instant(end),
            exit_code: Some(if state == AttemptState::Succeeded {
                0
            } else {
                3
            }),
            http_status: None,
            error: None,
            output_bytes: 0,
            output_truncated: false,
        }
    }

    #[test]
    fn the_tail_rule_keeps_what_the_ratio_would_drop() {
        let none = sampling(0.0);
        let trace = RunTrace::of(&TraceKey::UNKEYED, 5, None);
        let on_time = run(RunState::Succeeded, "2026-11-30T00:00:00.010Z");
        assert_eq!(none.keep(&trace, &EndFacts::of(&on_time)), None);
        assert_eq!(
            sampling(1.0).keep(&trace, &EndFacts::of(&on_time)),
            Some(Kept::Ratio)
        );
        let late = run(RunState::Succeeded, "2026-11-30T00:00:02Z");
        assert_eq!(none.keep(&trace, &EndFacts::of(&late)), Some(Kept::Late));
        let failed = run(RunState::Failed, "2026-11-30T00:00:00.010Z");
        assert_eq!(
            none.keep(&trace, &EndFacts::of(&failed)),
            Some(Kept::Failed)
        );
        // A run that succeeded on its second attempt (the first failed or was lost) is kept.
        let mut retried = on_time.clone();
        retried.attempts = 2;
        assert_eq!(
            none.keep(&trace, &EndFacts::of(&retried)),
            Some(Kept::Retried)
        );
        let mut missed = on_time;
        missed.deadline_missed = vec![crate::deadline::Miss {
            kind: crate::deadline::DeadlineKind::FinishBy,
            by_ms: 10,
        }];
        assert_eq!(
            none.keep(&trace, &EndFacts::of(&missed)),
            Some(Kept::Deadline)
        );
    }

    #[test]
    fn a_runs_spans_nest_under_its_root_and_its_attempts_carry_their_propagated_ids() {
        let trace = RunTrace::of(&TraceKey::UNKEYED, 5, None);
        let mut failed = run(RunState::Failed, "2026-11-30T00:00:00.010Z");
        failed.error = Some("é".repeat(1_000));
        let attempts = [
            attempt(
                1,
                AttemptState::Failed,
                "2026-11-30T00:00:00.010Z",
                "2026-11-30T00:00:01Z",
            ),
            attempt(
                2,
                AttemptState::Failed,
                "2026-11-30T00:00:02Z",
                "2026-11-30T00:00:05Z",
            ),
        ];
        let target: crate::TargetSpec = serde_json::from_value(serde_json::json!(
            {"amqp": {"connection": "main", "exchange": "jobs", "routing_key": "{{job}}"}}
        ))
        .unwrap();
        let spans = run_spans(&trace, &failed, &attempts, Some(&target), failed.created_at);
        assert_eq!(spans[3].kind, SpanKind::Producer);
        assert!(spans[3]
            .attributes
            .contains(&("messaging.system", Value::Str("rabbitmq".into()))));
        assert!(spans[4].attributes.contains(&(
            "messaging.rabbitmq.destination.routing_key",
            Value::Str("{{job}}".into())
        )));
        let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "run default/nightly",
                "record-fire",
                "queued",
                "attempt 1",
                "attempt 2"
            ]
        );
        let root = &spans[0];
        assert_eq!(root.parent, None);
        assert!(spans[1..].iter().all(|s| s.parent == Some(root.span_id)));
        assert!(spans
            .iter()
            .all(|s| s.start <= s.end && s.trace_id == trace.trace_id));
        assert!(root.error.as_ref().unwrap().len() <= MAX_ERROR_LEN);
        let handed = trace.for_attempt(2, &sampling(0.0));
        assert_eq!(spans[4].span_id, handed.parent_id);
        assert!(!handed.sampled);
        assert_eq!(spans[2].end, attempts[0].started_at);
    }

    proptest! {
        #[test]
        fn every_header_written_reads_back(trace in any::<[u8; 16]>(), span in any::<[u8; 8]>(), sampled: bool) {
            let parent = TraceParent { trace_id: TraceId(non_zero(trace)), parent_id: SpanId(non_zero(span)), sampled };
            prop_assert_eq!(TraceParent::parse(&parent.to_string()), Ok(parent));
        }

        #[test]
        fn no_text_makes_the_reader_panic(text in ".{0,300}") {
            let _ = TraceParent::parse(&text);
        }
    }
}

//! Traces of runs, exported over OTLP when `--otlp-endpoint` is given (off otherwise, at no
//! cost: no trace context is handed out and no duty runs).
//!
//! Every node hands each attempt it starts the W3C trace context of its run
//! ([`RunTracing::traceparent`]), derived from the run and attempt ids under the key every
//! node shares, so targets (processes, HTTP endpoints, broker consumers) make their spans
//! children of the attempt's span without any node having recorded anything. The elected
//! node's exporter ([`run`]) walks the runs that ended, a page at a time behind a settling
//! delay (a run's end may commit a little after the instant it records), judges each by a few
//! columns and keeps those the sampling keeps (`sked_core::trace::Sampling`: a share by trace
//! id, and every failed, retried, late or deadline-missing run), reads only those whole,
//! builds their spans from the ledger (`sked_core::trace::run_spans`) and sends them
//! (`export.rs`). Spans that cannot be sent
//! are counted and dropped: tracing never holds the ledger back.
//!
//! It reads the store through `TraceStore` only and changes nothing.

pub mod export;

use crate::AppState;
use chrono::Utc;
use sked_core::records::RunRecord;
use sked_core::trace::{run_spans, Kept, RunTrace, Sampling, Span, TraceKey, Value};
use sked_core::TargetSpec;
use sked_store::{EndedCursor, EndedRun};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::{watch, Mutex};

/// How the server exports traces.
#[derive(Clone)]
pub struct TraceSettings {
    /// The collector's base URL (`http://host:4318` for HTTP, `http://host:4317` for gRPC);
    /// HTTP appends `/v1/traces`.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Sent with every export (an API key, a tenant id); values never printed.
    pub headers: Vec<(String, String)>,
    pub sampling: Sampling,
    /// The longest one export may take.
    pub timeout: Duration,
    /// Where a trace is seen in the tracing backend's UI: an http(s) URL with `{trace_id}` in
    /// it, which a run's page links its trace id to.
    pub link: Option<String>,
}

impl std::fmt::Debug for TraceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("TraceSettings")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &names)
            .field("sampling", &self.sampling)
            .field("timeout", &self.timeout)
            .field("link", &self.link)
            .finish()
    }
}

/// OTLP's transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`http/protobuf`), port 4318 by convention.
    Http,
    /// gRPC, port 4317 by convention.
    Grpc,
}

impl OtlpProtocol {
    pub fn parse(text: &str) -> Option<OtlpProtocol> {
        match text {
            "http" | "http/protobuf" => Some(OtlpProtocol::Http),
            "grpc" => Some(OtlpProtocol::Grpc),
            _ => None,
        }
    }
}

/// What every node needs to name a run's trace: the shared key and the sampling.
#[derive(Debug, Clone, Copy)]
pub struct RunTracing {
    pub key: TraceKey,
    pub sampling: Sampling,
}

impl RunTracing {
    /// The `traceparent` an attempt's target is handed: the run's trace (`trace_parent`, the
    /// trace it joined, as the store keeps it), the attempt's span.
    pub fn traceparent(&self, run_id: i64, trace_parent: Option<&str>, attempt_id: i64) -> String {
        RunTrace::stored(&self.key, run_id, trace_parent)
            .for_attempt(attempt_id, &self.sampling)
            .to_string()
    }

    /// Whether an ended run is told, and its trace if so.
    pub fn judge(&self, run: &EndedRun) -> Option<(RunTrace, Kept)> {
        let trace = RunTrace::stored(&self.key, run.id, run.trace_parent.as_deref());
        self.sampling
            .keep(&trace, &run.facts)
            .map(|kept| (trace, kept))
    }
}

/// A run's trace as the API shows it: its id and the link to it while traces are exported,
/// and its spans as the ledger tells them (the console's timeline, with or without a tracing
/// backend).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    pub spans: Vec<SpanView>,
}

/// One span of [`TraceView`]: the root is the run (depth 0), the rest its children.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpanView {
    pub name: String,
    pub depth: u8,
    /// While traces are exported: the span's id, as the tracing backend has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    pub start: sked_core::Instant,
    pub end: sked_core::Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `run`'s [`TraceView`] at `now` (what has not ended is drawn up to it).
pub fn view(
    state: &AppState,
    run: &RunRecord,
    attempts: &[sked_core::records::AttemptRecord],
    now: sked_core::Instant,
) -> TraceView {
    let exported = state.run_traces;
    let key = exported.map_or(TraceKey::UNKEYED, |t| t.key);
    let trace = RunTrace::stored(&key, run.id, run.trace_parent.as_deref());
    let root = trace.span_id(sked_core::trace::Part::Run);
    let trace_id = exported.map(|_| trace.trace_id.to_string());
    let link = state
        .config
        .traces
        .as_ref()
        .and_then(|t| t.link.as_ref())
        .zip(trace_id.as_ref())
        .map(|(link, id)| link.replace("{trace_id}", id));
    let spans = run_spans(&trace, run, attempts, None, now)
        .into_iter()
        .map(|span| SpanView {
            depth: u8::from(span.span_id != root),
            span_id: exported.map(|_| span.span_id.to_string()),
            name: span.name,
            start: span.start,
            end: span.end,
            error: span.error,
        })
        .collect();
    TraceView {
        trace_id,
        link,
        spans,
    }
}

/// How often the exporter looks for ended runs: once a second, half a second after the whole
/// second ([`to_mid_second`]), away from the instants most schedules name, whose fires its
/// reads would otherwise meet on a busy node.
const INTERVAL: Duration = Duration::from_secs(1);
/// The shortest pause between two passes; the rest of the wait is [`to_mid_second`]'s.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// A run is read this long after the end it records, so that ends committed a little after
/// they were stamped are not walked past.
const SETTLE: chrono::Duration = chrono::Duration::seconds(2);
/// How far back the walk starts when this node starts exporting (at start, or on taking over
/// the maintenance role): a few seconds of runs may be told twice after a handover.
const LOOKBACK: chrono::Duration = chrono::Duration::seconds(10);
/// The furthest behind the walk goes: a node that takes the maintenance role back after a
/// while, or an exporter that cannot keep up, starts again this far back rather than telling
/// old runs late (the runs it passes over are logged, not exported).
const MAX_BEHIND: chrono::Duration = chrono::Duration::seconds(60);
/// Runs read per page.
const PAGE: u32 = 1_000;

/// Exports the spans of ended runs while this node holds the maintenance role.
pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    let (Some(tracing), Some(settings)) = (state.run_traces, state.config.traces.clone()) else {
        return;
    };
    let exporter = match export::Exporter::new(&settings, &state.node.id) {
        Ok(exporter) => std::sync::Arc::new(exporter),
        Err(e) => {
            tracing::error!("traces: cannot export to {}: {e}", settings.endpoint);
            return;
        }
    };
    let walk = std::sync::Arc::new(Mutex::new(Walk::default()));
    let elected = state.maintenance.clone();
    super::maintenance::every(INTERVAL, MIN_PAUSE, elected.clone(), shutdown, || {
        let (state, exporter, walk) = (state.clone(), exporter.clone(), walk.clone());
        async move {
            tokio::time::sleep(to_mid_second(Utc::now())).await;
            let mut walk = walk.lock().await;
            walk.pass(&state, &tracing, &exporter, Utc::now()).await;
        }
    })
    .await;
    exporter.shutdown().await;
}

/// How long from `now` to the next half past a whole second (at least [`MIN_PAUSE`] on from
/// one, so two passes never share a second).
fn to_mid_second(now: sked_core::Instant) -> Duration {
    let into = u64::from(now.timestamp_subsec_millis());
    let wait = (1_500 - into) % 1_000;
    Duration::from_millis(if wait < MIN_PAUSE.as_millis() as u64 {
        wait + 1_000
    } else {
        wait
    })
}

/// How long a job's target is kept before it is read again, and how many jobs' are kept.
const TARGET_TTL: Duration = Duration::from_secs(60);
const MAX_TARGETS: usize = 10_000;

/// What the exporter keeps between passes: where the walk of ended runs is (`None` until the
/// first pass, which starts [`LOOKBACK`] back), and the targets of the jobs it told runs of,
/// which name their attempts' destinations (`None`: the job is gone).
#[derive(Default)]
struct Walk {
    cursor: Option<EndedCursor>,
    targets: HashMap<i64, (std::time::Instant, Option<TargetSpec>)>,
}

impl Walk {
    /// One pass, which moves the cursor on; a page the store cannot read ends it there.
    async fn pass(
        &mut self,
        state: &AppState,
        tracing: &RunTracing,
        exporter: &export::Exporter,
        now: sked_core::Instant,
    ) {
        self.cursor = walk(state, tracing, exporter, self, now).await;
    }

    /// The targets of these jobs, read where not known or stale.
    async fn targets_of(&mut self, state: &AppState, job_ids: impl Iterator<Item = i64>) {
        let now = std::time::Instant::now();
        if self.targets.len() > MAX_TARGETS {
            self.targets.clear();
        }
        for id in job_ids {
            let fresh = self
                .targets
                .get(&id)
                .is_some_and(|(read, _)| now.duration_since(*read) < TARGET_TTL);
            if fresh {
                continue;
            }
            match state.store.get_job_by_id(id).await {
                Ok(job) => {
                    self.targets.insert(id, (now, job.map(|j| j.spec.target)));
                }
                // Told without its target's attributes this time.
                Err(e) => tracing::debug!("traces: cannot read job {id}: {e}"),
            }
        }
    }
}

/// Every page of runs ended since the walk's cursor up to `now - SETTLE`, told; the cursor the
/// walk is at after it. The spans of the pages are sent in requests of their own size, not one
/// a page: at a low ratio a page keeps a few runs.
async fn walk(
    state: &AppState,
    tracing: &RunTracing,
    exporter: &export::Exporter,
    known: &mut Walk,
    now: sked_core::Instant,
) -> Option<EndedCursor> {
    let until = now - SETTLE;
    let start = EndedCursor {
        finished_at: until - LOOKBACK,
        run_id: 0,
    };
    let mut cursor = match known.cursor {
        None => start,
        Some(at) if at.finished_at < until - MAX_BEHIND => {
            tracing::warn!(
                "traces: runs that ended from {} to {} are not exported: the walk was more than \
                 {}s behind",
                at.finished_at,
                start.finished_at,
                MAX_BEHIND.num_seconds()
            );
            start
        }
        Some(at) => at,
    };
    let mut spans = Vec::new();
    loop {
        let runs = match state.store.ended_runs(cursor, until, PAGE).await {
            Ok(runs) => runs,
            Err(e) => {
                tracing::error!("traces: cannot read ended runs: {e}");
                break;
            }
        };
        let Some(next) = runs.last().and_then(EndedRun::cursor) else {
            break;
        };
        let full = runs.len() as u32 == PAGE;
        match spans_of(state, tracing, known, runs).await {
            Ok(told) => spans.extend(told),
            Err(e) => {
                tracing::error!("traces: cannot read the ended runs to tell: {e}");
                break;
            }
        }
        cursor = next;
        if spans.len() >= export::SPANS_PER_REQUEST {
            exporter
                .send(std::mem::take(&mut spans), &state.metrics)
                .await;
        }
        if !full {
            break;
        }
    }
    exporter.send(spans, &state.metrics).await;
    Some(cursor)
}

/// The spans of the runs of a page that sampling keeps, counted by why they were kept: only
/// those are read whole, with their attempts.
async fn spans_of(
    state: &AppState,
    tracing: &RunTracing,
    known: &mut Walk,
    runs: Vec<EndedRun>,
) -> sked_store::Result<Vec<Span>> {
    let kept: HashMap<i64, (RunTrace, Kept)> = runs
        .iter()
        .filter_map(|run| tracing.judge(run).map(|judged| (run.id, judged)))
        .collect();
    if kept.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = runs
        .iter()
        .map(|r| r.id)
        .filter(|id| kept.contains_key(id))
        .collect();
    let told = state.store.told_runs(&ids).await?;
    let jobs: std::collections::BTreeSet<i64> = told.iter().map(|(run, _)| run.job_id).collect();
    known.targets_of(state, jobs.into_iter()).await;
    let mut spans = Vec::new();
    for (run, attempts) in told {
        let Some((trace, why)) = kept.get(&run.id) else {
            continue;
        };
        state.metrics.trace_kept(*why);
        let end = run.finished_at.unwrap_or(run.created_at);
        let target = known.targets.get(&run.job_id).and_then(|(_, t)| t.as_ref());
        let mut these = run_spans(trace, &run, &attempts, target, end);
        if let Some(root) = these.first_mut() {
            root.attributes
                .push(("sked.trace.kept", Value::Str(why.as_str().to_string())));
        }
        spans.extend(these);
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> sked_core::Instant {
        chrono::DateTime::from_timestamp_millis(1_800_000_000_000 + millis).unwrap_or_default()
    }

    #[test]
    fn passes_fall_half_past_a_whole_second() {
        assert_eq!(to_mid_second(at(0)), Duration::from_millis(500));
        assert_eq!(to_mid_second(at(499)), Duration::from_millis(1_001));
        assert_eq!(to_mid_second(at(495)), Duration::from_millis(1_005));
        assert_eq!(to_mid_second(at(489)), Duration::from_millis(11));
        assert_eq!(to_mid_second(at(500)), Duration::from_millis(1_000));
        assert_eq!(to_mid_second(at(999)), Duration::from_millis(501));
        for ms in 0..3_000 {
            let next =
                at(ms) + chrono::Duration::from_std(to_mid_second(at(ms))).unwrap_or_default();
            assert_eq!(next.timestamp_subsec_millis(), 500, "{ms}");
        }
    }
}

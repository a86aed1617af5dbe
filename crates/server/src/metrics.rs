//! What the server measures about itself, exposed at `/metrics` in the OpenMetrics text format
//! (which Prometheus scrapes) through the Prometheus project's own Rust client.
//!
//! Each server holds its own registry, so several servers in one process (the tests, the
//! benchmarks) never add into each other's figures. Labels are bounded by design: a namespace,
//! an outcome, a skip reason, a priority, a store call; never a run id, and a job's name only
//! for the jobs that ask (`job_metrics`, at most [`MAX_NAMED_JOBS`]). Those per-job series are
//! kept in a registry of their own and rendered only for a caller with a token, and only for
//! the namespaces it sees ([`Metrics::render`]): `/metrics` without a token names no job. The
//! duties own the events; this module owns only their names, help texts, units and buckets.

use chrono::TimeDelta;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sked_core::{AttemptOutcome, RunState, SkipReason};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Mutex;

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the lateness and lag histograms, in seconds: 1 ms to 1 min, so the
/// sub-10 ms fires of a healthy node and a minute-long stall both land in a bucket of their own.
const LATENESS_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Upper bounds of attempt durations, in seconds: 10 ms (a no-op) to 6 h (a nightly batch).
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 21600.0,
];

/// Upper bounds of store calls, in seconds: 0.5 ms to 10 s.
const STORE_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabel {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    namespace: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    namespace: String,
    outcome: &'static str,
    /// Why a run was skipped; empty for the other outcomes.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowHoldLabels {
    namespace: String,
    /// `concurrency`, `rate` or `undefined` (a namespace limit that is not defined).
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowKeyLabels {
    namespace: String,
    key: String,
}

/// Keys the per-key gauge shows, at most: those with the most runs waiting.
pub const FLOW_KEYS_SHOWN: usize = 20;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeptLabel {
    /// Why a run's trace was exported: `ratio`, `failed`, `retried`, `late` or `deadline`.
    kept: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadlineLabels {
    namespace: String,
    /// `start_by`, `finish_by` or `max_duration`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    priority: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabel {
    change: &'static str,
}

/// A job that asked for metrics by name (`job_metrics`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    namespace: String,
    job: String,
    outcome: &'static str,
}

/// Jobs labelled by name at most, per node: past it, further jobs' runs are counted only by
/// namespace (and `sked_job_metrics_refused_total` says how many were left out), so that a
/// flood of opted-in jobs cannot grow the exposition without bound.
pub const MAX_NAMED_JOBS: usize = 1000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotificationLabels {
    event: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreCallLabel {
    call: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn lateness() -> Histogram {
    Histogram::new(LATENESS_BUCKETS)
}

fn duration() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn store_call() -> Histogram {
    Histogram::new(STORE_BUCKETS)
}

/// Every metric of one server. Counters and gauges are public for the duty that owns each;
/// the labelled families are reached through the methods below, which name their labels.
pub struct Metrics {
    registry: Registry,
    /// The series labelled by a job's name: served only to callers that see its namespace.
    job_registry: Registry,
    pub fires: Counter,
    pub fires_skipped: Counter,
    pub fires_skipped_backlog: Counter,
    pub fire_batches: Counter,
    pub attempts_started: Counter,
    pub messages_published: Counter,
    pub messages_failed: Counter,
    pub completions_accepted: Counter,
    pub completions_rejected: Counter,
    pub attempts_lost: Counter,
    pub retries: Counter,
    pub workers_declared_dead: Counter,
    pub runs_deleted: Counter,
    pub schedules: Gauge,
    pub workers_overloaded: Gauge,
    pub log_follows: Gauge,
    fire_lateness: Histograms<NamespaceLabel>,
    start_lateness: Histograms<NamespaceLabel>,
    attempt_duration: Histograms<AttemptLabels>,
    publish_lag: Histograms<NamespaceLabel>,
    runs: Family<RunLabels, Counter>,
    deadline_misses: Family<DeadlineLabels, Counter>,
    runs_at_risk: Family<NamespaceLabel, Counter>,
    traces_kept: Family<KeptLabel, Counter>,
    spans_exported: Counter,
    spans_dropped: Counter,
    flow_holds: Family<FlowHoldLabels, Counter>,
    flow_key_waiting: Family<FlowKeyLabels, Gauge>,
    queue_by_priority: Family<PriorityLabel, Gauge>,
    /// The priorities `queue_by_priority` has had: few (a job's priority is its owner's
    /// choice, and jobs share a handful of them).
    priorities_seen: Mutex<BTreeSet<i32>>,
    leases: Family<LeaseLabel, Counter>,
    notifications: Family<NotificationLabels, Counter>,
    job_runs: Family<JobLabels, Counter>,
    job_durations: Histograms<JobLabels>,
    /// The jobs labelled by name so far.
    named_jobs: Mutex<std::collections::HashSet<(String, String)>>,
    job_metrics_refused: Counter,
    store_calls: Histograms<StoreCallLabel>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        // A counter is named without its `_total`, which the encoder appends.
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let fires = counter("sked_fires", "Instants written to the ledger");
        let fires_skipped = counter("sked_fires_skipped", "Instants recorded as skipped");
        let fires_skipped_backlog = counter(
            "sked_fires_skipped_backlog",
            "Instants recorded as skipped because their job or namespace had too many runs queued",
        );
        let fire_batches = counter(
            "sked_fire_batches",
            "Ledger transactions of the firing loop",
        );
        let attempts_started = counter("sked_attempts_started", "Attempts handed to workers");
        let messages_published = counter(
            "sked_messages_published",
            "Messages of broker targets the broker confirmed",
        );
        let messages_failed = counter(
            "sked_messages_failed",
            "Publishes of broker targets that failed or timed out",
        );
        let completions_accepted = counter("sked_completions_accepted", "Attempt results recorded");
        let completions_rejected = counter(
            "sked_completions_rejected",
            "Attempt results rejected (fenced or unknown)",
        );
        let attempts_lost = counter(
            "sked_attempts_lost",
            "Attempts lost with their worker; their runs were re-queued without spending a retry",
        );
        let retries = counter(
            "sked_retries",
            "Failed or timed-out attempts whose run was queued again by its retry policy",
        );
        let workers_declared_dead = counter(
            "sked_workers_declared_dead",
            "Workers declared dead after missing heartbeats",
        );
        let runs_deleted = counter("sked_runs_deleted", "Finished runs removed by retention");
        let mut gauge = |name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let schedules = gauge("sked_schedules", "Schedules held by the firing loop");
        let workers_overloaded = gauge(
            "sked_workers_overloaded",
            "Workers this node knows whose overload control holds them back now",
        );
        let log_follows = gauge(
            "sked_log_follows",
            "Run logs being followed (GET /runs/{id}/log?follow=true) now",
        );
        let fire_lateness = Histograms::new_with_constructor(lateness as fn() -> Histogram);
        registry.register(
            "sked_fire_lateness_seconds",
            "From an instant to its run written to the ledger, by namespace",
            fire_lateness.clone(),
        );
        let start_lateness = Histograms::new_with_constructor(lateness as fn() -> Histogram);
        registry.register(
            "sked_start_lateness_seconds",
            "From an instant to its attempt handed to a worker or the publisher, by namespace",
            start_lateness.clone(),
        );
        let attempt_duration = Histograms::new_with_constructor(duration as fn() -> Histogram);
        registry.register(
            "sked_attempt_duration_seconds",
            "From an attempt's start to its recorded end, by namespace and outcome",
            attempt_duration.clone(),
        );
        let publish_lag = Histograms::new_with_constructor(lateness as fn() -> Histogram);
        registry.register(
            "sked_publish_lag_seconds",
            "From an instant to the broker's confirm of its message, by namespace",
            publish_lag.clone(),
        );
        let runs = Family::default();
        registry.register(
            "sked_runs",
            "Runs that reached an end, by namespace, outcome and (for skipped) reason",
            runs.clone(),
        );
        let deadline_misses = Family::default();
        registry.register(
            "sked_deadline_misses",
            "Deadlines runs missed, by namespace and kind (start_by, finish_by, max_duration)",
            deadline_misses.clone(),
        );
        let runs_at_risk = Family::default();
        registry.register(
            "sked_runs_at_risk",
            "Runs called at risk of missing their finish_by before they did, by namespace",
            runs_at_risk.clone(),
        );
        let traces_kept = Family::default();
        registry.register(
            "sked_traces_kept",
            "Ended runs whose trace was exported, by why (ratio, failed, retried, late, deadline)",
            traces_kept.clone(),
        );
        let spans_exported = Counter::default();
        registry.register(
            "sked_spans_exported",
            "Spans of runs the OTLP collector accepted",
            spans_exported.clone(),
        );
        let spans_dropped = Counter::default();
        registry.register(
            "sked_spans_dropped",
            "Spans of runs not exported because the OTLP collector could not be reached or refused them",
            spans_dropped.clone(),
        );
        let flow_holds = Family::default();
        registry.register(
            "sked_flow_holds",
            "Starts a flow-control key held back, by namespace and kind (concurrency, rate, \
             undefined)",
            flow_holds.clone(),
        );
        let queue_by_priority = Family::default();
        registry.register(
            "sked_queue_depth",
            "Runs waiting in the dispatcher for a worker, by priority",
            queue_by_priority.clone(),
        );
        let leases = Family::default();
        registry.register(
            "sked_partition_leases",
            "Partition leases this node gained or lost",
            leases.clone(),
        );
        let notifications = Family::default();
        registry.register(
            "sked_notifications",
            "Sends of notifications, by event and outcome (sent, retried, failed)",
            notifications.clone(),
        );
        let mut job_registry = Registry::default();
        let job_runs = Family::default();
        job_registry.register(
            "sked_job_runs",
            "Runs of the jobs that ask for it (job_metrics) that reached an end as their last \
             attempt was recorded, by namespace, job and outcome",
            job_runs.clone(),
        );
        let job_durations = Histograms::new_with_constructor(duration as fn() -> Histogram);
        job_registry.register(
            "sked_job_attempt_duration_seconds",
            "Attempt durations of the jobs that ask for it (job_metrics), by namespace, job and \
             outcome",
            job_durations.clone(),
        );
        let flow_key_waiting = Family::default();
        job_registry.register(
            "sked_flow_key_waiting_runs",
            "Runs this node holds back for a flow-control key, for the keys with the most \
             (at most 20), by namespace and key",
            flow_key_waiting.clone(),
        );
        let job_metrics_refused = Counter::default();
        registry.register(
            "sked_job_metrics_refused",
            "Attempt ends of jobs asking for metrics by name that were counted by namespace only: \
             this node already labels its most jobs",
            job_metrics_refused.clone(),
        );
        let store_calls = Histograms::new_with_constructor(store_call as fn() -> Histogram);
        registry.register(
            "sked_store_call_seconds",
            "Store transactions of the hot path (fire, start, complete, heartbeat, membership), by call",
            store_calls.clone(),
        );
        Metrics {
            registry,
            job_registry,
            fires,
            fires_skipped,
            fires_skipped_backlog,
            fire_batches,
            attempts_started,
            messages_published,
            messages_failed,
            completions_accepted,
            completions_rejected,
            attempts_lost,
            retries,
            workers_declared_dead,
            runs_deleted,
            schedules,
            workers_overloaded,
            log_follows,
            fire_lateness,
            start_lateness,
            attempt_duration,
            publish_lag,
            runs,
            deadline_misses,
            runs_at_risk,
            traces_kept,
            spans_exported,
            spans_dropped,
            flow_holds,
            flow_key_waiting,
            queue_by_priority,
            priorities_seen: Mutex::default(),
            leases,
            notifications,
            job_runs,
            job_durations,
            named_jobs: Mutex::default(),
            job_metrics_refused,
            store_calls,
        }
    }

    /// Counts one more on `gauge` until the returned guard is dropped, however the code
    /// holding it ends.
    pub fn hold(gauge: &Gauge) -> Held {
        gauge.inc();
        Held(gauge.clone())
    }

    pub fn fired(&self, namespace: &str, lateness: TimeDelta) {
        observe(&self.fire_lateness, &namespace_label(namespace), lateness);
    }

    pub fn started(&self, namespace: &str, lateness: TimeDelta) {
        observe(&self.start_lateness, &namespace_label(namespace), lateness);
    }

    pub fn published(&self, namespace: &str, lag: TimeDelta) {
        observe(&self.publish_lag, &namespace_label(namespace), lag);
    }

    /// An attempt's recorded end: its duration, and the run's end when this ended the run;
    /// by the job's name too when it asked (`job`).
    pub fn attempt_ended(
        &self,
        namespace: &str,
        job: Option<&str>,
        outcome: AttemptOutcome,
        took: TimeDelta,
        run: RunState,
    ) {
        let labels = AttemptLabels {
            namespace: namespace.to_string(),
            outcome: outcome.as_str(),
        };
        observe(&self.attempt_duration, &labels, took);
        if run.is_terminal() {
            self.run_ended(namespace, run, None);
        }
        if let Some(job) = job.filter(|job| self.may_name(namespace, job)) {
            let mut labels = JobLabels {
                namespace: namespace.to_string(),
                job: job.to_string(),
                outcome: outcome.as_str(),
            };
            observe(&self.job_durations, &labels, took);
            if run.is_terminal() {
                labels.outcome = run.as_str();
                self.job_runs.get_or_create(&labels).inc();
            }
        }
    }

    /// Whether a job may be labelled by name: it is already, or fewer than
    /// [`MAX_NAMED_JOBS`] are.
    fn may_name(&self, namespace: &str, job: &str) -> bool {
        let mut named = self.named_jobs.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), job.to_string());
        if named.contains(&key) {
            return true;
        }
        if named.len() >= MAX_NAMED_JOBS {
            self.job_metrics_refused.inc();
            return false;
        }
        named.insert(key);
        true
    }

    /// A run reached `state`, an end; `reason` says why when it was skipped.
    pub fn run_ended(&self, namespace: &str, state: RunState, reason: Option<SkipReason>) {
        let labels = RunLabels {
            namespace: namespace.to_string(),
            outcome: state.as_str(),
            reason: reason.map_or("", SkipReason::as_str),
        };
        self.runs.get_or_create(&labels).inc();
    }

    /// A run missed a deadline of `kind`.
    pub fn deadline_missed(&self, namespace: &str, kind: sked_core::deadline::DeadlineKind) {
        let labels = DeadlineLabels {
            namespace: namespace.to_string(),
            kind: kind.as_str(),
        };
        self.deadline_misses.get_or_create(&labels).inc();
    }

    /// A run's trace was exported, for this reason.
    pub fn trace_kept(&self, kept: sked_core::trace::Kept) {
        let labels = KeptLabel {
            kept: kept.as_str(),
        };
        self.traces_kept.get_or_create(&labels).inc();
    }

    pub fn spans_exported(&self, count: u64) {
        self.spans_exported.inc_by(count);
    }

    pub fn spans_dropped(&self, count: u64) {
        self.spans_dropped.inc_by(count);
    }

    /// A key held a start back.
    pub fn flow_held(&self, namespace: &str, hold: &sked_core::flow::Hold) {
        use sked_core::flow::Hold;
        let kind = match hold {
            Hold::Concurrency { .. } => "concurrency",
            Hold::Rate { .. } => "rate",
            Hold::Undefined { .. } => "undefined",
        };
        let labels = FlowHoldLabels {
            namespace: namespace.to_string(),
            kind,
        };
        self.flow_holds.get_or_create(&labels).inc();
    }

    /// The keys with the most runs held back now, as the dispatcher counts them: replaces
    /// the gauge's series, so a key that no longer waits leaves it.
    pub fn flow_keys_waiting<'a>(&self, keys: impl IntoIterator<Item = (&'a str, &'a str, usize)>) {
        self.flow_key_waiting.clear();
        for (namespace, key, runs) in keys {
            let labels = FlowKeyLabels {
                namespace: namespace.to_string(),
                key: key.to_string(),
            };
            self.flow_key_waiting
                .get_or_create(&labels)
                .set(i64::try_from(runs).unwrap_or(i64::MAX));
        }
    }

    /// A run was called at risk of missing its `finish_by`.
    pub fn at_risk(&self, namespace: &str) {
        let labels = NamespaceLabel {
            namespace: namespace.to_string(),
        };
        self.runs_at_risk.get_or_create(&labels).inc();
    }

    /// The dispatcher's queue by priority. A priority seen before and absent now is set to
    /// zero, so a drained priority reads as zero rather than as its last depth.
    pub fn queue(&self, by_priority: &BTreeMap<i32, u64>) {
        let mut seen = self
            .priorities_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for priority in seen.iter() {
            if !by_priority.contains_key(priority) {
                self.queue_by_priority
                    .get_or_create(&PriorityLabel {
                        priority: *priority,
                    })
                    .set(0);
            }
        }
        for (priority, n) in by_priority {
            seen.insert(*priority);
            self.queue_by_priority
                .get_or_create(&PriorityLabel {
                    priority: *priority,
                })
                .set(*n as i64);
        }
    }

    /// Partition leases that changed hands at this node.
    /// One send of a notification of `event`: `sent`, `retried` (it failed and waits to be
    /// sent again) or `failed` (given up).
    pub fn notification_sent(&self, event: sked_core::notify::NotifyEvent, outcome: &'static str) {
        self.notifications
            .get_or_create(&NotificationLabels {
                event: event.as_str(),
                outcome,
            })
            .inc();
    }

    pub fn leases_changed(&self, gained: usize, lost: usize) {
        for (change, n) in [("gained", gained), ("lost", lost)] {
            if n > 0 {
                self.leases
                    .get_or_create(&LeaseLabel { change })
                    .inc_by(n as u64);
            }
        }
    }

    /// Awaits a store call, timing it as `call`.
    pub async fn store_call<T>(&self, call: &'static str, work: impl Future<Output = T>) -> T {
        let began = std::time::Instant::now();
        let out = work.await;
        self.store_calls
            .get_or_create(&StoreCallLabel { call })
            .observe(began.elapsed().as_secs_f64());
        out
    }

    /// The OpenMetrics text of every metric, with `more` (families kept elsewhere, in the same
    /// text format) before the end marker. The per-job series are there only when `sees` is
    /// given, and only their samples of the namespaces it says yes to.
    pub fn render(&self, more: &str, sees: Option<&dyn Fn(&str) -> bool>) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if let Some(sees) = sees {
            let mut jobs = String::new();
            let _ = encode_registry(&mut jobs, &self.job_registry);
            for line in jobs.lines() {
                if line.starts_with('#') || sample_namespace(line).is_some_and(sees) {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out.push_str(more);
        let _ = encode_eof(&mut out);
        out
    }
}

/// The `namespace` label of a sample line. Namespace names are plain (letters, digits, `-`,
/// `_`, `.`), so the label's value holds no quote to unescape.
fn sample_namespace(line: &str) -> Option<&str> {
    let labels = line.split_once('{')?.1;
    let value = labels
        .split(',')
        .find_map(|pair| pair.strip_prefix("namespace=\""))?;
    value.split_once('"').map(|(namespace, _)| namespace)
}

fn namespace_label(namespace: &str) -> NamespaceLabel {
    NamespaceLabel {
        namespace: namespace.to_string(),
    }
}

/// Observes a span of time in seconds; a negative one (clocks of two nodes) counts as zero.
fn observe<L: Clone + std::hash::Hash + Eq>(family: &Histograms<L>, labels: &L, span: TimeDelta) {
    let seconds = span.num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6;
    family.get_or_create(labels).observe(seconds);
}

/// One unit of a gauge, given back on drop (see [`Metrics::hold`]).
pub struct Held(Gauge);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_family_with_its_type_and_ends_with_the_marker() {
        let metrics = Metrics::new();
        metrics.fires.inc_by(3);
        metrics.fired("team-a", TimeDelta::milliseconds(7));
        metrics.run_ended("team-a", RunState::Skipped, Some(SkipReason::Overlap));
        let text = metrics.render("", Some(&|_| true));
        assert!(text.contains("# TYPE sked_fires counter\n"), "{text}");
        assert!(text.contains("\nsked_fires_total 3\n"), "{text}");
        assert!(
            text.contains("sked_fire_lateness_seconds_bucket{le=\"0.01\",namespace=\"team-a\"} 1")
                || text.contains(
                    "sked_fire_lateness_seconds_bucket{namespace=\"team-a\",le=\"0.01\"} 1"
                ),
            "{text}"
        );
        assert!(
            text.contains(
                "sked_runs_total{namespace=\"team-a\",outcome=\"skipped\",reason=\"overlap\"} 1"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_negative_span_counts_as_zero_and_a_gauge_held_is_given_back() {
        let metrics = Metrics::new();
        metrics.started("ns", TimeDelta::milliseconds(-40));
        let text = metrics.render("", Some(&|_| true));
        assert!(
            text.contains("sked_start_lateness_seconds_sum{namespace=\"ns\"} 0.0"),
            "{text}"
        );
        {
            let _held = Metrics::hold(&metrics.log_follows);
            assert_eq!(metrics.log_follows.get(), 1);
        }
        assert_eq!(metrics.log_follows.get(), 0);
    }

    #[test]
    fn jobs_are_named_only_when_they_ask_and_only_so_many() {
        let metrics = Metrics::new();
        let took = TimeDelta::milliseconds(20);
        metrics.attempt_ended(
            "ns",
            None,
            AttemptOutcome::Succeeded,
            took,
            RunState::Succeeded,
        );
        metrics.attempt_ended(
            "ns",
            Some("billing"),
            AttemptOutcome::Failed,
            took,
            RunState::Failed,
        );
        let text = metrics.render("", Some(&|_| true));
        assert!(
            text.contains(
                r#"sked_job_runs_total{namespace="ns",job="billing",outcome="failed"} 1"#
            ),
            "{text}"
        );
        assert!(!text.contains(r#"job="""#), "{text}");
        // Without a caller that sees the namespace, no job is named.
        for sees in [
            None,
            Some(&(|ns: &str| ns != "ns") as &dyn Fn(&str) -> bool),
        ] {
            let text = metrics.render("", sees);
            assert!(!text.contains("billing"), "{text}");
            assert!(text.contains("sked_job_metrics_refused_total 0"), "{text}");
        }
        for i in 0..MAX_NAMED_JOBS + 5 {
            let job = format!("job-{i}");
            let state = RunState::Succeeded;
            metrics.attempt_ended("ns", Some(&job), AttemptOutcome::Succeeded, took, state);
        }
        let text = metrics.render("", Some(&|_| true));
        let named = text.matches("sked_job_runs_total{").count();
        assert_eq!(named, MAX_NAMED_JOBS, "billing and the first 999 others");
        assert!(text.contains("sked_job_metrics_refused_total 6"), "{text}");
    }

    #[test]
    fn an_emptied_priority_reads_zero() {
        let metrics = Metrics::new();
        metrics.queue(&BTreeMap::from([(0, 4), (9, 1)]));
        metrics.queue(&BTreeMap::from([(0, 2)]));
        let text = metrics.render("", Some(&|_| true));
        assert!(
            text.contains("sked_queue_depth{priority=\"0\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("sked_queue_depth{priority=\"9\"} 0"),
            "{text}"
        );
    }

    /// Every `sked_…` name the queries of `docs/grafana-dashboard.json` use.
    fn dashboard_series() -> BTreeSet<String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/grafana-dashboard.json"
        );
        let text = std::fs::read_to_string(path).expect("the dashboard");
        let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let panels = dashboard["panels"].as_array().expect("panels");
        let variables = dashboard["templating"]["list"]
            .as_array()
            .expect("variables");
        let queries = panels
            .iter()
            .flat_map(|p| p["targets"].as_array().expect("targets"))
            .map(|t| t["expr"].as_str().expect("expr"))
            .chain(variables.iter().filter_map(|v| v["query"].as_str()));
        let mut names = BTreeSet::new();
        for query in queries {
            let mut rest = query;
            while let Some(at) = rest.find("sked_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.insert(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
        names
    }

    #[test]
    fn every_metric_the_dashboard_graphs_is_one_the_server_has() {
        let metrics = Metrics::new();
        // A family is listed once it has a series: give each one.
        let span = TimeDelta::milliseconds(5);
        metrics.fired("ns", span);
        metrics.started("ns", span);
        metrics.published("ns", span);
        metrics.attempt_ended(
            "ns",
            None,
            AttemptOutcome::Succeeded,
            span,
            RunState::Succeeded,
        );
        metrics.run_ended("ns", RunState::Skipped, Some(SkipReason::Paused));
        metrics.queue(&BTreeMap::from([(0, 1)]));
        metrics.leases_changed(1, 1);
        futures_util::FutureExt::now_or_never(metrics.store_call("heartbeat", async {}));
        let brokers: Vec<sked_core::publish::BrokerConnection> =
            vec!["main=amqp://127.0.0.1:5672/%2f"
                .parse()
                .expect("a connection")];
        let health = crate::publish::BrokerHealth::new(&brokers);
        let text = metrics.render(&health.render_metrics(), Some(&|_| true));
        // Each series a query names, as the text has it: a counter's with `_total`, a
        // histogram's with `_bucket`, `_sum` or `_count`.
        let series: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let graphed = dashboard_series();
        assert!(graphed.len() >= 10, "{graphed:?}");
        let missing: Vec<&String> = graphed
            .iter()
            .filter(|name| !series.contains(name.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "graphed but not exposed: {missing:?}\n{text}"
        );
    }
}

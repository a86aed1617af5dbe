//! The overview of a namespace, what an on-call engineer looks at first: what runs now, what
//! is queued or held back and why, the runs that missed a deadline or are at risk of one, and
//! the jobs whose latest run failed; then runs per minute by outcome, firing lateness, the
//! queue, the workers, and the cluster's nodes and partitions.
//!
//! Run figures come from the namespace's newest runs (at most [`SAMPLE`], one API page), and
//! the runs not yet ended from the ledger's index of them, so the page costs the same at ten
//! runs or ten million; the page says how far back the figures go.

use super::{chosen, job_href, refused};
use crate::console::api::query;
use crate::console::chart;
use crate::console::clock::Clock;
use crate::console::layout::{self, millis, span};
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;
use sked_core::records::{NodeRecord, RunRecord, WorkerRecord};
use sked_core::run::{RunState, Trigger, WaitReason};
use sked_core::Instant;
use std::collections::{BTreeMap, HashSet};

/// Newest runs the figures are computed from.
const SAMPLE: u32 = 1000;
/// Minutes the runs-per-minute chart covers.
const MINUTES: i64 = 30;
/// Runs the "late and at risk" list shows, and reads of each kind.
const LATE_SHOWN: usize = 20;
const LATE_READ: &str = "50";
/// Runs "now" lists of each state not yet ended (it says when there are more).
const NOW_SHOWN: usize = 20;
const NOW_READ: &str = "21";
/// Queued runs whose dispatcher's reason is asked for, one API call each.
const REASONS_ASKED: usize = 5;

#[derive(Debug, Default, Deserialize)]
pub struct Params {
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
struct RunPage {
    runs: Vec<RunRecord>,
}

/// What `GET /runs/{id}` adds for a queued run: why no worker takes it.
#[derive(Deserialize)]
struct QueuedView {
    #[serde(default)]
    waiting_for_workers: Option<String>,
}

/// Why a run not yet started is where it is, in a few words. `waiting_for_workers` is what
/// the dispatcher said of a queued run, when it was asked.
pub fn held_because(run: &RunRecord, waiting_for_workers: Option<&str>, now: Instant) -> String {
    match run.state {
        RunState::Waiting => {
            let mut reason = match run.waiting_reason {
                Some(WaitReason::Dependencies) if !run.waiting_for.is_empty() => {
                    format!("dependencies: {}", run.waiting_for.join(", "))
                }
                Some(WaitReason::Dependencies) => "dependencies".to_string(),
                Some(WaitReason::Overlap) => "an earlier run of its job is still active".into(),
                Some(WaitReason::Ping) => "a ping".into(),
                None => "held back".into(),
            };
            if let Some(until) = run.waiting_until {
                reason.push_str(&format!(", skipped at {}", until.format("%H:%M:%S UTC")));
            }
            reason
        }
        RunState::Queued if run.ready_at > now => {
            let why = if run.attempts > 0 {
                "retry backoff"
            } else {
                "delayed start"
            };
            format!(
                "{why}, ready in {}",
                millis((run.ready_at - now).num_milliseconds() as f64)
            )
        }
        RunState::Queued => match waiting_for_workers {
            Some(reason) => reason.to_string(),
            None => "ready, next for a free worker slot".into(),
        },
        _ => String::new(),
    }
}

/// The runs queued in this node's dispatcher, from `/metrics` (`sked_queue_depth`, one
/// series per priority). Counting queued runs through the ledger would read every run of a
/// namespace when few are queued.
pub fn queue_depth(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("sked_queue_depth{") || line.starts_with("sked_queue_depth ")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[derive(Deserialize)]
struct WorkerList {
    workers: Vec<WorkerRecord>,
}

#[derive(Deserialize)]
struct Cluster {
    partitions: u32,
    unowned: u32,
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
struct Node {
    #[serde(flatten)]
    node: NodeRecord,
    alive: bool,
}

/// Ended runs per minute, by outcome, for the last [`MINUTES`] minutes before `now`.
pub fn per_minute(runs: &[RunRecord], now: Instant) -> Vec<BTreeMap<&'static str, u32>> {
    let mut minutes = vec![BTreeMap::new(); MINUTES as usize];
    for run in runs {
        let Some(finished) = run.finished_at else {
            continue;
        };
        let ago = (now - finished).num_minutes();
        if (0..MINUTES).contains(&ago) {
            let slot = (MINUTES - 1 - ago) as usize;
            *minutes[slot].entry(outcome(run.state)).or_insert(0) += 1;
        }
    }
    minutes
}

/// The outcome a chart colours a run by.
fn outcome(state: RunState) -> &'static str {
    match state {
        RunState::Succeeded => "succeeded",
        RunState::Failed | RunState::TimedOut => "failed",
        RunState::Skipped => "skipped",
        _ => "other",
    }
}

/// Jobs whose newest run (among `runs`, newest first) failed, with that run.
pub fn failing(runs: &[RunRecord]) -> Vec<&RunRecord> {
    let mut seen = HashSet::new();
    runs.iter()
        .filter(|r| r.state.is_terminal() && r.state != RunState::Skipped)
        .filter(|r| seen.insert(r.job.as_str()))
        .filter(|r| matches!(r.state, RunState::Failed | RunState::TimedOut))
        .collect()
}

/// The runs "late and at risk" lists, from the namespace's newest runs that missed a deadline
/// and those called at risk: the runs not ended first (a missed deadline before a risk), then
/// the ended ones, newest end first; each once, at most [`LATE_SHOWN`].
pub fn late_and_at_risk<'a>(
    missed: &'a [RunRecord],
    at_risk: &'a [RunRecord],
) -> Vec<&'a RunRecord> {
    let mut seen = HashSet::new();
    let mut runs: Vec<&RunRecord> = missed
        .iter()
        .chain(at_risk)
        .filter(|r| seen.insert(r.id))
        .collect();
    runs.sort_by_key(|r| {
        (
            r.state.is_terminal(),
            r.deadline_missed.is_empty(),
            std::cmp::Reverse(r.finished_at),
            std::cmp::Reverse(r.scheduled_for),
        )
    });
    runs.truncate(LATE_SHOWN);
    runs
}

/// What a run of the "late and at risk" list missed, or what is expected of it.
fn deadline_line(run: &RunRecord, clock: &Clock) -> Markup {
    let finish_by = run.deadline.and_then(|d| d.finish_by);
    html! {
        @for (i, miss) in run.deadline_missed.iter().enumerate() {
            @if i > 0 { ", " }
            "missed " (miss.kind.as_str()) " by " (millis(miss.by_ms as f64))
        }
        @if run.deadline_missed.is_empty() {
            @if let Some(risk) = run.at_risk {
                "at risk: finish_by " (clock.when(finish_by))
                @if let Some(end) = risk.estimated_finish { ", expected end " (clock.when(Some(end))) }
            }
        }
    }
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(p): Query<Params>,
) -> Response {
    let (namespace, known) = chosen(&console, &visitor, &p.namespace).await;
    let namespace = namespace.as_str();
    let who = visitor.who();
    let sample = SAMPLE.to_string();
    let recent = format!(
        "/api/v1/runs?{}",
        query(&[("namespace", namespace), ("limit", &sample)])
    );
    let flagged = |flag: &str| {
        format!(
            "/api/v1/runs?{}",
            query(&[
                ("namespace", namespace),
                (flag, "true"),
                ("limit", LATE_READ)
            ])
        )
    };
    let (missed, at_risk) = (flagged("deadline_missed"), flagged("at_risk"));
    let in_state = |state: &str| {
        format!(
            "/api/v1/runs?{}",
            query(&[
                ("namespace", namespace),
                ("state", state),
                ("limit", NOW_READ)
            ])
        )
    };
    let (running, queued_runs, waiting) =
        (in_state("running"), in_state("queued"), in_state("waiting"));
    let (recent, missed, at_risk, running, queued_runs, waiting, metrics, workers, cluster) = tokio::join!(
        console.api.get::<RunPage>(who, &recent),
        console.api.get::<RunPage>(who, &missed),
        console.api.get::<RunPage>(who, &at_risk),
        console.api.get::<RunPage>(who, &running),
        console.api.get::<RunPage>(who, &queued_runs),
        console.api.get::<RunPage>(who, &waiting),
        console
            .api
            .raw(who, axum::http::Method::GET, "/metrics", None),
        console
            .api
            .get::<WorkerList>(who, "/api/v1/workers?limit=1000"),
        console.api.get::<Cluster>(who, "/api/v1/cluster"),
    );
    let recent = match recent {
        Ok(recent) => recent,
        Err(failure) => return refused(&console, &visitor, "Overview", failure),
    };
    // Unknown (shown as a dash) when `/metrics` cannot be read, never a made-up zero.
    let queued = if metrics.status().is_success() {
        axum::body::to_bytes(metrics.into_body(), 16 * 1024 * 1024)
            .await
            .ok()
            .map(|text| queue_depth(&String::from_utf8_lossy(&text)))
    } else {
        None
    };
    let now = chrono::Utc::now();
    let minutes = per_minute(&recent.runs, now);
    let mut lateness: Vec<f64> = recent
        .runs
        .iter()
        .filter(|r| r.trigger == Trigger::Schedule)
        .map(RunRecord::lateness_ms)
        .collect();
    let lateness = sked_core::stats::percentiles(&mut lateness);
    let oldest = recent.runs.last().map(|r| r.scheduled_for);
    let failing = failing(&recent.runs);
    let (missed, at_risk) = (
        missed.map(|p| p.runs).unwrap_or_default(),
        at_risk.map(|p| p.runs).unwrap_or_default(),
    );
    let late = late_and_at_risk(&missed, &at_risk);
    let running = running.map(|p| p.runs).unwrap_or_default();
    // Held: the queued first, then those held back, each newest first and cut to NOW_SHOWN.
    let (mut queued_runs, mut waiting) = (
        queued_runs.map(|p| p.runs).unwrap_or_default(),
        waiting.map(|p| p.runs).unwrap_or_default(),
    );
    let more_held = queued_runs.len() > NOW_SHOWN || waiting.len() > NOW_SHOWN;
    queued_runs.truncate(NOW_SHOWN);
    waiting.truncate(NOW_SHOWN);
    let queued_count = queued_runs.len();
    let held: Vec<RunRecord> = queued_runs.into_iter().chain(waiting).collect();
    let api = &console.api;
    let reasons =
        futures_util::future::join_all(held.iter().take(queued_count.min(REASONS_ASKED)).map(
            |run| async move {
                api.get::<QueuedView>(who, &format!("/api/v1/runs/{}", run.id))
                    .await
                    .ok()
                    .and_then(|v| v.waiting_for_workers)
            },
        ))
        .await;
    let body = html! {
        form.filters method="get" action="/" {
            label { "Namespace "
                select name="namespace" {
                    @for ns in &known { option value=(ns) selected[ns == namespace] { (ns) } }
                }
            }
            button type="submit" { "Show" }
        }
        section aria-labelledby="running" {
            h2 #running { "Running now" }
            @if running.is_empty() { p.empty { "Nothing runs in this namespace now." } }
            @else {
                div.table-wrap tabindex="0" { table.now {
                    thead { tr { th scope="col" { "Job" } th scope="col" { "Run" } th scope="col" { "Started" }
                                 th scope="col" { "For" } th scope="col" { "Attempt" } } }
                    tbody { @for run in running.iter().take(NOW_SHOWN) { tr {
                        td { a href=(job_href(&run.namespace, &run.job)) { (run.job) } }
                        td { a href={ "/runs/" (run.id) } { (run.id) } }
                        td { (visitor.clock.when(run.started_at)) }
                        td.num { (span(run.started_at, None)) }
                        td.num { (run.attempts) }
                    } } }
                } }
                @if running.len() > NOW_SHOWN { p.hint { "More run than these " (NOW_SHOWN) "." } }
            }
        }
        section aria-labelledby="held" {
            h2 #held { "Queued and held back" }
            @if held.is_empty() { p.empty { "No run waits: every run due has started." } }
            @else {
                div.table-wrap tabindex="0" { table.now {
                    thead { tr { th scope="col" { "Job" } th scope="col" { "Run" } th scope="col" { "State" }
                                 th scope="col" { "Due" } th scope="col" { "Why" } } }
                    tbody { @for (i, run) in held.iter().enumerate() { tr {
                        td { a href=(job_href(&run.namespace, &run.job)) { (run.job) } }
                        td { a href={ "/runs/" (run.id) } { (run.id) } }
                        td { (layout::state(run.state.as_str())) }
                        td { (visitor.clock.when(Some(run.scheduled_for))) }
                        td { (held_because(run, reasons.get(i).and_then(|r| r.as_deref()), now)) }
                    } } }
                } }
                @if more_held { p.hint { "The newest " (NOW_SHOWN) " of each state are shown; more wait." } }
            }
        }
        section aria-labelledby="late" {
            h2 #late { "Late and at risk" }
            @if late.is_empty() { p.empty { "No run has missed a deadline or is at risk of one." } }
            @else {
                ul.errors { @for run in &late {
                    li { a href=(job_href(&run.namespace, &run.job)) { (run.job) } " "
                         a href={ "/runs/" (run.id) } { (layout::state(run.state.as_str())) } " "
                         (visitor.clock.when(Some(run.scheduled_for))) ": " (deadline_line(run, &visitor.clock)) }
                } }
            }
        }
        section aria-labelledby="failing" {
            h2 #failing { "Failing jobs" }
            @if failing.is_empty() { p.empty { "None: every job's latest run that ended succeeded." } }
            @else {
                ul.errors { @for run in &failing {
                    li { a href=(job_href(&run.namespace, &run.job)) { (run.job) } " "
                         a href={ "/runs/" (run.id) } { (layout::state(run.state.as_str())) } " "
                         (visitor.clock.when(run.finished_at)) ": " code { (run.error.as_deref().unwrap_or_default()) } }
                } }
            }
        }
        dl.figures.big {
            div { dt title="Runs queued in this node's dispatcher, all namespaces" { "queued here" } dd { @match queued { Some(n) => { (n) }, None => { "—" } } } }
            div { dt { "firing lateness p50" } dd { (millis(lateness.p50)) } }
            div { dt { "firing lateness p99" } dd { (millis(lateness.p99)) } }
            @if let Ok(w) = &workers {
                // A broker publisher is no worker: its 4,096 slots would swamp the pool's.
                @let alive = || w.workers.iter().filter(|w| w.alive && !w.publisher);
                div { dt { "workers alive" } dd { (alive().count()) } }
                div { dt { "slots busy" } dd {
                    (alive().map(|w| w.running).sum::<u32>()) " / "
                    (alive().map(|w| w.slots).sum::<u32>()) } }
            }
            div { dt { "failing jobs" } dd.bad[!failing.is_empty()] { (failing.len()) } }
        }
        p.hint {
            "From the namespace's newest " (recent.runs.len()) " runs"
            @if let Some(t) = oldest { ", back to " (visitor.clock.exact(Some(t), None)) } "."
        }
        section aria-labelledby="per-minute" {
            h2 #per-minute { "Runs ended per minute, last " (MINUTES) " minutes" }
            (minute_chart(&minutes, now, visitor.clock.tz()))
        }
        @if let Ok(cluster) = &cluster {
            section aria-labelledby="cluster" {
                h2 #cluster { "Cluster" }
                p { (cluster.partitions) " partitions, " (cluster.unowned) " held by no node." }
                div.table-wrap tabindex="0" { table {
                    thead { tr { th scope="col" { "Node" } th scope="col" { "Address" } th scope="col" { "Partitions" }
                                 th scope="col" { "Maintenance" } th scope="col" { "Seen" } th scope="col" { "State" } } }
                    tbody { @for n in &cluster.nodes { tr {
                        td { code { (n.node.id) } } td { (n.node.address) } td.num { (n.node.partitions) }
                        td { @if n.node.maintenance { "yes" } } td { (visitor.clock.when(Some(n.node.seen_at))) }
                        td { (layout::state(if n.alive { "alive" } else { "lost" })) }
                    } } }
                } }
            }
        }
    };
    layout::page(&console, &visitor, "Overview", body)
}

/// The outcomes the per-minute chart draws, each as one bar of a minute's group.
const OUTCOMES: [(&str, &str); 4] = [
    ("succeeded", "succeeded"),
    ("failed", "failed"),
    ("skipped", "skipped"),
    ("other", "cancelled and other"),
];

/// Runs ended per minute as grouped bars, one per outcome, oldest minute on the left, with
/// labelled axes; each bar's title gives its count, outcome and minute.
fn minute_chart(
    minutes: &[BTreeMap<&'static str, u32>],
    now: Instant,
    zone: chrono_tz::Tz,
) -> Markup {
    let total: u32 = minutes.iter().flat_map(|m| m.values()).sum();
    let slot = chrono::Duration::seconds(60 / OUTCOMES.len() as i64);
    let series = OUTCOMES
        .iter()
        .enumerate()
        .map(|(i, (outcome, name))| chart::Series {
            name: (*name).to_string(),
            class: (*outcome).to_string(),
            mark: chart::Mark::Bars { width: slot },
            points: minutes
                .iter()
                .enumerate()
                .filter_map(|(minute, counts)| {
                    let count = *counts.get(outcome)?;
                    let start = now - chrono::Duration::minutes(MINUTES - minute as i64);
                    Some(chart::Point {
                        at: start + slot * i as i32,
                        value: f64::from(count),
                        class: (*outcome).to_string(),
                        note: minute_ago(minute),
                    })
                })
                .collect(),
        })
        .collect();
    let drawn = chart::render(&chart::Chart {
        label: format!("{total} runs ended in the last {MINUTES} minutes, by outcome"),
        value_axis: "runs".into(),
        time_axis: "minute".into(),
        unit: chart::Unit::Count,
        zone,
        series,
    });
    match drawn {
        Some(chart) => chart,
        None => html! { p.empty { "No run ended in the last " (MINUTES) " minutes." } },
    }
}

/// When the `i`th minute of the chart was.
fn minute_ago(i: usize) -> String {
    match MINUTES - 1 - i as i64 {
        0 => "within the last minute".into(),
        n => format!("{n} to {} minutes ago", n + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        job: &str,
        state: RunState,
        finished_minutes_ago: Option<i64>,
        now: Instant,
    ) -> RunRecord {
        let mut run: RunRecord = serde_json::from_value(serde_json::json!({
            "id": 1, "namespace": "default", "job": job, "job_id": 1,
            "scheduled_for": now, "trigger": "schedule", "state": "queued", "priority": 0,
            "ready_at": now, "created_at": now, "attempts": 0, "failures": 0,
            "cancel_requested": false, "waiting_for": []
        }))
        .unwrap();
        run.state = state;
        run.finished_at = finished_minutes_ago.map(|m| now - chrono::Duration::minutes(m));
        run
    }

    #[test]
    fn queue_depth_sums_every_priority() {
        let text = "# HELP sked_queue_depth Runs queued\n# TYPE sked_queue_depth gauge\n\
                    sked_queue_depth{priority=\"0\"} 2\nsked_queue_depth{priority=\"9\"} 5\n\
                    sked_queue_depth_other 7\n";
        assert_eq!(queue_depth(text), 7);
        assert_eq!(queue_depth(""), 0);
    }

    #[test]
    fn runs_are_counted_in_the_minute_they_ended() {
        let now = chrono::Utc::now();
        let runs = [
            run("a", RunState::Succeeded, Some(0), now),
            run("a", RunState::Failed, Some(0), now),
            run("b", RunState::Succeeded, Some(29), now),
            run("b", RunState::Succeeded, Some(30), now),
            run("c", RunState::Running, None, now),
        ];
        let minutes = per_minute(&runs, now);
        assert_eq!(minutes.len(), 30);
        assert_eq!(minutes[29].get("succeeded"), Some(&1));
        assert_eq!(minutes[29].get("failed"), Some(&1));
        assert_eq!(minutes[0].get("succeeded"), Some(&1));
        assert_eq!(minutes.iter().flat_map(|m| m.values()).sum::<u32>(), 3);
    }

    #[test]
    fn a_held_run_says_what_it_waits_for() {
        let now = chrono::Utc::now();
        let mut waiting = run("etl", RunState::Waiting, None, now);
        waiting.waiting_reason = Some(WaitReason::Dependencies);
        waiting.waiting_for = vec!["extract".into(), "load".into()];
        assert_eq!(
            held_because(&waiting, None, now),
            "dependencies: extract, load"
        );
        waiting.waiting_reason = Some(WaitReason::Overlap);
        assert_eq!(
            held_because(&waiting, None, now),
            "an earlier run of its job is still active"
        );

        let mut queued = run("etl", RunState::Queued, None, now);
        assert_eq!(
            held_because(&queued, None, now),
            "ready, next for a free worker slot"
        );
        let busy = "waiting for workers: 3 eligible, all busy";
        assert_eq!(held_because(&queued, Some(busy), now), busy);
        queued.ready_at = now + chrono::Duration::seconds(30);
        queued.attempts = 1;
        assert_eq!(
            held_because(&queued, Some(busy), now),
            "retry backoff, ready in 30.0 s"
        );
        queued.attempts = 0;
        assert!(held_because(&queued, None, now).starts_with("delayed start"));
    }

    #[test]
    fn a_job_is_failing_when_its_newest_ended_run_failed() {
        let now = chrono::Utc::now();
        let runs = [
            run("a", RunState::Running, None, now),
            run("a", RunState::Failed, Some(1), now),
            run("b", RunState::Succeeded, Some(1), now),
            run("b", RunState::Failed, Some(2), now),
            run("c", RunState::Skipped, Some(1), now),
            run("c", RunState::TimedOut, Some(2), now),
        ];
        let jobs: Vec<&str> = failing(&runs).iter().map(|r| r.job.as_str()).collect();
        assert_eq!(jobs, ["a", "c"]);
    }
}

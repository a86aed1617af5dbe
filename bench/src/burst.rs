//! A burst: N jobs whose one instant is the same (a one-off `at` schedule a few seconds after the
//! server is ready), with the no-op worker of `noop.rs` holding enough slots to take them all.
//! Reports how long after the instant the last run was queued (its ledger row written), the
//! last attempt started (handed to the worker) and the last result recorded, with the median
//! and 99th percentile of each over the runs. Every one of the N runs must be there and have
//! succeeded once the wait is over.
//!
//! "Queued" is the run's `created_at`, which the store sets to the moment the firing loop hands
//! it the batch, just before the batch's transaction: the transaction's own time is not in it.
//! "Started" is the attempt's start, written when the run had been committed and handed out.

use crate::harness::{ms, percentiles_of, start, store_with_jobs};
use crate::noop;
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use sked_core::Instant;
use std::collections::BTreeMap;
use std::time::Instant as Clock;

/// DESIGN's target: every run of the burst handed to a worker within this of the instant.
const TARGET_MS: f64 = 1000.0;

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub runs: usize,
    pub slots: u32,
    /// From the first job's creation to the instant; planned from `runs` when absent.
    pub lead_seconds: Option<f64>,
    /// How long after the instant every run may take to succeed.
    pub limit_seconds: u64,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let n = options.runs;
    if n == 0 || options.slots == 0 {
        bail!("--runs and --slots must be above zero");
    }
    // Creating the jobs must end, and the server be ready, before the instant: a generous
    // allowance per job (SQLite creates about 6,000-8,000 a second, PostgreSQL about 500-1,300).
    let per_job_ms = if options.database_url.is_some() {
        3.0
    } else {
        0.4
    };
    let lead = options
        .lead_seconds
        .unwrap_or(3.0 + n as f64 * per_job_ms / 1000.0);
    // Whole milliseconds, so the instant reads back from the store (microseconds) unchanged.
    let planned = Utc::now().timestamp_millis() + (lead * 1000.0) as i64;
    let instant: Instant =
        DateTime::from_timestamp_millis(planned).context("the burst's instant")?;
    let jobs = (0..n).map(move |i| {
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"at": instant.to_rfc3339()},
            "target": {"shell": {"command": "true"}},
        }))
        .expect("a valid benchmark job");
        (format!("burst-{i:06}"), spec)
    });
    let created = Clock::now();
    let (store, place) = store_with_jobs(options.database_url, jobs).await?;
    let create_s = created.elapsed().as_secs_f64();
    let started = Clock::now();
    let mut server = start(store.clone(), place, 1).await?;
    let ready_s = started.elapsed().as_secs_f64();
    let store_name = server.store_name();
    let http = crate::harness::http_client();
    let limit = std::time::Duration::from_secs(options.limit_seconds);
    let workers = noop::spawn(
        &http,
        &server.bases,
        options.slots,
        &noop::Until::after_instant(instant, limit, n as u64),
    );
    let ahead_ms = ms(instant - Utc::now());
    if ahead_ms < 200.0 {
        server.stop().await;
        server.finish().await;
        bail!(
            "the server was ready only {ahead_ms:.0} ms before the burst's instant (jobs \
             created in {create_s:.1} s): pass a longer --lead"
        );
    }
    let completed = noop::join(workers).await;
    let fire_batches = server.metric_sum("sked_fire_batches_total").await?;
    let attempts_started = server.metric_sum("sked_attempts_started_total").await?;
    server.stop().await;
    let completed = completed?;

    let runs = server
        .finish_with_runs(
            store.as_ref(),
            instant - Duration::days(1),
            instant + Duration::days(1),
        )
        .await?;
    let at_instant: Vec<&RunRecord> = runs.iter().filter(|r| r.scheduled_for == instant).collect();
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for r in &at_instant {
        *by_state.entry(r.state.as_str().to_string()).or_default() += 1;
    }
    let succeeded = at_instant
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    let queued = spread(&at_instant, instant, |r| Some(r.created_at));
    let dispatched = spread(&at_instant, instant, |r| r.started_at);
    let finished = spread(&at_instant, instant, |r| r.finished_at);
    let all = |p: &Spread| (p.count == n).then_some(p.max);
    let figures = json!({
        "scenario": "burst",
        "store": store_name,
        "runs": n,
        "worker_slots": options.slots,
        "instant": instant.to_rfc3339(),
        "create_jobs_seconds": create_s,
        "start_to_ready_seconds": ready_s,
        "ready_before_instant_ms": ahead_ms,
        "runs_recorded": at_instant.len(),
        "runs_other_instants": runs.len() - at_instant.len(),
        "runs_started": dispatched.count,
        "runs_succeeded": succeeded,
        "runs_by_state": by_state,
        "queued_all_ms": all(&queued),
        "dispatched_all_ms": all(&dispatched),
        "finished_all_ms": all(&finished),
        "queued_ms": queued.json(),
        "dispatched_ms": dispatched.json(),
        "finished_ms": finished.json(),
        "dispatched_all_within_target": all(&dispatched).is_some_and(|ms| ms <= TARGET_MS),
        "target_dispatched_all_ms": TARGET_MS,
        "completions_sent": completed,
        "attempts_started": attempts_started,
        "fire_batches": fire_batches,
    });
    if succeeded < n {
        bail!(
            "{succeeded} of {n} runs succeeded within {} s of the instant: {}",
            options.limit_seconds,
            serde_json::to_string_pretty(&figures)?
        );
    }
    Ok(figures)
}

/// Milliseconds from the instant to one moment of each run.
struct Spread {
    count: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Spread {
    fn json(&self) -> Value {
        json!({"runs": self.count, "p50": self.p50, "p99": self.p99, "max": self.max})
    }
}

fn spread(
    runs: &[&RunRecord],
    instant: Instant,
    at: impl Fn(&RunRecord) -> Option<Instant>,
) -> Spread {
    let p = percentiles_of(runs.iter().copied(), |r| at(r).map(|t| ms(t - instant)));
    Spread {
        count: p.count,
        p50: p.p50,
        p99: p.p99,
        max: p.max,
    }
}

//! Fair share under a flood: namespace `team-a` queues `--runs` runs at once (backfills of a
//! one-second schedule), namespace `team-b` triggers one run every `--every-ms` by hand, and one
//! worker pool of `--slots` slots, whose attempts each take `--duration-ms`, serves both with
//! weight 1 each. The pool is what limits A (its ceiling is slots / duration), so A's backlog
//! takes tens of seconds to drain and every slot is wanted by A all along: the question is
//! whether B's runs still start as soon as a slot frees, rather than behind A's backlog.
//!
//! Reports B's start lateness (its attempt's start minus the run's instant, which a manual
//! trigger sets to the moment it was asked) p50/p99/max over the runs triggered while A still
//! had a backlog, against the bar of [`BAR_P99_MS`]; A's insert time, drain time (from the
//! first backfill to A's last result) and throughput; and how long B's triggers took to answer.
//!
//! The worker is a client of the HTTP worker protocol in this process that asks for work as
//! `sked worker` does (at most its free slots; again as soon as a slot frees, while the
//! completion is on its way) and lists what it holds in its heartbeats, so the server counts
//! each namespace's attempts as it would with real workers.

use crate::harness::{self, ms, percentiles_of, tail_json};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sked_core::policy::admission::BacklogLimits;
use sked_core::protocol::{Completion, LeaseResponse, RegisterResponse};
use sked_core::records::RunRecord;
use sked_core::run::{AttemptOutcome, RunState};
use sked_core::stats::Percentiles;
use sked_server::ServerConfig;
use sked_store::{RunQuery, Store};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as Clock};
use tokio::sync::{mpsc, Notify};

/// The bar: B's start lateness p99 under this while A's backlog drains.
const BAR_P99_MS: f64 = 1000.0;

/// The namespace that floods, and the one that trickles.
const FLOOD: &str = "team-a";
const STEADY: &str = "team-b";

/// Runs per backfill request (the server's most).
const BACKFILL_PART: usize = 10_000;

/// How long one lease request waits for work (long poll).
const LEASE_WAIT_MS: u64 = 200;

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    /// A's runs, queued at once.
    pub runs: usize,
    /// The pool's slots.
    pub slots: u32,
    /// How long each attempt holds its slot.
    pub duration_ms: u64,
    /// Between two of B's triggers.
    pub every_ms: u64,
    /// How long A may take to drain before the benchmark gives up.
    pub limit_seconds: u64,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    if options.runs == 0 || options.slots == 0 || options.every_ms == 0 {
        bail!("--runs, --slots and --every-ms must be above zero");
    }
    let (store, place) = harness::fresh_store(options.database_url).await?;
    // A's flood must be queued, not recorded skipped at the node's default cap per job.
    let runs = options.runs as u64;
    let defaults = BacklogLimits::default();
    let config = ServerConfig {
        backlog: BacklogLimits {
            per_job: defaults.per_job.max(runs),
            per_namespace: defaults.per_namespace.max(runs),
        },
        retention: None,
        ..ServerConfig::default()
    };
    let mut server = harness::start_configured(store.clone(), place, 1, config).await?;
    let store_name = server.store_name();
    let base = server.base().to_string();
    let http = harness::http_client();

    // The flood's instants: the `runs` whole seconds ending a minute ago (a whole-second
    // anchor, so that each backfill part holds exactly its share). The schedule ends there, so
    // it fires nothing more of its own while the benchmark runs.
    let first_s = Utc::now().timestamp() - 60 - options.runs as i64;
    let last = instant_at(first_s + options.runs as i64 - 1, 0)?;
    put_job(
        &http,
        &base,
        FLOOD,
        "flood",
        json!({"schedule": {"every": "1s", "anchor": "2026-01-01T00:00:00Z", "end": last}}),
    )
    .await?;
    put_job(&http, &base, STEADY, "steady", json!({})).await?;

    let a_done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = tokio::spawn(pool_worker(
        http.clone(),
        base.clone(),
        Pool {
            slots: options.slots,
            duration: Duration::from_millis(options.duration_ms),
        },
        a_done.clone(),
        stop.clone(),
    ));

    let began = Clock::now();
    let mut recorded = 0usize;
    let mut part_from = first_s;
    let drained = Arc::new(AtomicBool::new(false));
    let mut trickling = None;
    while recorded < options.runs {
        let part = (options.runs - recorded).min(BACKFILL_PART) as i64;
        let from = instant_at(part_from, -500)?;
        let to = instant_at(part_from + part - 1, 500)?;
        recorded += backfill(&http, &base, from, to).await?;
        part_from += part;
        // B trickles from the moment A has a backlog until A has drained.
        if trickling.is_none() {
            trickling = Some(tokio::spawn(trickle(
                http.clone(),
                base.clone(),
                Duration::from_millis(options.every_ms),
                drained.clone(),
            )));
        }
    }
    let trickle = trickling.context("no backfill part was sent")?;
    let inserted = began.elapsed();
    let inserted_at = Utc::now();
    if recorded != options.runs {
        bail!("{recorded} of A's {} runs recorded", options.runs);
    }

    let limit = Duration::from_secs(options.limit_seconds);
    while a_done.load(Ordering::Relaxed) < runs {
        if began.elapsed() > limit {
            bail!(
                "A did not drain within {limit:?}: {} of {runs} completed",
                a_done.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = began.elapsed();
    drained.store(true, Ordering::Relaxed);
    let triggers = trickle.await.context("B's triggers")??;
    // B's last runs are started and reported before the worker stops.
    let steady_runs = triggers.len() as u64;
    let deadline = Clock::now() + Duration::from_secs(30);
    loop {
        let ended = count_ended(store.as_ref(), STEADY).await?;
        if ended >= steady_runs {
            break;
        }
        if Clock::now() > deadline {
            bail!("{ended} of B's {steady_runs} runs ended within 30 s of A's drain");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let completed = worker.await.context("the pool's worker")??;
    server.stop().await;

    let flood = runs_in(store.as_ref(), FLOOD).await?;
    let steady = runs_in(store.as_ref(), STEADY).await?;
    server.finish().await;

    let succeeded = |runs: &[RunRecord]| {
        runs.iter()
            .filter(|r| r.state == RunState::Succeeded)
            .count()
    };
    // A's backlog lasts until its last run started: B's runs due before then met it.
    let backlog_until = flood
        .iter()
        .filter_map(|r| r.started_at)
        .max()
        .context("no run of A started")?;
    let (during, after): (Vec<&RunRecord>, Vec<&RunRecord>) =
        steady.iter().partition(|r| r.scheduled_for < backlog_until);
    let lateness = |r: &RunRecord| r.started_at.map(|s| ms(s - r.scheduled_for));
    let during_p = percentiles_of(during.iter().copied(), lateness);
    let after_p = percentiles_of(after.iter().copied(), lateness);
    // The part of the backlog while A's runs were still being written, when B's trigger
    // shares the store with the flood's own writes, and the rest.
    let inserting_p = percentiles_of(
        during
            .iter()
            .copied()
            .filter(|r| r.scheduled_for < inserted_at),
        lateness,
    );
    let draining_p = percentiles_of(
        during
            .iter()
            .copied()
            .filter(|r| r.scheduled_for >= inserted_at),
        lateness,
    );
    let mut trigger_ms: Vec<f64> = triggers.clone();
    let trigger_p = sked_core::stats::percentiles(&mut trigger_ms);
    let drain_s = drain.as_secs_f64();
    let holds = during_p.count > 0 && during_p.p99 < BAR_P99_MS;
    Ok(json!({
        "scenario": "fairness",
        "store": store_name,
        "bar": format!(
            "B's start lateness p99 under {BAR_P99_MS} ms while A's backlog drains"
        ),
        "bar_holds": holds,
        "a_runs": options.runs,
        "a_succeeded": succeeded(&flood),
        "slots": options.slots,
        "attempt_ms": options.duration_ms,
        "pool_ceiling_per_second": f64::from(options.slots) * 1000.0 / options.duration_ms.max(1) as f64,
        "a_insert_seconds": inserted.as_secs_f64(),
        "a_drain_seconds": drain_s,
        "a_runs_per_second": options.runs as f64 / drain_s,
        "b_every_ms": options.every_ms,
        "b_runs": steady.len(),
        "b_succeeded": succeeded(&steady),
        "b_runs_during_a_backlog": during_p.count,
        "b_start_lateness_during_a_backlog_ms": tail(&during_p),
        "b_start_lateness_while_a_inserts_ms": tail(&inserting_p),
        "b_start_lateness_after_a_inserted_ms": tail(&draining_p),
        "b_start_lateness_after_a_backlog_ms": tail(&after_p),
        "b_trigger_answer_ms": tail_json(&trigger_p),
        "attempts_completed_by_worker": completed,
    }))
}

/// A lateness summary with the number of runs it is over.
fn tail(p: &Percentiles) -> Value {
    let mut summary = tail_json(p);
    summary["runs"] = json!(p.count);
    summary
}

/// `second` (Unix seconds) plus `offset_ms`.
fn instant_at(second: i64, offset_ms: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(second * 1000 + offset_ms).context("an instant of the flood")
}

async fn put_job(
    http: &reqwest::Client,
    base: &str,
    namespace: &str,
    name: &str,
    extra: Value,
) -> Result<()> {
    let mut spec = json!({"target": {"shell": {"command": "true"}}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let resp = http
        .put(format!("{base}/api/v1/jobs/{name}?namespace={namespace}"))
        .json(&spec)
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("PUT job {namespace}/{name}: {}", resp.text().await?);
    }
    Ok(())
}

/// Backfills A's job over `[from, to]`; returns how many runs were queued.
async fn backfill(
    http: &reqwest::Client,
    base: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<usize> {
    let resp = http
        .post(format!(
            "{base}/api/v1/jobs/flood/backfill?namespace={FLOOD}"
        ))
        .json(&json!({"from": from, "to": to}))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("backfill: {}", resp.text().await?);
    }
    let answer: Value = resp.json().await?;
    if answer["skipped_backlog"].as_u64().unwrap_or(0) > 0 {
        bail!("backfill: runs skipped at the backlog cap: {answer}");
    }
    Ok(answer["recorded"].as_array().map_or(0, Vec::len))
}

/// Triggers B's job every `every` until `drained`; returns how long each trigger took to be
/// answered, in ms. Each trigger is a request of its own, so a slow answer does not delay the
/// next one.
async fn trickle(
    http: reqwest::Client,
    base: String,
    every: Duration,
    drained: Arc<AtomicBool>,
) -> Result<Vec<f64>> {
    let mut ticks = tokio::time::interval(every);
    let mut sent = tokio::task::JoinSet::new();
    while !drained.load(Ordering::Relaxed) {
        ticks.tick().await;
        let (http, url) = (
            http.clone(),
            format!("{base}/api/v1/jobs/steady/trigger?namespace={STEADY}"),
        );
        sent.spawn(async move {
            let asked = Clock::now();
            let resp = http.post(url).json(&json!({})).send().await?;
            if !resp.status().is_success() {
                bail!("trigger: {}", resp.text().await?);
            }
            Ok(asked.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = sent.join_next().await {
        answers.push(done.context("a trigger")??);
    }
    Ok(answers)
}

/// Runs of `namespace` that have ended (for B: each succeeds once started and reported).
async fn count_ended(store: &dyn Store, namespace: &str) -> Result<u64> {
    Ok(runs_in(store, namespace)
        .await?
        .iter()
        .filter(|r| r.state.is_terminal())
        .count() as u64)
}

/// Every run of `namespace`.
async fn runs_in(store: &dyn Store, namespace: &str) -> Result<Vec<RunRecord>> {
    let mut runs = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(&RunQuery {
                namespace: namespace.into(),
                limit: 1000,
                cursor,
                ..Default::default()
            })
            .await?;
        runs.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(runs),
        }
    }
}

/// The worker pool: its slots, and how long each attempt holds one.
#[derive(Clone, Copy)]
struct Pool {
    slots: u32,
    duration: Duration,
}

/// What the worker holds: the attempts it has not reported yet (its heartbeats list them), and
/// how many of them are still executing (its slots in use).
#[derive(Default)]
struct Held {
    unreported: Mutex<HashSet<i64>>,
    executing: AtomicU64,
    slot_freed: Notify,
}

/// One worker of `pool.slots` slots whose attempts each take `pool.duration` and succeed;
/// counts A's completions in `a_done`; stops once `stop` is set. Returns the attempts it
/// completed.
async fn pool_worker(
    http: reqwest::Client,
    base: String,
    pool: Pool,
    a_done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<u64> {
    let resp = http
        .post(format!("{base}/api/v1/workers"))
        .json(&json!({"name": "pool", "slots": pool.slots}))
        .send()
        .await
        .context("register")?;
    if !resp.status().is_success() {
        bail!("register: {}: {}", resp.status(), resp.text().await?);
    }
    let reg: RegisterResponse = resp.json().await.context("register")?;
    let worker = reg.worker_id;
    let held = Arc::new(Held::default());
    // The heartbeats list the attempts held, as `sked worker`'s do: an attempt a heartbeat
    // leaves out loses its lease, and stops counting in its namespace's share.
    let heartbeats = tokio::spawn({
        let (http, url, held) = (
            http.clone(),
            format!("{base}/api/v1/workers/{worker}/heartbeat"),
            held.clone(),
        );
        let every = Duration::from_millis(reg.heartbeat_interval_ms);
        async move {
            loop {
                let running: Vec<i64> = match held.unreported.lock() {
                    Ok(ids) => ids.iter().copied().collect(),
                    Err(_) => return,
                };
                let _ = http
                    .post(&url)
                    .json(&json!({ "running": running }))
                    .send()
                    .await;
                tokio::time::sleep(every).await;
            }
        }
    });
    let (ended, reports) = mpsc::unbounded_channel::<(Completion, bool)>();
    let reporter = tokio::spawn(report_loop(
        http.clone(),
        format!("{base}/api/v1/workers/{worker}/complete"),
        reports,
        held.clone(),
        a_done,
    ));
    let leasing: Result<()> = async {
        while !stop.load(Ordering::Relaxed) {
            let free = u64::from(pool.slots).saturating_sub(held.executing.load(Ordering::Relaxed));
            if free == 0 {
                // Woken by a freed slot; the timeout only lets `stop` be seen.
                let _ = tokio::time::timeout(
                    Duration::from_millis(LEASE_WAIT_MS),
                    held.slot_freed.notified(),
                )
                .await;
                continue;
            }
            let lease: LeaseResponse = http
                .post(format!("{base}/api/v1/workers/{worker}/lease"))
                .json(&json!({"max": free, "wait_ms": LEASE_WAIT_MS}))
                .send()
                .await?
                .json()
                .await
                .context("lease")?;
            for attempt in lease.attempts {
                held.executing.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut ids) = held.unreported.lock() {
                    ids.insert(attempt.attempt_id);
                }
                let (held, ended) = (held.clone(), ended.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(pool.duration).await;
                    let completion = Completion {
                        attempt_id: attempt.attempt_id,
                        token: attempt.token,
                        outcome: AttemptOutcome::Succeeded,
                        exit_code: Some(0),
                        http_status: None,
                        error: None,
                    };
                    // The slot is free once the attempt ends; the report follows on its own.
                    held.executing.fetch_sub(1, Ordering::Relaxed);
                    held.slot_freed.notify_one();
                    let _ = ended.send((completion, attempt.namespace == FLOOD));
                });
            }
        }
        Ok(())
    }
    .await;
    drop(ended);
    heartbeats.abort();
    if let Err(e) = leasing {
        reporter.abort();
        return Err(e);
    }
    reporter.await.context("the worker's reporter")?
}

/// Sends the completions of `reports` to `url`, each request carrying all that ended meanwhile;
/// returns how many it sent.
async fn report_loop(
    http: reqwest::Client,
    url: String,
    mut reports: mpsc::UnboundedReceiver<(Completion, bool)>,
    held: Arc<Held>,
    a_done: Arc<AtomicU64>,
) -> Result<u64> {
    let mut completed = 0u64;
    while let Some(first) = reports.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = reports.try_recv() {
            batch.push(more);
        }
        let completions: Vec<&Completion> = batch.iter().map(|(c, _)| c).collect();
        let resp = http
            .post(&url)
            .json(&json!({ "completions": completions }))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("complete: {}", resp.text().await?);
        }
        if let Ok(mut ids) = held.unreported.lock() {
            for (c, _) in &batch {
                ids.remove(&c.attempt_id);
            }
        }
        let of_a = batch.iter().filter(|(_, a)| *a).count() as u64;
        a_done.fetch_add(of_a, Ordering::Relaxed);
        completed += batch.len() as u64;
    }
    Ok(completed)
}

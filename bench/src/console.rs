//! The web console's pages on a large store: `--jobs` jobs (cron, every and manual, none due
//! during the measurement) and a pipeline of [`PIPELINE`] more (a tree: each step waits for
//! the one at half its number, so the namespace's graph is larger than the console draws),
//! and `--runs` ended runs spread over the first (one in ten failed),
//! written straight to the store (on PostgreSQL set-based, [`crate::console_pg`]); then a server on it, a console login, and each page asked
//! for `--samples` times, one after another. The time of each, from the request sent to the
//! whole page read over loopback, bounds the server's time from above.

use crate::harness::{fresh_store, http_client, start, Place, ADMIN_TOKEN};
use anyhow::{bail, Context, Result};
use chrono::{Duration, Utc};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::stats::percentiles;
use sked_core::{AttemptOutcome, Instant, RunState, Trigger};
use sked_store::{AttemptReport, AttemptStart, Audit, Fire, NewWorker, PutMode, Store};
use std::sync::Arc;

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub jobs: usize,
    pub runs: usize,
    pub samples: usize,
}

/// Runs written per store call.
const BATCH: usize = 1000;
/// Jobs of the pipeline written besides `--jobs`.
const PIPELINE: usize = 400;

pub async fn run(options: Options<'_>) -> Result<Value> {
    let Options {
        database_url,
        jobs,
        runs,
        samples,
    } = options;
    if jobs == 0 || runs == 0 || samples == 0 {
        bail!("--jobs, --runs and --samples must be positive");
    }
    let (store, place) = fresh_store(database_url).await?;
    let writing = std::time::Instant::now();
    let ids = write_jobs(&store, jobs).await?;
    // Without runs: a dependant's fired instant would wait for its upstreams.
    write_pipeline(store.as_ref()).await?;
    let jobs_seconds = writing.elapsed().as_secs_f64();
    let writing = std::time::Instant::now();
    let first = Utc::now() - Duration::seconds(runs as i64 + 60);
    register_worker(store.as_ref()).await?;
    let (run_id, runs) = match &place {
        // Through the store, PostgreSQL would take hours over ten million runs.
        Place::Schema { url, .. } => {
            crate::console_pg::write_runs(url, &ids, runs, first, WORKER).await?
        }
        Place::Dir { .. } => write_runs(store.as_ref(), &ids, runs, first).await?,
    };
    let runs_seconds = writing.elapsed().as_secs_f64();
    eprintln!("console: {jobs} jobs in {jobs_seconds:.0} s, {runs} runs in {runs_seconds:.0} s");

    let mut running = start(store.clone(), place, 1).await?;
    let base = running.base().to_string();
    let http = crate::harness::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let login = http
        .post(format!("{base}/login"))
        .form(&[("token", ADMIN_TOKEN), ("next", "/")])
        .send()
        .await?;
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .context("the console login set no cookie")?
        .to_string();
    // A page far into the job list: its cursor, from the API.
    let deep = deep_cursor(&base, jobs).await?;
    let middle = format!("console-{:07}", jobs / 2);
    let pages = [
        ("overview", "/".to_string()),
        ("jobs", "/jobs".to_string()),
        ("jobs, deep page", format!("/jobs?cursor={deep}")),
        ("jobs, search", format!("/jobs?search={middle}")),
        (
            "jobs, cron whose last run failed",
            "/jobs?kind=cron&last=failed".to_string(),
        ),
        // No job has an event schedule: every job is looked at.
        (
            "jobs, a filter nothing matches",
            "/jobs?kind=event".to_string(),
        ),
        ("job", format!("/jobs/default/{middle}")),
        ("job form", format!("/jobs/default/{middle}/edit")),
        ("run", format!("/runs/{run_id}")),
        ("grid", "/grid".to_string()),
        // The most one page holds: 500 jobs, each with up to 100 runs of a month.
        (
            "grid, 500 jobs over 31 days",
            "/grid?window=31d&rows=500".to_string(),
        ),
        ("grid, cron jobs", "/grid?kind=cron&window=7d".to_string()),
        ("workers", "/workers".to_string()),
        ("audit", "/audit".to_string()),
        (
            "audit, one object in a time range",
            format!("/audit?object={middle}&since=2000-01-01T00:00&until=2100-01-01T00:00"),
        ),
        ("search", format!("/search?q={middle}")),
        ("search, a run's id", format!("/search?q={run_id}")),
        ("preferences", "/preferences".to_string()),
        ("graph", "/graph".to_string()),
        (
            "job in the pipeline",
            "/jobs/default/pipeline-0005".to_string(),
        ),
    ];
    let mut figures = Vec::new();
    // Requests over this are listed with when they came, to tell what holds them from what
    // the page reads.
    let slow_ms = 200.0;
    let mut slow = Vec::new();
    let measuring = std::time::Instant::now();
    for (name, path) in &pages {
        let mut times = Vec::with_capacity(samples);
        let mut bytes = 0;
        for sample in 0..samples {
            let t = std::time::Instant::now();
            let response = http
                .get(format!("{base}{path}"))
                .header(reqwest::header::COOKIE, &cookie)
                .send()
                .await?;
            let status = response.status();
            let body = response.bytes().await?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            times.push(ms);
            if ms > slow_ms {
                let at = (t - measuring).as_secs_f64();
                eprintln!(
                    "console: {name} took {ms:.0} ms (sample {sample}), {at:.1} s into the requests"
                );
                slow.push(json!({"page": name, "ms": ms, "sample": sample, "at_s": at}));
            }
            if !status.is_success() {
                bail!("{path} answered {status}");
            }
            bytes = body.len();
        }
        let p = percentiles(&mut times);
        eprintln!(
            "console: {name:<34} p50 {:7.1} ms  p99 {:7.1} ms",
            p.p50, p.p99
        );
        figures.push(json!({
            "page": name, "path": path, "bytes": bytes,
            "p50_ms": p.p50, "p99_ms": p.p99, "max_ms": p.max,
        }));
    }
    let store_name = running.store_name();
    running.stop().await;
    drop(store);
    running.finish().await;
    Ok(json!({
        "scenario": "console",
        "store": store_name,
        "jobs": jobs,
        "runs": runs,
        "samples": samples,
        "jobs_written_seconds": jobs_seconds,
        "runs_written_seconds": runs_seconds,
        "pages": figures,
        "slow_requests": slow,
        "measures": "each page from request sent to body read over loopback, one at a time",
    }))
}

/// `jobs` jobs, a third each cron (yearly), every (a day: none due soon) and manual.
async fn write_jobs(store: &Arc<dyn Store>, jobs: usize) -> Result<Vec<i64>> {
    let kinds = [
        json!({"schedule": {"cron": "0 0 0 1 1 *", "timezone": "Europe/London"}}),
        json!({"schedule": {"every": "24h"}}),
        json!({}),
    ];
    let mut ids: Vec<i64> = futures_util::stream::iter(0..jobs)
        .map(|i| {
            let store = store.clone();
            let mut spec = kinds[i % kinds.len()].clone();
            spec["target"] = json!({"shell": {"command": "echo console benchmark"}});
            spec["description"] = json!(format!("benchmark job number {i}"));
            async move {
                let spec: JobSpec = serde_json::from_value(spec)?;
                let now = Utc::now();
                let job = spec
                    .validate(Some(&format!("console-{i:07}")), now)
                    .context("benchmark job")?;
                let (_, record) = store
                    .put_job("default", &job, PutMode::Upsert, now, Audit::none())
                    .await?;
                anyhow::Ok(record.id)
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    ids.sort_unstable();
    Ok(ids)
}

/// The pipeline's [`PIPELINE`] jobs, without a schedule: `pipeline-{i}` waits for
/// `pipeline-{i / 2}` (a tree), written in order so each upstream is there first.
async fn write_pipeline(store: &dyn Store) -> Result<()> {
    for i in 0..PIPELINE {
        let mut spec = json!({"target": {"shell": {"command": "echo pipeline step"}}});
        if i > 0 {
            spec["depends_on"] = json!([{"job": format!("pipeline-{:04}", i / 2)}]);
        }
        let spec: JobSpec = serde_json::from_value(spec)?;
        let now = Utc::now();
        let job = spec
            .validate(Some(&format!("pipeline-{i:04}")), now)
            .context("pipeline job")?;
        store
            .put_job("default", &job, PutMode::Upsert, now, Audit::none())
            .await?;
    }
    Ok(())
}

/// The worker the runs' attempts name.
const WORKER: &str = "console-bench";

async fn register_worker(store: &dyn Store) -> Result<()> {
    store
        .register_worker(
            &NewWorker {
                id: WORKER.into(),
                name: WORKER.into(),
                labels: Default::default(),
                slots: BATCH as u32,
                namespaces: vec!["*".into()],
                token_id: None,
                publisher: false,
            },
            Utc::now(),
        )
        .await?;
    Ok(())
}

/// One run in this many fails: the last instant of every such stretch.
pub const FAIL_EVERY: usize = 10;

/// Whether the run of the `n`th instant written (from 0) fails: by the instant rather than by
/// the run's id, since a store hands out ids in an order of its own. [`crate::console_pg`]
/// applies the same rule in SQL, with [`FAIL_EVERY`] as a parameter.
fn fails(n: usize) -> bool {
    n % FAIL_EVERY == FAIL_EVERY - 1
}

/// `runs` runs over the jobs, round robin, instants a second apart from `first`: fired,
/// started and ended, one in ten failed ([`fails`]), through the store, [`BATCH`] at a time.
/// Returns a run's id and the runs written. [`crate::console_pg`] writes the same on
/// PostgreSQL without the store.
async fn write_runs(
    store: &dyn Store,
    ids: &[i64],
    runs: usize,
    first: Instant,
) -> Result<(i64, usize)> {
    let worker = WORKER;
    let mut written = 0;
    let mut some_run = 0;
    while written < runs {
        let count = BATCH.min(runs - written);
        let fires: Vec<Fire> = (written..written + count)
            .map(|n| {
                let at = sked_core::ledger_instant(first + Duration::seconds(n as i64));
                Fire {
                    job_id: ids[n % ids.len()],
                    scheduled_for: at,
                    trigger: Trigger::Schedule,
                    skip: None,
                    ready_at: at,
                    advance: None,
                    nominal_for: None,
                    why: None,
                }
            })
            .collect();
        let now = Utc::now();
        let fired = store.record_fires(&fires, now, Audit::none()).await?;
        // A store's fired runs are in the fires' order.
        let (starts, failing): (Vec<AttemptStart>, Vec<bool>) = fired
            .runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.inserted && r.state == RunState::Queued)
            .map(|(i, r)| {
                let start = AttemptStart {
                    run_id: r.run_id,
                    worker_id: worker.into(),
                    token: r.run_id,
                    lease_expires_at: now + Duration::seconds(60),
                    flow: None,
                };
                (start, fails(written + i))
            })
            .unzip();
        let started = store.start_attempts(&starts, now).await?;
        let reports: Vec<AttemptReport> = starts
            .iter()
            .zip(failing)
            .zip(started)
            .filter_map(|((s, failed), a)| {
                a.ok().map(|a| AttemptReport {
                    attempt_id: a.attempt_id,
                    token: s.token,
                    worker_id: worker.into(),
                    outcome: if failed {
                        AttemptOutcome::Failed
                    } else {
                        AttemptOutcome::Succeeded
                    },
                    exit_code: Some(i32::from(failed)),
                    http_status: None,
                    error: failed.then(|| "exited with code 1".to_string()),
                })
            })
            .collect();
        if reports.len() != count {
            bail!("{} of {count} runs were started", reports.len());
        }
        // The newest run written: a store returns fired runs in an order of its own.
        some_run = starts.iter().map(|s| s.run_id).fold(some_run, i64::max);
        store.complete_attempts(&reports, now).await?;
        written += count;
    }
    Ok((some_run, written))
}

/// The cursor of the job list's page nine tenths of the way through, walked from the API.
async fn deep_cursor(base: &str, jobs: usize) -> Result<String> {
    let http = http_client();
    let pages = (jobs * 9 / 10) / 1000;
    let mut cursor = String::new();
    for _ in 0..pages.max(1) {
        let after = if cursor.is_empty() {
            String::new()
        } else {
            format!("&cursor={cursor}")
        };
        let response = http
            .get(format!("{base}/api/v1/jobs?limit=1000{after}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("listing jobs answered {}", response.status());
        }
        let page: Value = response.json().await?;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    if cursor.is_empty() {
        bail!("the job list has no page past the first");
    }
    Ok(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_store::RunQuery;

    /// A value with the instants a writer takes from its clock, job names (jobs are written
    /// concurrently, so a name's id differs between stores) and the ids of runs and attempts
    /// (handed out in an order of the writer's own) left out.
    fn without_clock(mut value: Value) -> Value {
        match &mut value {
            Value::Object(map) => {
                for key in [
                    "id",
                    "run_id",
                    "created_at",
                    "started_at",
                    "finished_at",
                    "lease_expires_at",
                    "job",
                    "lateness_ms",
                    "start_lateness_ms",
                ] {
                    map.remove(key);
                }
                for v in map.values_mut() {
                    *v = without_clock(v.take());
                }
            }
            Value::Array(items) => {
                for v in items.iter_mut() {
                    *v = without_clock(v.take());
                }
            }
            _ => {}
        }
        value
    }

    /// What the store reads back of the runs: each run with its attempts, the namespace's
    /// newest runs as listed, and each job's statistics, by job id.
    async fn read_back(store: &dyn Store, ids: &[i64], newest: i64) -> Result<Value> {
        let mut runs = Vec::new();
        for id in 1..=newest {
            let (run, attempts) = store.get_run(id).await?.context("a run is missing")?;
            runs.push(json!({"run": run, "attempts": attempts}));
        }
        let listed = store
            .list_runs(&RunQuery {
                namespace: "default".into(),
                job: None,
                state: None,
                deadline_missed: false,
                at_risk: false,
                limit: 100,
                cursor: None,
            })
            .await?;
        let mut stats = Vec::new();
        for &id in ids {
            let job = store.get_job_by_id(id).await?.context("a job is missing")?;
            let stat = store.job_stats("default", &job.name).await?;
            stats.push(json!({"job_id": id, "stats": stat}));
        }
        let mut listed: Vec<Value> = listed.items.iter().map(|run| json!(run)).collect();
        // Each run by its job and instant: a store hands out ids in an order of its own.
        by_instant(&mut runs);
        by_instant(&mut listed);
        Ok(without_clock(
            json!({"runs": runs, "listed": listed, "stats": stats}),
        ))
    }

    /// Runs (or runs with their attempts) in order of their job and instant.
    fn by_instant(runs: &mut [Value]) {
        let key = |v: &Value| {
            let run = v.get("run").unwrap_or(v);
            (run["job_id"].as_i64(), run["scheduled_for"].to_string())
        };
        runs.sort_by_key(key);
    }

    /// The runs written set-based on PostgreSQL read back through the store as those written
    /// through it do. Needs `SKED_TEST_DATABASE_URL` (reported as ignored without it, and a
    /// failure under CI).
    #[tokio::test]
    #[cfg_attr(
        not(sked_pg_tests),
        ignore = "needs SKED_TEST_DATABASE_URL (PostgreSQL)"
    )]
    async fn runs_written_set_based_read_back_as_the_stores_own() -> Result<()> {
        let url = std::env::var("SKED_TEST_DATABASE_URL")
            .context("SKED_TEST_DATABASE_URL must name a PostgreSQL database")?;
        let first = sked_core::ledger_instant(Utc::now() - Duration::seconds(3600));
        let runs = 45;
        let mut seen = Vec::new();
        for set_based in [false, true] {
            let (store, place) = fresh_store(Some(&url)).await?;
            let ids = write_jobs(&store, 7).await?;
            register_worker(store.as_ref()).await?;
            let (newest, written) = match (&place, set_based) {
                (Place::Schema { url, .. }, true) => {
                    crate::console_pg::write_runs(url, &ids, runs, first, WORKER).await?
                }
                _ => write_runs(store.as_ref(), &ids, runs, first).await?,
            };
            assert_eq!((newest, written), (runs as i64, runs));
            seen.push(read_back(store.as_ref(), &ids, newest).await?);
            drop(store);
            place.remove().await;
        }
        let failed = seen[0]["runs"].as_array().map_or(0, |runs| {
            runs.iter()
                .filter(|r| r["run"]["state"] == "failed")
                .count()
        });
        assert_eq!(failed, 4);
        // Item by item, so a difference shows alone.
        for part in ["runs", "listed", "stats"] {
            let (store, set_based) = (&seen[0][part], &seen[1][part]);
            assert_eq!(
                store.as_array().map(Vec::len),
                set_based.as_array().map(Vec::len)
            );
            for (i, (a, b)) in store
                .as_array()
                .iter()
                .flat_map(|a| a.iter())
                .zip(set_based.as_array().iter().flat_map(|b| b.iter()))
                .enumerate()
            {
                assert_eq!(a, b, "{part}[{i}]: through the store, then set-based");
            }
        }
        Ok(())
    }
}

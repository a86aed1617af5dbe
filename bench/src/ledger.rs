//! The ledger's own cost as it grows, with nothing else running: batches of fires, starts and
//! completions written straight to the store, one after another, the time of each statement
//! batch reported per slice of the ledger's growth. A server's latency tail that grows over a
//! long run is either this (the store's transactions getting dearer with history) or the
//! waiting around them; this separates the two, and says which of the three writes grows.

use crate::harness::fresh_store;
use anyhow::{bail, Context, Result};
use chrono::{Duration, Utc};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::stats::percentiles;
use sked_core::{AttemptOutcome, RunState, Trigger};
use sked_store::{AttemptReport, AttemptStart, Audit, Fire, NewWorker, PutMode};

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub jobs: usize,
    pub runs: usize,
    pub batch: usize,
    /// Slices the growth is reported in.
    pub slices: usize,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let Options {
        database_url,
        jobs,
        runs,
        batch,
        slices,
    } = options;
    if jobs == 0 || batch == 0 || slices == 0 || runs < batch * slices {
        bail!("--jobs, --batch and --slices must be positive, and --runs at least batch x slices");
    }
    let (store, place) = fresh_store(database_url).await?;
    let spec: JobSpec = serde_json::from_value(json!({
        "schedule": {"every": "5s"},
        "target": {"shell": {"command": "true"}},
    }))?;
    let writing = std::time::Instant::now();
    let mut ids: Vec<i64> = futures_util::stream::iter(0..jobs)
        .map(|i| {
            let (store, spec) = (store.clone(), spec.clone());
            async move {
                let now = Utc::now();
                let job = spec
                    .validate(Some(&format!("ledger-{i:07}")), now)
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
    let jobs_written = writing.elapsed();
    let worker = "ledger-bench";
    store
        .register_worker(
            &NewWorker {
                id: worker.into(),
                name: worker.into(),
                labels: Default::default(),
                slots: u32::try_from(batch).unwrap_or(u32::MAX),
                namespaces: vec!["*".into()],
                token_id: None,
                publisher: false,
            },
            Utc::now(),
        )
        .await?;

    // Instants one period apart per job, in job order within a period, as the schedules of
    // the publish benchmark fall due.
    let base = Utc::now();
    let period_us = 5_000_000 / jobs as i64;
    let batches = runs / batch;
    let per_slice = batches / slices;
    let mut timings: [Vec<f64>; 3] = Default::default();
    let mut by_slice = Vec::new();
    let ms = |t: std::time::Instant| t.elapsed().as_secs_f64() * 1000.0;
    for b in 0..batches {
        let fires: Vec<Fire> = (0..batch)
            .map(|k| {
                let n = b * batch + k;
                let at = base + Duration::microseconds(period_us * n as i64);
                Fire {
                    job_id: ids[n % jobs],
                    scheduled_for: sked_core::ledger_instant(at),
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
        let t = std::time::Instant::now();
        let fired = store.record_fires(&fires, now, Audit::none()).await?;
        timings[0].push(ms(t));
        let starts: Vec<AttemptStart> = fired
            .runs
            .iter()
            .filter(|r| r.inserted && r.state == RunState::Queued)
            .map(|r| AttemptStart {
                run_id: r.run_id,
                worker_id: worker.into(),
                token: r.run_id,
                lease_expires_at: now + Duration::seconds(60),
                flow: None,
            })
            .collect();
        let t = std::time::Instant::now();
        let started = store.start_attempts(&starts, now).await?;
        timings[1].push(ms(t));
        let reports: Vec<AttemptReport> = starts
            .iter()
            .zip(started)
            .filter_map(|(s, a)| {
                a.ok().map(|a| AttemptReport {
                    attempt_id: a.attempt_id,
                    token: s.token,
                    worker_id: worker.into(),
                    outcome: AttemptOutcome::Succeeded,
                    exit_code: Some(0),
                    http_status: None,
                    error: None,
                })
            })
            .collect();
        if reports.len() != batch {
            bail!(
                "batch {b}: {} of {batch} instants were started",
                reports.len()
            );
        }
        let t = std::time::Instant::now();
        store.complete_attempts(&reports, now).await?;
        timings[2].push(ms(t));
        if (b + 1) % per_slice == 0 {
            let [fire, start, complete] = &mut timings;
            let row = |v: &mut Vec<f64>| {
                let p = percentiles(v);
                json!({"p50": p.p50, "p99": p.p99, "max": p.max})
            };
            by_slice.push(json!({
                "runs_in_ledger": (b + 1) * batch,
                "record_fires_ms": row(fire),
                "start_attempts_ms": row(start),
                "complete_attempts_ms": row(complete),
            }));
            for t in &mut timings {
                t.clear();
            }
        }
    }
    let store_name = place.store_name();
    drop(store);
    place.remove().await;
    Ok(json!({
        "scenario": "ledger",
        "store": store_name,
        "jobs": jobs,
        "batch": batch,
        "jobs_written_seconds": jobs_written.as_secs_f64(),
        "by_slice": by_slice,
        "measures": "the time of each store call for one batch, alone on the store",
    }))
}

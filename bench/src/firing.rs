//! Firing lateness: N schedules each firing once a minute, anchored evenly across the minute so
//! that N/60 instants fall due every second. Lateness is the time from an instant to its run's
//! ledger row.

use crate::harness::{all_runs, in_window, ms, start, store_with_jobs};
use anyhow::Result;
use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::stats::percentiles;
use std::time::Instant as Clock;

pub async fn run(database_url: Option<&str>, schedules: usize, seconds: u64) -> Result<Value> {
    let base = Utc::now();
    let step_us = 60_000_000 / schedules.max(1) as i64;
    let jobs = (0..schedules).map(move |i| {
        let anchor = base + Duration::microseconds(step_us * i as i64);
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": "60s", "anchor": anchor.to_rfc3339()},
            "target": {"shell": {"command": "true"}},
        }))
        .expect("a valid benchmark job");
        (format!("job-{i:07}"), spec)
    });
    let created = Clock::now();
    let (store, place) = store_with_jobs(database_url, jobs).await?;
    let create_s = created.elapsed().as_secs_f64();
    let started = Clock::now();
    let mut server = start(store.clone(), place).await?;
    let store_name = server.store_name();
    let ready_s = started.elapsed().as_secs_f64();
    let from = Utc::now() + Duration::seconds(1);
    tokio::time::sleep(std::time::Duration::from_secs(seconds + 1)).await;
    let to = from + Duration::seconds(seconds as i64);
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await?
        .text()
        .await?;
    server.stop().await;

    let runs = all_runs(store.as_ref()).await?;
    server.finish().await;
    let mut lateness: Vec<f64> = runs
        .iter()
        .filter(|r| in_window(r.scheduled_for, from, to))
        .map(|r| ms(r.created_at - r.scheduled_for))
        .collect();
    let expected = (schedules as f64 * seconds as f64 / 60.0).round() as usize;
    let p = percentiles(&mut lateness);
    Ok(json!({
        "scenario": "firing",
        "store": store_name,
        "schedules": schedules,
        "fires_per_second": schedules as f64 / 60.0,
        "window_seconds": seconds,
        "fires_expected": expected,
        "fires_recorded": p.count,
        "lateness_ms": {"p50": p.p50, "p90": p.p90, "p99": p.p99, "max": p.max},
        "create_jobs_seconds": create_s,
        "start_to_ready_seconds": ready_s,
        "fire_batches": metric(&metrics, "sked_fire_batches_total"),
    }))
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

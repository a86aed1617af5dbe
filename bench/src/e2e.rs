//! End-to-end durable no-op runs per second: schedules fire, the dispatcher hands attempts to a
//! worker over the HTTP worker protocol, the worker completes each at once, and the results are
//! recorded. The worker here is a minimal protocol client, so the figure is sked's own cost.
//! With several nodes, the slots are split between one such worker per node, each polling its
//! own node.

use crate::harness::{cluster, ms, start, store_with_jobs};
use anyhow::{bail, Context, Result};
use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::protocol::{Completion, LeaseResponse, RegisterResponse};
use sked_core::run::{AttemptOutcome, RunState};
use sked_core::stats::percentiles;

pub async fn run(
    database_url: Option<&str>,
    nodes: usize,
    schedules: usize,
    every: &str,
    seconds: u64,
    slots: u32,
) -> Result<Value> {
    let jobs = (0..schedules).map(|i| {
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": every},
            "target": {"shell": {"command": "true"}},
        }))
        .expect("a valid benchmark job");
        (format!("noop-{i:07}"), spec)
    });
    let (store, place) = store_with_jobs(database_url, jobs).await?;
    let mut server = start(store.clone(), place, nodes).await?;
    let store_name = server.store_name();
    let http = reqwest::Client::new();
    let shares = if nodes > 1 {
        Some(cluster(&http, server.base()).await?.shares())
    } else {
        None
    };
    let from = Utc::now() + Duration::seconds(2);
    let to = from + Duration::seconds(seconds as i64);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds + 4);
    // The total stays `slots` whatever the number of nodes.
    let count = server.bases.len() as u32;
    let mut workers = tokio::task::JoinSet::new();
    for (i, base) in server.bases.iter().enumerate() {
        let share = slots / count + u32::from((i as u32) < slots % count);
        workers.spawn(noop_worker(http.clone(), base.clone(), share, deadline));
    }
    let mut completed = 0u64;
    while let Some(done) = workers.join_next().await {
        completed += done.context("no-op worker")??;
    }
    let attempts_started = server.metric_sum("sked_attempts_started_total").await?;
    server.stop().await;

    let window = server.finish_with_runs(store.as_ref(), from, to).await?;
    let succeeded = window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    let mut end_to_end: Vec<f64> = window
        .iter()
        .filter_map(|r| r.finished_at.map(|f| ms(f - r.scheduled_for)))
        .collect();
    let p = percentiles(&mut end_to_end);
    let mut figures = json!({
        "scenario": "e2e",
        "store": store_name,
        "nodes": nodes,
        "schedules": schedules,
        "every": every,
        "window_seconds": seconds,
        "runs_in_window": window.len(),
        "succeeded_in_window": succeeded,
        "runs_per_second": succeeded as f64 / seconds as f64,
        "instant_to_recorded_ms": {"p50": p.p50, "p99": p.p99, "max": p.max},
        "completions_sent": completed,
        "attempts_started": attempts_started,
    });
    if let Some(shares) = shares {
        figures["partitions_per_node"] = json!(shares);
    }
    Ok(figures)
}

/// A worker with `slots` slots on the node at `base` that completes every attempt it leases at
/// once, until `deadline`; returns how many it completed.
async fn noop_worker(
    http: reqwest::Client,
    base: String,
    slots: u32,
    deadline: std::time::Instant,
) -> Result<u64> {
    let reg: RegisterResponse = http
        .post(format!("{base}/api/v1/workers"))
        .json(&json!({"name": "noop", "slots": slots}))
        .send()
        .await?
        .json()
        .await
        .context("register")?;
    let worker = reg.worker_id;
    // Every attempt completes within its lease poll, so heartbeats carry no attempts; they only
    // keep the worker alive.
    let heartbeats = tokio::spawn({
        let (http, url) = (
            http.clone(),
            format!("{base}/api/v1/workers/{worker}/heartbeat"),
        );
        let every = std::time::Duration::from_millis(reg.heartbeat_interval_ms);
        async move {
            loop {
                let _ = http.post(&url).json(&json!({"running": []})).send().await;
                tokio::time::sleep(every).await;
            }
        }
    });
    let leased = lease_loop(&http, &base, &worker, slots, deadline).await;
    heartbeats.abort();
    leased
}

async fn lease_loop(
    http: &reqwest::Client,
    base: &str,
    worker: &str,
    slots: u32,
    deadline: std::time::Instant,
) -> Result<u64> {
    let mut completed = 0u64;
    while std::time::Instant::now() < deadline {
        let lease: LeaseResponse = http
            .post(format!("{base}/api/v1/workers/{worker}/lease"))
            .json(&json!({"max": slots, "wait_ms": 200}))
            .send()
            .await?
            .json()
            .await
            .context("lease")?;
        if lease.attempts.is_empty() {
            continue;
        }
        let completions: Vec<Completion> = lease
            .attempts
            .iter()
            .map(|a| Completion {
                attempt_id: a.attempt_id,
                token: a.token,
                outcome: AttemptOutcome::Succeeded,
                exit_code: Some(0),
                http_status: None,
                error: None,
            })
            .collect();
        let resp = http
            .post(format!("{base}/api/v1/workers/{worker}/complete"))
            .json(&json!({"completions": completions}))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("complete: {}", resp.text().await?);
        }
        completed += completions.len() as u64;
    }
    Ok(completed)
}

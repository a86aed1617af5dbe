//! End-to-end durable no-op runs per second: schedules fire, the dispatcher hands attempts to a
//! worker over the HTTP worker protocol, the worker completes each at once, and the results are
//! recorded. The worker here is the no-op protocol client of `noop.rs`, so the figure is sked's
//! own cost.
//! With several nodes, the slots are split between one such worker per node, each polling its
//! own node.

use crate::harness::{cluster, ms, start, store_with_jobs};
use crate::noop;
use anyhow::Result;
use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::run::RunState;
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
    let workers = noop::spawn(
        &http,
        &server.bases,
        slots,
        &noop::Until::deadline(deadline),
    );
    let completed = noop::join(workers).await?;
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

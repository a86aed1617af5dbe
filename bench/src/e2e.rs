//! End-to-end durable no-op runs per second: schedules fire, the dispatcher hands attempts to a
//! worker over the HTTP worker protocol, the worker completes each at once, and the results are
//! recorded. The worker here is the no-op protocol client of `noop.rs`, so the figure is sked's
//! own cost.
//! With several nodes, the slots are split between one such worker per node, each polling its
//! own node.
//!
//! Besides the runs due in the window, it reports what the server did during the window
//! (completions accepted and instants fired per second, read from `/metrics`), which stays
//! meaningful past the ceiling, when the runs completed are partly older ones, and the lateness
//! of each second's runs, which shows whether a backlog grows smoothly or collapses. On
//! PostgreSQL it also reports what each completed run cost the database (`pgcost.rs`).

use crate::harness::{by_second, cluster, ms, percentiles_of, start, store_with_jobs, Running};
use crate::noop;
use crate::pgcost;
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
    let http = crate::harness::http_client();
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
    let sampled = async {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let start = Counters::read(&server).await?;
        let window = std::time::Duration::from_secs(seconds);
        let cost = match server.admin() {
            None => {
                tokio::time::sleep(window).await;
                None
            }
            // On PostgreSQL, what the window cost the database.
            Some(admin) => {
                let before = pgcost::Snapshot::read(admin).await?;
                let waits = pgcost::lock_waits(admin, std::time::Instant::now() + window).await?;
                let after = pgcost::Snapshot::read(admin).await?;
                Some((admin, before, after, waits))
            }
        };
        let end = Counters::read(&server).await?;
        let cost = match cost {
            None => None,
            Some((admin, before, after, waits)) => {
                let runs = end.completions - start.completions;
                Some(pgcost::per_run(admin, &before, &after, &waits, runs).await?)
            }
        };
        Ok::<_, anyhow::Error>((start, end, cost))
    };
    let (completed, counted) = tokio::join!(noop::join(workers), sampled);
    let completed = completed?;
    let (at_start, at_end, cost) = counted?;
    let attempts_started = server.metric_sum("sked_attempts_started_total").await?;
    server.stop().await;

    let window = server.finish_with_runs(store.as_ref(), from, to).await?;
    let succeeded = window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    let p = percentiles_of(&window, |r| r.finished_at.map(|f| ms(f - r.scheduled_for)));
    // Each second's median time from instant to result recorded, of the runs due in it.
    let p50_by_second = by_second(
        &window,
        from,
        seconds,
        |r| r.finished_at.map(|f| ms(f - r.scheduled_for)),
        |values| percentiles(values).p50,
    );
    let per_second = |end: f64, start: f64| (end - start) / seconds as f64;
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
        "completed_per_second": per_second(at_end.completions, at_start.completions),
        "fired_per_second": per_second(at_end.fires, at_start.fires),
        "skipped_backlog_per_second": per_second(at_end.backlog, at_start.backlog),
        "instant_to_recorded_p50_by_second_ms": p50_by_second,
    });
    if let Some(shares) = shares {
        figures["partitions_per_node"] = json!(shares);
    }
    if let Some(cost) = cost {
        figures["postgres_cost"] = cost;
    }
    Ok(figures)
}

/// Counters of `/metrics` summed over the nodes, read at the window's edges.
pub struct Counters {
    pub completions: f64,
    pub fires: f64,
    pub backlog: f64,
}

impl Counters {
    pub async fn read(server: &Running) -> Result<Counters> {
        let read = |name: &'static str| async move {
            Ok::<_, anyhow::Error>(server.metric_sum(name).await?.unwrap_or(0.0))
        };
        Ok(Counters {
            completions: read("sked_completions_accepted_total").await?,
            fires: read("sked_fires_total").await?,
            backlog: read("sked_fires_skipped_backlog_total").await?,
        })
    }
}

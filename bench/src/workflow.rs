//! Dependencies: N jobs in one graph — a chain, a binary tree, a wide fan-out, or a fan-out
//! whose leaves fan back in by 32 — whose root has one instant a few seconds after the server is
//! ready and every other job runs at its upstreams' instant (no schedule). The no-op worker
//! completes each attempt at once, so what is measured is sked's own cost of releasing a
//! dependant and handing it out.
//!
//! It reports, per edge, the time from the upstream's run ending (the last upstream, at a
//! fan-in) to the dependant's attempt starting; the whole graph's time from the root's end to
//! the last run's end; and that time less the execution along the path that ended last (each
//! run's start to end, the no-op worker's round trip), which is the scheduling overhead the
//! target is about. Every one of the N runs must have succeeded once, at the root's instant.

use crate::harness::{fresh_store, ms, start};
use crate::noop;
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use sked_core::stats::percentiles;
use sked_core::Instant;
use sked_store::{Audit, PutMode};
use std::collections::HashMap;
use std::time::Instant as Clock;

/// DESIGN's target for the scheduling overhead of a 1,000-job tree.
const TARGET_MS: f64 = 100.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Each job waits for the one before it.
    Chain,
    /// Job i waits for job (i - 1) / 2.
    Tree,
    /// Every job waits for the root.
    Wide,
    /// Leaves wait for the root; each sink waits for 32 leaves.
    FanIn,
}

/// The upstreams of job `i` of `n` in `shape` (job 0 is the root).
fn upstreams(shape: Shape, n: usize, i: usize) -> Vec<usize> {
    if i == 0 {
        return Vec::new();
    }
    match shape {
        Shape::Chain => vec![i - 1],
        Shape::Tree => vec![(i - 1) / 2],
        Shape::Wide => vec![0],
        Shape::FanIn => {
            // Of the n - 1 jobs below the root, one in 33 is a sink over the 32 leaves before.
            let sinks = (n - 1) / 33;
            let leaves = n - 1 - sinks;
            if i <= leaves {
                vec![0]
            } else {
                let sink = i - leaves - 1;
                (1 + sink * 32..=(sink + 1) * 32).collect()
            }
        }
    }
}

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub jobs: usize,
    pub shape: Shape,
    pub slots: u32,
    /// How long after the instant every run may take to succeed.
    pub limit_seconds: u64,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let n = options.jobs;
    if n < 2 || options.slots == 0 {
        bail!("--jobs must be at least 2 and --slots above zero");
    }
    let name = |i: usize| format!("step-{i:06}");
    let (store, place) = fresh_store(options.database_url).await?;
    let created = Clock::now();
    let now = Utc::now();
    let mut specs: Vec<(String, JobSpec)> = Vec::with_capacity(n);
    let lead_ms = 3_000 + n as i64 * if options.database_url.is_some() { 4 } else { 1 };
    let instant: Instant = DateTime::from_timestamp_millis(Utc::now().timestamp_millis() + lead_ms)
        .context("the root's instant")?;
    for i in 0..n {
        let mut spec = json!({"target": {"shell": {"command": "true"}}});
        if i == 0 {
            spec["schedule"] = json!({"at": instant.to_rfc3339()});
        } else {
            spec["depends_on"] = upstreams(options.shape, n, i)
                .into_iter()
                .map(|u| json!({"job": name(u)}))
                .collect();
        }
        specs.push((name(i), serde_json::from_value(spec)?));
    }
    // In index order, so upstreams first: a definition may name only jobs that exist.
    for (job, spec) in specs {
        let valid = spec.validate(Some(&job), now).context("benchmark job")?;
        store
            .put_job(
                "default",
                &valid,
                PutMode::Upsert,
                Utc::now(),
                Audit::none(),
            )
            .await?;
    }
    let create_s = created.elapsed().as_secs_f64();
    let mut server = start(store.clone(), place, 1).await?;
    let store_name = server.store_name();
    let ahead_ms = ms(instant - Utc::now());
    if ahead_ms < 200.0 {
        server.stop().await;
        server.finish().await;
        bail!("the server was ready only {ahead_ms:.0} ms before the root's instant");
    }
    let http = crate::harness::http_client();
    let limit = std::time::Duration::from_secs(options.limit_seconds);
    let workers = noop::spawn(
        &http,
        &server.bases,
        options.slots,
        &noop::Until::after_instant(instant, limit, n as u64),
    );
    let completed = noop::join(workers).await;
    server.stop().await;
    let completed = completed?;
    let runs = server
        .finish_with_runs(
            store.as_ref(),
            instant - chrono::Duration::days(1),
            instant + chrono::Duration::days(1),
        )
        .await?;

    let by_job: HashMap<&str, &RunRecord> = runs
        .iter()
        .filter(|r| r.scheduled_for == instant)
        .map(|r| (r.job.as_str(), r))
        .collect();
    let succeeded = by_job
        .values()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    if succeeded < n || runs.len() != n {
        bail!(
            "{succeeded} of {n} jobs succeeded at the root's instant ({} runs recorded) within \
             {} s",
            runs.len(),
            options.limit_seconds
        );
    }
    let names: Vec<String> = (0..n).map(name).collect();
    let run_of = |i: usize| by_job[names[i].as_str()];
    let finished = |i: usize| run_of(i).finished_at.unwrap_or(instant);
    let started = |i: usize| run_of(i).started_at.unwrap_or(instant);
    // Per edge: the last upstream's end to the dependant's start.
    let mut edge_ms: Vec<f64> = (1..n)
        .map(|i| {
            let last = upstreams(options.shape, n, i)
                .into_iter()
                .map(finished)
                .max()
                .unwrap_or(instant);
            ms(started(i) - last)
        })
        .collect();
    let edges = percentiles(&mut edge_ms);
    let mut execution_ms: Vec<f64> = (0..n).map(|i| ms(finished(i) - started(i))).collect();
    let execution = percentiles(&mut execution_ms);
    // The path that ended last, followed up through each step's last-ending upstream.
    let last = (0..n).max_by_key(|&i| finished(i)).unwrap_or(0);
    let (mut step, mut path_edges, mut path_execution) = (last, 0usize, 0.0f64);
    while step != 0 {
        path_execution += ms(finished(step) - started(step));
        path_edges += 1;
        step = upstreams(options.shape, n, step)
            .into_iter()
            .max_by_key(|&u| finished(u))
            .unwrap_or(0);
    }
    let whole_ms = ms(finished(last) - finished(0));
    let overhead_ms = whole_ms - path_execution;
    Ok(json!({
        "scenario": "workflow",
        "store": store_name,
        "shape": format!("{:?}", options.shape).to_lowercase(),
        "jobs": n,
        "worker_slots": options.slots,
        "create_jobs_seconds": create_s,
        "runs_succeeded": succeeded,
        "completions_sent": completed,
        "root_end_to_last_end_ms": whole_ms,
        "path_that_ended_last": {"edges": path_edges, "execution_ms": path_execution},
        "scheduling_overhead_ms": overhead_ms,
        "overhead_per_edge_on_that_path_ms": overhead_ms / path_edges.max(1) as f64,
        "edge_ms": {"p50": edges.p50, "p99": edges.p99, "max": edges.max},
        "execution_ms": {"p50": execution.p50, "p99": execution.p99},
        "target_overhead_ms": TARGET_MS,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_in_sinks_wait_for_32_leaves_and_every_job_has_an_upstream() {
        let n = 1000;
        let sinks = (n - 1) / 33;
        let last = upstreams(Shape::FanIn, n, n - 1);
        assert_eq!(last.len(), 32);
        assert_eq!(*last.last().unwrap(), sinks * 32);
        for shape in [Shape::Chain, Shape::Tree, Shape::Wide, Shape::FanIn] {
            for i in 1..n {
                let up = upstreams(shape, n, i);
                assert!(!up.is_empty() && up.iter().all(|&u| u < i), "{shape:?} {i}");
            }
        }
    }
}

//! What flow control costs: the `e2e` load (N schedules every second, the no-op worker) run
//! without limits and with them, alternated in one process (without, with, without, with...)
//! so that the machine's drift falls on both sides alike. With limits, each job holds one
//! concurrency key out of `--keys` (`k-<n>`, a constant key per job, the jobs spread evenly
//! over the keys) with limit 50, and every job spends the one rate key `api`, generous enough
//! never to hold a run back: what is measured is the bookkeeping (reading and locking the
//! keys, admitting, recording the holders), not waiting.
//!
//! Each pass reports the completions per second of its window, its runs' lateness, the store's
//! `start_attempts` call time (`sked_store_call_seconds{call="start_attempts"}`), and the
//! benchmark process's CPU per run; the summary is the ratio of the means, with over without.
//!
//! The answer is checked too, and the benchmark fails otherwise: every run of the window that
//! ended succeeded; no start was held back (`sked_flow_holds`); and no key ever had more than
//! its limit of runs between start and end at once, counted from the runs' own start and end
//! times (a run's attempt holds its key from the start to the completion that ends the run).

use crate::harness::{ms, percentiles_of, start, store_with_jobs, Running};
use crate::noop;
use crate::pgcost;
use anyhow::{bail, Context, Result};
use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use std::collections::HashMap;

/// The concurrency limit of every key.
const KEY_LIMIT: u32 = 50;

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub schedules: usize,
    pub keys: usize,
    pub seconds: u64,
    pub slots: u32,
    /// Pairs of passes, each without limits then with them.
    pub pairs: usize,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    if options.keys == 0 || options.pairs == 0 || options.seconds == 0 {
        bail!("--keys, --pairs and --seconds must be above zero");
    }
    let mut passes = Vec::new();
    let mut problems = Vec::new();
    for pair in 0..options.pairs {
        for limits in [false, true] {
            let pass = pass(&options, limits).await?;
            eprintln!("{}", pass.figures);
            problems.extend(
                pass.problems
                    .into_iter()
                    .map(|p| format!("pass {} ({}): {p}", passes.len() + 1, mode(limits))),
            );
            let mut figures = pass.figures;
            figures["pair"] = json!(pair + 1);
            passes.push(figures);
        }
    }
    let mean = |limits: bool, field: &str| -> f64 {
        let values: Vec<f64> = passes
            .iter()
            .filter(|p| p["limits"] == json!(limits))
            .filter_map(|p| p[field].as_f64())
            .collect();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    let without = mean(false, "completed_per_second");
    let with = mean(true, "completed_per_second");
    let ratio = if without > 0.0 { with / without } else { 0.0 };
    let pair_ratios: Vec<f64> = passes
        .chunks(2)
        .filter_map(|pair| {
            let a = pair.first()?["completed_per_second"].as_f64()?;
            let b = pair.get(1)?["completed_per_second"].as_f64()?;
            (a > 0.0).then_some(b / a)
        })
        .collect();
    let figures = json!({
        "scenario": "flow",
        "store": passes.first().map(|p| p["store"].clone()).unwrap_or_default(),
        "schedules": options.schedules,
        "keys": options.keys,
        "key_limit": KEY_LIMIT,
        "window_seconds": options.seconds,
        "slots": options.slots,
        "passes": passes,
        "completed_per_second_without": without,
        "completed_per_second_with": with,
        "ratio_with_over_without": ratio,
        "cost": 1.0 - ratio,
        "pair_ratios": pair_ratios,
        "start_call_ms_mean_without": mean(false, "start_call_ms_mean"),
        "start_call_ms_mean_with": mean(true, "start_call_ms_mean"),
        "start_call_us_per_run_without": mean(false, "start_call_us_per_run"),
        "start_call_us_per_run_with": mean(true, "start_call_us_per_run"),
        "process_cpu_us_per_run_without": mean(false, "process_cpu_us_per_run"),
        "process_cpu_us_per_run_with": mean(true, "process_cpu_us_per_run"),
        "checks": if problems.is_empty() { json!("passed") } else { json!(problems) },
    });
    if !problems.is_empty() {
        eprintln!("{figures}");
        bail!("the answer was wrong: {}", problems.join("; "));
    }
    Ok(figures)
}

fn mode(limits: bool) -> &'static str {
    if limits {
        "with limits"
    } else {
        "without limits"
    }
}

/// One pass's figures, and what its checks found wrong.
struct Pass {
    figures: Value,
    problems: Vec<String>,
}

/// The key job `i` holds.
fn key_of(i: usize, keys: usize) -> String {
    format!("k-{:04}", i % keys)
}

fn job_spec(limits: bool, i: usize, keys: usize) -> Result<JobSpec> {
    let mut spec = json!({
        "schedule": {"every": "1s"},
        "target": {"shell": {"command": "true"}},
    });
    if limits {
        spec["concurrency"] = json!([{"key": key_of(i, keys), "limit": KEY_LIMIT}]);
        // A start per microsecond, 100,000 back to back: the load never comes near it.
        spec["rate_limit"] =
            json!([{"key": "api", "limit": 1_000_000, "per": "1s", "burst": 100_000}]);
    }
    serde_json::from_value(spec).context("a benchmark job")
}

async fn pass(options: &Options<'_>, limits: bool) -> Result<Pass> {
    let jobs = (0..options.schedules)
        .map(|i| Ok((format!("noop-{i:07}"), job_spec(limits, i, options.keys)?)))
        .collect::<Result<Vec<_>>>()?;
    let (store, place) = store_with_jobs(options.database_url, jobs.into_iter()).await?;
    let mut server = start(store.clone(), place, 1).await?;
    let store_name = server.store_name();
    let http = crate::harness::http_client();
    let seconds = options.seconds;
    let from = Utc::now() + Duration::seconds(2);
    let to = from + Duration::seconds(seconds as i64);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds + 4);
    let workers = noop::spawn(
        &http,
        &server.bases,
        options.slots,
        &noop::Until::deadline(deadline),
    );
    let sampled = async {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let start = Sample::read(&server).await?;
        let window = std::time::Duration::from_secs(seconds);
        let cost = match server.admin() {
            None => {
                tokio::time::sleep(window).await;
                None
            }
            Some(admin) => {
                let before = pgcost::Snapshot::read(admin).await?;
                let waits = pgcost::lock_waits(admin, std::time::Instant::now() + window).await?;
                let after = pgcost::Snapshot::read(admin).await?;
                Some((admin, before, after, waits))
            }
        };
        let end = Sample::read(&server).await?;
        let cost = match cost {
            None => None,
            Some((admin, before, after, waits)) => {
                let runs = end.completions - start.completions;
                Some(pgcost::per_run(admin, &before, &after, &waits, runs).await?)
            }
        };
        Ok::<_, anyhow::Error>((start, end, cost))
    };
    let (completed, sampled) = tokio::join!(noop::join(workers), sampled);
    completed?;
    let (at_start, at_end, cost) = sampled?;
    let holds = server.metric_sum("sked_flow_holds_total").await?;
    server.stop().await;
    let window = server.finish_with_runs(store.as_ref(), from, to).await?;

    let mut problems = Vec::new();
    let succeeded = count(&window, |s| s == RunState::Succeeded);
    let ended_otherwise = count(&window, |s| s.is_terminal() && s != RunState::Succeeded);
    if ended_otherwise > 0 {
        problems.push(format!(
            "{ended_otherwise} runs of the window ended other than succeeded"
        ));
    }
    let holds = holds.unwrap_or(0.0);
    if holds > 0.0 {
        problems.push(format!("{holds} starts were held back by a key"));
    }
    let most_at_once = if limits {
        let most = most_at_once(&window, options.keys)?;
        if most > KEY_LIMIT as usize {
            problems.push(format!(
                "a key had {most} runs at once, above its limit of {KEY_LIMIT}"
            ));
        }
        Some(most)
    } else {
        None
    };

    let completions = at_end.completions - at_start.completions;
    let starts = at_end.attempts_started - at_start.attempts_started;
    let calls = at_end.start_calls - at_start.start_calls;
    let call_seconds = at_end.start_seconds - at_start.start_seconds;
    let lateness = percentiles_of(&window, |r| r.finished_at.map(|f| ms(f - r.scheduled_for)));
    let mut figures = json!({
        "limits": limits,
        "store": store_name,
        "completed_per_second": completions / seconds as f64,
        "runs_in_window": window.len(),
        "succeeded_in_window": succeeded,
        "instant_to_recorded_ms": {"p50": lateness.p50, "p99": lateness.p99, "max": lateness.max},
        "start_calls": calls,
        "start_call_ms_mean": call_seconds / calls.max(1.0) * 1e3,
        "start_call_us_per_run": call_seconds / starts.max(1.0) * 1e6,
        "runs_per_start_call": starts / calls.max(1.0),
        "process_cpu_us_per_run": (at_end.cpu_seconds - at_start.cpu_seconds)
            / completions.max(1.0)
            * 1e6,
        "held_back": holds,
        "most_runs_of_one_key_at_once": most_at_once,
    });
    if let Some(cost) = cost {
        figures["postgres_cost"] = cost;
    }
    Ok(Pass { figures, problems })
}

fn count(runs: &[RunRecord], state: impl Fn(RunState) -> bool) -> usize {
    runs.iter().filter(|r| state(r.state)).count()
}

/// The most runs of one key between their start and their end at any moment, over the runs
/// that started (a run still running counts to the end of time). An end at the same moment
/// as a start counts first: the store saw the attempt end before it counted the key.
fn most_at_once(runs: &[RunRecord], keys: usize) -> Result<usize> {
    let mut by_key: HashMap<String, Vec<(i64, i32)>> = HashMap::new();
    for run in runs {
        let Some(started) = run.started_at else {
            continue;
        };
        let i: usize = run
            .job
            .strip_prefix("noop-")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("a run of an unknown job {}", run.job))?;
        let edges = by_key.entry(key_of(i, keys)).or_default();
        edges.push((started.timestamp_micros(), 1));
        edges.push((
            run.finished_at.map_or(i64::MAX, |f| f.timestamp_micros()),
            -1,
        ));
    }
    let mut most = 0;
    for edges in by_key.values_mut() {
        edges.sort_unstable();
        let mut now = 0i32;
        for (_, step) in edges.iter() {
            now += step;
            most = most.max(now.max(0) as usize);
        }
    }
    Ok(most)
}

/// The server's counters at one edge of the window, and this process's CPU time.
struct Sample {
    completions: f64,
    attempts_started: f64,
    start_calls: f64,
    start_seconds: f64,
    cpu_seconds: f64,
}

impl Sample {
    async fn read(server: &Running) -> Result<Sample> {
        let text = reqwest::get(format!("{}/metrics", server.base()))
            .await?
            .text()
            .await?;
        let call = |series: &str| start_call(&text, series).unwrap_or(0.0);
        Ok(Sample {
            completions: crate::harness::metric(&text, "sked_completions_accepted_total")
                .unwrap_or(0.0),
            attempts_started: crate::harness::metric(&text, "sked_attempts_started_total")
                .unwrap_or(0.0),
            start_calls: call("sked_store_call_seconds_count"),
            start_seconds: call("sked_store_call_seconds_sum"),
            cpu_seconds: crate::process::cpu_time(std::process::id())?.own,
        })
    }
}

/// The sample of `series` labelled `call="start_attempts"` in a `/metrics` text.
fn start_call(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let labelled = line.strip_prefix(series)?.strip_prefix('{')?;
        let (labels, value) = labelled.split_once("} ")?;
        labels
            .contains("call=\"start_attempts\"")
            .then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_call_is_read_by_its_label() {
        let text = "sked_store_call_seconds_sum{call=\"fire\"} 1.5\n\
                    sked_store_call_seconds_sum{call=\"start_attempts\"} 2.25\n\
                    sked_store_call_seconds_count{call=\"start_attempts\"} 9\n";
        assert_eq!(start_call(text, "sked_store_call_seconds_sum"), Some(2.25));
        assert_eq!(start_call(text, "sked_store_call_seconds_count"), Some(9.0));
        assert_eq!(start_call(text, "sked_store_call_seconds_bucket"), None);
    }
}

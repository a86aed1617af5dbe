//! Shell process starts per second on one real worker: the server runs in this process, and one
//! `sked worker` process (the real agent, with `--slots S`) runs shell jobs whose command is
//! `true`. N schedules fire every `--every`, their anchors spread over the period, so the
//! worker is offered N runs per period at an even rate and is never short of work when N is
//! above what it can do. Each run is one `/bin/sh -c true` process (`true` is a shell builtin).
//!
//! Reports the runs that succeeded during the window per second (whatever their instant: the
//! rate the worker started and finished processes), how many of the window's own instants had
//! succeeded a little after it, the time from instant to result, and the worker process's CPU
//! time (its own, and its children's: the supervisor server with every supervisor and job it
//! forked, from `/proc/PID/stat`) per run over the window.
//!
//! Then, in the same sitting, the baseline: this process starts `/bin/sh -c COMMAND` directly,
//! `--slots` at a time, for the same window, with no scheduler around it; the ratio of the two
//! rates is what sked's worker costs against the machine's own process starts.

use crate::harness::{ms, percentiles_of, start, store_with_jobs};
use crate::process::{children_of, cpu_time, sked_bin, spawn, terminate, CpuTime};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::WorkerRecord;
use sked_core::run::RunState;
use sked_core::HumanDuration;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration as Span, Instant as Clock};

/// DESIGN's target for one worker.
const TARGET_PER_SECOND: f64 = 1500.0;
/// How long the worker may take to register.
const REGISTER_LIMIT: Span = Span::from_secs(30);
/// How long after the window its last instants may take to succeed.
const GRACE: Span = Span::from_secs(3);
/// How long the worker may take to stop.
const STOP_LIMIT: Span = Span::from_secs(10);

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub schedules: usize,
    pub every: String,
    pub seconds: u64,
    pub slots: u32,
    pub command: String,
    pub sked_bin: Option<PathBuf>,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let bin = sked_bin(options.sked_bin.as_deref())?;
    let period = options
        .every
        .parse::<HumanDuration>()
        .map_err(|e| anyhow::anyhow!("--every {}: {e}", options.every))?
        .as_chrono();
    let period_us = period.num_microseconds().context("--every is too long")?;
    if period_us <= 0 || options.schedules == 0 || options.slots == 0 || options.seconds == 0 {
        bail!("--every, --schedules, --slots and --seconds must be above zero");
    }
    let n = options.schedules;
    let base = Utc::now().timestamp_micros() / 1_000_000 * 1_000_000;
    let mut jobs = Vec::with_capacity(n);
    for i in 0..n {
        let anchor = DateTime::<Utc>::from_timestamp_micros(base + period_us * i as i64 / n as i64)
            .context("an anchor")?;
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": options.every, "anchor": anchor.to_rfc3339()},
            "target": {"shell": {"command": options.command}},
        }))
        .context("a benchmark job with this --command")?;
        jobs.push((format!("shell-{i:06}"), spec));
    }
    let (store, place) = store_with_jobs(options.database_url, jobs.into_iter()).await?;
    let mut server = start(store.clone(), place, 1).await?;
    let store_name = server.store_name();
    let logs = tempfile::Builder::new()
        .prefix("sked-shell-")
        .tempdir()?
        .keep();
    let log = logs.join("worker.log");
    let mut worker = spawn(
        &bin,
        &[
            "worker",
            "--server",
            server.base(),
            "--slots",
            &options.slots.to_string(),
            "--name",
            "bench-shell",
        ],
        &log,
    )?;
    let measured = measure(&options, server.base(), &mut worker, &log).await;
    let stopped_by_itself = terminate(&mut worker, STOP_LIMIT).await;
    let attempts_started = server.metric_sum("sked_attempts_started_total").await?;
    server.stop().await;
    let Window {
        from,
        to,
        worker_cpu,
        server_cpu,
    } = measured?;
    let stopped_by_itself = stopped_by_itself?;
    let direct = direct_starts(&options.command, options.slots, options.seconds).await?;
    let runs = server
        .finish_with_runs(
            store.as_ref(),
            from - Duration::days(1),
            to + Duration::days(1),
        )
        .await?;

    let in_window: Vec<_> = runs
        .iter()
        .filter(|r| r.scheduled_for >= from && r.scheduled_for < to)
        .collect();
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for r in &in_window {
        *by_state.entry(r.state.as_str().to_string()).or_default() += 1;
    }
    let succeeded_in_window = in_window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    // The rate of processes run: results recorded during the window, whatever their instant.
    let finished_during = runs
        .iter()
        .filter(|r| r.finished_at.is_some_and(|f| f >= from && f < to))
        .count();
    let succeeded_during = runs
        .iter()
        .filter(|r| {
            r.state == RunState::Succeeded && r.finished_at.is_some_and(|f| f >= from && f < to)
        })
        .count();
    let finished_p = percentiles_of(in_window.iter().copied(), |r| {
        r.finished_at.map(|f| ms(f - r.scheduled_for))
    });
    let started_p = percentiles_of(in_window.iter().copied(), |r| {
        r.started_at.map(|s| ms(s - r.scheduled_for))
    });
    let seconds = (to - from).num_milliseconds() as f64 / 1000.0;
    let per_second = succeeded_during as f64 / seconds;
    let per_run_ms = |cpu_s: f64| {
        if succeeded_during == 0 {
            None
        } else {
            Some(cpu_s * 1000.0 / succeeded_during as f64)
        }
    };
    Ok(json!({
        "scenario": "shell",
        "store": store_name,
        "schedules": n,
        "every": options.every,
        "offered_per_second": n as f64 / (period_us as f64 / 1e6),
        "command": options.command,
        "worker_slots": options.slots,
        "window_seconds": seconds,
        "succeeded_during_window": succeeded_during,
        "finished_during_window": finished_during,
        "process_starts_per_second": per_second,
        "target_per_second": TARGET_PER_SECOND,
        "direct_starts_per_second": direct,
        "vs_direct": per_second / direct,
        "runs_in_window": in_window.len(),
        "succeeded_in_window": succeeded_in_window,
        "window_runs_by_state": by_state,
        "keeps_up": succeeded_in_window == in_window.len(),
        "instant_to_started_ms": {"runs": started_p.count, "p50": started_p.p50,
                                  "p99": started_p.p99, "max": started_p.max},
        "instant_to_finished_ms": {"runs": finished_p.count, "p50": finished_p.p50,
                                   "p99": finished_p.p99, "max": finished_p.max},
        "worker_cpu_seconds": worker_cpu.own,
        "worker_children_cpu_seconds": worker_cpu.children,
        "worker_cpu_ms_per_run": per_run_ms(worker_cpu.own),
        "worker_children_cpu_ms_per_run": per_run_ms(worker_cpu.children),
        "server_cpu_ms_per_run": per_run_ms(server_cpu.own),
        "attempts_started": attempts_started,
        "worker_stopped_on_sigterm": stopped_by_itself,
        "worker_log": log.display().to_string(),
    }))
}

/// `GET /api/v1/workers`.
#[derive(Deserialize)]
struct WorkerList {
    workers: Vec<WorkerRecord>,
}

/// The measured window and the CPU time spent in it.
struct Window {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    worker_cpu: CpuTime,
    /// This process's: the server's and the benchmark's own (which only sleeps meanwhile).
    server_cpu: CpuTime,
}

async fn measure(
    options: &Options<'_>,
    base: &str,
    worker: &mut tokio::process::Child,
    log: &std::path::Path,
) -> Result<Window> {
    let pid = worker.id().context("the worker exited at once")?;
    let http = crate::harness::client_builder()
        .timeout(Span::from_secs(10))
        .build()?;
    let deadline = Clock::now() + REGISTER_LIMIT;
    loop {
        if let Some(status) = worker.try_wait()? {
            bail!("the worker exited ({status}); see {}", log.display());
        }
        if let Ok(resp) = http.get(format!("{base}/api/v1/workers")).send().await {
            if let Ok(list) = resp.json::<WorkerList>().await {
                if list
                    .workers
                    .iter()
                    .any(|w| w.name == "bench-shell" && w.alive)
                {
                    break;
                }
            }
        }
        if Clock::now() > deadline {
            bail!(
                "the worker did not register within {REGISTER_LIMIT:?}; see {}",
                log.display()
            );
        }
        tokio::time::sleep(Span::from_millis(50)).await;
    }
    // A second for the worker to fill its slots before the window opens.
    let opens = Clock::now() + Span::from_secs(1);
    let from = Utc::now() + Duration::seconds(1);
    tokio::time::sleep_until(opens.into()).await;
    // The worker's long-lived children (its supervisor server) are reaped only when it stops,
    // so their time and their reaped children's is read from them.
    let helpers = children_of(pid);
    let worker_time = || -> Result<CpuTime> {
        let mut time = cpu_time(pid)?;
        for &helper in &helpers {
            if let Ok(t) = cpu_time(helper) {
                time.children += t.own + t.children;
            }
        }
        Ok(time)
    };
    let (worker_start, server_start) = (worker_time()?, cpu_time(std::process::id())?);
    tokio::time::sleep_until((opens + Span::from_secs(options.seconds)).into()).await;
    let to = from + Duration::seconds(options.seconds as i64);
    let (worker_end, server_end) = (worker_time()?, cpu_time(std::process::id())?);
    if let Some(status) = worker.try_wait()? {
        bail!(
            "the worker exited ({status}) during the window; see {}",
            log.display()
        );
    }
    tokio::time::sleep(GRACE).await;
    let less = |a: CpuTime, b: CpuTime| CpuTime {
        own: a.own - b.own,
        children: a.children - b.children,
    };
    Ok(Window {
        from,
        to,
        worker_cpu: less(worker_end, worker_start),
        server_cpu: less(server_end, server_start),
    })
}

/// `/bin/sh -c COMMAND` started directly by this process, `slots` at a time, for `seconds`:
/// processes finished per second.
async fn direct_starts(command: &str, slots: u32, seconds: u64) -> Result<f64> {
    let window = Span::from_secs(seconds);
    let started = Clock::now();
    let mut starters = tokio::task::JoinSet::new();
    for _ in 0..slots {
        let command = command.to_string();
        starters.spawn(async move {
            let mut done = 0u64;
            while started.elapsed() < window {
                // Output read, as the worker reads it.
                let finished = tokio::process::Command::new("/bin/sh")
                    .args(["-c", &command])
                    .stdin(std::process::Stdio::null())
                    .process_group(0)
                    .output()
                    .await?;
                if finished.status.success() {
                    done += 1;
                }
            }
            anyhow::Ok(done)
        });
    }
    let mut done = 0;
    while let Some(finished) = starters.join_next().await {
        done += finished??;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

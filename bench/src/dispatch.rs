//! Dispatch policies in the live system: the simulator's workload (`sked_sim::workload`) replayed
//! through a real server and real `sked worker` processes, once per policy, side by side.
//!
//! Each worker stands for one of the seed's servers. Its runs are HTTP requests to a service in
//! this process that models the server behind it: `--slots` requests execute at once, the
//! rest wait in line there (which the worker, started with `--stall-over` that many, counts
//! in its stall gauge, with requests in flight past its `--stall-after`), and a request takes its trace's `warm` time when that
//! server ran its key among its last `--cache` keys, `cold` otherwise. The service learns
//! which worker sent a request from the run's attempt (`GET /api/v1/runs/{id}`).
//!
//! Every request of the trace becomes a manual trigger of the job of its key and priority (jobs
//! route by `affinity_key` = the key, with the cell's strategy), sent at its time scaled by
//! `--time-scale`; the server runs with the cell's `--overload`. Reported per cell and class,
//! in trace seconds: mean and p99 wait (trigger to execution start at the service), mean
//! duration (execution), mean time at the server (the request's arrival at the service to its
//! end: the wait in line there plus execution, the study's "duration"), the spread of
//! per-worker wait variance, and the ratio to the first cell (the baseline).

use crate::harness::{fresh_store, http_client, start_configured, ADMIN_TOKEN};
use crate::process::{sked_bin, spawn, terminate};
use anyhow::{bail, Context, Result};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use sked_core::dispatch::{Overload, StallLimits, Strategy};
use sked_server::ServerConfig;
use sked_sim::trace::TraceLine;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};

/// How long the last requests may take to end after the trace's last arrival, in real time.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);
/// How long the workers may take to register, and to stop.
const WORKER_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Trace hours to replay (from 08:00 of the synthetic day).
    #[arg(long, default_value_t = 0.25)]
    hours: f64,
    /// Real seconds per trace second.
    #[arg(long, default_value_t = 0.5)]
    time_scale: f64,
    /// Workers, one per modelled server.
    #[arg(long, default_value_t = 14)]
    servers: u32,
    /// Requests a modelled server executes at once (the workers' --stall-over).
    #[arg(long, default_value_t = 4)]
    slots: u32,
    /// Slots of each worker (requests in flight to its server).
    #[arg(long, default_value_t = 16)]
    accept: u32,
    /// Keys a modelled server holds warm.
    #[arg(long, default_value_t = 32)]
    cache: usize,
    /// The workers' --stall-after, in real milliseconds.
    #[arg(long, default_value_t = 600_000)]
    stall_after_ms: u64,
    #[arg(long, default_value_t = StallLimits::default().trip)]
    trip: u32,
    #[arg(long, default_value_t = StallLimits::default().reset)]
    reset: u32,
    /// Cells as OVERLOAD/HOST, comma-separated; the first is the baseline.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none/random,breaker/affinity"
    )]
    cells: Vec<String>,
    #[arg(long)]
    sked_bin: Option<PathBuf>,
}

fn parse_cells(cells: &[String]) -> Result<Vec<(Overload, Strategy)>> {
    cells
        .iter()
        .map(|c| {
            let (overload, host) = c
                .split_once('/')
                .ok_or_else(|| anyhow::anyhow!("cell {c:?} is not OVERLOAD/HOST"))?;
            Ok((
                overload.parse().map_err(anyhow::Error::msg)?,
                host.parse().map_err(anyhow::Error::msg)?,
            ))
        })
        .collect()
}

/// One request as the service saw it, in real time.
#[derive(Debug, Clone)]
struct Served {
    worker: String,
    /// When the worker's request reached the service.
    arrived: Instant,
    start: Instant,
    end: Instant,
}

/// The modelled servers behind the workers, and what they served.
struct Service {
    sked: String,
    http: reqwest::Client,
    slots: u32,
    cache: usize,
    time_scale: f64,
    lines: Vec<TraceLine>,
    /// Run id to trace index, filled as triggers are answered.
    runs: Mutex<HashMap<i64, usize>>,
    run_known: Notify,
    servers: Mutex<HashMap<String, Arc<Server>>>,
    served: Mutex<HashMap<usize, Served>>,
    failures: Mutex<Vec<String>>,
}

struct Server {
    executing: Semaphore,
    /// Keys of its latest executions, newest last.
    cache: Mutex<VecDeque<String>>,
}

impl Service {
    async fn request(&self, run_id: i64) -> Result<()> {
        let arrived = Instant::now();
        let index = self.index_of(run_id).await?;
        let worker = self.worker_of(run_id).await?;
        let server = {
            let mut servers = lock(&self.servers);
            servers
                .entry(worker.clone())
                .or_insert_with(|| {
                    Arc::new(Server {
                        executing: Semaphore::new(self.slots as usize),
                        cache: Mutex::new(VecDeque::new()),
                    })
                })
                .clone()
        };
        let _slot = server.executing.acquire().await?;
        let start = Instant::now();
        let line = &self.lines[index];
        let warm = {
            let mut cache = lock(&server.cache);
            let warm = match cache.iter().position(|k| *k == line.key) {
                Some(at) => {
                    cache.remove(at);
                    true
                }
                None => false,
            };
            cache.push_back(line.key.clone());
            if cache.len() > self.cache {
                cache.pop_front();
            }
            warm
        };
        let seconds = if warm { line.warm } else { line.cold };
        tokio::time::sleep(Duration::from_secs_f64(seconds * self.time_scale)).await;
        let end = Instant::now();
        lock(&self.served).insert(
            index,
            Served {
                worker,
                arrived,
                start,
                end,
            },
        );
        Ok(())
    }

    async fn index_of(&self, run_id: i64) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let known = self.run_known.notified();
            if let Some(index) = lock(&self.runs).get(&run_id) {
                return Ok(*index);
            }
            if Instant::now() > deadline {
                bail!("run {run_id} was never triggered by this benchmark");
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), known).await;
        }
    }

    async fn worker_of(&self, run_id: i64) -> Result<String> {
        let run: Value = self
            .http
            .get(format!("{}/api/v1/runs/{run_id}", self.sked))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        run["attempt_history"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|a| a["worker_id"].as_str())
            .map(str::to_string)
            .with_context(|| format!("run {run_id} has no attempt"))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn work(State(service): State<Arc<Service>>, headers: HeaderMap) -> &'static str {
    let run_id = headers
        .get(sked_core::protocol::HEADER_RUN_ID)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let outcome = match run_id {
        Some(id) => service.request(id).await,
        None => Err(anyhow::anyhow!("a request without a run id")),
    };
    if let Err(e) = outcome {
        lock(&service.failures).push(format!("{e:#}"));
    }
    "done"
}

pub async fn run(options: Args, database_url: Option<&str>) -> Result<Value> {
    let cells_asked = parse_cells(&options.cells)?;
    if cells_asked.is_empty() {
        bail!("--cells names no cell");
    }
    if !(options.time_scale > 0.0 && options.time_scale <= 10.0) {
        bail!("--time-scale must be above 0 and at most 10");
    }
    let bin = sked_bin(options.sked_bin.as_deref())?;
    let workload = sked_sim::workload::Workload::new(options.seed, options.hours)?;
    let lines = workload.trace()?.to_lines();
    println!(
        "dispatch: {} requests over {:.2} trace hours ({:.0} real seconds at --time-scale {}), \
         {} workers of {} slots in front of servers of {} slots",
        lines.len(),
        options.hours,
        options.hours * 3600.0 * options.time_scale,
        options.time_scale,
        options.servers,
        options.accept,
        options.slots
    );
    let mut cells = Vec::new();
    for (overload, host) in cells_asked {
        let figures = cell(&options, database_url, &bin, &lines, overload, host).await?;
        cells.push((overload, host, figures));
    }
    let mut out = Vec::new();
    let baseline = &cells[0].2;
    for (overload, host, figures) in &cells {
        for (priority, f) in figures {
            let base = &baseline[priority];
            let row = json!({
                "overload": overload.as_str(),
                "host": host.as_str(),
                "priority": priority,
                "requests": f.requests,
                "mean_wait": f.mean_wait,
                "p99_wait": f.p99_wait,
                "mean_duration": f.mean_duration,
                "mean_at_server": f.mean_at_server,
                "variance_spread": f.spread,
                "warm_share": f.warm_share,
                "vs_baseline": {
                    "mean_wait": base.mean_wait / f.mean_wait,
                    "mean_duration": base.mean_duration / f.mean_duration,
                    "mean_at_server": base.mean_at_server / f.mean_at_server,
                },
            });
            println!("{row}");
            out.push(row);
        }
    }
    Ok(json!({"scenario": "dispatch", "requests": lines.len(), "cells": out}))
}

/// Per priority class, in trace seconds.
#[derive(Debug, Clone, Default)]
struct Figures {
    requests: usize,
    mean_wait: f64,
    p99_wait: f64,
    mean_duration: f64,
    mean_at_server: f64,
    spread: Option<f64>,
    warm_share: f64,
}

async fn cell(
    options: &Args,
    database_url: Option<&str>,
    bin: &std::path::Path,
    lines: &[TraceLine],
    overload: Overload,
    host: Strategy,
) -> Result<BTreeMap<i32, Figures>> {
    let limits = StallLimits::new(options.trip, options.reset).map_err(anyhow::Error::msg)?;
    let config = ServerConfig {
        overload: sked_core::dispatch::OverloadControl::new(overload, limits),
        http_target_policy: sked_core::egress::EgressPolicy {
            internal_allowed: true,
            ..Default::default()
        },
        retention: None,
        ..ServerConfig::default()
    };
    let (store, place) = fresh_store(database_url).await?;
    let sked = start_configured(store, place, 1, config).await?;
    let base = sked.base().to_string();
    let http = http_client();

    let service = Arc::new(Service {
        sked: base.clone(),
        http: http.clone(),
        slots: options.slots,
        cache: options.cache,
        time_scale: options.time_scale,
        lines: lines.to_vec(),
        runs: Mutex::new(HashMap::new()),
        run_known: Notify::new(),
        servers: Mutex::new(HashMap::new()),
        served: Mutex::new(HashMap::new()),
        failures: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let service_url = format!("http://{}/work", listener.local_addr()?);
    let app = Router::new()
        .route("/work", post(work))
        .with_state(service.clone());
    let server_task = tokio::spawn(async move { axum::serve(listener, app).await });

    // One job per key and priority.
    let mut jobs: BTreeMap<(String, i32), String> = BTreeMap::new();
    for line in lines {
        let n = jobs.len();
        jobs.entry((line.key.clone(), line.priority))
            .or_insert_with(|| format!("job-{n}"));
    }
    for ((key, priority), name) in &jobs {
        let spec = json!({
            "target": {"http": {"method": "POST", "url": service_url, "timeout": "30m"}},
            "priority": priority,
            "routing": {"strategy": host.as_str(), "affinity_key": key},
        });
        let answer = http
            .put(format!("{base}/api/v1/jobs/{name}"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&spec)
            .send()
            .await?;
        if !answer.status().is_success() {
            bail!("creating {name}: {}", answer.text().await?);
        }
    }

    let logs = tempfile::Builder::new()
        .prefix("sked-dispatch-")
        .tempdir()?
        .keep();
    let mut workers = Vec::new();
    for i in 0..options.servers {
        let name = format!("server-{i:02}");
        let log = logs.join(format!("{name}.log"));
        workers.push(spawn(
            bin,
            &[
                "worker",
                "--server",
                &base,
                "--slots",
                &options.accept.to_string(),
                "--name",
                &name,
                "--stall-after",
                &format!("{}ms", options.stall_after_ms),
                "--stall-over",
                &options.slots.to_string(),
            ],
            &log,
        )?);
    }
    wait_for_workers(&http, &base, options.servers as usize).await?;

    // Replay: each request triggers its job at its scaled time.
    let started = Instant::now();
    let mut triggers = tokio::task::JoinSet::new();
    let mut arrivals = vec![started; lines.len()];
    for (index, line) in lines.iter().enumerate() {
        let at = started + Duration::from_secs_f64(line.at * options.time_scale);
        tokio::time::sleep_until(at.into()).await;
        arrivals[index] = Instant::now();
        let name = jobs[&(line.key.clone(), line.priority)].clone();
        let (http, base, service) = (http.clone(), base.clone(), service.clone());
        triggers.spawn(async move {
            let answer: Value = http
                .post(format!("{base}/api/v1/jobs/{name}/trigger"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let run_id = answer["id"].as_i64().context("a run id")?;
            lock(&service.runs).insert(run_id, index);
            service.run_known.notify_waiters();
            anyhow::Ok(())
        });
        while let Some(done) = triggers.try_join_next() {
            done??;
        }
    }
    while let Some(done) = triggers.join_next().await {
        done??;
    }
    let deadline = Instant::now() + DRAIN_LIMIT;
    while lock(&service.served).len() < lines.len() {
        if Instant::now() > deadline {
            bail!(
                "{} of {} requests were served within {DRAIN_LIMIT:?} of the last arrival",
                lock(&service.served).len(),
                lines.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in &mut workers {
        terminate(worker, WORKER_LIMIT).await?;
    }
    sked.finish().await;
    server_task.abort();
    let failures = lock(&service.failures).clone();
    if !failures.is_empty() {
        bail!(
            "the service failed {} requests: {}",
            failures.len(),
            failures[0]
        );
    }

    let served = lock(&service.served).clone();
    let scale = options.time_scale;
    let mut figures = BTreeMap::new();
    let classes: std::collections::BTreeSet<i32> = lines.iter().map(|l| l.priority).collect();
    for class in classes {
        let mut waits = Vec::new();
        let mut durations = Vec::new();
        let mut at_server = Vec::new();
        let mut warm = 0usize;
        let mut per_worker: HashMap<&str, Vec<f64>> = HashMap::new();
        for (index, line) in lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.priority == class)
        {
            let s = &served[&index];
            let wait = (s.start - arrivals[index]).as_secs_f64() / scale;
            let duration = (s.end - s.start).as_secs_f64() / scale;
            if (duration - line.warm).abs() < (duration - line.cold).abs() {
                warm += 1;
            }
            waits.push(wait);
            durations.push(duration);
            at_server.push((s.end - s.arrived).as_secs_f64() / scale);
            per_worker.entry(&s.worker).or_default().push(wait);
        }
        let variances: Vec<f64> = per_worker
            .values()
            .filter_map(|w| sked_sim::stats::variance(w))
            .collect();
        let n = waits.len();
        let mut sorted = waits.clone();
        sorted.sort_by(f64::total_cmp);
        figures.insert(
            class,
            Figures {
                requests: n,
                mean_wait: sked_sim::stats::mean(&waits),
                p99_wait: sked_sim::stats::percentile(&sorted, 0.99),
                mean_duration: sked_sim::stats::mean(&durations),
                mean_at_server: sked_sim::stats::mean(&at_server),
                spread: sked_sim::stats::spread(&variances),
                warm_share: warm as f64 / n.max(1) as f64,
            },
        );
    }
    Ok(figures)
}

async fn wait_for_workers(http: &reqwest::Client, base: &str, n: usize) -> Result<()> {
    let deadline = Instant::now() + WORKER_LIMIT;
    loop {
        let list: Value = http
            .get(format!("{base}/api/v1/workers?limit=1000"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await?
            .json()
            .await?;
        let alive = list["workers"]
            .as_array()
            .map(|w| w.iter().filter(|w| w["alive"] == true).count())
            .unwrap_or(0);
        if alive >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{alive} of {n} workers registered within {WORKER_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

//! A million stored schedules: N jobs, each firing once an hour (`every 3600s`), their anchors
//! spread evenly over the hour (N/3600 instants a second), in a SQLite store served by a real
//! `sked server` process, so its memory is its own. Reports how long the server takes from
//! spawn to ready, its resident memory at ready and after a load phase, and during the load
//! phase the latency of the API (reading one job by name, and pages of the job list, first
//! pages and pages further down by following the cursor) driven at a bounded rate while the
//! schedules fire, plus the firing lateness of the instants owed during the load phase.
//!
//! Creating a million jobs takes about two minutes, so `--data-dir DIR` keeps the prepared store
//! for later runs: the jobs are created only when DIR does not already hold them (a store this
//! benchmark prepared for the same N; an interrupted preparation resumes where it stopped). A
//! kept store falls behind while nothing serves it: every schedule whose instant passed owes a
//! ledger row, which the server records (the jobs' misfire policy is `skip`, so as skipped
//! rows) before it reports ready. So each run first starts the server once to catch up (its
//! figures are reported apart, under `catch_up`), stops it, and only then measures a second
//! start, which misses only the instants of the moment in between. A store last served more
//! than an hour ago (a row owed by every schedule) is refused: remove DIR to prepare it afresh.
//!
//! Without `--data-dir` the store is prepared in a temporary directory, removed afterwards.

use crate::harness::{metric, ms, percentiles_of, tail_json};
use crate::noop;
use crate::process::{free_port, memory, sked_bin, spawn, terminate, Memory};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::stats::percentiles;
use sked_store::{Audit, PutMode, RunQuery, SqliteStore, Store};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration as Span, Instant as Clock};
use tokio::process::Child;

const PERIOD_US: i64 = 3_600_000_000;
/// What the benchmark writes into a data directory it prepared.
const MARKER: &str = "sked-bench-scale.json";
/// How long a start may take to be ready (a catch-up start records many rows first).
const READY_LIMIT: Span = Span::from_secs(600);
/// How long the server may take to stop on SIGTERM before it is killed.
const STOP_LIMIT: Span = Span::from_secs(60);
/// How often the resident memory is sampled while the server starts.
const SAMPLE_EVERY: Span = Span::from_millis(100);
/// Jobs per page of the list requests.
const PAGE: u32 = 50;
/// DESIGN's targets for a million schedules.
const TARGET_RSS_MB: f64 = 256.0;
const TARGET_READY_SECONDS: f64 = 3.0;
const TARGET_API_P99_MS: f64 = 50.0;

pub struct Options {
    pub schedules: usize,
    pub data_dir: Option<PathBuf>,
    /// Length of the load phase.
    pub seconds: u64,
    /// Requests per second of each kind (reading a job, listing a page).
    pub rate: u32,
    /// Concurrent clients of each kind, sharing its rate.
    pub clients: u32,
    /// Slots of a no-op worker completing the runs during the load phase; none without.
    pub worker_slots: Option<u32>,
    pub sked_bin: Option<PathBuf>,
}

/// The marker's content: what the store was prepared with.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    schedules: usize,
    /// Job i's anchor is this plus i/N of the hour, in microseconds since the epoch.
    anchor_base_us: i64,
}

fn job_name(i: usize) -> String {
    format!("scale-{i:07}")
}

fn anchor_us(marker: &Marker, i: usize) -> i64 {
    marker.anchor_base_us + PERIOD_US * i as i64 / marker.schedules as i64
}

pub async fn run(options: Options) -> Result<Value> {
    let n = options.schedules;
    if n == 0 || options.seconds == 0 || options.rate == 0 || options.clients == 0 {
        bail!("--schedules, --seconds, --rate and --clients must be above zero");
    }
    let bin = sked_bin(options.sked_bin.as_deref())?;
    let temp;
    let dir = match &options.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("sked-scale-data-")
                .tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let logs = tempfile::Builder::new()
        .prefix("sked-scale-")
        .tempdir()?
        .keep();
    eprintln!("data in {}, logs in {}", dir.display(), logs.display());
    let (marker, prepared) = prepare(&dir, n).await?;

    // The catch-up start: brings every schedule up to now, so the measured start that follows
    // misses only the instants of the moment between the two.
    eprintln!("catch-up start");
    let mut catch_up = Server::start(&bin, &dir, &logs.join("catch-up.log")).await?;
    let catch_up_figures = catch_up.figures().await;
    let stopping = Clock::now();
    let catch_up_stopped = terminate(&mut catch_up.child, STOP_LIMIT).await?;
    let catch_up_figures = json!({
        "start": catch_up_figures?,
        "stopped_on_sigterm": catch_up_stopped,
        "sigterm_to_exit_seconds": stopping.elapsed().as_secs_f64(),
    });

    eprintln!("measured start");
    let mut server = Server::start(&bin, &dir, &logs.join("server.log")).await?;
    let measured = measure(&options, &server).await;
    let stopping = Clock::now();
    let stopped = terminate(&mut server.child, STOP_LIMIT).await?;
    let stop_s = stopping.elapsed().as_secs_f64();
    let (start, load, from, to) = measured?;

    let firing = firing_figures(&dir, &marker, from, to).await?;
    let api_p99 = ["get_job", "list_first_page", "list_next_page"]
        .iter()
        .filter_map(|k| load["requests"][k]["latency_ms"]["p99"].as_f64())
        .fold(0.0, f64::max);
    let rss_mb = [
        start["memory_at_ready"]["rss_mb"].as_f64(),
        load["memory_after"]["rss_mb"].as_f64(),
    ]
    .into_iter()
    .flatten()
    .fold(0.0, f64::max);
    let ready_s = start["start_to_ready_seconds"].as_f64().unwrap_or(f64::MAX);
    Ok(json!({
        "scenario": "scale",
        "store": "sqlite",
        "schedules": n,
        "period_seconds": PERIOD_US / 1_000_000,
        "fires_per_second": n as f64 * 1e6 / PERIOD_US as f64,
        "data_dir": options.data_dir.as_ref().map(|d| d.display().to_string()),
        "prepare": prepared,
        "catch_up": catch_up_figures,
        "start": start,
        "load": load,
        "firing": firing,
        "server_stopped_on_sigterm": stopped,
        "sigterm_to_exit_seconds": stop_s,
        "targets": {
            "rss_mb": TARGET_RSS_MB,
            "ready_seconds": TARGET_READY_SECONDS,
            "api_p99_ms": TARGET_API_P99_MS,
            "rss_met": rss_mb < TARGET_RSS_MB,
            "ready_met": ready_s < TARGET_READY_SECONDS,
            "api_p99_met": api_p99 < TARGET_API_P99_MS,
        },
        "logs": logs.display().to_string(),
    }))
}

/// Makes sure `dir` holds the N jobs, creating what is missing. Returns the marker and what
/// was done.
async fn prepare(dir: &Path, n: usize) -> Result<(Marker, Value)> {
    let marker_path = dir.join(MARKER);
    let db = dir.join("sked.db");
    let marker = if marker_path.is_file() {
        let text = std::fs::read_to_string(&marker_path)?;
        let marker: Marker = serde_json::from_str(&text)
            .with_context(|| format!("read {}", marker_path.display()))?;
        if marker.schedules != n {
            bail!(
                "{} was prepared for {} schedules, not {n}: pass another --data-dir, or remove it",
                dir.display(),
                marker.schedules
            );
        }
        marker
    } else {
        if db.exists() {
            bail!(
                "{} holds a store this benchmark did not prepare: pass another --data-dir",
                dir.display()
            );
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("create the data directory {}", dir.display()))?;
        let marker = Marker {
            schedules: n,
            anchor_base_us: Utc::now().timestamp_micros() / 1_000_000 * 1_000_000,
        };
        std::fs::write(&marker_path, serde_json::to_string_pretty(&marker)?)?;
        marker
    };
    let stale = last_written(dir).map(|t| t.elapsed().unwrap_or_default());
    if let Some(stale) = stale {
        if stale.as_micros() as i64 > PERIOD_US {
            bail!(
                "the store in {} was last written {:.1} hours ago: each of its {n} schedules \
                 owes a ledger row for every hour since, which the server writes before it is \
                 ready. Remove the directory (or pass another --data-dir) to prepare it afresh",
                dir.display(),
                stale.as_secs_f64() / 3600.0
            );
        }
    }

    let started = Clock::now();
    let store = SqliteStore::open(&db).with_context(|| format!("open {}", db.display()))?;
    // Jobs are created in name order: the first missing one is where creation stopped.
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if store.get_job("default", &job_name(mid)).await?.is_some() {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let present = lo;
    // A few before it again (an upsert of an existing job changes nothing), in case the last
    // ones before an interruption were not written in order.
    let from = if present < n {
        present.saturating_sub(64)
    } else {
        n
    };
    if present < n {
        eprintln!(
            "creating jobs {} to {} in {}",
            job_name(from),
            job_name(n - 1),
            db.display()
        );
    }
    let mut last_report = Clock::now();
    for i in from..n {
        let anchor =
            DateTime::<Utc>::from_timestamp_micros(anchor_us(&marker, i)).context("an anchor")?;
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": "3600s", "anchor": anchor.to_rfc3339()},
            "target": {"shell": {"command": "true"}},
            "misfire": {"policy": "skip"},
        }))
        .expect("a valid benchmark job");
        let now = Utc::now();
        let name = job_name(i);
        let job = spec.validate(Some(&name), now).context("benchmark job")?;
        store
            .put_job("default", &job, PutMode::Upsert, now, Audit::none())
            .await?;
        if last_report.elapsed() > Span::from_secs(10) {
            last_report = Clock::now();
            let done = i + 1 - from;
            eprintln!(
                "{done} jobs created, {:.0}/s",
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    if store.get_job("default", &job_name(n)).await?.is_some() {
        bail!(
            "{} holds more than {n} jobs: pass another --data-dir",
            dir.display()
        );
    }
    drop(store);
    let figures = json!({
        "reused": present == n,
        "jobs_present": present,
        "jobs_written": n - from,
        "seconds": started.elapsed().as_secs_f64(),
        "store_last_written_seconds_ago": stale.map(|s| s.as_secs_f64()),
        "store_file_mb": file_mb(&db),
    });
    Ok((marker, figures))
}

/// The latest modification of the store's files.
fn last_written(dir: &Path) -> Option<std::time::SystemTime> {
    ["sked.db", "sked.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok()?.modified().ok())
        .max()
}

fn file_mb(path: &Path) -> Option<f64> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.len() as f64 / (1024.0 * 1024.0))
}

/// One `sked server` process on the data directory, with what its start measured.
struct Server {
    child: Child,
    pid: u32,
    base: String,
    log: PathBuf,
    spawned: Clock,
    listening: Option<Span>,
    ready: Span,
    memory_at_ready: Memory,
    /// Seconds since spawn and resident MiB, while it started.
    timeline: Vec<(f64, f64)>,
}

impl Server {
    /// Spawns the server and waits until it answers ready, sampling its memory meanwhile.
    async fn start(bin: &Path, dir: &Path, log: &Path) -> Result<Server> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let data_dir = dir.display().to_string();
        let spawned = Clock::now();
        let mut child = spawn(
            bin,
            &["server", "--data-dir", &data_dir, "--listen", &listen],
            log,
        )?;
        let pid = child.id().context("the server exited at once")?;
        let base = format!("http://{listen}");
        let http = crate::harness::client_builder()
            .timeout(Span::from_secs(2))
            .build()?;
        let mut listening = None;
        let mut timeline = Vec::new();
        let mut next_sample = spawned;
        let ready = loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the server exited ({status}) before it was ready; see {}",
                    log.display()
                );
            }
            if Clock::now() >= next_sample {
                next_sample += SAMPLE_EVERY;
                let m = memory(pid)?;
                timeline.push((
                    round(spawned.elapsed().as_secs_f64(), 2),
                    round(m.rss_mb, 1),
                ));
            }
            if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
                listening.get_or_insert(spawned.elapsed());
                if r.status().is_success() {
                    break spawned.elapsed();
                }
            }
            if spawned.elapsed() > READY_LIMIT {
                bail!(
                    "the server was not ready within {READY_LIMIT:?}; see {}",
                    log.display()
                );
            }
            tokio::time::sleep(Span::from_millis(10)).await;
        };
        let memory_at_ready = memory(pid)?;
        let at = round(ready.as_secs_f64(), 2);
        if timeline.last().is_none_or(|&(t, _)| t < at) {
            timeline.push((at, round(memory_at_ready.rss_mb, 1)));
        }
        Ok(Server {
            child,
            pid,
            base,
            log: log.to_path_buf(),
            spawned,
            listening,
            ready,
            memory_at_ready,
            timeline,
        })
    }

    /// What the start measured, and the server's counters now.
    async fn figures(&self) -> Result<Value> {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await?
            .text()
            .await?;
        Ok(json!({
            "start_to_listening_seconds": self.listening.map(|l| l.as_secs_f64()),
            "start_to_ready_seconds": self.ready.as_secs_f64(),
            "memory_at_ready": memory_json(&self.memory_at_ready),
            "rss_timeline_mb": self.timeline,
            "schedules_loaded": metric(&text, "sked_schedules"),
            "instants_recorded_by_ready": metric(&text, "sked_fires_total"),
            "instants_skipped_by_ready": metric(&text, "sked_fires_skipped_total"),
            "queued_runs_at_ready": metric(&text, "sked_queue_depth"),
            "log": self.log.display().to_string(),
        }))
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn memory_json(m: &Memory) -> Value {
    json!({"rss_mb": round(m.rss_mb, 1), "peak_rss_mb": round(m.peak_mb, 1),
           "anon_mb": round(m.anon_mb, 1)})
}

/// The load phase on the measured server: the figures of its start, those of the load, and
/// the window `[from, to)` the load covered.
async fn measure(
    options: &Options,
    server: &Server,
) -> Result<(Value, Value, DateTime<Utc>, DateTime<Utc>)> {
    let start = server.figures().await?;
    let http = crate::harness::client_builder()
        .timeout(Span::from_secs(10))
        .build()?;
    let seconds = Span::from_secs(options.seconds);
    let opens = Clock::now();
    let from = Utc::now();
    let end = opens + seconds;
    // The worker goes on a moment past the window, so the window's last runs complete.
    let worker_until = noop::Until::deadline(end + Span::from_secs(2));
    let workers = options.worker_slots.map(|slots| {
        noop::spawn(
            &http,
            std::slice::from_ref(&server.base),
            slots,
            &worker_until,
        )
    });
    let mut kinds = tokio::task::JoinSet::new();
    let per_client = options.rate as f64 / options.clients as f64;
    for _ in 0..options.clients {
        kinds.spawn(get_jobs(
            http.clone(),
            server.base.clone(),
            options.schedules,
            per_client,
            end,
        ));
        kinds.spawn(list_jobs(
            http.clone(),
            server.base.clone(),
            per_client,
            end,
        ));
    }
    // Resident memory once a second, for its peak during the load.
    let mut peak_rss = 0.0f64;
    while Clock::now() < end {
        peak_rss = peak_rss.max(memory(server.pid)?.rss_mb);
        tokio::time::sleep(Span::from_secs(1).min(end.saturating_duration_since(Clock::now())))
            .await;
    }
    let to = from + Duration::from_std(seconds)?;
    let mut samples: HashMap<&'static str, Samples> = HashMap::new();
    while let Some(done) = kinds.join_next().await {
        for (kind, s) in done.context("an API client")?? {
            samples.entry(kind).or_default().merge(s);
        }
    }
    let memory_after = memory(server.pid)?;
    let completions = match workers {
        Some(workers) => Some(noop::join(workers).await?),
        None => None,
    };
    let text = reqwest::get(format!("{}/metrics", server.base))
        .await?
        .text()
        .await?;
    let mut requests = serde_json::Map::new();
    for kind in ["get_job", "list_first_page", "list_next_page"] {
        let s = samples.remove(kind).unwrap_or_default();
        requests.insert(kind.to_string(), s.json(options.seconds));
    }
    let load = json!({
        "seconds": options.seconds,
        "rate_per_kind": options.rate,
        "clients_per_kind": options.clients,
        "requests": requests,
        "memory_after": memory_json(&memory_after),
        "peak_rss_sampled_mb": round(peak_rss.max(memory_after.rss_mb), 1),
        "worker_slots": options.worker_slots,
        "completions_sent": completions,
        "instants_recorded_since_spawn": metric(&text, "sked_fires_total"),
        "attempts_started_since_spawn": metric(&text, "sked_attempts_started_total"),
        "seconds_since_spawn": server.spawned.elapsed().as_secs_f64(),
    });
    Ok((start, load, from, to))
}

/// Latencies of one kind of request, with the failures.
#[derive(Default)]
struct Samples {
    latency_ms: Vec<f64>,
    errors: usize,
    first_error: Option<String>,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.latency_ms.extend(other.latency_ms);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn fail(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn json(mut self, seconds: u64) -> Value {
        let p = percentiles(&mut self.latency_ms);
        json!({
            "requests": p.count + self.errors,
            "per_second": (p.count + self.errors) as f64 / seconds as f64,
            "errors": self.errors,
            "first_error": self.first_error,
            "latency_ms": tail_json(&p),
        })
    }
}

/// A ticker of `rate` a second until `end`; a late tick is sent at once and the ones after it
/// keep their own times.
fn ticker(rate: f64) -> tokio::time::Interval {
    let mut every = tokio::time::interval(Span::from_secs_f64(1.0 / rate.max(0.001)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every
}

/// `GET /api/v1/jobs/{name}` of random jobs at `rate` a second until `end`.
async fn get_jobs(
    http: reqwest::Client,
    base: String,
    n: usize,
    rate: f64,
    end: Clock,
) -> Result<Vec<(&'static str, Samples)>> {
    let mut samples = Samples::default();
    let mut every = ticker(rate);
    loop {
        every.tick().await;
        if Clock::now() >= end {
            break;
        }
        let i = rand::thread_rng().gen_range(0..n);
        let url = format!("{base}/api/v1/jobs/{}", job_name(i));
        let sent = Clock::now();
        match http.get(&url).send().await {
            Ok(resp) if resp.status().is_success() => match resp.bytes().await {
                Ok(_) => samples
                    .latency_ms
                    .push(sent.elapsed().as_secs_f64() * 1000.0),
                Err(e) => samples.fail(format!("GET {url}: {e}")),
            },
            Ok(resp) => samples.fail(format!("GET {url}: {}", resp.status())),
            Err(e) => samples.fail(format!("GET {url}: {e}")),
        }
    }
    Ok(vec![("get_job", samples)])
}

/// `GET /api/v1/jobs` pages at `rate` a second until `end`, alternating a first page and the
/// next page of a walk down the list (following `next_cursor`, from the top again at its end).
async fn list_jobs(
    http: reqwest::Client,
    base: String,
    rate: f64,
    end: Clock,
) -> Result<Vec<(&'static str, Samples)>> {
    #[derive(Deserialize)]
    struct Page {
        next_cursor: Option<String>,
    }
    let (mut first, mut next) = (Samples::default(), Samples::default());
    let mut cursor: Option<String> = None;
    let mut tick = 0u64;
    let mut every = ticker(rate);
    loop {
        every.tick().await;
        if Clock::now() >= end {
            break;
        }
        tick += 1;
        let walk = if tick.is_multiple_of(2) {
            cursor.clone()
        } else {
            None
        };
        let mut url = format!("{base}/api/v1/jobs?limit={PAGE}");
        if let Some(c) = &walk {
            url.push_str("&cursor=");
            url.push_str(c);
        }
        let samples = if walk.is_some() {
            &mut next
        } else {
            &mut first
        };
        let sent = Clock::now();
        let page = match http.get(&url).send().await {
            Ok(resp) if resp.status().is_success() => resp.json::<Page>().await,
            Ok(resp) => {
                samples.fail(format!("GET {url}: {}", resp.status()));
                continue;
            }
            Err(e) => Err(e),
        };
        match page {
            Ok(page) => {
                samples
                    .latency_ms
                    .push(sent.elapsed().as_secs_f64() * 1000.0);
                if walk.is_some() || cursor.is_none() {
                    cursor = page.next_cursor;
                }
            }
            Err(e) => samples.fail(format!("GET {url}: {e}")),
        }
    }
    Ok(vec![("list_first_page", first), ("list_next_page", next)])
}

/// Reads the runs of the instants in `[from, to)` from the store (the server has stopped) and
/// checks them against the instants the schedules owed.
async fn firing_figures(
    dir: &Path,
    marker: &Marker,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Value> {
    let db = dir.join("sked.db");
    let store = SqliteStore::open(&db).with_context(|| format!("open {}", db.display()))?;
    // Newest instant first: read until the page reaches before the window.
    let mut window: Vec<RunRecord> = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(&RunQuery {
                namespace: "default".into(),
                limit: 1000,
                cursor,
                ..Default::default()
            })
            .await?;
        let past = page.items.last().is_none_or(|r| r.scheduled_for < from);
        window.extend(
            page.items
                .into_iter()
                .filter(|r| r.scheduled_for >= from && r.scheduled_for < to),
        );
        match page.next_cursor {
            Some(c) if !past => cursor = Some(c),
            _ => break,
        }
    }
    drop(store);
    let (from_us, to_us) = (from.timestamp_micros(), to.timestamp_micros());
    let mut owed: HashMap<(String, i64), u32> = HashMap::new();
    for i in 0..marker.schedules {
        let anchor = anchor_us(marker, i);
        let mut t = anchor + (from_us - anchor).div_euclid(PERIOD_US) * PERIOD_US;
        if t < from_us {
            t += PERIOD_US;
        }
        while t < to_us {
            owed.insert((job_name(i), t), 0);
            t += PERIOD_US;
        }
    }
    let mut unexpected = 0usize;
    for r in &window {
        match owed.get_mut(&(r.job.clone(), r.scheduled_for.timestamp_micros())) {
            Some(count) => *count += 1,
            None => unexpected += 1,
        }
    }
    let p = percentiles_of(&window, |r| Some(ms(r.created_at - r.scheduled_for)));
    let sp = percentiles_of(&window, |r| r.started_at.map(|s| ms(s - r.scheduled_for)));
    Ok(json!({
        "window": {"from": from.to_rfc3339(), "to": to.to_rfc3339()},
        "fires_expected": owed.len(),
        "fires_recorded": window.len(),
        "fires_lost": owed.values().filter(|&&c| c == 0).count(),
        "fires_doubled": owed.values().filter(|&&c| c > 1).count(),
        "fires_unexpected": unexpected,
        "lateness_ms": tail_json(&p),
        "runs_started": sp.count,
        "started_lateness_ms": tail_json(&sp),
    }))
}

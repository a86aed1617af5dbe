//! What trace export costs: the `e2e` load (N schedules every second, the no-op worker) with
//! tracing off and on at each of `--ratios` (1.0 and 0.01 by default), alternated in one
//! process (off, 1.0, 0.01, off, 1.0, 0.01...) so that the machine's drift falls on every mode
//! alike, each pass on a fresh store. With tracing on, every attempt is handed a traceparent
//! and the node's exporter walks the ended runs, keeps a share by ratio (and every failed,
//! retried, late or deadline-missing run: `--late-after` is long, so that with a no-op load
//! the share is what is kept), builds their spans and sends them over OTLP/HTTP as protobuf.
//!
//! The collector is a sink in this process on 127.0.0.1 that accepts `POST /v1/traces`,
//! counts requests and bytes, and answers 200 with an empty protobuf body at once: what is
//! measured is sked's own cost (walking, building, encoding, sending), not a collector's.
//!
//! Each pass reports the completions per second of its window, its runs' lateness (instant →
//! run written, → attempt started, → result recorded), the benchmark process's CPU per run
//! (server, no-op worker and sink together), and, traced, the spans exported and dropped
//! (`sked_spans_exported`, `sked_spans_dropped`), the runs kept by reason
//! (`sked_traces_kept{kept}`) and the requests and bytes the sink received; the summary is
//! the ratio of the means of each traced mode over off.
//!
//! The answer is checked too, and the benchmark fails otherwise: every run of the window that
//! ended succeeded; with tracing off no span was exported and the sink heard nothing; at ratio
//! 1.0 spans were exported; and no traced pass dropped a span.

use crate::harness::{ms, percentiles_of, start_configured, store_with_jobs, Running};
use crate::noop;
use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::{Duration, Utc};
use futures_util::StreamExt;
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use sked_core::trace::Sampling;
use sked_server::traces::{OtlpProtocol, TraceSettings};
use sked_server::ServerConfig;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The longest one export may take (the server's default).
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub schedules: usize,
    pub seconds: u64,
    pub slots: u32,
    /// The sampling ratios of the traced passes, each run after the pass with tracing off.
    pub ratios: Vec<f64>,
    /// A run that started this long after its instant is kept whatever the ratio.
    pub late_after: std::time::Duration,
    /// Rounds of passes: off, then each ratio.
    pub rounds: usize,
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    if options.rounds == 0 || options.seconds == 0 || options.schedules == 0 {
        bail!("--rounds, --seconds and --schedules must be above zero");
    }
    if options.ratios.is_empty() || options.ratios.iter().any(|r| !(0.0..=1.0).contains(r)) {
        bail!("--ratios needs at least one ratio, each from 0 to 1");
    }
    let collector = Collector::start().await?;
    let modes: Vec<Option<f64>> = std::iter::once(None)
        .chain(options.ratios.iter().copied().map(Some))
        .collect();
    let mut passes = Vec::new();
    let mut problems = Vec::new();
    for round in 0..options.rounds {
        for &ratio in &modes {
            let pass = pass(&options, &collector, ratio).await?;
            eprintln!("{}", pass.figures);
            problems.extend(
                pass.problems
                    .into_iter()
                    .map(|p| format!("pass {} ({}): {p}", passes.len() + 1, mode(ratio))),
            );
            let mut figures = pass.figures;
            figures["round"] = json!(round + 1);
            passes.push(figures);
        }
    }
    let mean = |ratio: Option<f64>, field: &[&str]| -> f64 {
        let values: Vec<f64> = passes
            .iter()
            .filter(|p| p["tracing"] == json!(mode(ratio)))
            .filter_map(|p| field.iter().fold(p, |v, f| &v[*f]).as_f64())
            .collect();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    let over = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let fields: [(&str, &[&str]); 6] = [
        ("completed_per_second", &["completed_per_second"]),
        ("fire_p50_ms", &["fire_lateness_ms", "p50"]),
        ("fire_p99_ms", &["fire_lateness_ms", "p99"]),
        ("start_p99_ms", &["start_lateness_ms", "p99"]),
        ("recorded_p99_ms", &["instant_to_recorded_ms", "p99"]),
        ("process_cpu_us_per_run", &["process_cpu_us_per_run"]),
    ];
    let mut means = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for &ratio in &modes {
        let mut of_mode = serde_json::Map::new();
        for (name, path) in fields {
            of_mode.insert(name.to_string(), json!(mean(ratio, path)));
        }
        means.insert(mode(ratio), Value::Object(of_mode));
        let Some(r) = ratio else { continue };
        let mut of_ratio = serde_json::Map::new();
        for (name, path) in fields {
            of_ratio.insert(
                name.to_string(),
                json!(over(mean(Some(r), path), mean(None, path))),
            );
        }
        // Each round's traced pass over the same round's pass with tracing off.
        let by_round: Vec<Value> = passes
            .chunks(modes.len())
            .filter_map(|round| {
                let off = round.first()?;
                let on = round
                    .iter()
                    .find(|p| p["tracing"] == json!(mode(Some(r))))?;
                let of = |p: &Value, path: &[&str]| path.iter().fold(p, |v, f| &v[*f]).as_f64();
                Some(json!({
                    "completed_per_second": over(
                        of(on, &["completed_per_second"])?,
                        of(off, &["completed_per_second"])?,
                    ),
                    "fire_p99_ms": over(
                        of(on, &["fire_lateness_ms", "p99"])?,
                        of(off, &["fire_lateness_ms", "p99"])?,
                    ),
                }))
            })
            .collect();
        of_ratio.insert("by_round".to_string(), json!(by_round));
        ratios.insert(mode(Some(r)), Value::Object(of_ratio));
    }
    let figures = json!({
        "scenario": "traces",
        "store": passes.first().map(|p| p["store"].clone()).unwrap_or_default(),
        "schedules": options.schedules,
        "window_seconds": options.seconds,
        "slots": options.slots,
        "late_after_seconds": options.late_after.as_secs_f64(),
        "passes": passes,
        "means": means,
        "ratios_over_off": ratios,
        "checks": if problems.is_empty() { json!("passed") } else { json!(problems) },
    });
    if !problems.is_empty() {
        eprintln!("{figures}");
        bail!("the answer was wrong: {}", problems.join("; "));
    }
    Ok(figures)
}

/// How a pass is named in the figures: `off`, or `ratio <r>`.
fn mode(ratio: Option<f64>) -> String {
    match ratio {
        None => "off".to_string(),
        Some(r) => format!("ratio {r}"),
    }
}

/// One pass's figures, and what its checks found wrong.
struct Pass {
    figures: Value,
    problems: Vec<String>,
}

fn job_spec() -> Result<JobSpec> {
    serde_json::from_value(json!({
        "schedule": {"every": "1s"},
        "target": {"shell": {"command": "true"}},
    }))
    .context("a benchmark job")
}

async fn pass(options: &Options<'_>, collector: &Collector, ratio: Option<f64>) -> Result<Pass> {
    let spec = job_spec()?;
    let jobs = (0..options.schedules).map(|i| (format!("noop-{i:07}"), spec.clone()));
    let (store, place) = store_with_jobs(options.database_url, jobs).await?;
    let config = ServerConfig {
        retention: None,
        traces: ratio.map(|ratio| TraceSettings {
            endpoint: collector.base.clone(),
            protocol: OtlpProtocol::Http,
            headers: Vec::new(),
            sampling: Sampling {
                ratio,
                late_after: options.late_after,
            },
            timeout: EXPORT_TIMEOUT,
            link: None,
        }),
        ..ServerConfig::default()
    };
    let heard_before = collector.heard();
    let mut server = start_configured(store.clone(), place, 1, config).await?;
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
        let start = Sample::read(&server, collector).await?;
        tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
        let end = Sample::read(&server, collector).await?;
        Ok::<_, anyhow::Error>((start, end))
    };
    let (completed, sampled) = tokio::join!(noop::join(workers), sampled);
    completed?;
    let (at_start, at_end) = sampled?;
    // The whole pass's spans, for the checks: read before the node stops.
    let at_stop = Sample::read(&server, collector).await?;
    server.stop().await;
    let heard = collector.heard().since(&heard_before);
    let window = server.finish_with_runs(store.as_ref(), from, to).await?;

    let mut problems = Vec::new();
    let succeeded = count(&window, |s| s == RunState::Succeeded);
    let ended_otherwise = count(&window, |s| s.is_terminal() && s != RunState::Succeeded);
    if ended_otherwise > 0 {
        problems.push(format!(
            "{ended_otherwise} runs of the window ended other than succeeded"
        ));
    }
    match ratio {
        None => {
            if at_stop.spans_exported > 0.0 {
                problems.push(format!(
                    "{} spans were exported with tracing off",
                    at_stop.spans_exported
                ));
            }
            if heard.requests > 0 {
                problems.push(format!(
                    "the collector received {} requests with tracing off",
                    heard.requests
                ));
            }
        }
        Some(r) => {
            if r >= 1.0 && at_stop.spans_exported <= 0.0 {
                problems.push("no span was exported at ratio 1".to_string());
            }
            if at_stop.spans_dropped > 0.0 {
                problems.push(format!("{} spans were dropped", at_stop.spans_dropped));
            }
            if heard.not_protobuf > 0 {
                problems.push(format!(
                    "{} export requests were not application/x-protobuf",
                    heard.not_protobuf
                ));
            }
        }
    }

    let completions = at_end.completions - at_start.completions;
    let spans = at_end.spans_exported - at_start.spans_exported;
    let in_window = at_end.heard.since(&at_start.heard);
    let kept: BTreeMap<String, f64> = at_end
        .kept
        .iter()
        .map(|(reason, n)| {
            let before = at_start.kept.get(reason).copied().unwrap_or(0.0);
            (reason.clone(), n - before)
        })
        .collect();
    let fire = percentiles_of(&window, |r| Some(ms(r.created_at - r.scheduled_for)));
    let started = percentiles_of(&window, |r| r.started_at.map(|s| ms(s - r.scheduled_for)));
    let recorded = percentiles_of(&window, |r| r.finished_at.map(|f| ms(f - r.scheduled_for)));
    let mut figures = json!({
        "tracing": mode(ratio),
        "store": store_name,
        "completed_per_second": completions / seconds as f64,
        "runs_in_window": window.len(),
        "succeeded_in_window": succeeded,
        "fire_lateness_ms": {"p50": fire.p50, "p99": fire.p99, "max": fire.max},
        "start_lateness_ms": {"p50": started.p50, "p99": started.p99, "max": started.max},
        "instant_to_recorded_ms": {"p50": recorded.p50, "p99": recorded.p99, "max": recorded.max},
        "process_cpu_us_per_run": (at_end.cpu_seconds - at_start.cpu_seconds)
            / completions.max(1.0)
            * 1e6,
    });
    if ratio.is_some() {
        figures["window"] = json!({
            "spans_exported": spans,
            "spans_dropped": at_end.spans_dropped - at_start.spans_dropped,
            "spans_per_completed_run": spans / completions.max(1.0),
            "runs_kept": kept,
            "requests": in_window.requests,
            "bytes": in_window.bytes,
            "bytes_per_span": in_window.bytes as f64 / spans.max(1.0),
        });
    }
    figures["pass"] = json!({
        "spans_exported": at_stop.spans_exported,
        "spans_dropped": at_stop.spans_dropped,
        "requests": heard.requests,
        "bytes": heard.bytes,
    });
    Ok(Pass { figures, problems })
}

fn count(runs: &[RunRecord], state: impl Fn(RunState) -> bool) -> usize {
    runs.iter().filter(|r| state(r.state)).count()
}

/// The server's counters at one moment, the collector's, and this process's CPU time.
struct Sample {
    completions: f64,
    spans_exported: f64,
    spans_dropped: f64,
    /// Runs whose traces were kept, by reason.
    kept: BTreeMap<String, f64>,
    heard: Heard,
    cpu_seconds: f64,
}

impl Sample {
    async fn read(server: &Running, collector: &Collector) -> Result<Sample> {
        let text = reqwest::get(format!("{}/metrics", server.base()))
            .await?
            .text()
            .await?;
        let metric = |name: &str| crate::harness::metric(&text, name).unwrap_or(0.0);
        Ok(Sample {
            completions: metric("sked_completions_accepted_total"),
            spans_exported: metric("sked_spans_exported_total"),
            spans_dropped: metric("sked_spans_dropped_total"),
            kept: by_label(&text, "sked_traces_kept_total", "kept"),
            heard: collector.heard(),
            cpu_seconds: crate::process::cpu_time(std::process::id())?.own,
        })
    }
}

/// The samples of `series` in a `/metrics` text by the value of their label `label`.
fn by_label(text: &str, series: &str, label: &str) -> BTreeMap<String, f64> {
    let prefix = format!("{label}=\"");
    text.lines()
        .filter_map(|line| {
            let labelled = line.strip_prefix(series)?.strip_prefix('{')?;
            let (labels, value) = labelled.split_once("} ")?;
            let (_, rest) = labels.split_once(prefix.as_str())?;
            let (name, _) = rest.split_once('"')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// What the collector received up to a moment.
#[derive(Debug, Clone, Copy, Default)]
struct Heard {
    requests: u64,
    bytes: u64,
    /// Export requests whose content type was not `application/x-protobuf`.
    not_protobuf: u64,
}

impl Heard {
    fn since(&self, before: &Heard) -> Heard {
        Heard {
            requests: self.requests - before.requests,
            bytes: self.bytes - before.bytes,
            not_protobuf: self.not_protobuf - before.not_protobuf,
        }
    }
}

/// The OTLP/HTTP sink: counts what it is sent and answers at once; stops when dropped.
struct Collector {
    /// Its base URL, as `--otlp-endpoint` would be given.
    base: String,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
    not_protobuf: AtomicU64,
}

impl Collector {
    async fn start() -> Result<Collector> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let counts = Arc::new(Counts::default());
        let app = Router::new()
            .route("/v1/traces", post(accept))
            .with_state(counts.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("collector: {e}");
            }
        });
        Ok(Collector { base, counts, task })
    }

    fn heard(&self) -> Heard {
        Heard {
            requests: self.counts.requests.load(Ordering::Relaxed),
            bytes: self.counts.bytes.load(Ordering::Relaxed),
            not_protobuf: self.counts.not_protobuf.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `POST /v1/traces`: the body read and counted, not decoded; 200 with an empty
/// `ExportTraceServiceResponse`.
async fn accept(State(counts): State<Arc<Counts>>, headers: HeaderMap, body: Body) -> Response {
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/x-protobuf"));
    let mut read = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => read += chunk.len() as u64,
            Err(_) => return StatusCode::BAD_REQUEST.into_response(),
        }
    }
    counts.requests.fetch_add(1, Ordering::Relaxed);
    counts.bytes.fetch_add(read, Ordering::Relaxed);
    if !protobuf {
        counts.not_protobuf.fetch_add(1, Ordering::Relaxed);
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        "",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_kept_are_read_by_their_reason() {
        let text = "sked_traces_kept_total{kept=\"ratio\"} 12\n\
                    sked_traces_kept_total{kept=\"late\"} 3\n\
                    sked_traces_kept_created{kept=\"late\"} 1.7e9\n\
                    sked_spans_exported_total 60\n";
        let kept = by_label(text, "sked_traces_kept_total", "kept");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.get("ratio"), Some(&12.0));
        assert_eq!(kept.get("late"), Some(&3.0));
    }

    #[tokio::test]
    async fn the_collector_counts_what_it_is_sent() {
        let collector = Collector::start().await.unwrap();
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/traces", collector.base))
            .header("content-type", "application/x-protobuf")
            .body(vec![0u8; 1234])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers().get("content-type").unwrap(),
            "application/x-protobuf"
        );
        assert!(answer.bytes().await.unwrap().is_empty());
        let heard = collector.heard();
        assert_eq!(
            (heard.requests, heard.bytes, heard.not_protobuf),
            (1, 1234, 0)
        );
    }
}

//! Traces of runs, black-box: a `sked dev` exporting to a real OTLP receiver
//! (`tests/otlp/receiver.py`, which decodes with the official `opentelemetry-proto`
//! definitions from PyPI, in a venv this test makes). A run's process is handed the
//! `TRACEPARENT` of its attempt; the receiver gets the run's spans, rooted at its instant,
//! with the attempt's span named by that very context; over gRPC the configured headers
//! arrive, and with a ratio of 0 only the runs the tail rule keeps (here, a failure) are
//! exported. Without `--otlp-endpoint` nothing of it happens. A pipeline of three jobs whose
//! middle step is a RabbitMQ message that a consumer (`tests/otlp/consumer.py`, instrumented
//! with the OpenTelemetry SDK as a user's service would be) completes is one connected trace:
//! each step a child of the step before, the consumer's span a child of the attempt that
//! published its message.
//!
//! Needs `SKED_TEST_PYTHON` (a Python 3 with `venv`), and for the pipeline the brokers;
//! without them these tests are reported as ignored (under CI they run, and fail loudly).

mod common;

use common::{shell, Sked};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp");

/// The receiver, stopped when dropped.
struct Receiver {
    child: Child,
    out: PathBuf,
    http: u16,
    grpc: u16,
}

impl Receiver {
    fn start(dir: &Path) -> Receiver {
        let venv = common::python::venv("otlp-venv", &Path::new(HERE).join("requirements.txt"));
        let (http, grpc) = (common::free_port(), common::free_port());
        let out = dir.join("spans.jsonl");
        let mut child = Command::new(venv.join("bin/python"))
            .arg(Path::new(HERE).join("receiver.py"))
            .args([
                "--http-port",
                &http.to_string(),
                "--grpc-port",
                &grpc.to_string(),
            ])
            .arg("--out")
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("receiver.log")).expect("receiver log"))
            .spawn()
            .expect("the OTLP receiver");
        let stdout = child.stdout.take().expect("the receiver's stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the receiver's first line");
        assert!(
            line.starts_with("ready"),
            "the receiver did not start: {line:?}"
        );
        Receiver {
            child,
            out,
            http,
            grpc,
        }
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// The spans of trace `trace_id`, once `count` of them have arrived.
    async fn wait_trace(&self, trace_id: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["trace_id"] == trace_id)
                .collect();
            if spans.len() >= count {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace_id}: {} spans of {count} arrived: {spans:?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A job only triggered by hand.
fn job(command: &str) -> Value {
    json!({"schedule": {"every": "24h"}, "target": shell(command)})
}

/// `traceparent`'s parts: trace id, parent id, flags.
fn parts(traceparent: &str) -> (String, String, String) {
    let fields: Vec<&str> = traceparent.trim().split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent:?}");
    assert_eq!(fields[0], "00");
    (fields[1].into(), fields[2].into(), fields[3].into())
}

fn by_name(spans: &[Value]) -> HashMap<String, Value> {
    spans
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                s.clone(),
            )
        })
        .collect()
}

#[cfg_attr(not(sked_python_tests), ignore = "needs SKED_TEST_PYTHON")]
#[tokio::test]
async fn a_runs_spans_reach_the_collector_with_the_attempt_its_process_was_handed() {
    let mut sked = Sked::new();
    let receiver = Receiver::start(sked.dir.path());
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    sked.start_dev(&[
        "--otlp-endpoint",
        &endpoint,
        "--trace-link",
        "https://tempo.example/trace/{trace_id}",
        "--log-format",
        "json",
    ])
    .await;
    assert_eq!(
        sked.put_job("traced", job("echo \"$TRACEPARENT\"")).await.0,
        201
    );
    let id = sked.trigger("traced").await;
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let (trace_id, attempt_span, flags) = parts(&sked.run_log(id).await);
    assert_eq!(flags, "01", "a ratio of 1 samples every trace");

    let spans = receiver.wait_trace(&trace_id, 4).await;
    let named = by_name(&spans);
    let root = &named["run default/traced"];
    assert_eq!(root["parent_span_id"], "", "{root}");
    assert_eq!(root["attributes"]["sked.run.id"], id);
    assert_eq!(root["attributes"]["sked.run.state"], "succeeded");
    assert_eq!(root["attributes"]["sked.trace.kept"], "ratio");
    assert_eq!(root["resource"]["service.name"], "sked");
    assert_eq!(root["protocol"], "http");
    for child in ["record-fire", "queued", "attempt 1"] {
        assert_eq!(
            named[child]["parent_span_id"], root["span_id"],
            "{child}: {spans:?}"
        );
        assert!(named[child]["start_ns"].as_u64() >= root["start_ns"].as_u64());
        assert!(named[child]["end_ns"].as_u64() <= root["end_ns"].as_u64());
    }
    let attempt = &named["attempt 1"];
    assert_eq!(
        attempt["span_id"],
        attempt_span.as_str(),
        "the attempt span is the process's parent"
    );
    assert_eq!(attempt["attributes"]["process.exit.code"], 0);
    assert_eq!(attempt["attributes"]["sked.target.kind"], "shell");
    assert_eq!(attempt["kind"], 1, "internal: {attempt}");
    assert_eq!(attempt["events"][0]["name"], "lease");
    // The root starts at the run's instant.
    let instant = common::instant(&run["scheduled_for"]);
    assert_eq!(
        root["start_ns"].as_i64(),
        instant.timestamp_nanos_opt(),
        "{root}"
    );
    assert!(sked.metric("sked_spans_exported_total").await >= 4);
    assert_eq!(spans.len(), 4, "each span once: {spans:?}");

    // The API and the run's page tell the same trace, its spans drawn from the ledger.
    let view = sked.run(id).await;
    assert_eq!(view["trace"]["trace_id"], trace_id.as_str());
    let link = format!("https://tempo.example/trace/{trace_id}");
    assert_eq!(view["trace"]["link"], link.as_str());
    let listed: Vec<&str> = view["trace"]["spans"]
        .as_array()
        .expect("spans")
        .iter()
        .filter_map(|s| s["span_id"].as_str())
        .collect();
    let exported: Vec<&str> = ["run default/traced", "record-fire", "queued", "attempt 1"]
        .iter()
        .filter_map(|name| named[*name]["span_id"].as_str())
        .collect();
    assert_eq!(listed, exported);
    let page = sked
        .http
        .get(format!("{}/runs/{id}", sked.base()))
        .send()
        .await
        .expect("the run's page")
        .text()
        .await
        .expect("its text");
    assert!(page.contains(&format!("href=\"{link}\"")), "{page}");
    assert!(page.contains("table class=\"timeline\""), "{page}");

    // The worker's log lines about the attempt carry the trace id.
    let logs: String = std::fs::read_dir(sked.dir.path())
        .expect("the test's directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("dev-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    let tagged = format!("\"trace_id\":\"{trace_id}\"");
    assert!(
        logs.lines()
            .any(|l| l.contains("attempt ended") && l.contains(&tagged)),
        "{logs}"
    );
}

#[cfg_attr(not(sked_python_tests), ignore = "needs SKED_TEST_PYTHON")]
#[tokio::test]
async fn over_grpc_a_ratio_of_zero_exports_only_what_the_tail_rule_keeps() {
    let mut sked = Sked::new();
    let receiver = Receiver::start(sked.dir.path());
    let endpoint = format!("http://127.0.0.1:{}", receiver.grpc);
    sked.start_dev(&[
        "--otlp-endpoint",
        &endpoint,
        "--otlp-protocol",
        "grpc",
        "--otlp-header",
        "x-tenant=team-a",
        "--trace-ratio",
        "0",
    ])
    .await;
    assert_eq!(
        sked.put_job("fine", job("echo \"$TRACEPARENT\"")).await.0,
        201
    );
    assert_eq!(
        sked.put_job("broken", job("echo \"$TRACEPARENT\"; exit 3"))
            .await
            .0,
        201
    );
    let fine = sked.trigger("fine").await;
    assert_eq!(
        sked.wait_finished(fine, Duration::from_secs(20)).await["state"],
        "succeeded"
    );
    let broken = sked.trigger("broken").await;
    assert_eq!(
        sked.wait_finished(broken, Duration::from_secs(20)).await["state"],
        "failed"
    );
    let (fine_trace, _, fine_flags) = parts(&sked.run_log(fine).await);
    let (broken_trace, _, _) = parts(&sked.run_log(broken).await);
    assert_eq!(
        fine_flags, "00",
        "a ratio of 0 samples no trace at its start"
    );

    let spans = receiver.wait_trace(&broken_trace, 4).await;
    let named = by_name(&spans);
    let root = &named["run default/broken"];
    assert_eq!(root["protocol"], "grpc");
    assert_eq!(root["headers"]["x-tenant"], "team-a");
    assert_eq!(root["attributes"]["sked.trace.kept"], "failed");
    assert_eq!(root["status_code"], 2, "an error: {root}");
    let attempt = &named["attempt 1"];
    assert_eq!(attempt["attributes"]["process.exit.code"], 3);
    assert_eq!(attempt["status_code"], 2);
    // The run that ended first, and fine, was walked past without being exported.
    assert!(
        receiver
            .spans()
            .iter()
            .all(|s| s["trace_id"] != fine_trace.as_str()),
        "the succeeded run was exported at a ratio of 0"
    );
    assert!(sked
        .metrics()
        .await
        .contains("sked_traces_kept_total{kept=\"failed\"} 1"));
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, the other brokers and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn a_pipeline_through_rabbitmq_and_its_consumer_is_one_connected_trace() {
    let amqp = std::env::var("SKED_TEST_AMQP_URL").expect("SKED_TEST_AMQP_URL");
    let mut sked = Sked::new();
    let receiver = Receiver::start(sked.dir.path());
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let suffix = format!("{:08x}", rand::random::<u32>());
    let (exchange, queue) = (
        format!("sked-trace-x-{suffix}"),
        format!("sked-trace-q-{suffix}"),
    );
    let ready = sked.dir.path().join("consumer.ready");
    let venv = common::python::venv("otlp-venv", &Path::new(HERE).join("requirements.txt"));
    let mut consumer = Command::new(venv.join("bin/python"))
        .arg(Path::new(HERE).join("consumer.py"))
        .args(["--url", &amqp, "--exchange", &exchange, "--queue", &queue])
        .args([
            "--routing-key",
            "handoff",
            "--otlp",
            &endpoint,
            "--count",
            "1",
        ])
        .arg("--ready")
        .arg(&ready)
        .stderr(std::fs::File::create(sked.dir.path().join("consumer.log")).expect("log"))
        .spawn()
        .expect("the consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(
            Instant::now() < deadline,
            "the consumer did not declare its queue"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sked.start_dev(&[
        "--otlp-endpoint",
        &endpoint,
        "--broker",
        &format!("main={amqp}"),
    ])
    .await;
    assert_eq!(
        sked.put_job("extract", job("echo \"$TRACEPARENT\""))
            .await
            .0,
        201
    );
    let handoff = json!({
        "timeout": "30s",
        "depends_on": [{"job": "extract"}],
        "target": {"amqp": {
            "connection": "main", "exchange": exchange, "routing_key": "handoff",
            "await_completion": true
        }}
    });
    assert_eq!(sked.put_job("handoff", handoff).await.0, 201);
    let load =
        json!({"depends_on": [{"job": "handoff"}], "target": shell("echo \"$TRACEPARENT\"")});
    assert_eq!(sked.put_job("load", load).await.0, 201);

    let first = sked.trigger("extract").await;
    let loads = sked.wait_runs("load", 1, Duration::from_secs(30)).await;
    let last = sked
        .wait_finished(
            loads[0]["id"].as_i64().expect("an id"),
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(last["state"], "succeeded", "{last}");
    let status = consumer.wait().expect("the consumer ends");
    assert!(
        status.success(),
        "the consumer failed: see {:?}",
        sked.dir.path()
    );
    let (trace_id, _, _) = parts(&sked.run_log(first).await);
    let (load_trace, load_parent, _) = parts(&sked.run_log(last["id"].as_i64().unwrap_or(0)).await);
    assert_eq!(
        load_trace, trace_id,
        "the last step runs in the first step's trace"
    );

    // Three runs of four spans each, and the consumer's.
    let spans = receiver.wait_trace(&trace_id, 13).await;
    let named = by_name(&spans);
    assert_eq!(spans.len(), 13, "{spans:?}");
    let root = |job: &str| &named[&format!("run default/{job}")];
    assert_eq!(root("extract")["parent_span_id"], "");
    assert_eq!(
        root("handoff")["parent_span_id"],
        root("extract")["span_id"]
    );
    assert_eq!(root("load")["parent_span_id"], root("handoff")["span_id"]);
    let process = &named[&format!("{queue} process")];
    assert_eq!(process["resource"]["service.name"], "consumer");
    let handoff_attempt = spans
        .iter()
        .find(|s| s["name"] == "attempt 1" && s["parent_span_id"] == root("handoff")["span_id"])
        .expect("the handoff's attempt");
    assert_eq!(
        process["parent_span_id"], handoff_attempt["span_id"],
        "the consumer continues the attempt"
    );
    assert_eq!(handoff_attempt["kind"], 4, "a producer: {handoff_attempt}");
    assert_eq!(
        handoff_attempt["attributes"]["messaging.system"],
        "rabbitmq"
    );
    assert_eq!(
        handoff_attempt["attributes"]["messaging.destination.name"],
        exchange.as_str()
    );
    let load_attempt = spans
        .iter()
        .find(|s| s["name"] == "attempt 1" && s["parent_span_id"] == root("load")["span_id"])
        .expect("the load's attempt");
    assert_eq!(load_attempt["span_id"], load_parent.as_str());
    // Connected: one root, every other span's parent in the trace.
    let ids: std::collections::HashSet<&str> =
        spans.iter().filter_map(|s| s["span_id"].as_str()).collect();
    let roots = spans.iter().filter(|s| s["parent_span_id"] == "").count();
    assert_eq!(roots, 1);
    for span in &spans {
        let parent = span["parent_span_id"].as_str().unwrap_or_default();
        assert!(
            parent.is_empty() || ids.contains(parent),
            "an orphan: {span}"
        );
    }
}

#[cfg_attr(not(sked_python_tests), ignore = "needs SKED_TEST_PYTHON")]
#[tokio::test]
async fn a_callers_trace_reaches_the_run_it_triggers_and_the_runs_its_event_starts() {
    let mut sked = Sked::new();
    let receiver = Receiver::start(sked.dir.path());
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    sked.start_dev(&["--otlp-endpoint", &endpoint]).await;
    assert_eq!(
        sked.put_job("manual", job("echo \"$TRACEPARENT\"")).await.0,
        201
    );
    let on_event =
        json!({"schedule": {"event": "sales.ready"}, "target": shell("echo \"$TRACEPARENT\"")});
    assert_eq!(sked.put_job("on-sales", on_event).await.0, 201);
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let traceparent = format!("00-{caller_trace}-{caller_span}-01");
    let posted = |path: &str, body: Value, traceparent: &str| {
        sked.http
            .post(sked.url(path))
            .header("traceparent", traceparent)
            .json(&body)
            .send()
    };
    let answer = posted("/jobs/manual/trigger", json!(null), &traceparent)
        .await
        .expect("trigger");
    assert_eq!(answer.status(), 201);
    let triggered = answer.json::<Value>().await.expect("a run")["id"]
        .as_i64()
        .expect("an id");
    let answer = posted(
        "/events",
        json!({"key": "sales.ready", "id": "d1"}),
        &traceparent,
    )
    .await
    .expect("an event");
    assert_eq!(answer.status(), 201);
    // A header that is not a traceparent is ignored: that run has a trace of its own.
    let answer = posted("/jobs/manual/trigger", json!(null), "00-bogus")
        .await
        .expect("trigger");
    assert_eq!(answer.status(), 201);
    let own = answer.json::<Value>().await.expect("a run")["id"]
        .as_i64()
        .expect("an id");

    let started = sked.wait_runs("on-sales", 1, Duration::from_secs(20)).await;
    let from_event = started[0]["id"].as_i64().expect("an id");
    for id in [triggered, from_event, own] {
        let run = sked.wait_finished(id, Duration::from_secs(20)).await;
        assert_eq!(run["state"], "succeeded", "{run}");
    }
    for id in [triggered, from_event] {
        assert_eq!(parts(&sked.run_log(id).await).0, caller_trace, "run {id}");
    }
    assert_ne!(parts(&sked.run_log(own).await).0, caller_trace);
    let spans = receiver.wait_trace(caller_trace, 8).await;
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"].as_str().unwrap_or("").starts_with("run "))
        .collect();
    assert_eq!(roots.len(), 2, "{spans:?}");
    for root in roots {
        assert_eq!(root["parent_span_id"], caller_span, "{root}");
    }
}

#[tokio::test]
async fn without_an_endpoint_no_trace_context_reaches_a_run() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    assert_eq!(
        sked.put_job("plain", job("echo \"[${TRACEPARENT-unset}]\""))
            .await
            .0,
        201
    );
    let id = sked.trigger("plain").await;
    sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(sked.run_log(id).await, "[unset]\n");
    assert_eq!(sked.metric("sked_spans_exported_total").await, 0);
    // The timeline is drawn all the same, without ids.
    let view = sked.run(id).await;
    assert!(view["trace"]["trace_id"].is_null(), "{view}");
    let spans = view["trace"]["spans"].as_array().expect("spans");
    assert_eq!(spans.len(), 4, "{view}");
    assert!(spans
        .iter()
        .all(|s| s["span_id"].is_null() && s["start"].as_str() <= s["end"].as_str()));
}

#[tokio::test]
async fn bad_tracing_flags_are_refused_before_anything_starts() {
    let sked = Sked::new();
    for (args, says) in [
        (
            vec!["--otlp-endpoint", "ftp://collector:4318"],
            "--otlp-endpoint",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--otlp-protocol",
                "thrift",
            ],
            "--otlp-protocol",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--trace-ratio",
                "1.5",
            ],
            "--trace-ratio",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--otlp-header",
                "api-key",
            ],
            "NAME=VALUE",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--otlp-header",
                "bad name=hunter2",
            ],
            "not a valid header",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--trace-link",
                "javascript:alert('{trace_id}')",
            ],
            "--trace-link",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://127.0.0.1:4318",
                "--trace-link",
                "https://tempo.example/",
            ],
            "{trace_id}",
        ),
    ] {
        let data = sked.data_dir();
        let out = common::sked_command()
            .arg("dev")
            .args(["--data-dir", data.to_str().expect("utf-8")])
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .expect("sked dev");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("hunter2"),
            "a header's value was printed: {stderr}"
        );
    }
}

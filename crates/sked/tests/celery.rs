//! The Celery target, black-box, against a real `celery worker` (PyPI's Celery in a venv this
//! test makes, pinned in `tests/celery/requirements.txt`) over the real RabbitMQ and Redis: a
//! `sked server` with `--broker` connections publishes each run's task message, and the
//! unmodified worker runs the task of `tests/celery/skedtasks.py`, which writes what it
//! received to a log this test reads. With `await_result`, the run follows the task in a
//! Redis result backend: `SUCCESS` succeeds, `FAILURE` fails with the traceback, `RETRY` goes
//! on, and a timeout or a cancel revokes the task. A node SIGKILLed while it publishes (alone on
//! SQLite and restarted, or one of two on PostgreSQL) loses no instant: each ran on the worker at
//! least once, and a message sent again carries its instant's key (delivery is at least once;
//! the tests print how many were sent again).
//!
//! Needs `SKED_TEST_AMQP_URL`, `SKED_TEST_REDIS_URL` and `SKED_TEST_PYTHON` (a Python 3 with
//! `venv`); without them these tests are reported as ignored (under CI they run, and fail
//! loudly).

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn service(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: the Celery tests need the real service (see .ci/run)")
    })
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/celery");

/// The venv with Celery in it.
fn venv() -> PathBuf {
    common::python::venv("celery-venv", &Path::new(HERE).join("requirements.txt"))
}

/// A `celery worker` of `skedtasks` consuming `queue`, killed (with its pool) when dropped.
struct CeleryWorker {
    child: Child,
    log: PathBuf,
    tasks: PathBuf,
}

impl CeleryWorker {
    fn start(dir: &Path, broker: &str, backend: Option<&str>, queue: &str) -> CeleryWorker {
        let venv = venv();
        let log = dir.join(format!("{queue}.worker.log"));
        let tasks = dir.join(format!("{queue}.tasks.jsonl"));
        let child = Command::new(venv.join("bin/celery"))
            .args(["-A", "skedtasks", "worker", "--loglevel", "INFO"])
            .args([
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--without-gossip",
            ])
            .args(["--without-mingle", "--without-heartbeat", "-Q", queue])
            .args(["--hostname", &format!("{queue}@localhost")])
            .current_dir(HERE)
            .env("SKED_CELERY_BROKER", broker)
            .env("SKED_CELERY_BACKEND", backend.unwrap_or(""))
            .env("SKED_TASK_LOG", &tasks)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("worker log"))
            .process_group(0)
            .spawn()
            .expect("celery worker");
        let worker = CeleryWorker { child, log, tasks };
        worker.wait_ready();
        worker
    }

    /// Waits for the worker's "ready" line (it has declared and consumes its queue).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains(" ready.") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the celery worker did not become ready:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The tasks it ran (their log lines), once at least `n` of kind `kind` are there.
    async fn wait_tasks(&self, kind: &str, n: usize, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let lines: Vec<Value> = std::fs::read_to_string(&self.tasks)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            if lines.iter().filter(|l| l["kind"] == kind).count() >= n || Instant::now() > deadline
            {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for CeleryWorker {
    fn drop(&mut self) {
        // The worker and its pool's children share its process group.
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

async fn finished(sked: &Sked, run: i64, within: Duration) -> Value {
    let run = sked.wait_finished(run, within).await;
    assert!(
        run["finished_at"].is_string(),
        "the run did not finish: {run}"
    );
    run
}

/// Waits up to 10 s for the worker to record task `id` as `REVOKED` in the result backend.
async fn wait_revoked(backend: &str, id: &str, worker: &CeleryWorker) {
    let client = redis::Client::open(backend).expect("the backend's URL");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("the result backend");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let meta: Option<String> = redis::cmd("GET")
            .arg(format!("celery-task-meta-{id}"))
            .query_async(&mut redis)
            .await
            .expect("GET");
        let state = meta
            .as_deref()
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .map(|m| m["status"].clone());
        if state == Some(json!("REVOKED")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} is {state:?}, not REVOKED\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn redis_url(db: u8) -> String {
    let url = service("SKED_TEST_REDIS_URL");
    format!("{}/{db}", url.trim_end_matches('/'))
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn a_celery_worker_runs_the_task_sked_sends_over_rabbitmq_with_its_arguments() {
    let amqp = service("SKED_TEST_AMQP_URL");
    let mut sked = Sked::new();
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(sked.dir.path(), &amqp, None, &queue);
    sked.start_server(&["--broker", &format!("rabbit={amqp}")])
        .await;
    let (status, answer) = sked
        .put_job(
            "ledger",
            json!({"target": {"celery": {
                "connection": "rabbit", "task": "skedtasks.record", "queue": queue,
                "args": [42, "{{job}}"],
                "kwargs": {"at": "{{scheduled_for}}", "nested": {"list": [true, null]}},
                "headers": {"team": "billing"}
            }}}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let run_id = sked.trigger("ledger").await;
    let run = finished(&sked, run_id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "succeeded", "{run}");

    let tasks = worker
        .wait_tasks("record", 1, Duration::from_secs(20))
        .await;
    assert_eq!(tasks.len(), 1, "{tasks:?}\n{}", worker.log());
    let task = &tasks[0];
    assert_eq!(task["args"], json!([42, "ledger"]));
    let at = run["scheduled_for"].as_str().expect("scheduled_for");
    let at = chrono::DateTime::parse_from_rfc3339(at)
        .expect("an instant")
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    assert_eq!(
        task["kwargs"],
        json!({"at": at, "nested": {"list": [true, null]}})
    );
    assert_eq!(task["retries"], 0);
    assert_eq!(task["headers"]["sked-run-id"], json!(run_id.to_string()));
    assert_eq!(
        task["headers"]["sked-idempotency-key"],
        json!(format!("default/ledger/{at}"))
    );
    // The worker logged the task by its name and the arguments' repr sked wrote.
    let log = worker.log();
    assert!(
        log.contains("skedtasks.record") && log.contains(task["id"].as_str().unwrap_or("?")),
        "{log}"
    );
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn over_redis_the_run_follows_the_task_to_success_failure_and_retry() {
    let (broker, backend) = (redis_url(0), redis_url(1));
    let mut sked = Sked::new();
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(sked.dir.path(), &broker, Some(&backend), &queue);
    sked.start_server(&[
        "--broker",
        &format!("queue={broker}"),
        "--broker",
        &format!("results={backend}"),
    ])
    .await;
    let job = |task: &str| {
        json!({"timeout": "60s", "target": {"celery": {
            "connection": "queue", "task": task, "queue": queue, "args": ["{{run_id}}"],
            "await_result": true, "result_backend": "results"
        }}})
    };
    for (name, task) in [
        ("books", "skedtasks.record"),
        ("audit", "skedtasks.fail"),
        ("flaky", "skedtasks.flaky"),
    ] {
        let (status, answer) = sked.put_job(name, job(task)).await;
        assert_eq!(status, 201, "{answer}");
    }
    let mut stuck = job("skedtasks.slow");
    stuck["timeout"] = json!("3s");
    stuck["target"]["celery"]["args"] = json!([30]);
    assert_eq!(sked.put_job("stuck", stuck).await.0, 201);
    let books = sked.trigger("books").await;
    let audit = sked.trigger("audit").await;
    let flaky = sked.trigger("flaky").await;
    let stuck = sked.trigger("stuck").await;

    let run = finished(&sked, books, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}\n{}", worker.log());
    let run = finished(&sked, audit, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("ValueError: the ledger does not balance")
            && error.contains("Traceback (most recent call last)"),
        "{run}"
    );
    // RETRY is not an end: the run goes on to the retried task's success.
    let run = finished(&sked, flaky, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let tasks = worker.wait_tasks("flaky", 2, Duration::from_secs(5)).await;
    let flaky_tasks: Vec<&Value> = tasks.iter().filter(|t| t["kind"] == "flaky").collect();
    assert_eq!(flaky_tasks.len(), 2, "{tasks:?}");
    assert_eq!(flaky_tasks[0]["id"], flaky_tasks[1]["id"]);
    assert_eq!(flaky_tasks[1]["retries"], 1);
    let record = tasks
        .iter()
        .find(|t| t["kind"] == "record")
        .expect("record ran");
    assert_eq!(record["args"], json!([books.to_string()]));
    // Past its timeout, the task is revoked through Redis's broadcast and terminated.
    let run = finished(&sked, stuck, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    let tasks = worker.wait_tasks("slow", 1, Duration::from_secs(5)).await;
    let slow = tasks
        .iter()
        .find(|t| t["kind"] == "slow")
        .expect("slow ran");
    wait_revoked(&backend, slow["id"].as_str().unwrap_or("?"), &worker).await;
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn a_timeout_or_a_cancel_revokes_the_task_on_the_worker() {
    let amqp = service("SKED_TEST_AMQP_URL");
    let backend = redis_url(1);
    let mut sked = Sked::new();
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(sked.dir.path(), &amqp, Some(&backend), &queue);
    sked.start_server(&[
        "--broker",
        &format!("rabbit={amqp}"),
        "--broker",
        &format!("results={backend}"),
    ])
    .await;
    let job = |timeout: &str| {
        json!({"timeout": timeout, "target": {"celery": {
            "connection": "rabbit", "task": "skedtasks.slow", "queue": queue, "args": [30],
            "await_result": true, "result_backend": "results"
        }}})
    };
    assert_eq!(sked.put_job("short", job("3s")).await.0, 201);
    assert_eq!(sked.put_job("long", job("5m")).await.0, 201);

    let short = sked.trigger("short").await;
    let run = finished(&sked, short, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    assert!(
        run["error"]
            .as_str()
            .unwrap_or_default()
            .contains("the task was revoked"),
        "{run}"
    );

    let long = sked.trigger("long").await;
    worker.wait_tasks("slow", 2, Duration::from_secs(20)).await;
    let (status, answer) = sked
        .post(&format!("/runs/{long}/cancel"), json!(null))
        .await;
    assert!(status < 300, "{status} {answer}");
    let run = finished(&sked, long, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "cancelled", "{run}");

    // Both tasks were terminated on the worker (their 30 s sleeps cut short), and the
    // worker recorded them as revoked in the result backend.
    let tasks = worker.wait_tasks("slow", 2, Duration::from_secs(1)).await;
    let ids: Vec<&str> = tasks
        .iter()
        .filter(|t| t["kind"] == "slow")
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{tasks:?}");
    for id in ids {
        wait_revoked(&backend, id, &worker).await;
    }
    assert!(
        !tasks.iter().any(|t| t["kind"] == "slow-finished"),
        "{tasks:?}"
    );
    let log = worker.log();
    assert!(log.contains("Terminating"), "{log}");
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn bad_celery_definitions_are_refused_by_field() {
    let amqp = service("SKED_TEST_AMQP_URL");
    let mut sked = Sked::new();
    sked.start_server(&[
        "--broker",
        &format!("rabbit={amqp}"),
        "--broker",
        &format!("stream={}", service("SKED_TEST_NATS_URL")),
    ])
    .await;
    let cases = [
        (
            json!({"connection": "rabbit", "task": "a b"}),
            "target.celery.task",
        ),
        (
            json!({"connection": "amqp://guest:guest@127.0.0.1/", "task": "t"}),
            "target.celery.connection",
        ),
        (
            json!({"connection": "stream", "task": "t"}),
            "target.celery.connection",
        ),
        (
            json!({"connection": "rabbit", "task": "t", "await_result": true}),
            "target.celery.result_backend",
        ),
        (
            json!({"connection": "rabbit", "task": "t", "await_result": true,
                   "result_backend": "rabbit"}),
            "target.celery.result_backend",
        ),
        (
            json!({"connection": "rabbit", "task": "t", "headers": {"id": "mine"}}),
            "target.celery.headers.id",
        ),
        (
            json!({"connection": "rabbit", "task": "t", "expires": "30d"}),
            "target.celery.expires",
        ),
    ];
    for (target, field) in cases {
        let (status, answer) = sked
            .put_job("bad", json!({"target": {"celery": target}}))
            .await;
        assert_eq!(status, 400, "{target}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{target}: {answer}");
    }
    let (status, _) = sked.get("/jobs/bad").await;
    assert_eq!(status, 404, "nothing was written");
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn a_labelled_worker_publishes_and_follows_the_task_through_its_own_connections() {
    let (broker, backend) = (redis_url(0), redis_url(1));
    let mut sked = Sked::new();
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(sked.dir.path(), &broker, Some(&backend), &queue);
    // The server has no connections: the job's are the labelled worker's.
    sked.start_server(&[]).await;
    let job = json!({"timeout": "60s", "routing": {"labels": {"zone": "edge"}},
    "target": {"celery": {
        "connection": "queue", "task": "skedtasks.fail", "queue": queue,
        "await_result": true, "result_backend": "results"
    }}});
    let (status, answer) = sked.put_job("edge-audit", job).await;
    assert_eq!(status, 201, "{answer}");
    sked.start_worker_with(
        "edge",
        2,
        &[
            "--labels",
            "zone=edge",
            "--broker",
            &format!("queue={broker}"),
            "--broker",
            &format!("results={backend}"),
        ],
    );
    let id = sked.trigger("edge-audit").await;
    let run = finished(&sked, id, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "failed", "{run}\n{}", worker.log());
    assert!(
        run["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("ValueError: the ledger does not balance"),
        "{run}"
    );
    let log = sked.run_log(id).await;
    assert!(log.contains("following the task's result"), "{log}");
}

/// Each succeeded run's instant, as its envelope writes it.
fn envelope_instant(run: &Value) -> String {
    let at = run["scheduled_for"].as_str().unwrap_or_default();
    chrono::DateTime::parse_from_rfc3339(at)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        })
        .unwrap_or_default()
}

#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_AMQP_URL, SKED_TEST_REDIS_URL and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn a_node_sigkilled_mid_publish_loses_no_instant_and_any_resend_carries_the_same_key() {
    let amqp = service("SKED_TEST_AMQP_URL");
    let mut sked = Sked::new();
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(sked.dir.path(), &amqp, None, &queue);
    let broker = format!("rabbit={amqp}");
    sked.start_server(&["--broker", &broker]).await;
    let (status, answer) = sked.put_job("tick", ticking(&queue)).await;
    assert_eq!(status, 201, "{answer}");
    let mut rng = common::Rng::from_env();
    let kills = 5;
    for _ in 0..kills {
        tokio::time::sleep(rng.millis(1_000, 2_500)).await;
        if let Some(server) = sked.server.as_mut() {
            server.sigkill();
        }
        sked.start_server(&["--broker", &broker]).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    each_instant_ran_at_least_once(&sked, &worker, kills).await;
}

/// Pauses `tick` and checks, once every run ended, that each succeeded instant ran on the
/// worker, nothing ran that the ledger lacks, and every message sent again (a node died
/// between the broker's confirm and recording it) carries its instant's key and arguments.
async fn each_instant_ran_at_least_once(sked: &Sked, worker: &CeleryWorker, kills: usize) {
    let (_, paused) = sked.post("/jobs/tick/pause", json!(null)).await;
    assert_eq!(paused["state"], "paused", "{paused}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = sked.runs("tick").await;
        if runs.iter().all(|r| r["finished_at"].is_string()) || Instant::now() > deadline {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(runs.len() >= 10, "{} runs", runs.len());
    let open: Vec<&Value> = runs
        .iter()
        .filter(|r| !r["finished_at"].is_string())
        .collect();
    assert!(open.is_empty(), "runs without an end: {open:?}");
    let succeeded: Vec<String> = runs
        .iter()
        .filter(|r| r["state"] == "succeeded")
        .map(envelope_instant)
        .collect();
    let tasks = worker
        .wait_tasks("record", succeeded.len(), Duration::from_secs(20))
        .await;
    let mut by_key: std::collections::BTreeMap<String, Vec<&Value>> = Default::default();
    for task in tasks.iter().filter(|t| t["kind"] == "record") {
        let key = task["headers"]["sked-idempotency-key"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        by_key.entry(key).or_default().push(task);
    }
    for at in &succeeded {
        let key = format!("default/tick/{at}");
        let ran = by_key.get(&key).map_or(0, Vec::len);
        assert!(
            ran >= 1,
            "the instant {at} succeeded but no task ran for it"
        );
    }
    let ledger: std::collections::BTreeSet<String> = runs
        .iter()
        .map(|r| format!("default/tick/{}", envelope_instant(r)))
        .collect();
    let mut resent = 0;
    for (key, tasks) in &by_key {
        assert!(
            ledger.contains(key),
            "a task for {key}, which the ledger lacks"
        );
        let at = key.trim_start_matches("default/tick/");
        assert!(tasks.iter().all(|t| t["args"] == json!([at])), "{tasks:?}");
        resent += tasks.len() - 1;
    }
    println!(
        "{kills} SIGKILLs: {} runs, {} succeeded, {} tasks ran, {resent} sent again",
        runs.len(),
        succeeded.len(),
        by_key.values().map(Vec::len).sum::<usize>()
    );
}

/// The job every failover test runs: a Celery task each 500 ms, catching up what a dead node
/// missed.
fn ticking(queue: &str) -> Value {
    json!({"schedule": {"every": "500ms"}, "misfire": {"policy": "run_all"},
        "target": {"celery": {"connection": "rabbit", "task": "skedtasks.record",
                              "queue": queue, "args": ["{{scheduled_for}}"]}}})
}

#[cfg_attr(
    not(all(sked_celery_tests, sked_pg_tests)),
    ignore = "needs SKED_TEST_DATABASE_URL, the brokers and SKED_TEST_PYTHON"
)]
#[tokio::test]
async fn two_nodes_on_postgresql_fail_over_with_no_instant_lost() {
    use common::pg::{Logs, Node, Schema};
    let amqp = service("SKED_TEST_AMQP_URL");
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = common::http_client();
    let broker = format!("rabbit={amqp}");
    let extra = ["--broker", broker.as_str()];
    let ports = [common::free_port(), common::free_port()];
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut node = Node::spawn_with(&logs, &format!("node-{i}"), *port, &schema.url, &extra);
        node.ready(&http, Duration::from_secs(60)).await;
        nodes.push(node);
    }
    let queue = unique("sked-celery-");
    let worker = CeleryWorker::start(logs.path(), &amqp, None, &queue);
    let mut view = Sked::new();
    view.port = ports[0];
    let (status, answer) = view.put_job("tick", ticking(&queue)).await;
    assert_eq!(status, 201, "{answer}");
    let mut rng = common::Rng::from_env();
    let kills = 4;
    for kill in 0..kills {
        tokio::time::sleep(rng.millis(1_500, 3_000)).await;
        // Alternate, so each node in turn dies while the other takes its partitions.
        let slot = kill % 2;
        nodes[slot].proc.sigkill();
        view.port = ports[1 - slot];
        let mut node = Node::spawn_with(
            &logs,
            &format!("node-{slot}"),
            ports[slot],
            &schema.url,
            &extra,
        );
        node.ready(&http, Duration::from_secs(60)).await;
        nodes[slot] = node;
    }
    // Long enough for the last dead node's partitions and attempts to be taken over.
    tokio::time::sleep(Duration::from_secs(6)).await;
    each_instant_ran_at_least_once(&view, &worker, kills).await;
    drop(nodes);
    schema.drop_schema().await;
}

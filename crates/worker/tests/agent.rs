//! The protocol loop against a fake server (axum on 127.0.0.1:0) that records what the worker
//! sends: registration, leases sized by free slots, output before completion, stops from
//! heartbeats, re-registration when forgotten, completion retries, failover and the way back,
//! shutdown.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use sked_core::egress::EgressPolicy;
use sked_core::protocol::{
    CompleteRequest, CompleteResponse, Completion, CompletionResult, HeartbeatRequest,
    HeartbeatResponse, LeaseRequest, LeaseResponse, LeasedAttempt, RegisterRequest,
    RegisterResponse,
};
use sked_core::target::{HttpTarget, ShellTarget};
use sked_core::{AttemptOutcome, TargetSpec};
use sked_worker::{WorkerConfig, WorkerError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Default)]
struct Fake {
    registrations: u32,
    known: HashSet<String>,
    queue: Vec<LeasedAttempt>,
    lease_requests: Vec<LeaseRequest>,
    heartbeats: Vec<HeartbeatRequest>,
    logs: HashMap<i64, Vec<u8>>,
    completions: Vec<Completion>,
    complete_calls: u32,
    /// "log:ID" and "complete:ID", in arrival order.
    events: Vec<String>,
    /// Heartbeats answer `stop: [id]` once the worker lists this attempt.
    stop_when_running: Option<i64>,
    /// The next heartbeat that lists this attempt is answered 410 (the worker is forgotten).
    forget_when_running: Option<i64>,
    /// Answer this many completion requests with 503.
    failing_completes: u32,
    /// Heartbeats and leases tell the worker to drain.
    drain: bool,
    /// Handed to each worker that registers.
    http_target_policy: EgressPolicy,
}

type Shared = Arc<Mutex<Fake>>;

/// One fake server node; nodes may share a `Fake` (as real nodes share a store). A node that
/// is down answers 503 to everything. `served` counts the heartbeats and leases it answered.
#[derive(Clone)]
struct Node {
    fake: Shared,
    down: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
}

fn unavailable() -> Response {
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

fn lock(fake: &Shared) -> std::sync::MutexGuard<'_, Fake> {
    fake.lock().unwrap_or_else(|p| p.into_inner())
}

fn gone() -> Response {
    (
        StatusCode::GONE,
        Json(serde_json::json!({"error": {"code": "unknown_worker", "message": "register again"}})),
    )
        .into_response()
}

async fn register(State(node): State<Node>, Json(req): Json<RegisterRequest>) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    let fake = node.fake;
    if req.name == "refused" {
        let body = serde_json::json!({"error": {"code": "invalid_request", "message": "no"}});
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    }
    let mut fake = lock(&fake);
    fake.registrations += 1;
    let id = format!("{}-{}", req.name, fake.registrations);
    fake.known.insert(id.clone());
    let answer = RegisterResponse {
        worker_id: id,
        heartbeat_interval_ms: 100,
        heartbeat_timeout_ms: 1000,
        http_target_policy: fake.http_target_policy.clone(),
    };
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn heartbeat(
    State(node): State<Node>,
    Path(id): Path<String>,
    Json(req): Json<HeartbeatRequest>,
) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    node.served.fetch_add(1, Ordering::SeqCst);
    let fake = node.fake;
    let mut fake = lock(&fake);
    if !fake.known.contains(&id) {
        return gone();
    }
    fake.heartbeats.push(req.clone());
    if let Some(attempt) = fake.forget_when_running {
        if req.running.contains(&attempt) {
            fake.forget_when_running = None;
            fake.known.remove(&id);
            return gone();
        }
    }
    let stop = fake
        .stop_when_running
        .filter(|a| req.running.contains(a))
        .into_iter()
        .collect();
    Json(HeartbeatResponse {
        stop,
        drain: fake.drain,
    })
    .into_response()
}

async fn lease(
    State(node): State<Node>,
    Path(id): Path<String>,
    Json(req): Json<LeaseRequest>,
) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    node.served.fetch_add(1, Ordering::SeqCst);
    let fake = node.fake;
    let attempts = {
        let mut fake = lock(&fake);
        if !fake.known.contains(&id) {
            return gone();
        }
        fake.lease_requests.push(req.clone());
        if fake.drain {
            return Json(LeaseResponse {
                attempts: Vec::new(),
                drain: true,
            })
            .into_response();
        }
        let n = fake.queue.len().min(req.max as usize);
        fake.queue.drain(..n).collect::<Vec<_>>()
    };
    if attempts.is_empty() {
        tokio::time::sleep(Duration::from_millis(req.wait_ms.min(100))).await;
    }
    Json(LeaseResponse {
        attempts,
        drain: false,
    })
    .into_response()
}

#[derive(serde::Deserialize)]
struct Token {
    token: i64,
}

async fn log(
    State(node): State<Node>,
    Path(id): Path<i64>,
    Query(token): Query<Token>,
    body: Bytes,
) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    let fake = node.fake;
    let mut fake = lock(&fake);
    if token.token != token_of(id) {
        return StatusCode::CONFLICT.into_response();
    }
    fake.logs.entry(id).or_default().extend_from_slice(&body);
    fake.events.push(format!("log:{id}"));
    Json(serde_json::json!({"kept": body.len(), "truncated": false})).into_response()
}

async fn complete(
    State(node): State<Node>,
    Path(_id): Path<String>,
    Json(req): Json<CompleteRequest>,
) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    let fake = node.fake;
    let mut fake = lock(&fake);
    fake.complete_calls += 1;
    if fake.failing_completes > 0 {
        fake.failing_completes -= 1;
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let mut results = Vec::new();
    for c in req.completions {
        fake.events.push(format!("complete:{}", c.attempt_id));
        results.push(CompletionResult {
            attempt_id: c.attempt_id,
            accepted: c.token == token_of(c.attempt_id),
            reason: None,
        });
        fake.completions.push(c);
    }
    Json(CompleteResponse { results }).into_response()
}

fn token_of(attempt_id: i64) -> i64 {
    attempt_id * 1000 + 7
}

/// An HTTP target that takes its time: what makes a worker's stall gauge rise.
async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    "done"
}

async fn readyz(State(node): State<Node>) -> Response {
    if node.down.load(Ordering::SeqCst) {
        return unavailable();
    }
    "ready".into_response()
}

async fn fake_server() -> (Shared, String) {
    let fake: Shared = Arc::default();
    let url = node(fake.clone(), Arc::default(), Arc::default()).await;
    (fake, url)
}

async fn node(fake: Shared, down: Arc<AtomicBool>, served: Arc<AtomicUsize>) -> String {
    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/slow", get(slow))
        .route("/api/v1/workers", post(register))
        .route("/api/v1/workers/{id}/heartbeat", post(heartbeat))
        .route("/api/v1/workers/{id}/lease", post(lease))
        .route("/api/v1/workers/{id}/complete", post(complete))
        .route("/api/v1/attempts/{id}/log", post(log))
        .with_state(Node { fake, down, served });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// A URL where nothing listens.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}

fn shell_attempt(attempt_id: i64, command: &str, timeout_ms: Option<u64>) -> LeasedAttempt {
    LeasedAttempt {
        attempt_id,
        token: token_of(attempt_id),
        run_id: attempt_id + 100,
        attempt: 1,
        namespace: "default".to_string(),
        job: "test-job".to_string(),
        scheduled_for: Utc::now(),
        target: TargetSpec::Shell(ShellTarget {
            command: command.to_string(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            run_as: None,
            limits: Default::default(),
        }),
        timeout_ms,
        completion: None,
        event: None,
        affinity_key: None,
        shard: None,
        secret_headers: Vec::new(),
        params: Default::default(),
        traceparent: None,
    }
}

fn config(servers: Vec<String>, slots: u32) -> WorkerConfig {
    WorkerConfig {
        servers,
        name: "tester".to_string(),
        labels: BTreeMap::new(),
        slots,
        lease_wait: Duration::from_millis(200),
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        output_flush_interval: Duration::from_millis(50),
        kill_grace: Duration::from_millis(300),
        output_drain: Duration::from_millis(200),
        retry_initial: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(3),
        ..WorkerConfig::default()
    }
}

struct Worker {
    task: JoinHandle<Result<(), WorkerError>>,
    shutdown: oneshot::Sender<()>,
}

fn start(config: WorkerConfig) -> Worker {
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(sked_worker::run(config, async move {
        let _ = stopped.await;
    }));
    Worker { task, shutdown }
}

impl Worker {
    async fn stop(self) -> Result<(), WorkerError> {
        let _ = self.shutdown.send(());
        tokio::time::timeout(Duration::from_secs(8), self.task)
            .await
            .expect("the worker shuts down in bounded time")
            .expect("the worker task does not panic")
    }
}

async fn wait_until(fake: &Shared, what: &str, cond: impl Fn(&Fake) -> bool) {
    eventually(what, || cond(&lock(fake))).await;
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..250 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn runs_an_attempt_and_reports_it_after_its_output_failing_over() {
    let (fake, url) = fake_server().await;
    lock(&fake)
        .queue
        .push(shell_attempt(1, "echo \"hi $SKED_JOB\"; exit 2", None));
    let worker = start(config(vec![dead_url(), url], 2));
    wait_until(&fake, "the completion arrives", |f| {
        !f.completions.is_empty()
    })
    .await;
    {
        let f = lock(&fake);
        assert_eq!(f.registrations, 1);
        assert_eq!(f.lease_requests[0].max, 2);
        assert_eq!(f.lease_requests[0].wait_ms, 200);
        let c = &f.completions[0];
        assert_eq!(c.attempt_id, 1);
        assert_eq!(c.token, token_of(1));
        assert_eq!(c.outcome, AttemptOutcome::Failed);
        assert_eq!(c.exit_code, Some(2));
        assert_eq!(
            f.logs.get(&1).map(|l| l.as_slice()),
            Some(&b"hi test-job\n"[..])
        );
        let last_log = f.events.iter().rposition(|e| e == "log:1");
        let completed = f.events.iter().position(|e| e == "complete:1");
        assert!(last_log < completed, "{:?}", f.events);
    }
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn leases_ask_only_for_free_slots() {
    let (fake, url) = fake_server().await;
    lock(&fake).queue.push(shell_attempt(1, "sleep 30", None));
    let worker = start(config(vec![url], 3));
    wait_until(&fake, "a lease asks for the 2 free slots", |f| {
        f.lease_requests.iter().any(|r| r.max == 2)
    })
    .await;
    assert!(lock(&fake).lease_requests.iter().all(|r| r.max >= 2));
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn a_stop_from_the_heartbeat_cancels_the_attempt() {
    let (fake, url) = fake_server().await;
    {
        let mut f = lock(&fake);
        f.queue
            .push(shell_attempt(5, "echo started; sleep 30", None));
        f.stop_when_running = Some(5);
    }
    let worker = start(config(vec![url], 1));
    wait_until(&fake, "the cancelled attempt is reported", |f| {
        !f.completions.is_empty()
    })
    .await;
    {
        let f = lock(&fake);
        assert_eq!(f.completions[0].outcome, AttemptOutcome::Cancelled);
        let log = String::from_utf8_lossy(f.logs.get(&5).map(|l| l.as_slice()).unwrap_or(&[]))
            .into_owned();
        assert!(log.starts_with("started\n"), "{log:?}");
    }
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn a_forgotten_worker_stops_its_attempts_and_registers_again() {
    let (fake, url) = fake_server().await;
    {
        let mut f = lock(&fake);
        f.queue.push(shell_attempt(8, "sleep 30", None));
        f.forget_when_running = Some(8);
    }
    let worker = start(config(vec![url], 1));
    wait_until(&fake, "the worker registers again", |f| {
        f.registrations == 2
    })
    .await;
    wait_until(&fake, "the stopped attempt is reported", |f| {
        !f.completions.is_empty()
    })
    .await;
    assert_eq!(
        lock(&fake).completions[0].outcome,
        AttemptOutcome::Cancelled
    );
    // And it leases again under its new id.
    lock(&fake).queue.push(shell_attempt(9, "true", None));
    wait_until(&fake, "the next attempt runs", |f| f.completions.len() == 2).await;
    assert_eq!(
        lock(&fake).completions[1].outcome,
        AttemptOutcome::Succeeded
    );
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn completions_are_retried_until_the_server_takes_them() {
    let (fake, url) = fake_server().await;
    {
        let mut f = lock(&fake);
        f.failing_completes = 2;
        f.queue.push(shell_attempt(3, "true", None));
        f.queue.push(shell_attempt(4, "exit 1", None));
    }
    let worker = start(config(vec![url], 2));
    wait_until(&fake, "both completions arrive", |f| {
        f.completions.len() == 2
    })
    .await;
    {
        let f = lock(&fake);
        assert!(f.complete_calls >= 3);
        let mut ids: Vec<i64> = f.completions.iter().map(|c| c.attempt_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![3, 4]);
    }
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn a_timeout_is_reported_timed_out() {
    let (fake, url) = fake_server().await;
    lock(&fake)
        .queue
        .push(shell_attempt(6, "sleep 30", Some(300)));
    let worker = start(config(vec![url], 1));
    wait_until(&fake, "the timeout is reported", |f| {
        !f.completions.is_empty()
    })
    .await;
    assert_eq!(lock(&fake).completions[0].outcome, AttemptOutcome::TimedOut);
    assert!(worker.stop().await.is_ok());
}

/// Without a drain grace, shutdown stops what runs at once.
#[tokio::test]
async fn shutdown_cancels_running_attempts_and_reports_them() {
    let (fake, url) = fake_server().await;
    lock(&fake).queue.push(shell_attempt(2, "sleep 30", None));
    let worker = start(config(vec![url], 1));
    wait_until(&fake, "a heartbeat lists the attempt", |f| {
        f.heartbeats.iter().any(|h| h.running.contains(&2))
    })
    .await;
    let started = std::time::Instant::now();
    assert!(worker.stop().await.is_ok());
    assert!(started.elapsed() < Duration::from_secs(3));
    let f = lock(&fake);
    assert_eq!(f.completions.len(), 1);
    assert_eq!(f.completions[0].outcome, AttemptOutcome::Cancelled);
}

/// With a drain grace, shutdown leases nothing more, keeps heartbeating, and lets the running
/// attempt finish and be reported as it ended; past the grace, what still runs is stopped.
#[tokio::test]
async fn shutdown_drains_running_attempts_within_the_grace() {
    let (fake, url) = fake_server().await;
    lock(&fake)
        .queue
        .push(shell_attempt(3, "sleep 1; echo finished", None));
    lock(&fake).queue.push(shell_attempt(4, "sleep 30", None));
    let worker = start(WorkerConfig {
        drain_grace: Duration::from_secs(2),
        ..config(vec![url], 2)
    });
    wait_until(&fake, "a heartbeat lists both attempts", |f| {
        f.heartbeats
            .iter()
            .any(|h| h.running.contains(&3) && h.running.contains(&4))
    })
    .await;
    // Work that arrives after the shutdown began is not taken.
    lock(&fake).queue.push(shell_attempt(5, "true", None));
    let (leases, heartbeats) = {
        let f = lock(&fake);
        (f.lease_requests.len(), f.heartbeats.len())
    };
    let started = std::time::Instant::now();
    let stopping = tokio::spawn(worker.stop());
    // During the drain the worker keeps heartbeating (the attempts keep their leases).
    wait_until(&fake, "the short attempt is reported", |f| {
        f.completions.iter().any(|c| c.attempt_id == 3)
    })
    .await;
    assert!(lock(&fake).heartbeats.len() > heartbeats);
    assert!(stopping.await.expect("joined").is_ok());
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(6),
        "{elapsed:?}"
    );
    let f = lock(&fake);
    let outcome = |id: i64| {
        f.completions
            .iter()
            .find(|c| c.attempt_id == id)
            .map(|c| c.outcome)
    };
    assert_eq!(outcome(3), Some(AttemptOutcome::Succeeded));
    assert_eq!(outcome(4), Some(AttemptOutcome::Cancelled));
    assert_eq!(outcome(5), None);
    assert_eq!(f.queue.len(), 1, "attempt 5 was leased during the drain");
    assert!(f.lease_requests.len() <= leases + 1);
}

/// A drain asked by the server (at a heartbeat or a lease) is a shutdown the worker starts
/// by itself: it takes nothing more, lets the running attempt finish, reports it, and returns.
#[tokio::test]
async fn a_drain_from_the_server_ends_the_worker_after_its_attempts() {
    let (fake, url) = fake_server().await;
    lock(&fake)
        .queue
        .push(shell_attempt(6, "sleep 1; echo finished", None));
    let worker = start(WorkerConfig {
        drain_grace: Duration::from_secs(10),
        ..config(vec![url], 2)
    });
    wait_until(&fake, "a heartbeat lists the attempt", |f| {
        f.heartbeats.iter().any(|h| h.running.contains(&6))
    })
    .await;
    {
        let mut f = lock(&fake);
        f.drain = true;
        f.queue.push(shell_attempt(7, "true", None));
    }
    let ended = tokio::time::timeout(Duration::from_secs(8), worker.task)
        .await
        .expect("the worker ends by itself")
        .expect("the worker task does not panic");
    assert!(ended.is_ok());
    let f = lock(&fake);
    assert_eq!(f.completions.len(), 1);
    assert_eq!(f.completions[0].attempt_id, 6);
    assert_eq!(f.completions[0].outcome, AttemptOutcome::Succeeded);
    assert_eq!(f.queue.len(), 1, "attempt 7 was leased after the drain");
}

#[tokio::test]
async fn a_refused_registration_is_an_error() {
    let (_fake, url) = fake_server().await;
    let mut config = config(vec![url], 1);
    config.name = "refused".to_string();
    let worker = start(config);
    let result = tokio::time::timeout(Duration::from_secs(5), worker.task)
        .await
        .expect("bounded")
        .expect("no panic");
    assert!(
        matches!(result, Err(WorkerError::Registration { status: 400, .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn with_no_server_reachable_shutdown_still_returns() {
    let worker = start(config(vec![dead_url(), dead_url()], 1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn an_invalid_configuration_is_an_error() {
    let result = sked_worker::run(config(Vec::new(), 1), async {}).await;
    assert!(matches!(result, Err(WorkerError::Config(_))));
}

#[tokio::test]
async fn a_running_attempt_survives_its_server_and_is_reported_to_another() {
    let fake: Shared = Arc::default();
    let a_down = Arc::new(AtomicBool::new(false));
    let a = node(fake.clone(), a_down.clone(), Arc::default()).await;
    let b = node(fake.clone(), Arc::default(), Arc::default()).await;
    lock(&fake)
        .queue
        .push(shell_attempt(11, "echo one; sleep 0.6; echo two", None));
    let worker = start(config(vec![a, b], 1));
    wait_until(&fake, "the attempt's first output arrives", |f| {
        f.logs.contains_key(&11)
    })
    .await;
    a_down.store(true, Ordering::SeqCst);
    wait_until(&fake, "the completion arrives", |f| {
        !f.completions.is_empty()
    })
    .await;
    {
        let f = lock(&fake);
        assert_eq!(
            f.registrations, 1,
            "no re-registration: the nodes share the worker"
        );
        assert_eq!(f.completions[0].outcome, AttemptOutcome::Succeeded);
        assert_eq!(
            f.logs.get(&11).map(|l| l.as_slice()),
            Some(&b"one\ntwo\n"[..])
        );
    }
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn after_a_failover_the_worker_goes_back_to_its_first_server_once_ready() {
    let fake: Shared = Arc::default();
    let a_down = Arc::new(AtomicBool::new(false));
    let (a_served, b_served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = node(fake.clone(), a_down.clone(), a_served.clone()).await;
    let b = node(fake.clone(), Arc::default(), b_served.clone()).await;
    let worker = start(WorkerConfig {
        home_check_interval: Duration::from_millis(200),
        ..config(vec![a, b], 1)
    });
    let served = |node: &AtomicUsize| node.load(Ordering::SeqCst);

    eventually("the worker works through A", || served(&a_served) >= 3).await;
    assert_eq!(served(&b_served), 0, "nothing goes to B while A answers");

    a_down.store(true, Ordering::SeqCst);
    eventually("the worker fails over to B", || served(&b_served) >= 3).await;

    a_down.store(false, Ordering::SeqCst);
    let at_return = served(&a_served);
    eventually("the worker is back on A", || {
        served(&a_served) >= at_return + 3
    })
    .await;
    // Once back, B hears nothing more (a lease poll already waiting there may still finish).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b_then = served(&b_served);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(served(&b_served), b_then, "the worker keeps talking to B");
    assert_eq!(
        lock(&fake).registrations,
        1,
        "no re-registration on the way back"
    );
    assert!(worker.stop().await.is_ok());
}

/// The HTTP target policy comes with each registration: a worker the server forgot registers
/// again and works under the policy it gets then.
#[tokio::test]
async fn http_targets_follow_the_policy_of_the_latest_registration() {
    let (fake, url) = fake_server().await;
    let http_attempt = |attempt_id: i64| LeasedAttempt {
        target: TargetSpec::Http(HttpTarget {
            method: "GET".to_string(),
            url: format!("{url}/readyz"),
            headers: BTreeMap::new(),
            body: None,
            expected_status: Vec::new(),
            timeout: None,
            callback: false,
        }),
        ..shell_attempt(attempt_id, "true", None)
    };
    lock(&fake).queue.push(http_attempt(1));
    let worker = start(config(vec![url.clone()], 1));
    wait_until(&fake, "the first completion arrives", |f| {
        !f.completions.is_empty()
    })
    .await;
    {
        let mut f = lock(&fake);
        assert_eq!(f.completions[0].outcome, AttemptOutcome::Succeeded);
        f.http_target_policy = EgressPolicy {
            internal_allowed: false,
            ..EgressPolicy::default()
        };
        f.known.clear();
        f.queue.push(http_attempt(2));
    }
    wait_until(&fake, "the second completion arrives", |f| {
        f.completions.len() == 2
    })
    .await;
    let second = lock(&fake).completions[1].clone();
    assert_eq!(second.attempt_id, 2);
    assert_eq!(second.outcome, AttemptOutcome::Failed);
    let error = second.error.unwrap_or_default();
    assert!(
        error.starts_with("refused by the HTTP target policy: 127.0.0.1 is a loopback address"),
        "{error}"
    );
    assert!(lock(&fake).registrations >= 2);
    worker.stop().await.expect("a clean stop");
}

/// Each heartbeat carries the stall gauge (HTTP attempts in flight past `stall_after`), the
/// affinity keys of the latest attempts as warm keys, and the pool's overload control: what
/// the server's dispatcher chooses by.
#[tokio::test]
async fn heartbeats_report_the_stall_gauge_warm_keys_and_the_pools_overload_control() {
    let (fake, url) = fake_server().await;
    let slow_attempt = |attempt_id: i64, key: &str| LeasedAttempt {
        target: TargetSpec::Http(HttpTarget {
            method: "GET".to_string(),
            url: format!("{url}/slow"),
            headers: BTreeMap::new(),
            body: None,
            expected_status: Vec::new(),
            timeout: None,
            callback: false,
        }),
        affinity_key: Some(key.to_string()),
        shard: None,
        secret_headers: Vec::new(),
        params: Default::default(),
        ..shell_attempt(attempt_id, "true", None)
    };
    {
        let mut f = lock(&fake);
        f.queue.push(slow_attempt(1, "project-1"));
        f.queue.push(slow_attempt(2, "project-2"));
        // A shell attempt, however long, is not an HTTP request waiting on a slow target.
        f.queue.push(shell_attempt(3, "sleep 1", None));
    }
    let setting = sked_core::protocol::OverloadSetting {
        policy: sked_core::dispatch::Overload::Admission,
        trip: 3,
        reset: 1,
    };
    let worker = start(WorkerConfig {
        stall_after: Duration::from_millis(300),
        overload: Some(setting),
        ..config(vec![url.clone()], 4)
    });
    wait_until(&fake, "a heartbeat counts both slow requests", |f| {
        f.heartbeats.iter().any(|h| h.stall == 2)
    })
    .await;
    {
        let f = lock(&fake);
        let beat = f.heartbeats.iter().find(|h| h.stall == 2).expect("found");
        assert_eq!(beat.warm_keys, vec!["project-1", "project-2"]);
        assert_eq!(beat.overload, Some(setting));
        // Before `stall_after` had passed, the same attempts were not stalled.
        assert_eq!(f.heartbeats.first().map(|h| h.stall), Some(0));
    }
    wait_until(&fake, "all three attempts completed", |f| {
        f.completions.len() == 3
    })
    .await;
    wait_until(&fake, "the gauge falls back once they ended", |f| {
        f.heartbeats.last().is_some_and(|h| h.stall == 0)
    })
    .await;
    worker.stop().await.expect("a clean stop");
}

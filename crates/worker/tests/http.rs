//! The HTTP executor against a local axum server: expected statuses, headers, body, timeouts,
//! and the HTTP target policy (refusals before any connection, after resolution, on redirects).

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Redirect;
use axum::routing::{any, get};
use axum::Router;
use chrono::{TimeZone, Utc};
use sked_core::egress::EgressPolicy;
use sked_core::target::HttpTarget;
use sked_core::{AttemptOutcome, HumanDuration};
use sked_worker::egress::{SharedPolicy, TargetClient};
use sked_worker::executor::{http, stop_channel, ExecOptions, ExecResult, RunInfo};
use sked_worker::output::OutputBuffer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn server() -> String {
    let app = Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route(
            "/status/{code}",
            get(|Path(code): Path<u16>| async move {
                (
                    StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT),
                    format!("status {code}"),
                )
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route("/big", get(|| async { "x".repeat(200_000) }))
        .route(
            "/echo",
            any(
                |method: axum::http::Method, headers: HeaderMap, body: String| async move {
                    let mut lines = vec![format!("method={method}")];
                    for name in [
                        "x-sked-run-id",
                        "x-sked-attempt",
                        "x-sked-scheduled-for",
                        "x-sked-job",
                        "x-custom",
                        "x-sked-event-key",
                        "x-sked-event-id",
                        "traceparent",
                        "content-type",
                    ] {
                        let value = headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-");
                        lines.push(format!("{name}={value}"));
                    }
                    lines.push(format!("body={body}"));
                    lines.join("\n")
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn target(url: String) -> HttpTarget {
    HttpTarget {
        method: "GET".to_string(),
        url,
        headers: BTreeMap::new(),
        body: None,
        expected_status: Vec::new(),
        timeout: None,
        callback: false,
    }
}

fn info() -> RunInfo {
    RunInfo {
        attempt_id: 1,
        run_id: 42,
        attempt: 2,
        scheduled_for: Utc
            .with_ymd_and_hms(2026, 1, 2, 3, 4, 5)
            .single()
            .expect("valid instant"),
        job: "ping".to_string(),
        completion: None,
        event: None,
        shard: None,
        secret_headers: Vec::new(),
        params: Default::default(),
        traceparent: None,
    }
}

/// A client under the policy that restricts nothing.
fn open_client() -> TargetClient {
    TargetClient::new(SharedPolicy::new(EgressPolicy::default()), "sked-test")
        .expect("an HTTP client")
}

async fn run(target: &HttpTarget, options: &ExecOptions) -> (ExecResult, String) {
    run_with(&open_client(), target, options).await
}

async fn run_with(
    client: &TargetClient,
    target: &HttpTarget,
    options: &ExecOptions,
) -> (ExecResult, String) {
    run_as(client, target, &info(), options).await
}

async fn run_as(
    client: &TargetClient,
    target: &HttpTarget,
    info: &RunInfo,
    options: &ExecOptions,
) -> (ExecResult, String) {
    let (_stop, signal) = stop_channel();
    let output = OutputBuffer::new(1 << 20);
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        http::run(client, target, info, options, signal, &output),
    )
    .await
    .expect("the executor ends in bounded time");
    let text = String::from_utf8_lossy(&output.take(usize::MAX)).into_owned();
    (result, text)
}

#[tokio::test]
async fn a_run_an_event_started_sends_the_event_unless_the_target_has_a_body() {
    let base = server().await;
    let mut echo = target(format!("{base}/echo"));
    echo.method = "POST".to_string();
    let started = RunInfo {
        event: Some(sked_core::event::RunEvent {
            key: "sales.ready".into(),
            id: "2026-11-24".into(),
            payload: serde_json::json!({"rows": 3}),
        }),
        ..info()
    };
    let options = ExecOptions::default();
    let (result, text) = run_as(&open_client(), &echo, &started, &options).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    for line in [
        "x-sked-event-key=sales.ready",
        "x-sked-event-id=2026-11-24",
        "content-type=application/json",
        "body={\"rows\":3}",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    echo.body = Some("its own".to_string());
    let (_, text) = run_as(&open_client(), &echo, &started, &options).await;
    assert!(text.lines().any(|l| l == "body=its own"), "{text}");
    assert!(text.lines().any(|l| l == "content-type=-"), "{text}");
}

#[tokio::test]
async fn a_2xx_succeeds_and_the_body_is_logged() {
    let base = server().await;
    let (result, text) = run(&target(format!("{base}/ok")), &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(result.http_status, Some(200));
    assert_eq!(result.error, None);
    assert_eq!(text, "hello");
}

#[tokio::test]
async fn expected_status_decides() {
    let base = server().await;
    let (result, text) = run(
        &target(format!("{base}/status/500")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.http_status, Some(500));
    assert_eq!(result.error.as_deref(), Some("unexpected HTTP status 500"));
    assert_eq!(text, "status 500");

    let mut accepted = target(format!("{base}/status/404"));
    accepted.expected_status = vec![404, 410];
    let (result, _) = run(&accepted, &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(result.http_status, Some(404));

    let mut strict = target(format!("{base}/ok"));
    strict.expected_status = vec![201];
    let (result, _) = run(&strict, &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.http_status, Some(200));
}

#[tokio::test]
async fn method_headers_and_body_are_sent() {
    let base = server().await;
    let mut t = target(format!("{base}/echo"));
    t.method = "post".to_string();
    t.headers.insert("X-Custom".to_string(), "yes".into());
    // The run's own headers win over the job's.
    t.headers.insert("X-Sked-Run-Id".to_string(), "7".into());
    t.body = Some("payload".to_string());
    let (result, text) = run(&t, &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(
        text,
        "method=POST\nx-sked-run-id=42\nx-sked-attempt=2\n\
         x-sked-scheduled-for=2026-01-02T03:04:05Z\nx-sked-job=ping\nx-custom=yes\n\
         x-sked-event-key=-\nx-sked-event-id=-\ntraceparent=-\ncontent-type=-\nbody=payload"
    );
}

#[tokio::test]
async fn a_traced_attempt_sends_its_trace_context_over_the_jobs_own() {
    let base = server().await;
    let mut t = target(format!("{base}/echo"));
    t.headers.insert(
        "traceparent".to_string(),
        "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01".into(),
    );
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let traced = RunInfo {
        traceparent: Some(traceparent.to_string()),
        ..info()
    };
    let (result, text) = run_as(&open_client(), &t, &traced, &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert!(
        text.contains(&format!("\ntraceparent={traceparent}\n")),
        "{text}"
    );
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let base = server().await;
    let options = ExecOptions {
        timeout: Some(Duration::from_millis(300)),
        ..ExecOptions::default()
    };
    let started = Instant::now();
    let (result, _) = run(&target(format!("{base}/slow")), &options).await;
    assert_eq!(result.outcome, AttemptOutcome::TimedOut);
    assert_eq!(result.http_status, None);
    assert_eq!(result.error.as_deref(), Some("timed out after 300ms"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn the_targets_own_timeout_applies_when_shorter() {
    let base = server().await;
    let mut t = target(format!("{base}/slow"));
    t.timeout = Some(HumanDuration(Duration::from_millis(200)));
    let options = ExecOptions {
        timeout: Some(Duration::from_secs(30)),
        ..ExecOptions::default()
    };
    let started = Instant::now();
    let (result, log) = run(&t, &options).await;
    assert_eq!(result.outcome, AttemptOutcome::TimedOut, "{log}");
    assert!(started.elapsed() < Duration::from_secs(5), "{log}");
    assert!(log.contains("timed out after"), "{log}");
}

#[tokio::test]
async fn a_stop_cancels_the_request() {
    let base = server().await;
    let client = open_client();
    let (stop, signal) = stop_channel();
    let output = OutputBuffer::new(1 << 20);
    let t = target(format!("{base}/slow"));
    let options = ExecOptions::default();
    let info = info();
    let started = Instant::now();
    let (result, ()) = tokio::join!(
        http::run(&client, &t, &info, &options, signal, &output),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop.stop();
        }
    );
    assert_eq!(result.outcome, AttemptOutcome::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn the_logged_body_is_capped() {
    let base = server().await;
    let options = ExecOptions {
        http_body_cap: 1000,
        ..ExecOptions::default()
    };
    let (result, text) = run(&target(format!("{base}/big")), &options).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert!(text.starts_with(&"x".repeat(1000)), "{}", text.len());
    assert!(!text.starts_with(&"x".repeat(1001)));
    assert!(text.contains("truncated to 1000 bytes"), "{text}");
}

#[tokio::test]
async fn an_unreachable_url_fails() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    let (result, text) = run(&target(format!("http://{addr}/")), &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.http_status, None);
    assert!(result
        .error
        .is_some_and(|e| e.starts_with("request failed")));
    assert!(text.contains("request failed"), "{text}");
}

#[tokio::test]
async fn a_bad_header_fails_without_sending() {
    let base = server().await;
    let mut t = target(format!("{base}/ok"));
    t.headers.insert("bad header".to_string(), "x".into());
    let (result, _) = run(&t, &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert!(result
        .error
        .is_some_and(|e| e.contains("not a valid header name")));
}

// --- the HTTP target policy ---------------------------------------------------------------

/// A server that counts the requests it gets, with redirects to wherever a test says.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route(
            "/redirect/{*to}",
            get(|Path(to): Path<String>| async move { Redirect::temporary(&format!("http://{to}")) }),
        )
        .route(
            "/hop/{n}",
            get(|Path(n): Path<u32>| async move { Redirect::temporary(&format!("/hop/{}", n + 1)) }),
        )
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                counted.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let port = listener.local_addr().expect("local address").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, hits)
}

fn client_under(allow: &[&str], deny: &[&str], internal_allowed: bool) -> TargetClient {
    let rules = |texts: &[&str]| {
        texts
            .iter()
            .map(|t| t.parse().expect("a rule"))
            .collect::<Vec<_>>()
    };
    let policy = EgressPolicy {
        allow: rules(allow),
        deny: rules(deny),
        internal_allowed,
    };
    TargetClient::new(SharedPolicy::new(policy), "sked-test").expect("an HTTP client")
}

fn error_of(result: &ExecResult) -> &str {
    result.error.as_deref().unwrap_or_default()
}

#[tokio::test]
async fn an_internal_address_is_refused_without_a_connection() {
    let (port, hits) = counting_server().await;
    let client = client_under(&[], &[], false);
    for url in [
        format!("http://127.0.0.1:{port}/ok"),
        format!("http://localhost:{port}/ok"),
        format!("http://[::ffff:127.0.0.1]:{port}/ok"),
    ] {
        let (result, log) = run_with(&client, &target(url.clone()), &ExecOptions::default()).await;
        assert_eq!(result.outcome, AttemptOutcome::Failed, "{url}: {log}");
        assert_eq!(result.http_status, None);
        let error = error_of(&result);
        assert!(
            error.starts_with("refused by the HTTP target policy: ")
                && error.contains("is a loopback address; allow it with --http-target-allow"),
            "{url}: {error}"
        );
        assert!(log.contains("refused by the HTTP target policy"), "{log}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "no request reached the server"
    );
}

#[tokio::test]
async fn allowed_networks_and_hosts_are_reached() {
    let (port, hits) = counting_server().await;
    let by_address = client_under(&["127.0.0.1/32"], &[], false);
    let (result, log) = run_with(
        &by_address,
        &target(format!("http://127.0.0.1:{port}/ok")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded, "{log}");
    // The host named by an allow rule may be internal, whatever it resolves to.
    let by_name = client_under(&["localhost"], &[], false);
    let (result, log) = run_with(
        &by_name,
        &target(format!("http://localhost:{port}/ok")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded, "{log}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_address_deny_beats_an_allowed_host() {
    let (port, hits) = counting_server().await;
    let client = client_under(&["localhost"], &["127.0.0.0/8", "::1"], true);
    let (result, log) = run_with(
        &client,
        &target(format!("http://localhost:{port}/ok")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Failed, "{log}");
    assert!(
        error_of(&result).contains("(the address of localhost) is denied by the rule"),
        "{result:?}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn every_redirect_hop_is_judged() {
    let (port, hits) = counting_server().await;
    let client = client_under(&["127.0.0.1/32"], &["localhost"], false);
    // Allowed address -> denied name.
    let (result, log) = run_with(
        &client,
        &target(format!(
            "http://127.0.0.1:{port}/redirect/localhost:{port}/ok"
        )),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Failed, "{log}");
    assert_eq!(
        error_of(&result),
        format!(
            "refused by the HTTP target policy: host localhost is denied by the rule localhost \
             (redirected from http://127.0.0.1:{port}/redirect/localhost:{port}/ok)"
        )
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "only the first hop was sent"
    );
    // Allowed address -> an internal IP literal no resolver sees.
    let (result, _) = run_with(
        &client,
        &target(format!(
            "http://127.0.0.1:{port}/redirect/169.254.169.254/latest/meta-data/"
        )),
        &ExecOptions::default(),
    )
    .await;
    assert!(
        error_of(&result).contains("169.254.169.254 is a link-local address"),
        "{result:?}"
    );
    // reqwest's limit of 10 redirects still holds.
    let before = hits.load(Ordering::SeqCst);
    let (result, _) = run_with(
        &client,
        &target(format!("http://127.0.0.1:{port}/hop/0")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert!(error_of(&result).contains("redirect"), "{result:?}");
    assert_eq!(hits.load(Ordering::SeqCst) - before, 11);
}

/// A worker that registers again may get another policy: the client's resolver reads it at
/// once, and a new client (which the worker builds) drops connections pooled under the old one.
#[tokio::test]
async fn a_new_policy_applies_at_once() {
    let (port, hits) = counting_server().await;
    let (other_port, other_hits) = counting_server().await;
    let client = open_client();
    let url = format!("http://localhost:{port}/ok");
    let (result, log) = run_with(&client, &target(url.clone()), &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded, "{log}");
    let restricted = EgressPolicy {
        internal_allowed: false,
        ..EgressPolicy::default()
    };
    assert!(client.policy().replace(restricted.clone()));
    assert!(!client.policy().replace(restricted), "no change");
    let (result, log) = run_with(
        &client,
        &target(format!("http://localhost:{other_port}/ok")),
        &ExecOptions::default(),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Failed, "{log}");
    let fresh = TargetClient::new(client.policy().clone(), "sked-test").expect("an HTTP client");
    let (result, log) = run_with(&fresh, &target(url), &ExecOptions::default()).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed, "{log}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
}

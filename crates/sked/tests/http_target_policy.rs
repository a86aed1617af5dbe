//! The HTTP target policy through the real binary: `sked server` keeps HTTP targets off
//! internal addresses unless allowed, the worker refuses after resolving a name (and the target
//! never hears of it), allow and deny rules decide, a redirect hop is judged like the first
//! request and carries no secret header to another origin, a URL the policy refuses by itself
//! is refused when the job is written, and so is every IPv6 form of an internal IPv4 address.

mod common;

use axum::extract::Path;
use axum::response::Redirect;
use axum::routing::get;
use common::Sked;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A local HTTP server that counts every request it gets; `/redirect/HOST:PORT/PATH` sends the
/// client on to `http://HOST:PORT/PATH`.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app =
        axum::Router::new()
            .route("/ok", get(|| async { "fine" }))
            .route(
                "/redirect/{*to}",
                get(|Path(to): Path<String>| async move {
                    Redirect::temporary(&format!("http://{to}"))
                }),
            )
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    next.run(request)
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the target");
    let port = listener.local_addr().expect("target address").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, hits)
}

fn http_job(url: &str) -> Value {
    json!({"target": {"http": {"url": url}}})
}

/// Defines the job, runs it once and returns the finished run.
async fn run_once(sked: &Sked, name: &str, url: &str) -> Value {
    let (status, answer) = sked.put_job(name, http_job(url)).await;
    assert_eq!(status, 201, "{answer}");
    let (status, run) = sked.post(&format!("/jobs/{name}/trigger"), json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("a run id");
    sked.wait_finished(id, Duration::from_secs(20)).await
}

fn attempt_error(run: &Value) -> String {
    run["attempt_history"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Asserts that writing a job with `url` is refused for its URL, saying `why`.
async fn refused_at_write(sked: &Sked, url: &str, why: &str) {
    let (status, answer) = sked.put_job("refused", http_job(url)).await;
    assert_eq!(status, 400, "{url}: {answer}");
    assert_eq!(answer["error"]["field"], "target.http.url", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("refused by the HTTP target policy") && message.contains(why),
        "{url}: {message}"
    );
}

#[tokio::test]
async fn a_server_keeps_http_targets_off_internal_addresses_by_default() {
    let (port, hits) = counting_server().await;
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 2);

    // A name passes the write; the worker refuses it once it resolves to loopback.
    let run = run_once(&sked, "local", &format!("http://localhost:{port}/ok")).await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = attempt_error(&run);
    assert!(
        error.starts_with("refused by the HTTP target policy: ")
            && error.contains("(the address of localhost) is a loopback address")
            && error.contains("--http-target-allow"),
        "{run}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the target got no request");

    // An IP literal says enough by itself: refused when the job is written.
    refused_at_write(
        &sked,
        "http://169.254.169.254/latest/meta-data/",
        "169.254.169.254 is a link-local address",
    )
    .await;
    refused_at_write(&sked, &format!("http://127.0.0.1:{port}/ok"), "loopback").await;
    refused_at_write(&sked, "http://[::1]/", "loopback").await;
    let (status, _) = sked.get("/jobs/refused").await;
    assert_eq!(status, 404, "nothing was written");
}

#[tokio::test]
async fn allow_and_deny_rules_decide_for_every_hop() {
    let (port, hits) = counting_server().await;
    let mut sked = Sked::new();
    sked.start_server(&[
        "--http-target-allow",
        "127.0.0.1/32",
        "--http-target-deny",
        "localhost",
    ])
    .await;
    sked.start_worker("w", 2);

    let run = run_once(&sked, "allowed", &format!("http://127.0.0.1:{port}/ok")).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(run["attempt_history"][0]["http_status"], 200, "{run}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // From an allowed address to a denied name: the hop is refused before it is requested.
    let run = run_once(
        &sked,
        "redirected",
        &format!("http://127.0.0.1:{port}/redirect/localhost:{port}/ok"),
    )
    .await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = attempt_error(&run);
    assert!(
        error.starts_with(
            "refused by the HTTP target policy: host localhost is denied by the rule localhost"
        ) && error.contains("redirected from"),
        "{run}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "only the redirect itself was requested"
    );

    refused_at_write(
        &sked,
        &format!("http://localhost:{port}/ok"),
        "host localhost is denied by the rule localhost",
    )
    .await;
}

/// What a capturing server got: each request's path and headers.
type Captured = Arc<std::sync::Mutex<Vec<(String, std::collections::BTreeMap<String, String>)>>>;

/// A local HTTP server that records every request to `/capture` and sends any request to
/// `/redirect/HOST:PORT/PATH` on to `http://HOST:PORT/PATH` (307: same method, same body).
async fn capturing_server() -> (u16, Captured) {
    let got: Captured = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new()
        .route(
            "/capture",
            axum::routing::any(
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let seen = seen.clone();
                    async move {
                        let headers = headers
                            .iter()
                            .map(|(k, v)| {
                                (k.to_string(), v.to_str().unwrap_or_default().to_string())
                            })
                            .collect();
                        seen.lock().expect("lock").push((uri.to_string(), headers));
                        "captured"
                    }
                },
            ),
        )
        .route(
            "/redirect/{*to}",
            axum::routing::any(|Path(to): Path<String>| async move {
                Redirect::temporary(&format!("http://{to}"))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, got)
}

#[tokio::test]
async fn a_redirect_to_another_origin_carries_no_secret_header() {
    let (a, got_a) = capturing_server().await;
    let (b, got_b) = capturing_server().await;
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, answer) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/secrets/api-token"),
        Some(json!({"value": "from-a-reference"})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let headers = json!({
        "X-Api-Key": {"secret": "sealed-api-key"},
        "X-Token": {"secret_ref": "api-token"},
        "Authorization": "Bearer given-in-clear",
        "Cookie": "session=given-in-clear",
        "X-Plain": "visible"
    });
    let job = |url: String| json!({"target": {"http": {"url": url, "headers": headers.clone()}}});
    for (name, url) in [
        (
            "elsewhere",
            format!("http://127.0.0.1:{a}/redirect/127.0.0.1:{b}/capture"),
        ),
        (
            "same-origin",
            format!("http://127.0.0.1:{a}/redirect/127.0.0.1:{a}/capture"),
        ),
    ] {
        let (status, answer) = sked.put_job(name, job(url)).await;
        assert_eq!(status, 201, "{answer}");
        let (_, run) = sked.post(&format!("/jobs/{name}/trigger"), json!({})).await;
        let id = run["id"].as_i64().expect("a run id");
        let run = sked.wait_finished(id, Duration::from_secs(20)).await;
        assert_eq!(run["state"], "succeeded", "{run}");
    }
    let elsewhere = got_b.lock().expect("lock").clone();
    assert_eq!(elsewhere.len(), 1, "{elsewhere:?}");
    let sent = &elsewhere[0].1;
    assert_eq!(
        sent.get("x-plain").map(String::as_str),
        Some("visible"),
        "{sent:?}"
    );
    for dropped in ["x-api-key", "x-token", "authorization", "cookie"] {
        assert!(
            !sent.contains_key(dropped),
            "{dropped} went to another origin: {sent:?}"
        );
    }
    // Within one origin, the request keeps what the job gave it.
    let same = got_a.lock().expect("lock").clone();
    assert_eq!(same.len(), 1, "{same:?}");
    let kept = &same[0].1;
    assert_eq!(
        kept.get("x-api-key").map(String::as_str),
        Some("sealed-api-key")
    );
    assert_eq!(
        kept.get("x-token").map(String::as_str),
        Some("from-a-reference")
    );
    assert_eq!(
        kept.get("authorization").map(String::as_str),
        Some("Bearer given-in-clear")
    );
}

#[tokio::test]
async fn every_ipv6_form_of_an_internal_ipv4_address_is_refused() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    for (url, kind) in [
        ("http://[::127.0.0.1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[64:ff9b::7f00:1]/", "loopback"),
        (
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
            "link-local",
        ),
        ("http://[64:ff9b:1::7f00:1]/", "local-use NAT64"),
        ("http://[2002:7f00:1::]/", "loopback"),
        ("http://[2002:a00:1::1]/", "private"),
        ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "loopback"),
    ] {
        refused_at_write(&sked, url, kind).await;
    }
    // The public address behind a NAT64 form is reachable as it would be itself.
    let (status, answer) = sked
        .put_job("public", http_job("http://[64:ff9b::808:808]/"))
        .await;
    assert_eq!(status, 201, "{answer}");
}

//! An HTTP target with `callback`, black-box: the endpoint takes the work (202), the run stays
//! `running` holding its worker's slot, and the endpoint's later report to the address the
//! request carried ends it; without a report, the job's timeout does. Reports with made-up
//! tokens are refused, and an address that sends many is slowed down.

mod common;

use common::{report_completion as report, Sked};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// An endpoint that takes every request with 202 and passes on the completion address it
/// carried.
async fn endpoint() -> (String, mpsc::UnboundedReceiver<(String, String)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/start",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let tx = tx.clone();
            async move {
                let get = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                let _ = tx.send((get("sked-complete-url"), get("sked-complete-token")));
                (axum::http::StatusCode::ACCEPTED, "started")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/start"), rx)
}

#[tokio::test]
async fn an_http_callback_ends_its_run_when_the_endpoint_reports_or_at_the_timeout() {
    let (url, mut started) = endpoint().await;
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "1"]).await;
    let job = json!({
        "timeout": "4s",
        "target": {"http": {"method": "POST", "url": url, "callback": true}}
    });
    let (status, body) = sked.put_job("export", job).await;
    assert_eq!(status, 201, "{body}");

    // The endpoint took the work: the run waits for its report.
    let a = sked.trigger("export").await;
    let (complete_url, token) = tokio::time::timeout(Duration::from_secs(20), started.recv())
        .await
        .expect("the request reached the endpoint")
        .expect("a request");
    assert_eq!(
        complete_url,
        format!("{}/api/v1/runs/{a}/complete", sked.base())
    );
    assert!(token.starts_with("c2.") && token.len() > 40, "{token}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let run = sked.run(a).await;
    assert_eq!(run["state"], "running", "{run}");
    assert_eq!(run["attempt_history"][0]["http_status"], Value::Null);

    // Made-up tokens are refused, and past 20 refusals in a second an address is answered 429
    // for its made-up tokens without the store being read, until its second is over; nothing
    // changes meanwhile.
    let mut statuses = Vec::new();
    for i in 0..30 {
        let made_up = match i % 3 {
            0 => format!("c1.{i:064}"),
            1 => format!("c2.{i}.1.{}", "A".repeat(43)),
            _ => "not a token".to_string(),
        };
        let (status, _) = report(
            &complete_url,
            json!({"token": made_up, "outcome": "failed"}),
        )
        .await;
        statuses.push(status);
    }
    let refused = statuses.iter().filter(|s| **s == 403 || **s == 404).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((refused, limited), (20, 10), "{statuses:?}");
    assert_eq!(sked.run(a).await["state"], "running");

    // Only refusals are held back: within that same second, the run's own token is heard
    // from the same address (sent to another run, it is refused as such, not throttled).
    let (status, _) = report(
        &format!("{}/api/v1/runs/987654321/complete", sked.base()),
        json!({"token": token, "outcome": "failed"}),
    )
    .await;
    assert_eq!(
        status, 404,
        "a genuine token is told apart before any limit"
    );
    let (status, run) = report(
        &complete_url,
        json!({"token": token, "outcome": "succeeded", "message": "exported 7 files"}),
    )
    .await;
    assert_eq!(
        (status, run["state"].as_str()),
        (200, Some("succeeded")),
        "{run}"
    );

    // The worker lets the slot go once it learns the run ended: its one slot takes the next
    // run, which nobody reports, so the job's timeout ends it.
    let b = sked.trigger("export").await;
    let (b_url, b_token) = tokio::time::timeout(Duration::from_secs(20), started.recv())
        .await
        .expect("the next run reached the endpoint: the slot was let go")
        .expect("a request");
    let deadline = Instant::now() + Duration::from_secs(30);
    let b_run = loop {
        let run = sked.run(b).await;
        if run["state"] != "running" && run["state"] != "queued" {
            break run;
        }
        assert!(Instant::now() < deadline, "run {b} never ended: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(b_run["state"], "timed_out", "{b_run}");
    let error = b_run["error"].as_str().unwrap_or_default();
    assert!(error.contains("no report of the outcome"), "{error}");
    let (status, _) = report(&b_url, json!({"token": b_token, "outcome": "succeeded"})).await;
    assert_eq!(status, 409, "a report after the timeout changes nothing");
    assert_eq!(sked.run(b).await["state"], "timed_out");
    assert_eq!(sked.run(a).await["state"], "succeeded");
}

//! Failing, slow and hung jobs through the real binary: retries with growing delays, timeouts
//! that kill the whole process group, and HTTP targets with expected and unexpected statuses.

mod common;

use common::{instant, shell, Sked};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_failing_job_is_retried_with_growing_delays_then_fails() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({
        "target": shell("echo attempt $SKED_ATTEMPT; exit 1"),
        "retry": {"max_attempts": 3, "backoff": {"initial": "500ms", "multiplier": 2.0, "jitter": false}},
    });
    assert_eq!(sked.put_job("flaky", job).await.0, 201);
    let id = sked.trigger("flaky").await;
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert_eq!(run["failures"], 3, "{run}");
    let attempts = run["attempt_history"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{run}");
    assert!(
        attempts
            .iter()
            .all(|a| a["state"] == "failed" && a["exit_code"] == 1),
        "{run}"
    );
    let starts: Vec<_> = attempts.iter().map(|a| instant(&a["started_at"])).collect();
    let ends: Vec<_> = attempts
        .iter()
        .map(|a| instant(&a["finished_at"]))
        .collect();
    let first_delay = starts[1] - ends[0];
    let second_delay = starts[2] - ends[1];
    assert!(
        first_delay >= chrono::Duration::milliseconds(450),
        "{first_delay}"
    );
    assert!(
        second_delay >= chrono::Duration::milliseconds(950),
        "{second_delay}"
    );
    assert!(
        second_delay > first_delay,
        "delays grow: {first_delay} then {second_delay}"
    );
    let log = sked
        .http
        .get(sked.url(&format!("/runs/{id}/log?attempt=2")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(log, "attempt 2\n");
    let (_, stats) = sked.get("/jobs/flaky/stats").await;
    assert_eq!(stats["retries"], 2, "{stats}");
}

/// The processes running `sleep <marker>`, described by pid, parent, process group and state
/// (from /proc), so a survivor says where it came from.
fn sleeps_alive(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.trim() == format!("sleep {marker}") {
                let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
                // pid (comm) state ppid pgrp ...
                let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
                let fields: Vec<&str> = after.split_whitespace().take(3).collect();
                found.push(format!(
                    "pid {} state {:?} ppid {:?} pgrp {:?}",
                    entry.file_name().to_string_lossy(),
                    fields.first(),
                    fields.get(1),
                    fields.get(2)
                ));
            }
        }
    }
    found
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // A duration of its own, so only this test's processes are counted.
    let marker = format!("60.{:06}", chrono::Utc::now().timestamp_subsec_micros());
    let command = format!("sh -c 'sleep {marker} & sleep {marker}'");
    let job = json!({"target": shell(&command), "timeout": "1s"});
    assert_eq!(sked.put_job("hung", job).await.0, 201);
    let started = Instant::now();
    let id = sked.trigger("hung").await;
    let run = sked.wait_finished(id, Duration::from_secs(15)).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    // Give the kernel a moment to reap, then none of them may be left.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !sleeps_alive(&marker).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let survivors = sleeps_alive(&marker);
    assert!(
        survivors.is_empty(),
        "sleep processes survived the timeout: {survivors:?}; run {run}"
    );
}

#[tokio::test]
async fn http_targets_check_status_and_time_out() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/ok", get(|| async { "fine" }))
        .route(
            "/fail",
            get(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "broken") }),
        )
        .route(
            "/created",
            get(|| async { (axum::http::StatusCode::CREATED, "made") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let target = |path: &str, expected: Value| json!({"http": {"url": format!("http://{addr}{path}"), "expected_status": expected}});
    sked.put_job("ok", json!({"target": target("/ok", json!([]))}))
        .await;
    sked.put_job("fail", json!({"target": target("/fail", json!([]))}))
        .await;
    sked.put_job(
        "created",
        json!({"target": target("/created", json!([201]))}),
    )
    .await;
    sked.put_job("unexpected", json!({"target": target("/ok", json!([204]))}))
        .await;
    sked.put_job(
        "slow",
        json!({"target": target("/slow", json!([])), "timeout": "1s"}),
    )
    .await;

    let cases = [
        ("ok", "succeeded", Some(200)),
        ("fail", "failed", Some(500)),
        ("created", "succeeded", Some(201)),
        ("unexpected", "failed", Some(200)),
        ("slow", "timed_out", None),
    ];
    for (job, state, status) in cases {
        let id = sked.trigger(job).await;
        let run = sked.wait_finished(id, Duration::from_secs(15)).await;
        assert_eq!(run["state"], state, "{job}: {run}");
        let attempt = &run["attempt_history"][0];
        match status {
            Some(code) => assert_eq!(attempt["http_status"], code, "{job}: {run}"),
            None => assert!(attempt["http_status"].is_null(), "{job}: {run}"),
        }
    }
}

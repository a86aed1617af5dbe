//! The dead-man's switch, black-box: a heartbeat job's runs wait for pings; one that gets none
//! within its grace fails and alerts, pings by token or by the job's ping address answer the
//! next ones, which alerts the recovery; and the ping address is bounded like every open route.

mod common;

use common::{client_for, Sked};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A webhook receiver that keeps each body it is sent.
async fn receiver() -> (Arc<Mutex<Vec<Value>>>, String) {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push(body);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (got, format!("http://{addr}/hook"))
}

/// Waits for a notification of `event`; returns its body.
async fn notified(got: &Arc<Mutex<Vec<Value>>>, event: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(body) = got
            .lock()
            .unwrap()
            .iter()
            .find(|b| b["event"] == event)
            .cloned()
        {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "no {event} notification; got {:?}",
            got.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_missing_ping_fails_and_alerts_and_pings_bring_the_job_back() {
    let (got, hook) = receiver().await;
    let mut sked = Sked::new();
    sked.start_dev(&["--require-token"]).await;
    let job = json!({
        "schedule": {"every": "2s"},
        "target": {"heartbeat": {"grace": "1s"}},
        "notify": [{"on": ["failed", "recovered"], "webhook": {"url": hook}}]
    });
    let (status, body) = sked.put_job("nightly-backup", job).await;
    assert_eq!(status, 201, "{body}");

    // Nobody pings: a run fails, saying so, and the failure is notified.
    let failed = notified(&got, "failed", Duration::from_secs(15)).await;
    let run = sked.run(failed["run_id"].as_i64().unwrap()).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert_eq!(run["error"], "no ping within 1s of its instant", "{run}");
    assert_eq!(run["attempts"], 0, "no worker ran it: {run}");

    // A script pings by the job's address, with no token, every half second.
    let (status, address) = sked.get("/jobs/nightly-backup/ping-url").await;
    assert_eq!(status, 200, "{address}");
    let url = address["url"].as_str().unwrap().to_string();
    assert!(
        url.starts_with(&sked.base()) && url.contains("/ping/p1."),
        "{url}"
    );
    let anonymous = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while got
        .lock()
        .unwrap()
        .iter()
        .all(|b| b["event"] != "recovered")
    {
        assert!(
            Instant::now() < deadline,
            "no recovery: {:?}",
            got.lock().unwrap()
        );
        let resp = anonymous.post(&url).send().await.expect("ping");
        assert_eq!(resp.status().as_u16(), 200);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["job"], "nightly-backup");
        // A ping answers a waiting run, naming it, or is kept for the next run to credit:
        // which depends on where in the period it falls.
        match answer["outcome"].as_str() {
            Some("answered") => assert!(answer["run_id"].is_i64(), "{answer}"),
            Some("kept") => assert!(answer["run_id"].is_null(), "{answer}"),
            _ => panic!("{answer}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let recovered = notified(&got, "recovered", Duration::ZERO).await;
    assert_eq!(
        sked.run(recovered["run_id"].as_i64().unwrap()).await["state"],
        "succeeded"
    );

    // With a token: an emitter may ping, a viewer may not.
    let emitter = client_for(
        &sked,
        "pinger",
        json!({"role": "emitter", "namespaces": ["default"]}),
    )
    .await;
    let (status, answer) = common::call(
        &emitter,
        reqwest::Method::POST,
        sked.url("/jobs/nightly-backup/ping"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(["answered", "kept"].contains(&answer["outcome"].as_str().unwrap()));
    let viewer = client_for(
        &sked,
        "looker",
        json!({"role": "viewer", "namespaces": ["default"]}),
    )
    .await;
    let (status, _) = common::call(
        &viewer,
        reqwest::Method::POST,
        sked.url("/jobs/nightly-backup/ping"),
        None,
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn ping_addresses_open_only_their_job_and_refuse_floods() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let heartbeat = json!({"schedule": {"every": "1h"}, "target": {"heartbeat": {}}});
    let (status, body) = sked.put_job("hb", heartbeat).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = sked
        .put_job("plain", json!({"target": common::shell("true")}))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = sked.post("/jobs/plain/ping", json!(null)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_a_heartbeat"))
    );
    let (status, _) = sked.get("/jobs/plain/ping-url").await;
    assert_eq!(status, 409);
    // No run waits yet (the first instant is an hour away): the ping is kept.
    let (status, body) = sked.post("/jobs/hb/ping", json!(null)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("kept")),
        "{body}"
    );

    // A heartbeat job needs a schedule, and its grace is bounded.
    for (job, field) in [
        (json!({"target": {"heartbeat": {}}}), "schedule"),
        (
            json!({"schedule": {"every": "1h"}, "target": {"heartbeat": {"grace": "0s"}}}),
            "target.heartbeat.grace",
        ),
    ] {
        let (status, body) = sked.put_job("bad-hb", job).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }

    let (_, address) = sked.get("/jobs/hb/ping-url").await;
    let url = address["url"].as_str().unwrap().to_string();
    let anonymous = reqwest::Client::new();
    // Another job's id under this job's tag, and made-up tokens, open nothing.
    let forged = url.replacen("/ping/p1.1.", "/ping/p1.2.", 1);
    assert_ne!(forged, url, "{url}");
    let resp = anonymous.post(&forged).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let mut statuses = Vec::new();
    for i in 0..40 {
        let resp = anonymous
            .post(format!("{}/ping/p1.{i}.made-up", sked.base()))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert!(
        statuses.contains(&404) && statuses.contains(&429),
        "{statuses:?}"
    );
    let too_long = format!("{}/ping/{}", sked.base(), "p".repeat(4000));
    let status = anonymous.post(&too_long).send().await.unwrap().status();
    assert!(status.is_client_error(), "{status}");

    // The real address works, within the job's rate: a flood of one job's pings is refused.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut outcomes = Vec::new();
    for _ in 0..40 {
        outcomes.push(anonymous.post(&url).send().await.unwrap().status().as_u16());
    }
    assert_eq!(outcomes[0], 200, "{outcomes:?}");
    assert!(outcomes.contains(&429), "{outcomes:?}");
}

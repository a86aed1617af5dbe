//! Followed logs through the real binary: a follow ends as soon as its client goes, and
//! follows beyond the server's bound are refused with 429 and `Retry-After`.

mod common;

use common::{shell, Sked};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[tokio::test]
async fn abandoned_follows_end_and_extra_ones_are_refused() {
    let mut sked = Sked::new();
    sked.start_dev(&["--max-log-follows", "4"]).await;
    let job = json!({"target": shell("echo started; sleep 30")});
    assert_eq!(sked.put_job("long", job).await.0, 201);
    let (status, run) = sked.post("/jobs/long/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("run id");
    let url = sked.url(&format!("/runs/{id}/log?follow=true"));

    // Each follower on a client of its own, so dropping it closes its connection.
    let mut open = Vec::new();
    for _ in 0..4 {
        let client = reqwest::Client::new();
        let mut resp = client.get(&url).send().await.expect("follow");
        assert_eq!(resp.status().as_u16(), 200);
        // Everything the run will print for 30 s has arrived: from here on, only the
        // client's going can end the follow.
        let first = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("output within 10 s")
            .expect("a chunk");
        assert_eq!(first.as_deref(), Some(&b"started\n"[..]));
        open.push((client, resp));
    }
    assert_eq!(sked.metric("sked_log_follows").await, 4);
    let resp = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect("fifth follow");
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"), "{resp:?}");
    let body: Value = resp.json().await.expect("error body");
    assert_eq!(body["error"]["code"], "too_many_follows", "{body}");

    // The clients go while the run still runs and prints nothing: their follows end.
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sked.metric("sked_log_follows").await > 0 {
        assert!(
            Instant::now() < deadline,
            "abandoned follows still polling: {}",
            sked.metric("sked_log_follows").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resp = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect("follow again");
    assert_eq!(
        resp.status().as_u16(),
        200,
        "room again after the others left"
    );
}

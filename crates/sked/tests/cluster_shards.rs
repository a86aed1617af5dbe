//! Sharded and broadcast jobs on a cluster: two `sked server` nodes on one PostgreSQL schema,
//! the one worker polling only the second. Instants recorded by either node (triggers sent to
//! the first, and a schedule fired by whichever node holds its partition) reach the second
//! node's queue with every shard, so each shard runs, once; a broadcast recorded by the first
//! node is pinned to the worker that only the second knows.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the test is reported as ignored (see build.rs),
//! and under CI it runs, so a missing database fails it.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{free_port, shell, Proc};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NODE_START: Duration = Duration::from_secs(60);

/// Every run of `job`, as the node at `base` lists them.
async fn runs(http: &reqwest::Client, base: &str, job: &str) -> Vec<Value> {
    let url = format!("{base}/api/v1/jobs/{job}/runs?limit=1000");
    let page: Value = http
        .get(url)
        .send()
        .await
        .expect("list runs")
        .json()
        .await
        .expect("runs");
    page["runs"].as_array().cloned().unwrap_or_default()
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn every_shard_reaches_the_node_its_worker_polls() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, NODE_START).await;
    b.ready(&http, NODE_START).await;
    let (first, second) = (a.base(), b.base());
    let _worker = Proc::spawn(
        "worker",
        &["worker", "--server", &second, "--slots", "8"],
        &logs.file("worker"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list: Value = http
            .get(format!("{first}/api/v1/workers"))
            .send()
            .await
            .expect("workers")
            .json()
            .await
            .expect("workers");
        if list["workers"].as_array().is_some_and(|w| !w.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jobs = [
        (
            "split",
            json!({"target": shell("echo $SKED_SHARD"), "shards": 3}),
        ),
        (
            "ticking",
            json!({"target": shell("true"), "shards": 2, "schedule": {"every": "1s"}}),
        ),
        (
            "everywhere",
            json!({"target": shell("true"), "broadcast": true}),
        ),
    ];
    for (name, job) in &jobs {
        let resp = http
            .put(format!("{first}/api/v1/jobs/{name}"))
            .json(job)
            .send()
            .await
            .expect("PUT the job");
        assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
    }
    for (name, count) in [("split", 3), ("everywhere", 1)] {
        for _ in 0..3 {
            let resp = http
                .post(format!("{first}/api/v1/jobs/{name}/trigger"))
                .send()
                .await
                .expect("trigger");
            assert_eq!(resp.status().as_u16(), 201);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let all = runs(&http, &second, name).await;
            let succeeded = all.iter().filter(|r| r["state"] == "succeeded").count();
            if all.len() == 3 * count && succeeded == all.len() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: not every shard ran: {}",
                Value::Array(all)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The scheduled job: whichever node fires it, both shards of each instant run.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = runs(&http, &second, "ticking").await;
        let cutoff = chrono::Utc::now() - chrono::Duration::seconds(3);
        let stuck: Vec<&Value> = all
            .iter()
            .filter(|r| r["state"] != "succeeded")
            .filter(|r| common::instant(&r["scheduled_for"]) < cutoff)
            .collect();
        if all.len() >= 6 && stuck.is_empty() {
            assert_eq!(all.len() % 2, 0, "instants come in pairs of shards");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ticking: shards older than 3 s did not succeed: {stuck:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(a);
    drop(b);
    schema.drop_schema().await;
}

//! Notifications on a cluster: two `sked server` nodes on one PostgreSQL schema both send
//! notifications, and a failed run's notification reaches its webhook exactly once, whichever
//! node recorded the run and whichever claimed the notification.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the test is reported as ignored (see build.rs),
//! and under CI it runs, so a missing database fails it.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{free_port, shell, Proc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUNS: usize = 30;
const NODE_START: Duration = Duration::from_secs(60);

/// A webhook receiver that takes its time (so that both nodes have sends in flight at once)
/// and counts each notification id it is sent.
async fn receiver() -> (Arc<Mutex<BTreeMap<String, (usize, Value)>>>, String) {
    let got: Arc<Mutex<BTreeMap<String, (usize, Value)>>> = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let id = headers
                        .get("sked-notification-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let mut seen = seen.lock().unwrap();
                    seen.entry(id).or_insert((0, body)).0 += 1;
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (got, format!("http://{addr}/hook"))
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn two_nodes_send_each_notification_once() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let (got, url) = receiver().await;
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, NODE_START).await;
    b.ready(&http, NODE_START).await;
    let bases = [a.base(), b.base()];
    let servers = bases.join(",");
    let _worker = Proc::spawn(
        "worker",
        &["worker", "--server", &servers, "--slots", "8"],
        &logs.file("worker"),
    );
    let job = json!({
        "target": shell("exit 1"),
        "overlap": "allow",
        "notify": [{"on": ["failed"], "webhook": {"url": url}}]
    });
    let resp = http
        .put(format!("{}/api/v1/jobs/failing", bases[0]))
        .json(&job)
        .send()
        .await
        .expect("PUT the job");
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);

    let mut runs = Vec::new();
    for i in 0..RUNS {
        let resp = http
            .post(format!("{}/api/v1/jobs/failing/trigger", bases[i % 2]))
            .send()
            .await
            .expect("trigger");
        assert_eq!(resp.status().as_u16(), 201);
        let run: Value = resp.json().await.expect("the run");
        runs.push(run["id"].as_i64().expect("a run id"));
    }

    let deadline = Instant::now() + Duration::from_secs(90);
    while got.lock().unwrap().len() < RUNS {
        assert!(
            Instant::now() < deadline,
            "{} of {RUNS} notifications arrived",
            got.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Time for a second delivery of any of them to arrive, were there one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), RUNS, "{got:?}");
    let twice: Vec<_> = got.iter().filter(|(_, (n, _))| *n != 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let mut notified: Vec<i64> = got
        .values()
        .map(|(_, body)| body["run_id"].as_i64().expect("run_id"))
        .collect();
    notified.sort();
    runs.sort();
    assert_eq!(notified, runs, "one notification per failed run");

    drop(a);
    drop(b);
    schema.drop_schema().await;
}

//! sked on PostgreSQL, black-box: a real `sked server` and `sked worker` on a database schema of
//! their own. Jobs run, a second server node on the same database joins the first, and a server
//! killed with SIGKILL comes back with every instant of the downtime in the ledger exactly once.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the tests are reported as ignored (see build.rs),
//! and under CI they run, so a missing database fails them.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{instant, shell, Sked};
use serde_json::json;
use std::time::Duration;

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_server_on_postgres_runs_jobs_shares_with_a_second_node_and_survives_sigkill() {
    let schema = Schema::create().await;
    let mut sked = Sked::new();
    let db = ["--database-url", schema.url.as_str()];
    sked.start_server(&db).await;
    sked.start_worker("pg-worker", 4);
    let job = json!({"schedule": {"every": "1s"}, "target": shell("echo $SKED_RUN_ID"), "misfire": {"policy": "run_all"}});
    assert_eq!(sked.put_job("tick", job).await.0, 201);
    let runs = sked.wait_runs("tick", 3, Duration::from_secs(15)).await;
    assert!(runs.iter().all(|r| r["state"] == "succeeded"), "{runs:?}");

    // A second server node on the same database joins the first: both are listed alive.
    let logs = Logs::new();
    let http = pg::http_client();
    let mut second = Node::spawn(&logs, "second", common::free_port(), &schema.url);
    second.ready(&http, Duration::from_secs(30)).await;
    let view = pg::wait_cluster(
        &http,
        &second.base(),
        Duration::from_secs(15),
        "two alive nodes",
        |view| {
            view["nodes"]
                .as_array()
                .is_some_and(|nodes| nodes.iter().filter(|n| n["alive"] == true).count() == 2)
        },
    )
    .await;
    assert!(
        pg::member(&view, &second.id).is_some_and(|n| n["alive"] == true),
        "the second node lists itself alive: {view}"
    );
    // Back to one node, so that the rest of the test is about the first one's restart.
    second.proc.stop(Duration::from_secs(10));

    // Kill the server outright; its leases run out unrenewed, and a restart takes over.
    sked.server.as_mut().unwrap().sigkill();
    let killed = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    sked.start_server(&db).await;
    let restarted = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = sked.wait_runs("tick", 8, Duration::from_secs(30)).await;
    for pair in runs.windows(2) {
        let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
        assert_eq!(gap, chrono::Duration::seconds(1), "gap or double: {pair:?}");
    }
    let missed = runs
        .iter()
        .filter(|r| {
            let t = instant(&r["scheduled_for"]);
            t > killed && t < restarted
        })
        .count();
    assert!(
        missed >= 3,
        "the downtime's instants are in the ledger: {runs:?}"
    );
    assert!(
        runs.iter().all(|r| r["state"] == "succeeded"),
        "run_all ran every missed instant: {runs:?}"
    );
    drop(sked);
    schema.drop_schema().await;
}

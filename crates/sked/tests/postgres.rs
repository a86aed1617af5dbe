//! sked on PostgreSQL, black-box: a real `sked server` and `sked worker` on a database schema of
//! their own. Jobs run, a second server on the same database is refused, and a server killed
//! with SIGKILL comes back with every instant of the downtime in the ledger exactly once.
//!
//! Needs `SKED_TEST_DATABASE_URL`; under CI its absence fails the test, elsewhere it is skipped
//! with a notice.

mod common;

use common::{instant, shell, Proc, Sked};
use serde_json::json;
use std::time::{Duration, Instant};

/// A fresh schema on the test database, dropped at the end; the URL points sked into it.
struct Schema {
    admin: tokio_postgres::Client,
    name: String,
    url: String,
}

impl Schema {
    async fn create() -> Option<Schema> {
        let base = match std::env::var("SKED_TEST_DATABASE_URL") {
            Ok(url) => url,
            Err(_) if std::env::var_os("CI").is_some() => {
                panic!("SKED_TEST_DATABASE_URL must point at PostgreSQL when CI is set")
            }
            Err(_) => {
                eprintln!("skipped: set SKED_TEST_DATABASE_URL to run the PostgreSQL tests");
                return None;
            }
        };
        let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .expect("connect to SKED_TEST_DATABASE_URL");
        tokio::spawn(connection);
        let name = format!("sked_bb_{:016x}", rand::random::<u64>());
        admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("create a schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        Some(Schema { admin, name, url })
    }

    async fn drop_schema(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await;
    }
}

#[tokio::test]
async fn a_server_on_postgres_runs_jobs_refuses_a_second_node_and_survives_sigkill() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let mut sked = Sked::new();
    let db = ["--database-url", schema.url.as_str()];
    sked.start_server(&db).await;
    sked.start_worker("pg-worker", 4);
    let job = json!({"schedule": {"every": "1s"}, "target": shell("echo $SKED_RUN_ID"), "misfire": {"policy": "run_all"}});
    assert_eq!(sked.put_job("tick", job).await.0, 201);
    let runs = sked.wait_runs("tick", 3, Duration::from_secs(15)).await;
    assert!(runs.iter().all(|r| r["state"] == "succeeded"), "{runs:?}");

    // A second server node on the same database is refused with a clear message.
    let port = common::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let log = sked.dir.path().join("second-server.log");
    let mut second = Proc::spawn(
        "second",
        &["server", "--listen", &listen, "--database-url", &schema.url],
        &log,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(status)) = second.child.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "a second server kept running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("another sked server already serves"),
        "{said}"
    );
    assert!(!said.contains("password"), "{said}");

    // Kill the server outright; its claim dies with its connection, and a restart takes over.
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

//! `sked store migrate`, black-box, both ways: a store made by `sked dev` on SQLite is copied
//! to PostgreSQL and served there by `sked server` with every job, version, run, output,
//! token, secret, notification, calendar and namespace limit as it was, then copied back to a
//! new SQLite store and served by `sked dev` again; a copy into a store that holds anything is
//! refused and changes nothing.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the test is reported as ignored (see build.rs),
//! and under CI it runs, so a missing database fails it.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{client_with_token, free_port, shell, sked_command, token, Sked};
use serde_json::{json, Value};
use std::time::Duration;

/// Runs `sked store migrate`; its exit status and what it printed.
fn migrate(from: &str, to: &str) -> (bool, String) {
    let out = sked_command()
        .args(["store", "migrate", "--from", from, "--to", to])
        .output()
        .expect("run sked store migrate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// What the test compares on each store: the jobs, each job's runs (ids, states, attempts),
/// the first run's output, the versions of `greet`, the secrets and the notifications.
async fn snapshot(http: &reqwest::Client, base: &str) -> Value {
    let get = |path: String| {
        let http = http.clone();
        async move {
            let resp = http
                .get(format!("{base}/api/v1{path}"))
                .send()
                .await
                .expect("GET");
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            resp.json::<Value>().await.expect("JSON")
        }
    };
    let jobs: Vec<Value> = get("/jobs".to_string()).await["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|j| json!({"name": j["name"], "version": j["version"], "target": j["target"]}))
        .collect();
    let runs: Vec<Value> = get("/runs?limit=100".to_string()).await["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            json!([
                r["id"],
                r["job"],
                r["state"],
                r["attempts"],
                r["scheduled_for"]
            ])
        })
        .collect();
    let first = runs
        .iter()
        .filter_map(|r| r[0].as_i64())
        .min()
        .expect("a run");
    let log = http
        .get(format!("{base}/api/v1/runs/{first}/log"))
        .send()
        .await
        .expect("log")
        .text()
        .await
        .expect("log text");
    let versions = get("/jobs/greet/versions".to_string()).await["versions"]
        .as_array()
        .map(|v| v.len());
    let secrets = get("/secrets".to_string()).await;
    let notifications: Vec<Value> = get("/notifications".to_string()).await["notifications"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|n| json!([n["id"], n["event"], n["run_id"], n["state"]]))
        .collect();
    let limits = get("/limits".to_string()).await["limits"].clone();
    let calendars = get("/calendars".to_string()).await["calendars"]
        .as_array()
        .map(|c| c.iter().map(|c| c["name"].clone()).collect::<Vec<_>>());
    json!({
        "jobs": jobs, "runs": runs, "log": log, "versions": versions,
        "limits": limits, "calendars": calendars,
        "secrets": secrets["secrets"].as_array().map(|s| s.len()),
        "notifications": notifications
    })
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_store_moves_to_postgres_and_back_with_everything_it_held() {
    // A store with a little of everything, made by sked dev on SQLite.
    let mut dev = Sked::new();
    dev.start_dev(&["--require-token"]).await;
    let (status, body) = dev
        .put_job(
            "greet",
            json!({"target": shell("echo hello from $SKED_JOB")}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = dev
        .put_job(
            "greet",
            json!({"target": shell("echo hello again from $SKED_JOB")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = dev
        .put_job(
            "broken",
            json!({"target": shell("exit 4"),
                   "notify": [{"on": ["failed"], "webhook": {"url": "http://127.0.0.1:9/hook"}}]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for job in ["greet", "broken", "greet"] {
        let (status, run) = dev.post(&format!("/jobs/{job}/trigger"), json!(null)).await;
        assert_eq!(status, 201, "{run}");
        dev.wait_finished(run["id"].as_i64().unwrap(), Duration::from_secs(20))
            .await;
    }
    for (path, body) in [
        (
            "/limits/partner",
            json!({"concurrency": 2, "rate": {"limit": 5, "per": "1s"}}),
        ),
        ("/calendars/uk", json!({"timezone": "Europe/London"})),
    ] {
        let (status, answer) =
            common::call(&dev.http, reqwest::Method::PUT, dev.url(path), Some(body)).await;
        assert_eq!(status, 201, "{path}: {answer}");
    }
    let (status, body) = common::call(
        &dev.http,
        reqwest::Method::PUT,
        dev.url("/secrets/db-password"),
        Some(json!({"value": "hunter2"})),
    )
    .await;
    assert!(status == 201 || status == 200, "{status} {body}");
    let viewer = token(
        &dev,
        "reader",
        json!({"role": "viewer", "namespaces": ["default"]}),
    )
    .await;
    let before = snapshot(&dev.http, &dev.base()).await;
    dev.server.as_mut().unwrap().stop(Duration::from_secs(10));
    let source = format!("sqlite:{}", dev.data_dir().display());

    // To PostgreSQL.
    let schema = Schema::create().await;
    let (ok, said) = migrate(&source, &schema.url);
    assert!(ok, "{said}");
    assert!(said.contains("3 runs") && said.contains("2 jobs"), "{said}");
    assert!(!said.contains("hunter2"), "{said}");

    // Refused into a store that holds anything: and nothing changes there.
    let (ok, said) = migrate(&source, &schema.url);
    assert!(!ok, "{said}");
    assert!(said.contains("is not empty"), "{said}");

    let logs = Logs::new();
    let http = pg::http_client();
    let mut node = Node::spawn(&logs, "node", free_port(), &schema.url);
    node.ready(&http, Duration::from_secs(60)).await;
    let on_postgres = snapshot(&http, &node.base()).await;
    assert_eq!(on_postgres, before, "the store as PostgreSQL serves it");
    let reader = client_with_token(Some(&viewer));
    let resp = reader
        .get(format!("{}/api/v1/jobs", node.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "the token made on SQLite works"
    );
    // New rows take ids past the copied ones.
    let resp = http
        .post(format!("{}/api/v1/jobs/greet/trigger", node.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let run: Value = resp.json().await.unwrap();
    let copied_max = before["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r[0].as_i64())
        .max()
        .unwrap();
    assert!(run["id"].as_i64().unwrap() > copied_max, "{run}");
    node.proc.stop(Duration::from_secs(10));

    // And back, into a new SQLite store.
    let mut back = Sked::new();
    let target = format!("sqlite:{}", back.data_dir().display());
    let (ok, said) = migrate(&schema.url, &target);
    assert!(ok, "{said}");
    assert!(said.contains("4 runs"), "{said}");
    back.start_dev(&["--require-token"]).await;
    let on_sqlite = snapshot(&back.http, &back.base()).await;
    assert_eq!(on_sqlite["jobs"], before["jobs"]);
    assert_eq!(on_sqlite["versions"], before["versions"]);
    assert_eq!(on_sqlite["log"], before["log"]);
    assert_eq!(on_sqlite["notifications"], before["notifications"]);
    assert_eq!(on_sqlite["runs"].as_array().unwrap().len(), 4);
    schema.drop_schema().await;
}

#[tokio::test]
async fn a_migration_between_stores_of_one_kind_or_to_nowhere_is_refused() {
    let (ok, said) = migrate("sqlite:/nonexistent/sked-data", "sqlite:/tmp/x");
    assert!(
        !ok && said.contains("SQLite to PostgreSQL or back"),
        "{said}"
    );
    let (ok, said) = migrate("mysql://db/sked", "sqlite:/tmp/x");
    assert!(!ok && said.contains("--from"), "{said}");
    let (ok, said) = migrate(
        "sqlite:/nonexistent/sked-data",
        "postgres://u:pw@127.0.0.1:1/x",
    );
    assert!(!ok && said.contains("does not exist"), "{said}");
    assert!(
        !said.contains(":pw@"),
        "the password is never shown: {said}"
    );
}

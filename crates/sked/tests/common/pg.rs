//! sked on PostgreSQL for black-box tests: a fresh schema per test, `sked server` nodes on it,
//! and the cluster view they answer.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the test is reported as ignored (see
//! build.rs); under CI it runs, and its absence fails it.

use super::{Proc, FAST_HEARTBEATS};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a node's partition and maintenance leases last without renewal.
pub const NODE_LEASE: &str = "3s";

/// A fresh schema on the test database, dropped at the end; the URL points sked into it.
pub struct Schema {
    pub admin: tokio_postgres::Client,
    pub name: String,
    pub url: String,
}

impl Schema {
    pub async fn create() -> Schema {
        // Tests that get here were compiled to run (see build.rs): a missing database fails
        // them loudly instead of letting them pass without running.
        let base = std::env::var("SKED_TEST_DATABASE_URL").unwrap_or_else(|_| {
            panic!(
                "SKED_TEST_DATABASE_URL must point at PostgreSQL (for example \
                 postgres://postgres@127.0.0.1:5432/test)"
            )
        });
        let admin = sked_store::postgres::client(&base)
            .await
            .expect("connect to SKED_TEST_DATABASE_URL");
        let name = format!("sked_bb_{:016x}", rand::random::<u64>());
        admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("create a schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        Schema { admin, name, url }
    }

    /// A connection whose unqualified table names are this schema's.
    pub async fn client(&self) -> tokio_postgres::Client {
        sked_store::postgres::client(&self.url)
            .await
            .expect("connect to the test schema")
    }

    pub async fn drop_schema(self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await;
    }
}

/// A directory for the processes' logs, kept (and its path printed) when the test fails.
pub struct Logs {
    dir: Option<tempfile::TempDir>,
}

impl Logs {
    pub fn new() -> Logs {
        let dir = tempfile::Builder::new()
            .prefix("sked-cluster-")
            .tempdir()
            .expect("tempdir");
        Logs { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("the log directory").path()
    }

    /// A new log file for one process start; `label` names the process.
    pub fn file(&self, label: &str) -> PathBuf {
        let at = chrono::Utc::now().format("%H%M%S%.3f");
        self.path().join(format!("{label}-{at}.log"))
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                // CI keeps only what the test printed: each process's complaints go with it.
                print_complaints(dir.path());
                eprintln!("logs kept in {}", dir.keep().display());
            }
        }
    }
}

/// Prints, for each log in `dir`, its last warnings, errors and panics, and its last lines.
fn print_complaints(dir: &Path) {
    const COMPLAINTS: usize = 15;
    const LAST: usize = 3;
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let complaints: Vec<&str> = (lines.iter().copied())
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("panicked"))
            .collect();
        let name = log.file_name().unwrap_or_default().to_string_lossy();
        eprintln!("--- {name}: last warnings and errors, then last lines");
        for line in &complaints[complaints.len().saturating_sub(COMPLAINTS)..] {
            eprintln!("  {line}");
        }
        eprintln!("  ...");
        for line in &lines[lines.len().saturating_sub(LAST)..] {
            eprintln!("  {line}");
        }
    }
}

/// The last `lines` lines of a log, for a failure message.
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn http_client() -> reqwest::Client {
    super::http_client()
}

/// One `sked server` process on the test database. Each start is a new node id.
pub struct Node {
    pub proc: Proc,
    pub port: u16,
    /// The id the node reports for itself; empty until `ready` has returned.
    pub id: String,
    pub log: PathBuf,
}

impl Node {
    /// Starts `sked server` on `port`, with fast heartbeats and short node leases; does not
    /// wait for it.
    pub fn spawn(logs: &Logs, label: &str, port: u16, url: &str) -> Node {
        Node::spawn_with(logs, label, port, url, &[])
    }

    /// [`Node::spawn`] with more arguments (broker connections).
    pub fn spawn_with(logs: &Logs, label: &str, port: u16, url: &str, extra: &[&str]) -> Node {
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "server",
            "--listen",
            &listen,
            "--database-url",
            url,
            "--node-lease",
            NODE_LEASE,
            // The tests' HTTP targets are sinks on this machine's loopback address.
            "--http-target-allow",
            "127.0.0.1",
        ];
        args.extend_from_slice(FAST_HEARTBEATS);
        args.extend_from_slice(extra);
        let log = logs.file(label);
        Node {
            proc: Proc::spawn(label, &args, &log),
            port,
            id: String::new(),
            log,
        }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the node answers `/readyz`, then learns its id from `/api/v1/cluster`.
    pub async fn ready(&mut self, http: &reqwest::Client, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.proc.child.try_wait() {
                panic!(
                    "node {} exited ({status}) before it was ready; its log ends:\n{}",
                    self.proc.name,
                    tail(&self.log, 30)
                );
            }
            let url = format!("{}/readyz", self.base());
            if let Ok(resp) = http.get(url).send().await {
                if resp.status().is_success() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "node {} not ready within {within:?}; its log ends:\n{}",
                self.proc.name,
                tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let view = cluster(http, &self.base())
            .await
            .unwrap_or_else(|e| panic!("node {}: {e}", self.proc.name));
        self.id = view["node"]
            .as_str()
            .unwrap_or_else(|| panic!("node {}: no node id in {view}", self.proc.name))
            .to_string();
    }
}

/// `GET /api/v1/cluster` of the node at `base`, or why there is no answer.
pub async fn cluster(http: &reqwest::Client, base: &str) -> Result<Value, String> {
    let url = format!("{base}/api/v1/cluster");
    let resp = http
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    let body = resp.text().await.map_err(|e| format!("GET {url}: {e}"))?;
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: {e}: {body}"))
}

/// The entry of node `id` in a cluster view.
pub fn member<'a>(view: &'a Value, id: &str) -> Option<&'a Value> {
    view["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["id"] == id))
}

/// Two nodes on `url`, ready, each holding some of the partitions (every one held), and a
/// worker with `slots` slots polling both: the nodes and the worker.
pub async fn two_nodes_and_a_worker(
    logs: &Logs,
    url: &str,
    http: &reqwest::Client,
    slots: u32,
) -> (Node, Node, Proc) {
    let mut a = Node::spawn(logs, "node-a", super::free_port(), url);
    let mut b = Node::spawn(logs, "node-b", super::free_port(), url);
    a.ready(http, Duration::from_secs(60)).await;
    b.ready(http, Duration::from_secs(60)).await;
    let ids = [a.id.as_str(), b.id.as_str()];
    wait_cluster(
        http,
        &a.base(),
        Duration::from_secs(30),
        "balanced",
        |view| {
            all_alive_and_owned(view, &ids)
                && ids
                    .iter()
                    .all(|id| member(view, id).is_some_and(|m| m["partitions"].as_u64() > Some(0)))
        },
    )
    .await;
    let servers = format!("{},{}", a.base(), b.base());
    let slots = slots.to_string();
    let worker = Proc::spawn(
        "worker",
        &["worker", "--server", &servers, "--slots", &slots],
        &logs.file("worker"),
    );
    (a, b, worker)
}

/// Polls `/api/v1/cluster` at `base` until `settled` holds of the view, for at most `within`;
/// panics with the last view (or the last error) otherwise.
pub async fn wait_cluster(
    http: &reqwest::Client,
    base: &str,
    within: Duration,
    what: &str,
    settled: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let last = cluster(http, base).await;
        if let Ok(view) = &last {
            if settled(view) {
                return view.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base}: not {what} within {within:?}; last answer: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every node in `ids` is listed alive, no other node is, and no partition is unowned.
pub fn all_alive_and_owned(view: &Value, ids: &[&str]) -> bool {
    let alive: Vec<&str> = view["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter(|n| n["alive"] == true)
                .filter_map(|n| n["id"].as_str())
                .collect()
        })
        .unwrap_or_default();
    view["unowned"] == 0 && alive.len() == ids.len() && ids.iter().all(|id| alive.contains(id))
}

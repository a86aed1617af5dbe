//! sked clustered on PostgreSQL while its links go wrong, black-box: three `sked server` nodes,
//! each reaching PostgreSQL through a fault-injecting proxy of its own, and three workers, each
//! reaching every node through proxies of its own (`common/proxy.rs`). Hundreds of schedules
//! fire at an HTTP sink while one link is cut, slowed or frozen; once it heals, every job is
//! paused, every run must end, and the ledger check of `common/ledger.rs` reads the history
//! from the database: every instant owed has exactly one run, every run ended, no two
//! attempts of a run were accepted, nothing reached the sink unrecorded.
//!
//! Each scenario also measures its recovery and prints it: how soon the node cut off stopped
//! firing and its partitions moved, how soon a cut-off worker stopped its processes, how soon
//! the cluster was whole again after the heal. The fault lasts `SKED_TEST_PARTITION_FAULT` seconds
//! (default 10) and each scenario runs `SKED_TEST_PARTITION_RUNS` times (default 1): with 30 and 5
//! that is the long form of docs/BENCHMARKS.md.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the tests are reported as ignored (see build.rs),
//! and under CI they run, so a missing database fails them.

mod common;

use common::ledger::{create_jobs, pause_and_check_ledger, Sink};
use common::pg::{self, Logs, Node, Schema};
use common::proxy::{Fault, Proxy};
use common::{free_port, Proc};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const NODES: usize = 3;
const WORKERS: usize = 3;
/// Schedules firing every one or two seconds: about 200 runs a second, which this two-core
/// machine keeps up with beside three nodes, three workers and the proxies.
const JOBS: usize = 300;
/// The node lease the nodes run with (`pg::NODE_LEASE`).
const LEASE: Duration = Duration::from_secs(3);
/// How late past its lease a node cut off may still be seen firing: the poll of its metrics
/// and a loaded machine's scheduling.
const LEASE_SLACK: Duration = Duration::from_secs(2);
/// How long the cluster may take to be whole again once a link heals.
const HEAL_LIMIT: Duration = Duration::from_secs(30);
/// The label of the worker the worker scenario cuts off; the probe job runs only there.
const CUT_WORKER_LABEL: &str = "reach=cut";

/// The scenarios share the machine's two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn fault_length() -> Duration {
    let secs = std::env::var("SKED_TEST_PARTITION_FAULT")
        .ok()
        .and_then(|s| s.trim().trim_end_matches('s').parse::<u64>().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

fn repetitions() -> usize {
    std::env::var("SKED_TEST_PARTITION_RUNS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1)
}

/// Where PostgreSQL listens, read from `SKED_TEST_DATABASE_URL`.
fn database_address(url: &str) -> SocketAddr {
    let config: tokio_postgres::Config = url.parse().expect("SKED_TEST_DATABASE_URL parses");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("SKED_TEST_DATABASE_URL must name a TCP host, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = if host == "localhost" {
        "127.0.0.1".to_string()
    } else {
        host
    };
    format!("{host}:{port}")
        .parse()
        .unwrap_or_else(|e| panic!("{host}:{port} is not an address: {e}"))
}

/// `url` with its one `host:port` replaced by the proxy's.
fn through(url: &str, database: SocketAddr, proxy: &Proxy) -> String {
    let authority = database.to_string();
    let localhost = format!("localhost:{}", database.port());
    let replaced =
        url.replacen(&authority, &proxy.address(), 1)
            .replacen(&localhost, &proxy.address(), 1);
    assert_ne!(
        replaced, url,
        "SKED_TEST_DATABASE_URL must be a postgres:// URL naming {authority}"
    );
    replaced
}

/// The cluster under test and every link the test can break.
struct Cluster {
    schema: Schema,
    logs: Logs,
    http: reqwest::Client,
    sink: Sink,
    nodes: Vec<Node>,
    /// Node i's link to PostgreSQL.
    database_links: Vec<Proxy>,
    /// Worker w's link to node i: `worker_links[w][i]`.
    worker_links: Vec<Vec<Proxy>>,
    workers: Vec<Proc>,
    plans: Vec<common::ledger::JobPlan>,
    /// What each node said it held just before the fault.
    held_before: Vec<i64>,
}

impl Cluster {
    async fn start() -> Cluster {
        let schema = Schema::create().await;
        let logs = Logs::new();
        println!("schema {}, logs in {}", schema.name, logs.path().display());
        let http = pg::http_client();
        let (sink, sink_url) = Sink::start().await;
        let base = std::env::var("SKED_TEST_DATABASE_URL").expect("SKED_TEST_DATABASE_URL");
        let database = database_address(&base);
        let mut database_links = Vec::new();
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let link = Proxy::start(database).await;
            let url = through(&schema.url, database, &link);
            nodes.push(Node::spawn(&logs, &format!("node-{i}"), free_port(), &url));
            database_links.push(link);
        }
        for node in nodes.iter_mut() {
            node.ready(&http, Duration::from_secs(60)).await;
        }
        let mut cluster = Cluster {
            schema,
            logs,
            http,
            sink,
            nodes,
            database_links,
            worker_links: Vec::new(),
            workers: Vec::new(),
            plans: Vec::new(),
            held_before: Vec::new(),
        };
        cluster
            .whole(
                Duration::from_secs(30),
                "three nodes holding every partition",
            )
            .await;
        for w in 0..WORKERS {
            let mut links = Vec::new();
            for node in &cluster.nodes {
                links.push(
                    Proxy::start(
                        format!("127.0.0.1:{}", node.port)
                            .parse()
                            .expect("an address"),
                    )
                    .await,
                );
            }
            // Each worker starts on a different node and fails over through the others.
            let servers: Vec<String> = (0..NODES)
                .map(|k| format!("http://{}", links[(w + k) % NODES].address()))
                .collect();
            let name = format!("worker-{w}");
            let servers = servers.join(",");
            let mut args = vec![
                "worker", "--server", &servers, "--slots", "64", "--name", &name,
            ];
            if w == 0 {
                args.extend(["--labels", CUT_WORKER_LABEL]);
            }
            cluster
                .workers
                .push(Proc::spawn(&name, &args, &cluster.logs.file(&name)));
            cluster.worker_links.push(links);
        }
        let bases = cluster.bases();
        cluster.plans = create_jobs(&cluster.http, &bases, &sink_url, JOBS).await;
        println!("{JOBS} jobs created; about {} runs a second", JOBS * 2 / 3);
        cluster
    }

    fn bases(&self) -> Vec<String> {
        self.nodes.iter().map(Node::base).collect()
    }

    /// Waits until every node is alive and the partitions are all held, as node `asked` sees
    /// it (the first node not cut off); returns how long that took.
    async fn whole(&self, within: Duration, what: &str) -> Duration {
        let began = Instant::now();
        let ids: Vec<&str> = self.nodes.iter().map(|n| n.id.as_str()).collect();
        for node in &self.nodes {
            pg::wait_cluster(&self.http, &node.base(), within, what, |view| {
                pg::all_alive_and_owned(view, &ids)
            })
            .await;
        }
        began.elapsed()
    }

    /// Waits until, as node `by` sees it, node `gone` holds no partition and every partition
    /// is held; returns how long after `since` that was.
    async fn moved_off(&self, by: usize, gone: usize, since: Instant) -> Duration {
        let id = self.nodes[gone].id.clone();
        pg::wait_cluster(
            &self.http,
            &self.nodes[by].base(),
            HEAL_LIMIT,
            "holding the partitions of the node cut off",
            |view| {
                view["unowned"] == 0
                    && pg::member(view, &id)
                        .is_none_or(|m| m["partitions"] == 0 || m["alive"] == false)
            },
        )
        .await;
        since.elapsed()
    }

    /// Waits until node `i`'s own metrics say it holds no partition (it stopped firing);
    /// returns how long after `since` that was.
    async fn stopped_firing(&self, i: usize, since: Instant) -> Duration {
        assert!(
            self.held_before[i] > 0,
            "node-{i} held no partition before the fault"
        );
        let deadline = since + LEASE + LEASE_SLACK + Duration::from_secs(10);
        loop {
            if held_partitions(&self.nodes[i].base()).await == Some(0) {
                return since.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "node-{i} still holds partitions {:?} after it was cut off; its log ends:\n{}",
                since.elapsed(),
                pg::tail(&self.nodes[i].log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every job has a run fired for an instant after `after` (not skipped),
    /// for at most `within`: firing has resumed everywhere. Returns how long after `since`.
    async fn every_job_fires_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
        since: Instant,
        within: Duration,
    ) -> Duration {
        let db = self.schema.client().await;
        let after = after.timestamp_micros();
        loop {
            let firing: i64 = db
                .query_one(
                    "SELECT count(DISTINCT job) FROM runs WHERE namespace = 'default' \
                     AND state <> 'skipped' AND scheduled_for > $1",
                    &[&after],
                )
                .await
                .expect("count the jobs firing")
                .get(0);
            if firing as usize >= JOBS {
                return since.elapsed();
            }
            assert!(
                since.elapsed() < within,
                "only {firing} of {JOBS} jobs fired again within {within:?} of the fault"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Pauses every job, waits for every run to end and checks the ledger (printing its
    /// summary); then stops everything and drops the schema.
    async fn check_and_stop(self) {
        let (report, _) = pause_and_check_ledger(
            &self.http,
            &self.bases(),
            &self.plans,
            &self.schema,
            &self.sink,
        )
        .await;
        println!("{report}");
        self.stop().await;
    }

    async fn stop(self) {
        let Cluster {
            schema,
            nodes,
            workers,
            ..
        } = self;
        drop(workers);
        drop(nodes);
        schema.drop_schema().await;
    }
}

/// Partitions node `base` holds by its own count (`sked_partition_leases_total`: gained
/// minus lost), read from its metrics; `None` if it does not answer. Asked without a token:
/// the aggregate series need no database, where checking a token would.
async fn held_partitions(base: &str) -> Option<i64> {
    let text = common::client_with_token(None)
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    assert!(
        text.contains("sked_partition_leases_total"),
        "no sked_partition_leases_total in the metrics of {base}:\n{text}"
    );
    // A change never seen has no sample yet.
    let count = |change: &str| -> i64 {
        let prefix = format!("sked_partition_leases_total{{change=\"{change}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as i64)
    };
    Some(count("gained") - count("lost"))
}

/// Runs `scenario` `SKED_TEST_PARTITION_RUNS` times on a fresh cluster each, printing each run's
/// figures.
async fn repeat<F, Fut>(name: &str, scenario: F)
where
    F: Fn(Cluster, Duration) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let _one = ONE_AT_A_TIME.lock().await;
    let fault = fault_length();
    let runs = repetitions();
    for run in 1..=runs {
        println!("== {name}: run {run} of {runs}, fault {fault:?}");
        let mut cluster = Cluster::start().await;
        // Firing and dispatch under way before anything breaks.
        tokio::time::sleep(Duration::from_secs(4)).await;
        for node in &cluster.nodes {
            let held = held_partitions(&node.base()).await;
            cluster.held_before.push(held.unwrap_or_default());
        }
        println!(
            "partitions held before the fault: {:?}",
            cluster.held_before
        );
        let figures = scenario(cluster, fault).await;
        println!("== {name}: run {run} of {runs} clean: {figures}");
    }
}

/// Node `i`'s link to PostgreSQL goes wrong as `fault` says, for `length`, while its workers
/// still reach it: it must stop firing within its lease, the other nodes take its partitions,
/// and the cluster is whole again once the link heals.
async fn one_node_loses_postgresql(
    cluster: Cluster,
    length: Duration,
    i: usize,
    fault: Fault,
) -> String {
    let began = Instant::now();
    cluster.database_links[i].set(fault);
    println!("node-{i}'s link to PostgreSQL: {fault:?}; its workers still reach it");
    let stopped = cluster.stopped_firing(i, began).await;
    let moved = cluster.moved_off((i + 1) % NODES, i, began).await;
    // While the link is still broken, every job fires again, its own included: a session
    // cut off mid-transaction holds its row locks only until PostgreSQL ends it.
    let moved_at = chrono::Utc::now();
    let resumed = cluster.every_job_fires_after(moved_at, began, length).await;
    println!(
        "node-{i} stopped firing {} ms after the fault, its partitions moved in {} ms, every \
         job fired again {} ms after the fault",
        stopped.as_millis(),
        moved.as_millis(),
        resumed.as_millis()
    );
    assert!(
        stopped <= LEASE + LEASE_SLACK,
        "node-{i} went on firing {stopped:?} after {fault:?}; its lease is {LEASE:?}"
    );
    if fault == Fault::Cut {
        // What its clients hear meanwhile: 503, so a worker moves on to the next node of its
        // list and a client knows to try again.
        let url = format!("{}/api/v1/jobs?limit=1", cluster.nodes[i].base());
        let resp = cluster.http.get(&url).send().await.expect("GET jobs");
        let status = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").cloned();
        let body: Value = resp.json().await.unwrap_or_default();
        assert_eq!(status, 503, "GET {url} while cut off: {body}");
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
        assert!(retry_after.is_some(), "a 503 says when to try again");
    }
    tokio::time::sleep(length.saturating_sub(began.elapsed())).await;
    cluster.database_links[i].set(Fault::Pass);
    let healed = cluster
        .whole(HEAL_LIMIT, "whole again after the heal")
        .await;
    cluster.check_and_stop().await;
    format!(
        "stopped firing in {} ms, partitions moved in {} ms, every job firing in {} ms, whole \
         again {} ms after the heal",
        stopped.as_millis(),
        moved.as_millis(),
        resumed.as_millis(),
        healed.as_millis()
    )
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_postgresql_stops_firing_within_its_lease_and_its_partitions_move() {
    repeat("node cut off from PostgreSQL", |cluster, length| {
        one_node_loses_postgresql(cluster, length, 0, Fault::Cut)
    })
    .await;
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_postgresql_connections_freeze_half_open_stops_firing_within_its_lease() {
    repeat(
        "node's PostgreSQL connections frozen (half-open)",
        |cluster, length| one_node_loses_postgresql(cluster, length, 1, Fault::Freeze),
    )
    .await;
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_answering_two_seconds_late_delays_firing_and_loses_nothing() {
    repeat(
        "PostgreSQL answering 2 s late",
        |cluster, fault| async move {
            let slowed = Instant::now();
            for link in &cluster.database_links {
                link.set(Fault::Delay(Duration::from_secs(2)));
            }
            println!("every node's answers from PostgreSQL now come 2 s late");
            tokio::time::sleep(fault).await;
            for link in &cluster.database_links {
                link.set(Fault::Pass);
            }
            let healed = cluster
                .whole(HEAL_LIMIT, "whole again once PostgreSQL answers at once")
                .await;
            println!(
            "PostgreSQL answered at once again after {} ms; the cluster was whole again in {} ms",
            slowed.elapsed().as_millis() - healed.as_millis(),
            healed.as_millis()
        );
            cluster.check_and_stop().await;
            format!(
                "whole again {} ms after the slowness ended",
                healed.as_millis()
            )
        },
    )
    .await;
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_every_node_stops_its_processes_and_its_late_report_is_refused() {
    repeat("worker cut off from every node", |cluster, fault| async move {
        let (base, run_id, pid) = start_probe(&cluster).await;
        let cut = Instant::now();
        for link in &cluster.worker_links[0] {
            link.set(Fault::Cut);
        }
        println!("cut worker-0 from every node");
        let gone = wait_gone(pid, Duration::from_secs(30)).await;
        let gone_after = gone.duration_since(cut);
        println!("worker-0 stopped the probe's process {} ms after the cut", gone_after.as_millis());
        // The server's side: the attempt is taken from the worker and its run queued again.
        let taken = wait_attempt(&cluster.http, &base, run_id, 1, "lost", cut).await;
        println!("the server took the probe's attempt back {} ms after the cut", taken.as_millis());
        tokio::time::sleep(fault.saturating_sub(cut.elapsed())).await;
        for link in &cluster.worker_links[0] {
            link.set(Fault::Pass);
        }
        // Back, worker-0 registers again and reports the attempt it stopped: the report is
        // refused (its lease was taken), and the probe runs again there as attempt 2.
        let again = wait_attempt(&cluster.http, &base, run_id, 2, "running", cut).await;
        println!("after the heal the probe runs again (attempt 2) {} ms after the cut", again.as_millis());
        let run = cancel_probe(&cluster, &base, run_id).await;
        let first = &run["attempt_history"][0];
        assert_eq!(first["state"], "lost", "the cut-off attempt: {run}");
        assert!(
            first["exit_code"].is_null(),
            "the cut-off attempt's late report was accepted: {run}"
        );
        assert!(
            gone_after < taken + Duration::from_secs(1),
            "the cut-off worker's process outlived the server's takeover of its attempt by more \
             than a second: gone after {gone_after:?}, taken after {taken:?}"
        );
        let healed = cluster.whole(HEAL_LIMIT, "whole after the heal").await;
        cluster.check_and_stop().await;
        format!(
            "process stopped {} ms after the cut, attempt taken back after {} ms, ran again {} ms after the cut; cluster whole {} ms after",
            gone_after.as_millis(),
            taken.as_millis(),
            again.as_millis(),
            healed.as_millis()
        )
    })
    .await;
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_unreachable_from_every_node_stops_running_attempts_without_spending_a_retry() {
    repeat(
        "PostgreSQL unreachable from every node",
        |cluster, fault| async move {
            let (base, run_id, pid) = start_probe(&cluster).await;
            let cut = Instant::now();
            for link in &cluster.database_links {
                link.set(Fault::Cut);
            }
            println!("cut every node from PostgreSQL; the workers still reach the nodes");
            // No heartbeat can be recorded, so no lease extended: the workers stop their attempts
            // before the leases end, and do not report them as ended.
            let gone = wait_gone(pid, Duration::from_secs(30))
                .await
                .duration_since(cut);
            println!(
                "worker-0 stopped the probe's process {} ms after the cut",
                gone.as_millis()
            );
            tokio::time::sleep(fault.saturating_sub(cut.elapsed())).await;
            for link in &cluster.database_links {
                link.set(Fault::Pass);
            }
            let healed = cluster
                .whole(HEAL_LIMIT, "whole again once PostgreSQL is back")
                .await;
            println!(
                "PostgreSQL reachable again; the cluster was whole in {} ms",
                healed.as_millis()
            );
            let again = wait_attempt(&cluster.http, &base, run_id, 2, "running", cut).await;
            println!(
                "the probe runs again (attempt 2) {} ms after the cut",
                again.as_millis()
            );
            let run = cancel_probe(&cluster, &base, run_id).await;
            assert_eq!(
                run["attempt_history"][0]["state"], "lost",
                "the attempt stopped while PostgreSQL was away is lost, not failed: {run}"
            );
            assert_eq!(run["failures"], 0, "no retry was spent on it: {run}");
            cluster.check_and_stop().await;
            format!(
            "process stopped {} ms after the cut, cluster whole {} ms after the heal, the probe \
             ran again {} ms after the cut",
            gone.as_millis(),
            healed.as_millis(),
            again.as_millis()
        )
        },
    )
    .await;
}

/// Starts a long shell job that only worker-0 may run, and waits until it runs there: the
/// base URL it was made through, its run, and the pid of its shell.
async fn start_probe(cluster: &Cluster) -> (String, i64, u32) {
    let marker = format!("probe-{:08x}", rand::random::<u32>());
    let probe = json!({
        "schedule": {"every": "24h"},
        "target": {"shell": {"command": format!("sleep 600; echo {marker}")}},
        "routing": {"labels": {"reach": "cut"}},
    });
    let base = cluster.nodes[0].base();
    let put = cluster
        .http
        .put(format!("{base}/api/v1/jobs/probe?namespace=probe"))
        .json(&probe)
        .send()
        .await
        .expect("PUT the probe job");
    assert_eq!(
        put.status().as_u16(),
        201,
        "{}",
        put.text().await.unwrap_or_default()
    );
    let (status, run) = post(
        &cluster.http,
        &format!("{base}/api/v1/jobs/probe/trigger?namespace=probe"),
        json!({}),
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "trigger the probe: {status} {run}"
    );
    let run_id = run["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("a run id in {run}"));
    let pid = wait_for_process(&marker, Duration::from_secs(30)).await;
    println!("the probe runs on worker-0 as process {pid}");
    (base, run_id, pid)
}

/// Cancels the probe's run and waits for its end; the run.
async fn cancel_probe(cluster: &Cluster, base: &str, run_id: i64) -> Value {
    let (status, answer) = post(
        &cluster.http,
        &format!("{base}/api/v1/runs/{run_id}/cancel"),
        json!({}),
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "cancel the probe: {status} {answer}"
    );
    wait_run_ended(&cluster.http, base, run_id).await
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The pid of the process whose command line holds `marker`.
async fn wait_for_process(marker: &str, within: Duration) -> u32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(pid) = find_process(marker) {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no process with {marker} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn find_process(marker: &str) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            return Some(pid);
        }
    }
    None
}

/// When process `pid` ended (or became a zombie).
async fn wait_gone(pid: u32, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state is the field after the command's closing parenthesis.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        if stat.is_empty() || state == Some(Some('Z')) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs {within:?} later"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until attempt `number` of run `id` is in `state`; returns how long after `since`.
async fn wait_attempt(
    http: &reqwest::Client,
    base: &str,
    id: i64,
    number: usize,
    state: &str,
    since: Instant,
) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = get_run(http, base, id).await;
        if run["attempt_history"]
            .as_array()
            .and_then(|a| a.get(number - 1))
            .is_some_and(|a| a["state"] == state)
        {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "attempt {number} of run {id} not {state} within a minute: {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_run_ended(http: &reqwest::Client, base: &str, id: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = get_run(http, base, id).await;
        if common::is_terminal(&run["state"]) {
            return run;
        }
        assert!(Instant::now() < deadline, "run {id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get_run(http: &reqwest::Client, base: &str, id: i64) -> Value {
    let url = format!("{base}/api/v1/runs/{id}");
    let resp = http
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Sends `ping` through `link` and reads what comes back within `within`: the bytes read, or
/// `None` if nothing came.
async fn round_trip(link: &mut tokio::net::TcpStream, within: Duration) -> Option<usize> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    link.write_all(b"ping")
        .await
        .expect("write through the proxy");
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, link.read(&mut buf)).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(e)) => panic!("read through the proxy: {e}"),
        Err(_) => None,
    }
}

/// Whether `link` was closed: its next read ends (within two seconds) with no data.
async fn closed(link: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(2), link.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// The proxy itself, against an echo server: each fault does what it says, so that a
/// scenario cannot pass because its fault never happened.
#[tokio::test]
async fn the_fault_proxy_passes_delays_swallows_freezes_and_cuts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream = echo.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let proxy = Proxy::start(upstream).await;
    let mut link = TcpStream::connect(proxy.address()).await.expect("connect");
    let second = Duration::from_secs(1);
    let short = Duration::from_millis(300);

    assert_eq!(round_trip(&mut link, second).await, Some(4), "passes");

    proxy.set(Fault::Delay(Duration::from_millis(400)));
    let began = Instant::now();
    assert_eq!(round_trip(&mut link, second).await, Some(4), "delayed");
    assert!(
        began.elapsed() >= Duration::from_millis(400),
        "delayed {:?}",
        began.elapsed()
    );

    proxy.set(Fault::DropToServer);
    assert_eq!(
        round_trip(&mut link, short).await,
        None,
        "swallowed on the way"
    );
    proxy.set(Fault::DropToClient);
    assert_eq!(
        round_trip(&mut link, short).await,
        None,
        "swallowed on the way back"
    );
    proxy.set(Fault::Pass);
    assert_eq!(round_trip(&mut link, second).await, Some(4), "passes again");

    proxy.set(Fault::Freeze);
    assert_eq!(round_trip(&mut link, short).await, None, "frozen");
    // What was sent while frozen passes once it thaws, with what is sent then.
    proxy.set(Fault::Pass);
    let mut got = round_trip(&mut link, second).await.unwrap_or(0);
    let mut buf = [0u8; 64];
    while got < 8 {
        match tokio::time::timeout(second, link.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got += n,
            other => panic!("after the thaw {got} bytes came back, then {other:?}"),
        }
    }
    assert_eq!(got, 8, "both pings came back after the thaw");

    proxy.set(Fault::Cut);
    assert!(
        closed(&mut link).await,
        "an open connection is closed by a cut"
    );
    let mut again = TcpStream::connect(proxy.address()).await.expect("accepted");
    assert!(
        closed(&mut again).await,
        "a new connection is closed while cut"
    );
    proxy.set(Fault::Pass);
    let mut healed = TcpStream::connect(proxy.address()).await.expect("connect");
    assert_eq!(
        round_trip(&mut healed, second).await,
        Some(4),
        "passes after the cut"
    );
}

//! sked clustered on PostgreSQL, black-box: several `sked server` nodes on one database schema,
//! `sked worker`s failing over between them, nodes and workers killed with SIGKILL. The ledger
//! is then read from the database: every instant each schedule owed has exactly one run, every
//! run has ended, and no run had a result accepted twice or from an attempt that lost its lease.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the tests are reported as ignored (see build.rs),
//! and under CI they run, so a missing database fails them.

mod common;

use chrono::Utc;
use common::ledger::{create_jobs, pause_and_check_ledger, Sink};
use common::pg::{self, Logs, Node, Schema};
use common::{free_port, shell, Proc, Rng};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const WORKERS: usize = 3;
const SLOTS: &str = "128";
const JOBS: usize = 1000;
/// How long nodes and workers are killed and restarted.
const CHAOS: Duration = Duration::from_secs(60);
/// The product's target is 5 s; this bound leaves room for a loaded two-core machine.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(10);
/// A takeover still unfinished after this long is recorded as is, and fails the test.
const TAKEOVER_GIVE_UP: Duration = Duration::from_secs(20);
/// How long a node may take to answer `/readyz`, on a machine busy with the others.
const NODE_START: Duration = Duration::from_secs(60);

fn spawn_worker(logs: &Logs, name: &str, servers: &str) -> Proc {
    let args = [
        "worker", "--server", servers, "--slots", SLOTS, "--name", name,
    ];
    Proc::spawn(name, &args, &logs.file(name))
}

/// A server node's place in the test: its port survives restarts, so workers' URLs stay valid.
struct NodeSlot {
    label: String,
    port: u16,
    node: Option<Node>,
    restart_at: Option<Instant>,
}

struct WorkerSlot {
    name: String,
    servers: String,
    proc: Option<Proc>,
    restart_at: Option<Instant>,
}

/// A killed node whose partitions are not yet all taken over.
struct Takeover {
    slot: usize,
    node_id: String,
    killed: Instant,
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_nodes_three_workers_sigkill_ledger() {
    let schema = Schema::create().await;
    let mut rng = Rng::from_env();
    let logs = Logs::new();
    println!("schema {}, logs in {}", schema.name, logs.path().display());
    let http = pg::http_client();
    let (sink, sink_url) = Sink::start().await;

    let (mut nodes, bases) = start_nodes(&logs, &http, &schema.url).await;
    let mut workers = start_workers(&logs, &bases);
    let plans = create_jobs(&http, &bases, &sink_url, JOBS).await;
    let creating_took = plans
        .last()
        .map(|p| (Utc::now() - p.created).num_milliseconds())
        .unwrap_or_default();
    println!("{JOBS} jobs created through {NODES} nodes (the last {creating_took} ms ago)");

    // Chaos: every few seconds SIGKILL one node or one worker, restart it after a short pause.
    // At most one node is down at a time, so that each takeover is measured on its own, and at
    // least one worker always runs.
    let started = Instant::now();
    let end = started + CHAOS;
    let mut next_kill = started + rng.millis(1500, 4000);
    let mut pending: Option<Takeover> = None;
    let mut takeovers: Vec<(String, Duration)> = Vec::new();
    let (mut node_kills, mut worker_kills) = (0usize, 0usize);
    loop {
        let now = Instant::now();
        if let Some(done) = poll_takeover(&http, &nodes, &mut pending).await {
            takeovers.push(done);
        }
        restart_due(
            &logs,
            &http,
            &schema.url,
            &mut nodes,
            &mut workers,
            &pending,
        )
        .await;
        if now >= end {
            break;
        }
        if now >= next_kill {
            // Every draw is made whatever is chosen, so a seed replays the same choices.
            let (kind, pick) = (rng.below(2), rng.below(1000) as usize);
            let pause = rng.millis(300, 2500);
            next_kill = now + rng.millis(1000, 4000);
            let node_ok = pending.is_none() && nodes.iter().all(|s| s.node.is_some());
            let alive_workers: Vec<usize> = (0..WORKERS)
                .filter(|&i| workers[i].proc.is_some())
                .collect();
            let worker_ok = alive_workers.len() >= 2;
            // Past half the window, a kind never killed yet goes first.
            let late = now >= started + CHAOS / 2;
            let kill_node = match (node_ok, worker_ok) {
                (true, true) if late && node_kills == 0 => true,
                (true, true) if late && worker_kills == 0 => false,
                (true, true) => kind == 0,
                (ok, _) => ok,
            };
            if kill_node {
                let slot = pick % NODES;
                let mut node = nodes[slot].node.take().expect("every node is up");
                node.proc.sigkill();
                node_kills += 1;
                println!(
                    "{:>6} ms: SIGKILL {} ({}), restart in {} ms",
                    started.elapsed().as_millis(),
                    nodes[slot].label,
                    node.id,
                    pause.as_millis()
                );
                pending = Some(Takeover {
                    slot,
                    node_id: node.id,
                    killed: Instant::now(),
                });
                nodes[slot].restart_at = Some(Instant::now() + pause);
            } else if worker_ok {
                let slot = alive_workers[pick % alive_workers.len()];
                if let Some(mut proc) = workers[slot].proc.take() {
                    proc.sigkill();
                }
                worker_kills += 1;
                println!(
                    "{:>6} ms: SIGKILL {}, restart in {} ms",
                    started.elapsed().as_millis(),
                    workers[slot].name,
                    pause.as_millis()
                );
                workers[slot].restart_at = Some(Instant::now() + pause);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Everything back up, the last takeover measured, every partition owned by a live node.
    let settle = Instant::now() + TAKEOVER_GIVE_UP + NODE_START;
    while pending.is_some()
        || nodes.iter().any(|s| s.node.is_none())
        || workers.iter().any(|s| s.proc.is_none())
    {
        let down: Vec<&str> = (nodes.iter().filter(|s| s.node.is_none()).map(|s| &s.label))
            .chain(workers.iter().filter(|s| s.proc.is_none()).map(|s| &s.name))
            .map(String::as_str)
            .collect();
        assert!(
            Instant::now() < settle,
            "still down after the window: {down:?}"
        );
        if let Some(done) = poll_takeover(&http, &nodes, &mut pending).await {
            takeovers.push(done);
        }
        // The window is over: no more pauses, whatever was drawn.
        for slot in nodes.iter_mut() {
            slot.restart_at = slot.restart_at.map(|_| Instant::now());
        }
        for slot in workers.iter_mut() {
            slot.restart_at = slot.restart_at.map(|_| Instant::now());
        }
        restart_due(
            &logs,
            &http,
            &schema.url,
            &mut nodes,
            &mut workers,
            &pending,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    all_partitions_owned(
        &http,
        &nodes,
        &bases,
        "the three live nodes holding every partition",
    )
    .await;
    let (report, _) = pause_and_check_ledger(&http, &bases, &plans, &schema, &sink).await;
    println!("{report}");
    println!("{node_kills} node kills, {worker_kills} worker kills in {CHAOS:?}");
    for (id, took) in &takeovers {
        println!("  takeover of {id}: {} ms", took.as_millis());
    }
    let longest = takeovers
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    println!("longest partition takeover: {} ms", longest.as_millis());
    assert!(
        node_kills >= 1 && worker_kills >= 1,
        "the window killed {node_kills} nodes and {worker_kills} workers; both kinds must die"
    );
    assert_eq!(
        takeovers.len(),
        node_kills,
        "every node kill has its takeover measured: {takeovers:?}"
    );
    assert!(
        longest < TAKEOVER_LIMIT,
        "partitions of a killed node were taken over within {TAKEOVER_LIMIT:?}: {takeovers:?}"
    );

    drop(nodes);
    drop(workers);
    schema.drop_schema().await;
}

/// Three server nodes on the schema, each ready, every partition owned; and their base URLs.
async fn start_nodes(
    logs: &Logs,
    http: &reqwest::Client,
    url: &str,
) -> (Vec<NodeSlot>, Vec<String>) {
    let mut nodes: Vec<NodeSlot> = (0..NODES)
        .map(|i| NodeSlot {
            label: format!("node-{i}"),
            port: free_port(),
            node: None,
            restart_at: None,
        })
        .collect();
    for slot in nodes.iter_mut() {
        slot.node = Some(Node::spawn(logs, &slot.label, slot.port, url));
    }
    for slot in nodes.iter_mut() {
        let node = slot.node.as_mut().expect("just started");
        node.ready(http, NODE_START).await;
    }
    let bases: Vec<String> = nodes
        .iter()
        .map(|s| format!("http://127.0.0.1:{}", s.port))
        .collect();
    all_partitions_owned(http, &nodes, &bases, "three nodes holding every partition").await;
    (nodes, bases)
}

/// Waits until the nodes now in `nodes` are alive and hold every partition between them.
async fn all_partitions_owned(
    http: &reqwest::Client,
    nodes: &[NodeSlot],
    bases: &[String],
    what: &str,
) {
    let ids: Vec<String> = nodes.iter().map(|s| node_id(s).to_string()).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    pg::wait_cluster(http, &bases[0], Duration::from_secs(30), what, |view| {
        pg::all_alive_and_owned(view, &id_refs)
    })
    .await;
}

/// One worker per node: each starts on a different node and fails over through the others in
/// turn.
fn start_workers(logs: &Logs, bases: &[String]) -> Vec<WorkerSlot> {
    (0..WORKERS)
        .map(|i| {
            let servers: Vec<&str> = (0..NODES)
                .map(|k| bases[(i + k) % NODES].as_str())
                .collect();
            let name = format!("worker-{i}");
            let servers = servers.join(",");
            WorkerSlot {
                proc: Some(spawn_worker(logs, &name, &servers)),
                name,
                servers,
                restart_at: None,
            }
        })
        .collect()
}

/// How long a node or a worker stopped with SIGTERM may take to exit before the test calls it
/// stuck (a worker drains its running attempts first: a second here).
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Stops `proc` with SIGTERM and waits for it to exit; fails if it needed SIGKILL.
async fn stop_gracefully(mut proc: Proc) {
    let name = proc.name.clone();
    let began = Instant::now();
    let proc = tokio::task::spawn_blocking(move || {
        proc.stop(STOP_GRACE);
        proc
    })
    .await
    .expect("stopping");
    assert!(
        began.elapsed() < STOP_GRACE,
        "{name} did not exit within {STOP_GRACE:?} of SIGTERM"
    );
    drop(proc);
    println!(
        "         {name} stopped in {} ms",
        began.elapsed().as_millis()
    );
}

/// A rolling restart while 1,000 schedules fire: each node in turn is stopped with SIGTERM
/// (it answers its open lease polls and gives its partitions back as soon as it stops firing)
/// and started again, then each worker (SIGTERM drains it: it takes nothing new, takes the
/// answer of a poll in flight, and finishes what it runs). Nothing is lost: every instant has
/// one run, every run ended, and no attempt was lost with its worker or its node. (An instant
/// that falls due while a partition changes hands may be recorded `skipped (misfire)` by its
/// job's policy when its new node loads it: recorded, never silently dropped.)
#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_nodes_and_three_workers_loses_nothing() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    println!("schema {}, logs in {}", schema.name, logs.path().display());
    let http = pg::http_client();
    let (sink, sink_url) = Sink::start().await;
    let (mut nodes, bases) = start_nodes(&logs, &http, &schema.url).await;
    let mut workers = start_workers(&logs, &bases);
    let plans = create_jobs(&http, &bases, &sink_url, JOBS).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;

    for i in 0..nodes.len() {
        let slot = &mut nodes[i];
        let node = slot.node.take().expect("every node is up");
        println!(
            "{:>6} ms: SIGTERM {} ({})",
            started.elapsed().as_millis(),
            slot.label,
            node.id
        );
        stop_gracefully(node.proc).await;
        let mut fresh = Node::spawn(&logs, &slot.label, slot.port, &schema.url);
        fresh.ready(&http, NODE_START).await;
        println!("         {} back as {}", slot.label, fresh.id);
        slot.node = Some(fresh);
        all_partitions_owned(&http, &nodes, &bases, "the nodes holding every partition").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for slot in workers.iter_mut() {
        let proc = slot.proc.take().expect("every worker is up");
        println!(
            "{:>6} ms: SIGTERM {}",
            started.elapsed().as_millis(),
            slot.name
        );
        stop_gracefully(proc).await;
        slot.proc = Some(spawn_worker(&logs, &slot.name, &slot.servers));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let (report, lost) = pause_and_check_ledger(&http, &bases, &plans, &schema, &sink).await;
    println!("{report}");
    assert_eq!(lost, 0, "a graceful restart loses no attempt: {report}");
    drop(nodes);
    drop(workers);
    schema.drop_schema().await;
}

fn node_id(slot: &NodeSlot) -> &str {
    slot.node
        .as_ref()
        .map(|n| n.id.as_str())
        .unwrap_or_default()
}

/// Looks at the cluster through a surviving node: the takeover is over once the killed node
/// holds no partition and none is unowned. Returns the measured takeover when it ends.
async fn poll_takeover(
    http: &reqwest::Client,
    nodes: &[NodeSlot],
    pending: &mut Option<Takeover>,
) -> Option<(String, Duration)> {
    let takeover = pending.as_ref()?;
    let watcher = nodes
        .iter()
        .find_map(|s| s.node.as_ref())
        .expect("a node survives");
    // A busy node may miss a poll; the give-up bound below still applies.
    if let Ok(view) = pg::cluster(http, &watcher.base()).await {
        let held = pg::member(&view, &takeover.node_id)
            .and_then(|n| n["partitions"].as_u64())
            .unwrap_or(0);
        if held == 0 && view["unowned"] == 0 {
            let took = takeover.killed.elapsed();
            println!(
                "         takeover of {} done in {} ms",
                takeover.node_id,
                took.as_millis()
            );
            return pending.take().map(|t| (t.node_id, took));
        }
    }
    if takeover.killed.elapsed() > TAKEOVER_GIVE_UP {
        let view = pg::cluster(http, &watcher.base()).await;
        println!(
            "takeover of {} unfinished after {TAKEOVER_GIVE_UP:?}: {view:?}",
            takeover.node_id
        );
        return pending.take().map(|t| (t.node_id, t.killed.elapsed()));
    }
    None
}

/// Restarts every killed node and worker whose pause is over. A node waits for its takeover to
/// be measured first, so that its return does not blur the measurement.
async fn restart_due(
    logs: &Logs,
    http: &reqwest::Client,
    url: &str,
    nodes: &mut [NodeSlot],
    workers: &mut [WorkerSlot],
    pending: &Option<Takeover>,
) {
    let now = Instant::now();
    for (i, slot) in nodes.iter_mut().enumerate() {
        let due = slot.restart_at.is_some_and(|t| t <= now);
        if due && pending.as_ref().is_none_or(|t| t.slot != i) {
            let mut node = Node::spawn(logs, &slot.label, slot.port, url);
            node.ready(http, NODE_START).await;
            println!("         {} back as {}", slot.label, node.id);
            slot.node = Some(node);
            slot.restart_at = None;
        }
    }
    for slot in workers.iter_mut() {
        if slot.restart_at.is_some_and(|t| t <= now) {
            slot.proc = Some(spawn_worker(logs, &slot.name, &slot.servers));
            slot.restart_at = None;
        }
    }
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_worker_keeps_its_job_when_its_server_dies_and_goes_back_when_it_returns() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, NODE_START).await;
    b.ready(&http, NODE_START).await;
    let servers = format!("{},{}", a.base(), b.base());
    let _worker = Proc::spawn(
        "worker",
        &[
            "worker", "--server", &servers, "--slots", "1", "--name", "w-ab",
        ],
        &logs.file("worker"),
    );

    let job = json!({"target": shell("sleep 5; echo done")});
    create_job(&http, &a.base(), "slow", &job).await;
    let resp = http
        .post(format!("{}/api/v1/jobs/slow/trigger", a.base()))
        .send()
        .await
        .expect("trigger the job");
    assert_eq!(resp.status().as_u16(), 201, "trigger answered {resp:?}");
    let run: Value = resp.json().await.expect("the triggered run");
    let id = run["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no run id in {run}"));

    let running = wait_run(&http, &a.base(), id, Duration::from_secs(30), |r| {
        r["state"] == "running"
    })
    .await;
    // The attempt is on its way; the node the worker speaks to dies under it.
    a.proc.sigkill();
    let killed = Utc::now();
    println!("node A ({}) killed while run {id} runs: {running}", a.id);

    let run = wait_run(&http, &b.base(), id, Duration::from_secs(40), |r| {
        common::is_terminal(&r["state"])
    })
    .await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let tries = run["attempt_history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(tries.len(), 1, "one attempt, never restarted: {run}");
    let attempt = &tries[0];
    assert_eq!(attempt["state"], "succeeded", "{run}");
    assert_eq!(attempt["exit_code"], 0, "{run}");
    let (start, finish) = (
        common::instant(&attempt["started_at"]),
        common::instant(&attempt["finished_at"]),
    );
    assert!(
        finish - start >= chrono::Duration::seconds(5),
        "the attempt ran its whole 5 s sleep: {run}"
    );
    assert!(
        finish > killed,
        "the result was reported after node A died, so to node B: {run}"
    );
    let log = http
        .get(format!("{}/api/v1/runs/{id}/log", b.base()))
        .send()
        .await
        .expect("GET the run's log");
    assert_eq!(log.status().as_u16(), 200);
    let text = log.text().await.unwrap_or_default();
    assert!(
        text.contains("done"),
        "the output is the attempt's: {text:?}"
    );

    // Node A returns on its address: the worker, whose list starts with A, goes back to it.
    let mut a = Node::spawn(&logs, "node-a-again", a.port, &schema.url);
    a.ready(&http, NODE_START).await;
    let job = json!({"schedule": {"every": "1s"}, "target": shell("true")});
    create_job(&http, &b.base(), "tick", &job).await;
    // Within the worker's home check (10 s) and the lease poll it already has at B (20 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    while started(&http, &a.base()).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the worker did not go back to node A; its log ends:\n{}",
            pg::tail(&logs.file("worker"), 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at_b = started(&http, &b.base()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        started(&http, &b.base()).await,
        at_b,
        "node B still hands attempts to the worker that went back to A"
    );
    drop((a, b));
    schema.drop_schema().await;
}

/// Creates job `name` through the node at `base`.
async fn create_job(http: &reqwest::Client, base: &str, name: &str, job: &Value) {
    let resp = http
        .put(format!("{base}/api/v1/jobs/{name}"))
        .json(job)
        .send()
        .await
        .expect("PUT the job");
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
}

/// `sked_attempts_started_total` of the node at `base`: the attempts it handed to workers.
async fn started(http: &reqwest::Client, base: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    common::metric(&text, "sked_attempts_started_total")
}

/// Polls `GET /api/v1/runs/{id}` at `base` until `done` holds of the run.
async fn wait_run(
    http: &reqwest::Client,
    base: &str,
    id: i64,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    let url = format!("{base}/api/v1/runs/{id}");
    loop {
        let last = match http.get(&url).send().await {
            Ok(resp) => resp.json::<Value>().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Ok(run) = &last {
            if done(run) {
                return run.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "run {id} at {base}: not there within {within:?}; last answer: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn two_nodes_started_at_once_on_an_empty_schema_both_come_up() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    // Both start before either is ready: they race to migrate the empty schema.
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, NODE_START).await;
    b.ready(&http, NODE_START).await;
    assert_ne!(a.id, b.id, "each process is a node of its own");

    let db = schema.client().await;
    let versions: Vec<(i32, i32)> = db
        .query("SELECT id, version FROM sked_schema", &[])
        .await
        .expect("read sked_schema")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let latest = version_one_node_migrates_to(&logs, &http).await;
    assert_eq!(
        versions,
        vec![(1, latest)],
        "one schema row at the version a lone node migrates to"
    );

    let ids = [a.id.as_str(), b.id.as_str()];
    let settled = |view: &Value| {
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        let maintainers = nodes.iter().filter(|n| n["maintenance"] == true).count();
        pg::all_alive_and_owned(view, &ids)
            && nodes.len() == 2
            && nodes.iter().all(|n| n["partitions"] == 128)
            && maintainers == 1
    };
    for node in [&a, &b] {
        let view = pg::wait_cluster(
            &http,
            &node.base(),
            Duration::from_secs(15),
            "two alive nodes of 128 partitions each, one of them maintaining",
            settled,
        )
        .await;
        assert_eq!(view["node"], node.id.as_str(), "{view}");
        assert_eq!(view["partitions"], 256, "{view}");
        println!("{}: {view}", node.proc.name);
    }
    drop((a, b));
    schema.drop_schema().await;
}

/// The schema version a single node leaves an empty schema at: the newest this build knows.
async fn version_one_node_migrates_to(logs: &Logs, http: &reqwest::Client) -> i32 {
    let reference = Schema::create().await;
    let mut node = Node::spawn(logs, "reference", free_port(), &reference.url);
    node.ready(http, NODE_START).await;
    let version: i32 = reference
        .client()
        .await
        .query_one("SELECT version FROM sked_schema WHERE id = 1", &[])
        .await
        .expect("read the reference version")
        .get(0);
    node.proc.stop(Duration::from_secs(10));
    reference.drop_schema().await;
    version
}

//! A dependency graph on a cluster whose nodes are killed: three `sked server` nodes on one
//! PostgreSQL schema, two workers failing over between them, a 200-job graph whose 8 roots
//! fire every 5 s, and a node SIGKILLed every few seconds. The ledger is then read from the
//! database: no run succeeded twice, no dependant started before every upstream it waited for
//! had succeeded, and every upstream run that ended has its dependants' runs at its instant,
//! each ended in the state its upstreams call for. Each root's succeeded run also emits an
//! event (`on_success`) that starts a job of its own: every succeeded root run emitted exactly
//! one event, and every event started exactly one run, after the root run ended.
//!
//! Needs `SKED_TEST_DATABASE_URL`; without it the test is reported as ignored (see build.rs),
//! and under CI it runs, so a missing database fails it.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{free_port, shell, Proc, Rng};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const ROOTS: usize = 8;
const JOBS: usize = 200;
const CHAOS: Duration = Duration::from_secs(30);
const DRAIN: Duration = Duration::from_secs(90);
const NODE_START: Duration = Duration::from_secs(60);

/// The upstreams of job `i`: a root has none; every other job waits for one or two jobs
/// before it, drawn from the seed.
fn plan(rng: &mut Rng) -> Vec<Vec<usize>> {
    (0..JOBS)
        .map(|i| {
            if i < ROOTS {
                return Vec::new();
            }
            let first = rng.below(i as u64) as usize;
            let second = rng.below(i as u64) as usize;
            let mut ups = vec![first];
            if rng.below(3) == 0 && second != first {
                ups.push(second);
            }
            ups
        })
        .collect()
}

fn name(i: usize) -> String {
    format!("g{i:03}")
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_graph_keeps_its_order_while_nodes_die() {
    let schema = Schema::create().await;
    let mut rng = Rng::from_env();
    let logs = Logs::new();
    println!("schema {}, logs in {}", schema.name, logs.path().display());
    let http = pg::http_client();
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let mut nodes: Vec<Option<Node>> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| Some(Node::spawn(&logs, &format!("node-{i}"), *port, &schema.url)))
        .collect();
    for node in nodes.iter_mut().flatten() {
        node.ready(&http, NODE_START).await;
    }
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let workers: Vec<Proc> = (0..2)
        .map(|i| {
            let servers: Vec<&str> = (0..NODES)
                .map(|k| bases[(i + k) % NODES].as_str())
                .collect();
            let servers = servers.join(",");
            let name = format!("worker-{i}");
            let args = [
                "worker", "--server", &servers, "--slots", "32", "--name", &name,
            ];
            Proc::spawn(&name, &args, &logs.file(&name))
        })
        .collect();

    // Upstreams first: a definition may only name jobs that exist. The roots share one anchor,
    // so their instants are the same and a fan-in over two roots' descendants meets.
    let upstreams = plan(&mut rng);
    let anchor = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    for (i, ups) in upstreams.iter().enumerate() {
        let mut job = json!({"target": shell("true"), "retry": {"max_attempts": 2}});
        if ups.is_empty() {
            job["schedule"] = json!({"every": "5s", "anchor": anchor});
            job["on_success"] = json!({"emit": format!("{}.done", name(i))});
        } else {
            job["depends_on"] = ups.iter().map(|u| json!({"job": name(*u)})).collect();
        }
        let base = &bases[i % NODES];
        let (status, body) = common::call(
            &http,
            reqwest::Method::PUT,
            format!("{base}/api/v1/jobs/{}", name(i)),
            Some(job),
        )
        .await;
        assert_eq!(status, 201, "{}: {body}", name(i));
    }
    // A job per root, started by each event its root emits.
    for i in 0..ROOTS {
        let job =
            json!({"schedule": {"event": format!("{}.done", name(i))}, "target": shell("true")});
        let (status, body) = common::call(
            &http,
            reqwest::Method::PUT,
            format!("{}/api/v1/jobs/on-{}", bases[i % NODES], name(i)),
            Some(job),
        )
        .await;
        assert_eq!(status, 201, "on-{}: {body}", name(i));
    }

    // Chaos: a node killed every 3 to 7 s, back after a short pause, one at a time.
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < CHAOS {
        tokio::time::sleep(rng.millis(3000, 7000)).await;
        let slot = rng.below(NODES as u64) as usize;
        let pause = rng.millis(500, 2000);
        if let Some(mut node) = nodes[slot].take() {
            node.proc.sigkill();
            kills += 1;
            println!(
                "{:>6} ms: SIGKILL node-{slot}, back in {} ms",
                started.elapsed().as_millis(),
                pause.as_millis()
            );
            tokio::time::sleep(pause).await;
            let mut again = Node::spawn(
                &logs,
                &format!("node-{slot}-again{kills}"),
                ports[slot],
                &schema.url,
            );
            again.ready(&http, NODE_START).await;
            nodes[slot] = Some(again);
        }
    }
    assert!(kills >= 2, "the window killed {kills} nodes");

    // Stop the roots (their instants from now on are recorded skipped) and let the graph drain.
    for i in 0..ROOTS {
        let (status, body) = common::call(
            &http,
            reqwest::Method::POST,
            format!("{}/api/v1/jobs/{}/pause", bases[0], name(i)),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let db = schema.client().await;
    let began = Instant::now();
    loop {
        let active: i64 = db
            .query_one(
                "SELECT count(*) FROM runs WHERE state IN ('waiting', 'queued', 'running')",
                &[],
            )
            .await
            .expect("count active runs")
            .get(0);
        if active == 0 {
            break;
        }
        assert!(
            began.elapsed() < DRAIN,
            "{active} runs still active {DRAIN:?} after pausing the roots"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    check(&db, &upstreams).await;
    check_events(&db).await;
    drop(nodes);
    drop(workers);
    schema.drop_schema().await;
}

/// One run as the check reads it.
struct Run {
    id: i64,
    state: String,
    skip_reason: Option<String>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
}

async fn check(db: &tokio_postgres::Client, upstreams: &[Vec<usize>]) {
    let rows = db
        .query(
            "SELECT id, job, scheduled_for, state, skip_reason, started_at, finished_at \
             FROM runs WHERE trigger <> 'event'",
            &[],
        )
        .await
        .expect("read the runs");
    // (job, instant) -> run; the ledger's key makes it one at most.
    let mut runs: BTreeMap<(String, i64), Run> = BTreeMap::new();
    for row in &rows {
        runs.insert(
            (row.get(1), row.get(2)),
            Run {
                id: row.get(0),
                state: row.get(3),
                skip_reason: row.get(4),
                started_at: row.get(5),
                finished_at: row.get(6),
            },
        );
    }
    let twice: Vec<i64> = db
        .query(
            "SELECT run_id FROM attempts WHERE state = 'succeeded' GROUP BY run_id \
             HAVING count(*) > 1",
            &[],
        )
        .await
        .expect("read attempts")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut problems: Vec<String> = twice
        .iter()
        .map(|id| format!("run {id} succeeded in two attempts"))
        .collect();
    let instants: BTreeSet<i64> = runs
        .keys()
        .filter(|(job, _)| upstreams[job[1..].parse::<usize>().unwrap_or(0)].is_empty())
        .map(|(_, at)| *at)
        .collect();
    let (mut released, mut skipped) = (0usize, 0usize);
    for at in &instants {
        for (i, ups) in upstreams.iter().enumerate().filter(|(_, u)| !u.is_empty()) {
            let ended: Vec<&Run> = ups
                .iter()
                .filter_map(|u| runs.get(&(name(*u), *at)))
                .collect();
            let mine = runs.get(&(name(i), *at));
            let Some(run) = mine else {
                // A dependant's run exists once any of its upstreams' runs ended.
                if !ended.is_empty() {
                    problems.push(format!(
                        "{} has no run at {at} though an upstream ended",
                        name(i)
                    ));
                }
                continue;
            };
            if run.state == "succeeded" {
                released += 1;
                let first_start = run.started_at.unwrap_or(i64::MIN);
                for (u, upstream) in ups
                    .iter()
                    .zip(ups.iter().map(|u| runs.get(&(name(*u), *at))))
                {
                    match upstream {
                        Some(up) if up.state == "succeeded" => {
                            if up.finished_at.unwrap_or(i64::MAX) > first_start {
                                problems.push(format!(
                                    "run {} of {} started before run {} of {} ended",
                                    run.id,
                                    name(i),
                                    up.id,
                                    name(*u)
                                ));
                            }
                        }
                        other => problems.push(format!(
                            "run {} of {} succeeded though {} at {at} is {:?}",
                            run.id,
                            name(i),
                            name(*u),
                            other.map(|r| r.state.as_str())
                        )),
                    }
                }
            } else if run.state == "skipped" {
                skipped += 1;
                let failed_upstream = ups.iter().any(|u| {
                    runs.get(&(name(*u), *at))
                        .is_some_and(|r| r.state != "succeeded")
                });
                let reason = run.skip_reason.as_deref();
                if reason == Some("upstream_failed") && !failed_upstream {
                    problems.push(format!(
                        "run {} of {} skipped as upstream_failed with every upstream succeeded",
                        run.id,
                        name(i)
                    ));
                }
            } else if run.state != "failed" && run.state != "timed_out" {
                problems.push(format!(
                    "run {} of {} ended {} (not a dependant's outcome here)",
                    run.id,
                    name(i),
                    run.state
                ));
            }
        }
    }
    println!(
        "{} root instants; {released} dependant runs succeeded after their upstreams, {skipped} \
         skipped; {} problems",
        instants.len(),
        problems.len()
    );
    assert!(released > 0, "some dependants ran");
    assert!(
        problems.is_empty(),
        "{} problems, the first ones:\n{}",
        problems.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every succeeded root run emitted one event, and every event started one run, which began
/// after the root run ended.
async fn check_events(db: &tokio_postgres::Client) {
    let mut problems = Vec::new();
    let roots = db
        .query(
            "SELECT r.id, r.finished_at, count(e.id) FROM runs r \
             LEFT JOIN events e ON e.emitted_by_run = r.id \
             WHERE r.trigger <> 'event' AND r.state = 'succeeded' AND r.job < 'g008' \
             GROUP BY r.id, r.finished_at",
            &[],
        )
        .await
        .expect("read root runs and their events");
    let mut finished: BTreeMap<i64, i64> = BTreeMap::new();
    for row in &roots {
        let (id, events): (i64, i64) = (row.get(0), row.get(2));
        finished.insert(id, row.get(1));
        if events != 1 {
            problems.push(format!("root run {id} emitted {events} events"));
        }
    }
    let started = db
        .query(
            "SELECT e.emitted_by_run, e.event_id, count(r.id), min(r.started_at) FROM events e \
             LEFT JOIN runs r ON r.event_key = e.key AND r.event_id = e.event_id \
             GROUP BY e.emitted_by_run, e.event_id",
            &[],
        )
        .await
        .expect("read events and their runs");
    for row in &started {
        let (root, id, runs): (Option<i64>, String, i64) = (row.get(0), row.get(1), row.get(2));
        let start: Option<i64> = row.get(3);
        if runs != 1 {
            problems.push(format!("event {id} started {runs} runs"));
        }
        let ended = root.and_then(|r| finished.get(&r)).copied();
        if let (Some(start), Some(ended)) = (start, ended) {
            if start < ended {
                problems.push(format!(
                    "the run event {id} started began before its root ended"
                ));
            }
        }
    }
    println!(
        "{} root runs succeeded, {} events; {} problems",
        roots.len(),
        started.len(),
        problems.len()
    );
    assert!(!started.is_empty(), "some events were emitted");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

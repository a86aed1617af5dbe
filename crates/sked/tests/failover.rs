//! sked through a PostgreSQL primary failover, black-box: three `sked server` nodes and three
//! workers on a pg_auto_failover formation (a primary and a synchronous secondary, reached
//! through a multi-host URL with `target_session_attrs=read-write`), jobs firing every second
//! or two at an HTTP sink, and a writer creating jobs through the nodes all along. The primary
//! is killed with SIGKILL (its keeper too, so nothing restarts it) and the secondary promoted;
//! then the ledger is read from the promoted database: every instant each schedule owed has
//! exactly one run, every run has ended, no attempt had a result accepted twice or reached the
//! sink unrecorded, and every job whose PUT was acknowledged is there.
//!
//! `SKED_FAILOVER_RUNS` repeats it, each time on a fresh formation (the long form, with
//! `--release`, is the bench command in docs/BENCHMARKS.md). Needs `SKED_TEST_DATABASE_URL`
//! and pg_auto_failover's `/usr/bin/pg_autoctl`; without them the test is reported as ignored
//! (see the store's build.rs), and under CI it runs, so their absence fails it.

mod common;

use chrono::{DateTime, Utc};
use common::failover::Formation;
use common::ledger::{create_jobs, pause_and_check_ledger, Sink};
use common::pg::{self, Logs, Node, Schema};
use common::{free_port, Proc};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: usize = 3;
const WORKERS: usize = 3;
const SLOTS: &str = "128";
/// A third fire every second, the rest every two: 300 runs a second, which this two-core
/// machine keeps up with beside the three PostgreSQL servers of the formation.
const JOBS: usize = 450;
/// How long the jobs fire before the primary is killed, and after work has resumed.
const BEFORE: Duration = Duration::from_secs(10);
const AFTER: Duration = Duration::from_secs(10);
/// From promotion to runs reaching the sink again and every partition held by a live node.
const RESUME_LIMIT: Duration = Duration::from_secs(15);
/// The formation's own promotion: not what is tested, but bounded.
const PROMOTION_GIVE_UP: Duration = Duration::from_secs(60);
const FORMATION_START: Duration = Duration::from_secs(120);
const NODE_START: Duration = Duration::from_secs(60);
/// A write the writer gives up on (and counts as not acknowledged).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one failover measured.
struct Figures {
    promotion: Duration,
    work_resumed: Duration,
    partitions_owned: Duration,
    runs_checked: usize,
    ran_twice: usize,
    writes_acknowledged: usize,
    writes_after_promotion: usize,
    writes_refused: usize,
}

#[cfg_attr(
    not(sked_failover_tests),
    ignore = "needs SKED_TEST_DATABASE_URL and pg_auto_failover (/usr/bin/pg_autoctl)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_come_through_a_postgres_primary_failover_with_a_clean_ledger() {
    let runs: usize = match std::env::var("SKED_FAILOVER_RUNS") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("SKED_FAILOVER_RUNS={text:?} is not a count")),
        Err(_) => 1,
    };
    let mut all = Vec::new();
    for run in 1..=runs {
        println!("== failover {run} of {runs}");
        let figures = one_failover().await;
        println!(
            "failover {run}: promoted {} ms after the kill; work resumed {} ms and every \
             partition owned {} ms after promotion; {} runs checked, {} ran twice; {} \
             acknowledged writes checked ({} after promotion, {} refused or unanswered)",
            figures.promotion.as_millis(),
            figures.work_resumed.as_millis(),
            figures.partitions_owned.as_millis(),
            figures.runs_checked,
            figures.ran_twice,
            figures.writes_acknowledged,
            figures.writes_after_promotion,
            figures.writes_refused,
        );
        all.push(figures);
    }
    if runs > 1 {
        let ms = |pick: fn(&Figures) -> Duration| {
            let values: Vec<u128> = all.iter().map(|f| pick(f).as_millis()).collect();
            format!(
                "{:?} (min {} ms, max {} ms)",
                values,
                values.iter().min().unwrap_or(&0),
                values.iter().max().unwrap_or(&0)
            )
        };
        println!("promotion after the kill, ms: {}", ms(|f| f.promotion));
        println!(
            "work resumed after promotion, ms: {}",
            ms(|f| f.work_resumed)
        );
        println!(
            "partitions owned after promotion, ms: {}",
            ms(|f| f.partitions_owned)
        );
    }
}

async fn one_failover() -> Figures {
    let logs = Logs::new();
    println!("logs in {}", logs.path().display());
    let mut formation = Formation::start(&logs, FORMATION_START).await;
    let schema = schema_on(&formation).await;
    let http = pg::http_client();
    let (sink, sink_url) = Sink::start().await;

    let (nodes, bases) = start_nodes(&logs, &http, &schema.url).await;
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let workers = start_workers(&logs, &bases);
    let plans = create_jobs(&http, &bases, &sink_url, JOBS).await;
    println!("{JOBS} jobs created through {NODES} nodes");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_jobs(bases.clone(), stop.clone()));

    tokio::time::sleep(BEFORE).await;
    let (dead_port, killed) = formation.kill_primary().await;
    println!("SIGKILL the primary on {dead_port} and its keeper");
    let promotion = formation.wait_promoted(PROMOTION_GIVE_UP).await;
    let promoted = killed + promotion;
    let promoted_utc = Utc::now();
    println!("promoted {} ms after the kill", promotion.as_millis());

    // Work resumes: the sink sees an attempt it had not seen at promotion (an attempt is
    // handed out only once recorded, so this one was written to the promoted node), and
    // every partition is held by one of the three live nodes again, each of which has renewed
    // its leases since (on the promoted node: the dead one's rows may still look alive).
    let seen_at_promotion = sink.seen.lock().expect("sink lock").clone();
    let (mut work_resumed, mut partitions_owned) = (None, None);
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut last_view = String::new();
    while work_resumed.is_none() || partitions_owned.is_none() {
        if work_resumed.is_none()
            && sink
                .seen
                .lock()
                .expect("sink lock")
                .keys()
                .any(|pair| !seen_at_promotion.contains_key(pair))
        {
            work_resumed = Some(promoted.elapsed());
        }
        if partitions_owned.is_none() {
            for base in &bases {
                match pg::cluster(&http, base).await {
                    Ok(view)
                        if pg::all_alive_and_owned(&view, &id_refs)
                            && renewed_since(&view, &id_refs, promoted_utc) =>
                    {
                        partitions_owned = Some(promoted.elapsed());
                        break;
                    }
                    Ok(view) => last_view = view.to_string(),
                    Err(e) => last_view = e,
                }
            }
        }
        assert!(
            promoted.elapsed() < RESUME_LIMIT,
            "{RESUME_LIMIT:?} after promotion: runs reached the sink again after {work_resumed:?}, \
             every partition owned after {partitions_owned:?}; the last cluster view: {last_view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (work_resumed, partitions_owned) = (
        work_resumed.unwrap_or_default(),
        partitions_owned.unwrap_or_default(),
    );
    println!(
        "after promotion: runs reached the sink again in {} ms, every partition owned in {} ms",
        work_resumed.as_millis(),
        partitions_owned.as_millis()
    );

    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.expect("the writer");

    let (report, _) = pause_and_check_ledger(&http, &bases, &plans, &schema, &sink).await;
    println!("{report}");
    let runs_checked = report
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();

    // No attempt that reached the sink lost its lease: no worker was blamed for the outage, so
    // nothing ran twice.
    let db = schema.client().await;
    let seen = sink.seen.lock().expect("sink lock").clone();
    let ran_twice: Vec<(i64, i64)> = db
        .query(
            "SELECT run_id, number FROM attempts WHERE state = 'lost' ORDER BY run_id, number",
            &[],
        )
        .await
        .expect("read the lost attempts")
        .iter()
        .map(|r| (r.get::<_, i64>(0), i64::from(r.get::<_, i32>(1))))
        .filter(|pair| seen.contains_key(pair))
        .collect();
    println!(
        "{} lost attempts had reached the sink (their runs ran twice)",
        ran_twice.len()
    );
    assert!(
        ran_twice.is_empty(),
        "{} attempts reached the sink and then lost their lease, so their runs ran again \
         (workers blamed for the database's outage?): {:?}",
        ran_twice.len(),
        &ran_twice[..ran_twice.len().min(10)]
    );

    // Every acknowledged PUT's job is in the promoted database.
    let acknowledged: Vec<String> = writes.acknowledged.iter().map(|(n, _)| n.clone()).collect();
    let found: HashSet<String> = db
        .query(
            "SELECT name FROM jobs WHERE name = ANY($1)",
            &[&acknowledged],
        )
        .await
        .expect("read the written jobs")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut lost: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !found.contains(*n))
        .collect();
    lost.sort();
    let writes_after_promotion = writes
        .acknowledged
        .iter()
        .filter(|(_, at)| *at > promoted)
        .count();
    println!(
        "{} acknowledged writes checked ({writes_after_promotion} after promotion), {} lost; \
         {} refused or unanswered",
        acknowledged.len(),
        lost.len(),
        writes.refused
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged job writes are missing after the failover: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(
        writes_after_promotion > 0,
        "no job write was acknowledged after promotion"
    );

    drop(workers);
    drop(nodes);
    drop(formation);
    Figures {
        promotion,
        work_resumed,
        partitions_owned,
        runs_checked,
        ran_twice: ran_twice.len(),
        writes_acknowledged: acknowledged.len(),
        writes_after_promotion,
        writes_refused: writes.refused,
    }
}

/// Whether every node in `ids` was last seen after `since`.
fn renewed_since(view: &Value, ids: &[&str], since: DateTime<Utc>) -> bool {
    ids.iter().all(|id| {
        pg::member(view, id)
            .and_then(|m| m["seen_at"].as_str())
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .is_some_and(|at| at > since)
    })
}

/// A fresh schema on the formation, reached through its multi-host URL.
async fn schema_on(formation: &Formation) -> Schema {
    let base = formation.url();
    let admin = sked_store::postgres::client(&base)
        .await
        .expect("connect to the formation's primary");
    let name = format!("sked_fo_{:016x}", rand::random::<u64>());
    admin
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await
        .expect("create a schema");
    let url = format!("{base}&options=-csearch_path%3D{name}");
    Schema { admin, name, url }
}

/// Three server nodes on `url`, each ready, every partition owned; and their base URLs.
async fn start_nodes(logs: &Logs, http: &reqwest::Client, url: &str) -> (Vec<Node>, Vec<String>) {
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::spawn(logs, &format!("node-{i}"), free_port(), url))
        .collect();
    for node in nodes.iter_mut() {
        node.ready(http, NODE_START).await;
    }
    let bases: Vec<String> = nodes.iter().map(Node::base).collect();
    let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    pg::wait_cluster(
        http,
        &bases[0],
        Duration::from_secs(30),
        "three nodes holding every partition",
        |view| pg::all_alive_and_owned(view, &ids),
    )
    .await;
    (nodes, bases)
}

/// One worker per node: each starts on a different node and fails over through the others.
fn start_workers(logs: &Logs, bases: &[String]) -> Vec<Proc> {
    (0..WORKERS)
        .map(|i| {
            let servers: Vec<&str> = (0..NODES)
                .map(|k| bases[(i + k) % NODES].as_str())
                .collect();
            let name = format!("worker-{i}");
            let servers = servers.join(",");
            let args = [
                "worker", "--server", &servers, "--slots", SLOTS, "--name", &name,
            ];
            Proc::spawn(&name, &args, &logs.file(&name))
        })
        .collect()
}

/// What the writer did: the jobs whose PUT was answered 2xx, with when, and how many PUTs
/// were refused or went unanswered.
struct Writes {
    acknowledged: Vec<(String, Instant)>,
    refused: usize,
}

/// PUTs new jobs, one node after another, until `stop`. They are paused and have no
/// schedule, so they never make a run and leave the ledger alone.
async fn write_jobs(bases: Vec<String>, stop: Arc<AtomicBool>) -> Writes {
    let http = reqwest::Client::builder()
        .default_headers({
            let mut headers = reqwest::header::HeaderMap::new();
            let value = format!("Bearer {}", common::ADMIN_TOKEN)
                .parse()
                .expect("a header value");
            headers.insert(reqwest::header::AUTHORIZATION, value);
            headers
        })
        .timeout(WRITE_TIMEOUT)
        .build()
        .expect("client");
    let mut writes = Writes {
        acknowledged: Vec::new(),
        refused: 0,
    };
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let name = format!("w{n:06}");
        let base = &bases[n % bases.len()];
        let job = json!({
            "target": {"http": {"url": "http://127.0.0.1:9/never", "method": "GET"}},
            "paused": true,
        });
        let answered = http
            .put(format!("{base}/api/v1/jobs/{name}"))
            .json(&job)
            .send()
            .await;
        match answered {
            Ok(resp) if resp.status().is_success() => {
                writes.acknowledged.push((name, Instant::now()));
            }
            _ => writes.refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writes
}

//! Partition takeover: three real `sked server` processes on one PostgreSQL schema and one
//! `sked worker` failing over between them, running HTTP jobs against a sink in this process.
//! One node at a time is killed with SIGKILL; the takeover time is from the kill until a
//! surviving node's cluster view shows the killed node holding no partition and none unowned.
//! The node is then restarted and the partitions rebalance before the next kill.
//!
//! Afterwards the ledger is read from the database: every instant each schedule owed over the
//! window must have exactly one run, and the lateness (instant -> run row created) of the
//! instants that fell due during each takeover is reported.

use crate::harness::{cluster, fresh_schema, wait_balanced, Place};
use crate::process::{free_port, sked_bin, spawn};
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};
use sked_core::cluster::partition_of;
use sked_core::stats::percentiles;
use sked_core::HumanDuration;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration as Span, Instant as Clock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

const NODES: usize = 3;
/// The product's target for moving a dead node's schedules.
const TARGET: Span = Span::from_secs(5);
/// A takeover unfinished after this long is recorded as unfinished.
const GIVE_UP: Span = Span::from_secs(60);
/// How long a node may take to start, and the cluster to balance.
const START_LIMIT: Span = Span::from_secs(60);
/// Quiet time after each rebalance, before the next kill and before the window closes, so the
/// instants of one kill are not blurred by the previous one.
const SETTLE: Span = Span::from_secs(5);
/// How long the runs of the window may take to end once it closed.
const DRAIN_LIMIT: Span = Span::from_secs(60);
/// How often the cluster view is polled while a takeover is under way.
const POLL: Span = Span::from_millis(25);

pub struct Options {
    pub database_url: String,
    pub schedules: usize,
    pub every: String,
    pub kills: usize,
    pub sked_bin: Option<PathBuf>,
    pub slots: u32,
    pub node_lease: String,
}

/// One `sked server` process; its port survives restarts, so the worker's URLs stay valid.
struct Node {
    label: String,
    port: u16,
    child: Option<Child>,
    /// The id the node reports for itself; each start is a new node.
    id: String,
    log: PathBuf,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// What one kill measured.
struct Kill {
    label: String,
    node_id: String,
    partitions: Vec<i32>,
    killed_at: DateTime<Utc>,
    /// From the kill until the killed node's leases had expired (it held none).
    expired: Option<Span>,
    /// From the kill until it held none and no partition was unowned.
    takeover: Option<Span>,
    taken_over_at: DateTime<Utc>,
    /// From the restart until the new node answered ready.
    restart_ready: Span,
    restarted_at: DateTime<Utc>,
    /// From the restart until the partitions were balanced over the three nodes again.
    rebalance: Span,
    balanced_at: DateTime<Utc>,
}

pub async fn run(options: Options) -> Result<Value> {
    let bin = sked_bin(options.sked_bin.as_deref())?;
    let period = options
        .every
        .parse::<HumanDuration>()
        .map_err(|e| anyhow::anyhow!("--every {}: {e}", options.every))?
        .as_chrono();
    if period <= Duration::zero() || options.schedules == 0 {
        bail!("--every and --schedules must be above zero");
    }
    let logs = tempfile::Builder::new()
        .prefix("sked-takeover-")
        .tempdir()?
        .keep();
    eprintln!("logs in {}", logs.display());
    let place = fresh_schema(&options.database_url).await?;
    let result = measure(&options, &bin, &logs, &place, period).await;
    place.remove().await;
    let mut figures = result?;
    figures["logs"] = scan_logs(&logs)?;
    Ok(figures)
}

async fn measure(
    options: &Options,
    bin: &Path,
    logs: &Path,
    place: &Place,
    period: Duration,
) -> Result<Value> {
    let Place::Schema { url, .. } = place else {
        bail!("the takeover benchmark runs on PostgreSQL only");
    };
    let http = crate::harness::client_builder()
        .timeout(Span::from_secs(10))
        .build()?;
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let label = format!("node{i}");
        nodes.push(Node {
            log: logs.join(format!("{label}.log")),
            label,
            port: free_port()?,
            child: None,
            id: String::new(),
        });
    }
    let start = Start {
        bin,
        url,
        node_lease: &options.node_lease,
    };
    for node in nodes.iter_mut() {
        node.child = Some(spawn_server(&start, node)?);
    }
    for node in nodes.iter_mut() {
        ready(&http, node).await?;
    }
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    wait_balanced(&http, &nodes[0].base(), NODES, Some(&ids), START_LIMIT).await?;
    // The ledger is read by this connection, with the schema's tables unqualified.
    let db = sked_store::postgres::client(url).await?;

    let sink = Sink::start().await?;
    let servers: Vec<String> = nodes.iter().map(Node::base).collect();
    let mut worker = spawn(
        bin,
        &[
            "worker",
            "--server",
            &servers.join(","),
            "--slots",
            &options.slots.to_string(),
            "--name",
            "bench",
        ],
        &logs.join("worker.log"),
    )?;

    let anchors = create_jobs(&http, &servers, &sink.url, options, period).await?;
    let from = Utc::now() + Duration::seconds(2);
    eprintln!("{} jobs created; window opens at {from}", options.schedules);
    tokio::time::sleep(SETTLE).await;

    let mut kills = Vec::new();
    for k in 0..options.kills {
        let victim = k % NODES;
        // Any other node watches; it stays up throughout this kill.
        let watcher = nodes[(victim + 1) % NODES].base();
        let kill = kill_and_restart(&http, &db, &start, &mut nodes, victim, &watcher).await?;
        let took = kill
            .takeover
            .map(|t| format!("{} ms", t.as_millis()))
            .unwrap_or_else(|| format!("unfinished after {GIVE_UP:?}"));
        eprintln!(
            "kill {}: {} ({} partitions): leases expired after {} ms, takeover {took}; \
             restarted, ready in {} ms, rebalanced in {} ms",
            k + 1,
            kill.label,
            kill.partitions.len(),
            kill.expired.map(|t| t.as_millis() as i64).unwrap_or(-1),
            kill.restart_ready.as_millis(),
            kill.rebalance.as_millis()
        );
        kills.push(kill);
        tokio::time::sleep(SETTLE).await;
    }
    let to = Utc::now() - Duration::seconds(1);
    let drained = drain(&db, to).await?;
    let ledger = read_ledger(&db, from, to).await?;
    let hits = sink.hits();
    let _ = worker.start_kill();
    for node in nodes.iter_mut() {
        if let Some(child) = node.child.as_mut() {
            let _ = child.start_kill();
        }
    }

    let check = check_ledger(&ledger, &anchors, period, from, to);
    let executions = executions(&db, &ledger, &hits).await?;
    let mut per_kill = Vec::new();
    for kill in &kills {
        per_kill.push(kill_figures(kill, &ledger));
    }
    let longest = kills
        .iter()
        .map(|k| k.takeover.unwrap_or(GIVE_UP))
        .max()
        .unwrap_or_default();
    eprintln!(
        "takeover max {} ms (target {} ms); instants owed {}, lost {}, doubled {}",
        longest.as_millis(),
        TARGET.as_millis(),
        check["instants_owed"],
        check["lost"],
        check["doubled"]
    );
    Ok(json!({
        "scenario": "takeover",
        "store": "postgres",
        "nodes": NODES,
        "schedules": options.schedules,
        "every": options.every,
        "node_lease": options.node_lease,
        "worker_slots": options.slots,
        "kills": per_kill,
        "takeover_ms_max": longest.as_millis() as u64,
        "takeover_target_ms": TARGET.as_millis() as u64,
        "all_within_target": kills.iter().all(|k| k.takeover.is_some_and(|t| t <= TARGET)),
        "window": {"from": from.to_rfc3339(), "to": to.to_rfc3339(),
                   "seconds": (to - from).num_milliseconds() as f64 / 1000.0},
        "ledger": check,
        "runs_still_active_after_drain": drained,
        "executions": executions,
    }))
}

/// What starting a node needs besides the node itself.
struct Start<'a> {
    bin: &'a Path,
    url: &'a str,
    node_lease: &'a str,
}

async fn kill_and_restart(
    http: &reqwest::Client,
    db: &tokio_postgres::Client,
    start: &Start<'_>,
    nodes: &mut [Node],
    victim: usize,
    watcher: &str,
) -> Result<Kill> {
    let node_id = nodes[victim].id.clone();
    let partitions: Vec<i32> = db
        .query(
            "SELECT partition FROM partition_leases WHERE node = $1 AND expires_at > $2 \
             ORDER BY partition",
            &[&node_id, &Utc::now().timestamp_micros()],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let Some(mut child) = nodes[victim].child.take() else {
        bail!("{} is not running", nodes[victim].label);
    };
    let killed_at = Utc::now();
    let killed = Clock::now();
    // SIGKILL: the node gives nothing back; its leases have to expire.
    child.start_kill()?;
    child.wait().await?;

    let mut expired = None;
    let takeover = loop {
        // A busy node may miss a poll; the give-up bound still applies.
        if let Ok(view) = cluster(http, watcher).await {
            if view.held_by(&node_id) == 0 {
                expired.get_or_insert(killed.elapsed());
                if view.unowned == 0 {
                    break Some(killed.elapsed());
                }
            }
        }
        if killed.elapsed() > GIVE_UP {
            eprintln!(
                "takeover of {node_id} unfinished after {GIVE_UP:?}: {:?}",
                cluster(http, watcher).await
            );
            break None;
        }
        tokio::time::sleep(POLL).await;
    };
    let taken_over_at = Utc::now();

    let restarted_at = Utc::now();
    let restarted = Clock::now();
    let node = &mut nodes[victim];
    // The restart's log is a file of its own, so the killed process's log stays as it ended.
    node.log = node.log.with_file_name(format!(
        "{}-{}.log",
        node.label,
        restarted_at.format("%H%M%S")
    ));
    node.child = Some(spawn_server(start, node)?);
    ready(http, node).await?;
    let restart_ready = restarted.elapsed();
    let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
    wait_balanced(http, watcher, NODES, Some(&ids), START_LIMIT).await?;
    Ok(Kill {
        label: nodes[victim].label.clone(),
        node_id,
        partitions,
        killed_at,
        expired,
        takeover,
        taken_over_at,
        restart_ready,
        restarted_at,
        rebalance: restarted.elapsed(),
        balanced_at: Utc::now(),
    })
}

fn spawn_server(start: &Start<'_>, node: &Node) -> Result<Child> {
    let listen = format!("127.0.0.1:{}", node.port);
    spawn(
        start.bin,
        &[
            "server",
            "--listen",
            &listen,
            "--database-url",
            start.url,
            "--node-lease",
            start.node_lease,
            // The jobs' HTTP target is a sink on this machine's loopback address.
            "--http-target-allow",
            "127.0.0.1",
        ],
        &node.log,
    )
}

/// Waits until the node answers `/readyz`, then learns its id.
async fn ready(http: &reqwest::Client, node: &mut Node) -> Result<()> {
    let deadline = Clock::now() + START_LIMIT;
    loop {
        if let Some(child) = node.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{} exited ({status}) before it was ready; see {}",
                    node.label,
                    node.log.display()
                );
            }
        }
        if let Ok(r) = http.get(format!("{}/readyz", node.base())).send().await {
            if r.status().is_success() {
                break;
            }
        }
        if Clock::now() > deadline {
            bail!(
                "{} not ready within {START_LIMIT:?}; see {}",
                node.label,
                node.log.display()
            );
        }
        tokio::time::sleep(Span::from_millis(20)).await;
    }
    node.id = cluster(http, &node.base()).await?.node;
    Ok(())
}

/// Creates the jobs through the nodes in turn, several requests at a time. Their anchors are
/// spread evenly over one period, so the instants fall due at an even rate rather than in one
/// burst per period. Returns each job's anchor, in microseconds.
async fn create_jobs(
    http: &reqwest::Client,
    servers: &[String],
    sink: &str,
    options: &Options,
    period: Duration,
) -> Result<HashMap<String, i64>> {
    const LANES: usize = 8;
    let period_us = period.num_microseconds().context("--every is too long")?;
    let base = Utc::now().timestamp_micros() / 1_000_000 * 1_000_000;
    let mut anchors = HashMap::new();
    let mut jobs = Vec::new();
    for i in 0..options.schedules {
        let anchor = base + period_us * i as i64 / options.schedules as i64;
        let name = format!("take-{i:06}");
        anchors.insert(name.clone(), anchor);
        let at = DateTime::<Utc>::from_timestamp_micros(anchor).context("an anchor")?;
        // Every owed instant runs, also those that fell due while their partition had no
        // owner: each is a run to check, not a skipped row.
        let spec = json!({
            "schedule": {"every": options.every, "anchor": at.to_rfc3339()},
            "target": {"http": {"url": sink, "method": "GET", "timeout": "10s"}},
            "misfire": {"policy": "run_all"},
        });
        jobs.push((name, spec, servers[i % servers.len()].clone()));
    }
    let jobs = Arc::new(jobs);
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..LANES {
        let (http, jobs) = (http.clone(), jobs.clone());
        lanes.spawn(async move {
            for (name, spec, server) in jobs.iter().skip(lane).step_by(LANES) {
                let url = format!("{server}/api/v1/jobs/{name}");
                let resp = http.put(&url).json(spec).send().await?;
                if !resp.status().is_success() {
                    bail!("PUT {url}: {}: {}", resp.status(), resp.text().await?);
                }
            }
            Ok(())
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane.context("a lane of job creation")??;
    }
    Ok(anchors)
}

/// Waits until no run of the window is waiting, queued or running; returns how many still
/// are when the limit is reached.
async fn drain(db: &tokio_postgres::Client, to: DateTime<Utc>) -> Result<i64> {
    let deadline = Clock::now() + DRAIN_LIMIT;
    loop {
        let active: i64 = db
            .query_one(
                "SELECT count(*) FROM runs WHERE scheduled_for < $1 \
                 AND state IN ('waiting', 'queued', 'running')",
                &[&to.timestamp_micros()],
            )
            .await?
            .try_get(0)?;
        if active == 0 || Clock::now() > deadline {
            return Ok(active);
        }
        tokio::time::sleep(Span::from_millis(250)).await;
    }
}

struct Row {
    id: i64,
    job_id: i64,
    job: String,
    scheduled_for: i64,
    created_at: i64,
    state: String,
    skip_reason: Option<String>,
}

async fn read_ledger(
    db: &tokio_postgres::Client,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Row>> {
    let rows = db
        .query(
            "SELECT id, job_id, job, scheduled_for, created_at, state, skip_reason FROM runs \
             WHERE scheduled_for >= $1 AND scheduled_for < $2",
            &[&from.timestamp_micros(), &to.timestamp_micros()],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Row {
                id: r.try_get(0)?,
                job_id: r.try_get(1)?,
                job: r.try_get(2)?,
                scheduled_for: r.try_get(3)?,
                created_at: r.try_get(4)?,
                state: r.try_get(5)?,
                skip_reason: r.try_get(6)?,
            })
        })
        .collect()
}

/// Every instant each job owed in `[from, to)` against the rows: lost (no row), doubled (more
/// than one), unexpected (a row off the schedule's grid), and the rows by state.
fn check_ledger(
    rows: &[Row],
    anchors: &HashMap<String, i64>,
    period: Duration,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Value {
    let period_us = period.num_microseconds().unwrap_or(i64::MAX);
    let (from_us, to_us) = (from.timestamp_micros(), to.timestamp_micros());
    let mut owed: HashMap<(&str, i64), u32> = HashMap::new();
    for (job, &anchor) in anchors {
        // The first grid point at or after `from`.
        let mut t = anchor + (from_us - anchor).div_euclid(period_us) * period_us;
        if t < from_us {
            t += period_us;
        }
        while t < to_us {
            owed.insert((job.as_str(), t), 0);
            t += period_us;
        }
    }
    let mut unexpected = 0usize;
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows {
        match owed.get_mut(&(row.job.as_str(), row.scheduled_for)) {
            Some(count) => *count += 1,
            None => unexpected += 1,
        }
        let state = match &row.skip_reason {
            Some(reason) => format!("{} ({reason})", row.state),
            None => row.state.clone(),
        };
        *states.entry(state).or_default() += 1;
    }
    let lost = owed.values().filter(|&&c| c == 0).count();
    let doubled = owed.values().filter(|&&c| c > 1).count();
    json!({
        "instants_owed": owed.len(),
        "rows": rows.len(),
        "lost": lost,
        "doubled": doubled,
        "unexpected": unexpected,
        "by_state": states,
    })
}

/// The attempts of the window's runs against the requests the sink received for them: a run
/// whose target was reached more than once was executed twice (allowed only when an attempt
/// was lost).
async fn executions(
    db: &tokio_postgres::Client,
    rows: &[Row],
    hits: &HashMap<i64, u32>,
) -> Result<Value> {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let mut states: BTreeMap<String, i64> = BTreeMap::new();
    for row in db
        .query(
            "SELECT state, count(*) FROM attempts WHERE run_id = ANY($1) GROUP BY state",
            &[&ids],
        )
        .await?
    {
        states.insert(row.try_get(0)?, row.try_get(1)?);
    }
    let twice_succeeded: i64 = db
        .query_one(
            "SELECT count(*) FROM (SELECT run_id FROM attempts \
             WHERE state = 'succeeded' AND run_id = ANY($1) GROUP BY run_id HAVING count(*) > 1) t",
            &[&ids],
        )
        .await?
        .try_get(0)?;
    // A run whose attempt was lost (started by a node that died before the worker heard of
    // it) waits for that attempt's lease to lapse before it runs again.
    let (with_lost, lost_delay_ms): (i64, Option<f64>) = {
        let row = db
            .query_one(
                "SELECT count(*), max(r.finished_at - r.scheduled_for) FROM runs r \
                 WHERE r.id = ANY($1) AND EXISTS (SELECT 1 FROM attempts a \
                 WHERE a.run_id = r.id AND a.state = 'lost')",
                &[&ids],
            )
            .await?;
        let delay: Option<i64> = row.try_get(1)?;
        (row.try_get(0)?, delay.map(|us| us as f64 / 1000.0))
    };
    let reached: Vec<u32> = ids
        .iter()
        .map(|id| hits.get(id).copied().unwrap_or(0))
        .collect();
    let hit_twice: Vec<i64> = ids
        .iter()
        .zip(&reached)
        .filter(|(_, &n)| n > 1)
        .map(|(&id, _)| id)
        .collect();
    let with_lost_attempt: HashSet<i64> = if hit_twice.is_empty() {
        HashSet::new()
    } else {
        db.query(
            "SELECT DISTINCT run_id FROM attempts WHERE state = 'lost' AND run_id = ANY($1)",
            &[&hit_twice],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?
    };
    Ok(json!({
        "attempts_by_state": states,
        "runs_with_two_successes": twice_succeeded,
        "runs_with_a_lost_attempt": with_lost,
        "runs_with_a_lost_attempt_instant_to_recorded_max_ms": lost_delay_ms,
        "sink_requests": reached.iter().map(|&n| u64::from(n)).sum::<u64>(),
        "runs_never_reached": reached.iter().filter(|&&n| n == 0).count(),
        "runs_reached_twice": hit_twice.len(),
        "runs_reached_twice_without_lost_attempt": hit_twice
            .iter()
            .filter(|r| !with_lost_attempt.contains(r))
            .count(),
    }))
}

fn lateness(rows: &[&Row]) -> Value {
    let mut ms: Vec<f64> = rows
        .iter()
        .map(|r| (r.created_at - r.scheduled_for) as f64 / 1000.0)
        .collect();
    let p = percentiles(&mut ms);
    json!({"instants": p.count, "p50": p.p50, "p99": p.p99, "max": p.max})
}

fn kill_figures(kill: &Kill, ledger: &[Row]) -> Value {
    let orphaned: HashSet<u32> = kill.partitions.iter().map(|&p| p as u32).collect();
    let during = |from: DateTime<Utc>, to: DateTime<Utc>| -> Vec<&Row> {
        let (from, to) = (from.timestamp_micros(), to.timestamp_micros());
        ledger
            .iter()
            .filter(|r| r.scheduled_for >= from && r.scheduled_for < to)
            .collect()
    };
    let takeover = during(kill.killed_at, kill.taken_over_at);
    let of_killed: Vec<&Row> = takeover
        .iter()
        .copied()
        .filter(|r| orphaned.contains(&partition_of(r.job_id)))
        .collect();
    let rebalance = during(kill.restarted_at, kill.balanced_at);
    json!({
        "node": kill.label,
        "node_id": kill.node_id,
        "partitions_held": kill.partitions.len(),
        "leases_expired_ms": kill.expired.map(|t| t.as_millis() as u64),
        "takeover_ms": kill.takeover.map(|t| t.as_millis() as u64),
        "restart_ready_ms": kill.restart_ready.as_millis() as u64,
        "rebalance_ms": kill.rebalance.as_millis() as u64,
        "lateness_during_takeover_ms": lateness(&takeover),
        "lateness_during_takeover_killed_nodes_partitions_ms": lateness(&of_killed),
        "lateness_during_rebalance_ms": lateness(&rebalance),
    })
}

/// Counts the error and warning lines of each process's log, with the first error lines.
fn scan_logs(dir: &Path) -> Result<Value> {
    let mut files = BTreeMap::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    for path in names {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let errors: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
        let warnings = text.lines().filter(|l| l.contains(" WARN ")).count();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        files.insert(
            name,
            json!({
                "errors": errors.len(),
                "warnings": warnings,
                "first_errors": errors.iter().take(3).collect::<Vec<_>>(),
            }),
        );
    }
    Ok(json!({"dir": dir.display().to_string(), "files": files}))
}

/// The jobs' HTTP target: answers 200 at once, keeps connections alive, and counts requests
/// per run (from the `X-Sked-Run-Id` header the worker sends).
struct Sink {
    url: String,
    hits: Arc<Mutex<HashMap<i64, u32>>>,
}

impl Sink {
    async fn start() -> Result<Sink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hit", listener.local_addr()?);
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let counted = hits.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(stream, counted.clone()));
            }
        });
        Ok(Sink { url, hits })
    }

    fn hits(&self) -> HashMap<i64, u32> {
        // A poisoned lock only means a connection task panicked; its counts are still there.
        match self.hits.lock() {
            Ok(hits) => hits.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// HTTP/1.1 just enough for the worker's requests: a head, a body of `Content-Length` bytes.
async fn serve_connection(mut stream: tokio::net::TcpStream, hits: Arc<Mutex<HashMap<i64, u32>>>) {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<i64>().ok())
            };
            let total = end + 4 + header("content-length:").unwrap_or(0).max(0) as usize;
            if buf.len() < total {
                break;
            }
            if let Some(run) = header("x-sked-run-id:") {
                let mut hits = match hits.lock() {
                    Ok(hits) => hits,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *hits.entry(run).or_default() += 1;
            }
            buf.drain(..total);
            if stream.write_all(OK).await.is_err() {
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

//! Concurrency keys under failure, black-box: events spread over 200 keys start runs of two
//! jobs that share a key with limit 2, while `sked server` nodes and `sked worker`s are killed
//! with SIGKILL and restarted (three nodes on one PostgreSQL schema, or one server on SQLite
//! restarted on its data directory). The ledger is then read from the store's tables:
//!
//! - exactness: per key, a sweep over its attempts' `[started_at, finished_at)` never finds
//!   more than 2 at once. An attempt of a killed worker counts until the reaper ends it (its
//!   `finished_at` is when its lease was taken away), which is what "a live fencing token"
//!   means; a control job without keys, fed the same kind of burst, must exceed 2, so the
//!   sweep is seen to catch what it is meant to;
//! - no starvation: once the chaos stops, every run ends (none stays queued), and within one
//!   key no run is overtaken by more than [`OVERTAKE_BOUND`] runs of its key queued after it
//!   (on PostgreSQL, where nodes die too, [`TAKEOVER_OVERTAKES`] more).
//!
//! The chaos lasts `SKED_FLOW_CHAOS_SECS` seconds (25 by default, for each store). The
//! PostgreSQL test needs `SKED_TEST_DATABASE_URL`; without it it is reported as ignored (see
//! build.rs), and under CI it runs, so a missing database fails it.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{free_port, shell, Proc, Rng, Sked};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many keys the events spread over, and the limit each job sets on its key.
const KEYS: usize = 200;
const LIMIT: usize = 2;
const WORKERS: usize = 3;
const SLOTS: &str = "8";
/// Events posted per second: a burst on one key (each event starts a run of both keyed jobs,
/// so a burst queues twice as many runs of one key at once) and the rest on random keys.
const BURST: usize = 4;
const SCATTERED: usize = 12;
/// How many runs of its key queued after it may start before a run. A run queued on one
/// node is handed to that node's workers first and reaches the others after a grace, a run a
/// key holds back asks again within a second, and a run whose worker was killed goes back
/// in line when the reaper ends its attempt: later runs of its key may pass it meanwhile, but
/// only a few turns of the key's limit.
const OVERTAKE_BOUND: usize = 12;
/// On PostgreSQL nodes are killed too: a run queued in a dead node's partitions waits for
/// their takeover, up to a node lease (`pg::NODE_LEASE`, 3 s), while its key's runs on live
/// nodes go on starting, at most [`LIMIT`] per run's sleep (275 ms on average). That many more
/// may pass it there.
const TAKEOVER_OVERTAKES: usize = LIMIT * 3_000 / 275;

/// The overtaking bound of a store's scenario: [`OVERTAKE_BOUND`], and on PostgreSQL
/// [`TAKEOVER_OVERTAKES`] more.
fn overtake_bound(store: &str) -> usize {
    if store == "postgres" {
        OVERTAKE_BOUND + TAKEOVER_OVERTAKES
    } else {
        OVERTAKE_BOUND
    }
}
/// How long the runs still active once the chaos stops may take to end.
const DRAIN: Duration = Duration::from_secs(180);
const NODE_START: Duration = Duration::from_secs(60);

fn chaos() -> Duration {
    let secs = std::env::var("SKED_FLOW_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    Duration::from_secs(secs)
}

/// One attempt as the ledger records it: its number, start, end (none while it runs) and state.
#[derive(Debug, Clone)]
struct AttemptRow {
    number: i64,
    started: i64,
    finished: Option<i64>,
    state: String,
}

/// One run an event started, with the key its job's template renders from the event.
#[derive(Debug, Clone)]
struct RunRow {
    id: i64,
    job: String,
    key: String,
    created: i64,
    state: String,
    attempts: Vec<AttemptRow>,
}

impl RunRow {
    fn first_start(&self) -> Option<i64> {
        self.attempts.iter().map(|a| a.started).min()
    }
}

/// The ledger's event-started runs and their attempts: one row per (run, attempt).
const LEDGER: &str = "SELECT r.id, r.job, r.event_id, r.created_at, r.state, \
     a.number, a.started_at, a.finished_at, a.state \
     FROM runs r LEFT JOIN attempts a ON a.run_id = r.id \
     WHERE r.trigger = 'event' ORDER BY r.id, a.number";

/// An event's id names its key and how long its runs sleep: `k042-000123-275`.
fn event_id(key: usize, seq: usize, sleep_ms: u64) -> String {
    format!("k{key:03}-{seq:06}-{sleep_ms:03}")
}

fn key_of(event_id: &str) -> String {
    event_id.split('-').next().unwrap_or_default().to_string()
}

fn push_row(
    runs: &mut Vec<RunRow>,
    id: i64,
    job: String,
    event: Option<String>,
    created: i64,
    state: String,
    attempt: Option<AttemptRow>,
) {
    if runs.last().is_none_or(|r| r.id != id) {
        runs.push(RunRow {
            id,
            job,
            key: key_of(event.as_deref().unwrap_or_default()),
            created,
            state,
            attempts: Vec::new(),
        });
    }
    if let (Some(run), Some(attempt)) = (runs.last_mut(), attempt) {
        run.attempts.push(attempt);
    }
}

async fn ledger_pg(db: &tokio_postgres::Client) -> Vec<RunRow> {
    let mut runs = Vec::new();
    for row in db.query(LEDGER, &[]).await.expect("read the ledger") {
        let attempt = row.get::<_, Option<i32>>(5).map(|number| AttemptRow {
            number: i64::from(number),
            started: row.get(6),
            finished: row.get(7),
            state: row.get(8),
        });
        push_row(
            &mut runs,
            row.get(0),
            row.get(1),
            row.get(2),
            row.get(3),
            row.get(4),
            attempt,
        );
    }
    runs
}

fn ledger_sqlite(path: &std::path::Path) -> Vec<RunRow> {
    let db = rusqlite::Connection::open(path).expect("open the store beside the server");
    let mut stmt = db.prepare(LEDGER).expect("prepare the ledger read");
    let mut rows = stmt.query([]).expect("read the ledger");
    let mut runs = Vec::new();
    while let Some(row) = rows.next().expect("a ledger row") {
        let number: Option<i64> = row.get(5).expect("number");
        let attempt = number.map(|number| AttemptRow {
            number,
            started: row.get(6).expect("started_at"),
            finished: row.get(7).expect("finished_at"),
            state: row.get(8).expect("state"),
        });
        push_row(
            &mut runs,
            row.get(0).expect("id"),
            row.get(1).expect("job"),
            row.get(2).expect("event_id"),
            row.get(3).expect("created_at"),
            row.get(4).expect("state"),
            attempt,
        );
    }
    runs
}

/// The most intervals `[start, end)` holding at once, and the first instant it is reached.
/// An end and a start at one instant do not overlap.
fn most_at_once(intervals: &[(i64, i64)]) -> (usize, i64) {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    // Ends before starts at one instant.
    edges.sort();
    let (mut now, mut most, mut at) = (0i32, 0i32, 0i64);
    for (t, delta) in edges {
        now += delta;
        if now > most {
            (most, at) = (now, t);
        }
    }
    (usize::try_from(most).unwrap_or(0), at)
}

/// For each run of one key, how many runs of the key queued after it started before it:
/// the largest such count, and the run that suffered it. Runs that never started count as
/// starting last.
fn most_overtaken(runs: &[&RunRow]) -> (usize, i64) {
    let mut worst = (0, 0);
    for r in runs {
        let start = r.first_start().unwrap_or(i64::MAX);
        let passed = runs
            .iter()
            .filter(|s| (s.created, s.id) > (r.created, r.id))
            .filter(|s| s.first_start().unwrap_or(i64::MAX) < start)
            .count();
        if passed > worst.0 {
            worst = (passed, r.id);
        }
    }
    worst
}

/// What the sweep found over the runs of some jobs.
#[derive(Debug, Default)]
struct Sweep {
    keys: usize,
    runs: usize,
    attempts: usize,
    lost: usize,
    /// The most attempts of one key seen at once, and how many keys reached it.
    most: usize,
    keys_at_most: usize,
    /// Keys with more than the limit at once: (key, how many, at, the attempts then).
    over: Vec<(String, usize, i64, Vec<String>)>,
    most_overtaken: (usize, i64, String),
    longest_wait_ms: i64,
}

fn sweep(runs: &[RunRow], jobs: &[&str], limit: usize) -> Sweep {
    let mut by_key: BTreeMap<&str, Vec<&RunRow>> = BTreeMap::new();
    for run in runs.iter().filter(|r| jobs.contains(&r.job.as_str())) {
        by_key.entry(&run.key).or_default().push(run);
    }
    let mut found = Sweep {
        keys: by_key.len(),
        ..Sweep::default()
    };
    for (key, runs) in &by_key {
        found.runs += runs.len();
        let mut intervals = Vec::new();
        for run in runs {
            for a in &run.attempts {
                found.attempts += 1;
                found.lost += usize::from(a.state == "lost");
                // An attempt still running holds its key to the end of time.
                intervals.push((a.started, a.finished.unwrap_or(i64::MAX)));
            }
            if let Some(start) = run.first_start() {
                found.longest_wait_ms = found.longest_wait_ms.max((start - run.created) / 1000);
            }
        }
        let (most, at) = most_at_once(&intervals);
        match most.cmp(&found.most) {
            std::cmp::Ordering::Greater => (found.most, found.keys_at_most) = (most, 1),
            std::cmp::Ordering::Equal => found.keys_at_most += 1,
            std::cmp::Ordering::Less => {}
        }
        if most > limit {
            let then = runs
                .iter()
                .flat_map(|r| r.attempts.iter().map(move |a| (r, a)))
                .filter(|(_, a)| a.started <= at && a.finished.is_none_or(|f| f > at))
                .map(|(r, a)| {
                    format!(
                        "run {} ({}) attempt {} [{}, {:?}) {}",
                        r.id, r.job, a.number, a.started, a.finished, a.state
                    )
                })
                .collect();
            found.over.push((key.to_string(), most, at, then));
        }
        let (passed, run) = most_overtaken(runs);
        if passed > found.most_overtaken.0 {
            found.most_overtaken = (passed, run, key.to_string());
        }
    }
    found
}

/// Asserts the keyed jobs' ledger: every run ended, no key ever above [`LIMIT`], turns kept;
/// and that the control job's burst, with no key, went above it. Returns the summary.
fn check(runs: &[RunRow], store: &str) -> String {
    let active: Vec<String> = runs
        .iter()
        .filter(|r| matches!(r.state.as_str(), "waiting" | "queued" | "running"))
        .map(|r| format!("run {} of {} ({}) {}", r.id, r.job, r.key, r.state))
        .collect();
    assert!(active.is_empty(), "{store}: runs never ended: {active:?}");
    let keyed = sweep(runs, &["orders", "invoices"], LIMIT);
    let control = sweep(runs, &["control"], LIMIT);
    let summary = format!(
        "{store}: {} keys, {} runs, {} attempts ({} lost with their worker); at most {} \
         attempts of one key at once ({} keys reached it); at most {} later runs of a key \
         started ahead of one (run {} of {}); longest wait for a first start {} ms; the \
         control job without keys had {} of one key at once",
        keyed.keys,
        keyed.runs,
        keyed.attempts,
        keyed.lost,
        keyed.most,
        keyed.keys_at_most,
        keyed.most_overtaken.0,
        keyed.most_overtaken.1,
        keyed.most_overtaken.2,
        keyed.longest_wait_ms,
        control.most,
    );
    println!("{summary}");
    assert!(
        keyed.over.is_empty(),
        "{store}: {} keys ran more than {LIMIT} attempts at once; the first: {:#?}",
        keyed.over.len(),
        &keyed.over[..keyed.over.len().min(5)]
    );
    assert_eq!(
        keyed.most, LIMIT,
        "{store}: the load must fill keys to their limit, or the check proves nothing"
    );
    assert!(
        control.most > LIMIT,
        "{store}: the control burst without keys should exceed {LIMIT} at once: {control:?}"
    );
    assert!(
        keyed.most_overtaken.0 <= overtake_bound(store),
        "{store}: run {} of key {} was overtaken by {} runs of its key queued after it",
        keyed.most_overtaken.1,
        keyed.most_overtaken.2,
        keyed.most_overtaken.0
    );
    summary
}

#[test]
fn the_sweep_counts_half_open_intervals_and_overtakes() {
    assert_eq!(most_at_once(&[(0, 10), (5, 15), (9, 20)]), (3, 9));
    assert_eq!(most_at_once(&[(0, 10), (10, 20), (20, 30)]).0, 1);
    assert_eq!(most_at_once(&[(0, i64::MAX), (5, 6), (7, 8)]).0, 2);
    let run = |id: i64, created: i64, started: &[(i64, Option<i64>)]| RunRow {
        id,
        job: "orders".into(),
        key: "k001".into(),
        created,
        state: "succeeded".into(),
        attempts: started
            .iter()
            .enumerate()
            .map(|(i, &(started, finished))| AttemptRow {
                number: i as i64 + 1,
                started,
                finished,
                state: "succeeded".into(),
            })
            .collect(),
    };
    // Three overlapping attempts of one key: over a limit of 2, within a limit of 3.
    let runs = vec![
        run(1, 0, &[(10, Some(100))]),
        run(2, 1, &[(20, Some(100))]),
        run(3, 2, &[(30, Some(100))]),
    ];
    let found = sweep(&runs, &["orders"], 2);
    assert_eq!((found.most, found.over.len()), (3, 1), "{found:?}");
    assert_eq!(found.over[0].3.len(), 3, "{found:?}");
    assert!(sweep(&runs, &["orders"], 3).over.is_empty());
    // A lost attempt counts until its end; its retry after it does not overlap it.
    let runs = vec![
        run(1, 0, &[(0, Some(50)), (60, Some(70))]),
        run(2, 1, &[(10, Some(55))]),
    ];
    assert_eq!(sweep(&runs, &["orders"], 1).most, 2);
    // Run 1 started after the two runs queued behind it.
    let runs = [
        run(1, 0, &[(50, Some(60))]),
        run(2, 1, &[(10, Some(20))]),
        run(3, 2, &[(20, Some(30))]),
        run(4, 3, &[(70, Some(80))]),
    ];
    assert_eq!(most_overtaken(&runs.iter().collect::<Vec<_>>()), (2, 1));
}

/// The jobs: `orders` and `invoices` start on each `order` event, and both render its key from
/// the event's payload with limit 2, so they share it; `control` starts on each `control`
/// event and has no key. Each run sleeps as long as its event's id says.
async fn create_jobs(http: &reqwest::Client, base: &str) {
    let sleep = "sleep \"0.${SKED_EVENT_ID##*-}\"";
    let keyed = |key: &str| {
        json!({
            "schedule": {"event": "order"},
            "target": shell(sleep),
            "concurrency": [{"key": key, "limit": LIMIT}],
        })
    };
    let jobs = [
        ("orders", keyed("{{event.payload.k}}")),
        ("invoices", keyed("{{event.payload.k}}")),
        (
            "control",
            json!({"schedule": {"event": "control"}, "target": shell(sleep)}),
        ),
    ];
    for (name, job) in jobs {
        let url = format!("{base}/api/v1/jobs/{name}");
        let (status, body) = common::call(http, reqwest::Method::PUT, url, Some(job)).await;
        assert_eq!(status, 201, "PUT job {name}: {body}");
    }
}

/// Posts one event to the first of `bases` (rotated by `seq`) that takes it, retrying until
/// one does: a node killed mid-request may have recorded it, and a second post of one id is
/// the same event.
async fn post_event(http: &reqwest::Client, bases: &[String], seq: usize, event: Value) {
    let began = Instant::now();
    for round in 0.. {
        let base = &bases[(seq + round) % bases.len()];
        let sent = http
            .post(format!("{base}/api/v1/events"))
            .json(&event)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(resp) = sent {
            if resp.status().is_success() {
                return;
            }
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "no server took event {event} within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100 * (round as u64 % 5 + 1))).await;
    }
}

/// Posts [`BURST`] events on one key and [`SCATTERED`] on random keys every second until
/// `stop`; returns how many it posted.
fn start_posting(
    http: reqwest::Client,
    bases: Vec<String>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut rng = Rng::seeded(seed);
        let mut seq = 0usize;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let burst_key = rng.below(KEYS as u64) as usize;
            let mut sends = tokio::task::JoinSet::new();
            for i in 0..BURST + SCATTERED {
                let key = if i < BURST {
                    burst_key
                } else {
                    rng.below(KEYS as u64) as usize
                };
                let sleep_ms = 50 + rng.below(451);
                let id = event_id(key, seq, sleep_ms);
                let event =
                    json!({"key": "order", "id": id, "payload": {"k": format!("k{key:03}")}});
                let (http, bases) = (http.clone(), bases.clone());
                sends.spawn(async move { post_event(&http, &bases, seq, event).await });
                seq += 1;
            }
            while let Some(done) = sends.join_next().await {
                done.expect("posting an event");
            }
        }
        seq
    })
}

/// Posts the control burst: 12 events of one key at once, whose runs sleep 0.9 s.
async fn post_control_burst(http: &reqwest::Client, bases: &[String]) {
    for seq in 0..12 {
        let event =
            json!({"key": "control", "id": event_id(0, seq, 900), "payload": {"k": "k000"}});
        post_event(http, bases, seq, event).await;
    }
}

fn spawn_worker(logs: &Logs, name: &str, servers: &str) -> Proc {
    let args = [
        "worker", "--server", servers, "--slots", SLOTS, "--name", name,
    ];
    Proc::spawn(name, &args, &logs.file(name))
}

/// The servers of a deployment: PostgreSQL nodes, each keeping its port across restarts, or
/// one SQLite server restarted on its data directory.
enum Servers {
    Pg {
        url: String,
        nodes: Vec<(String, u16, Option<Node>)>,
    },
    Sqlite(Sked),
}

impl Servers {
    fn bases(&self) -> Vec<String> {
        match self {
            Servers::Pg { nodes, .. } => nodes
                .iter()
                .map(|(_, port, _)| format!("http://127.0.0.1:{port}"))
                .collect(),
            Servers::Sqlite(sked) => vec![sked.base()],
        }
    }

    fn up(&self) -> Vec<usize> {
        match self {
            Servers::Pg { nodes, .. } => {
                (0..nodes.len()).filter(|&i| nodes[i].2.is_some()).collect()
            }
            Servers::Sqlite(sked) => sked.server.iter().map(|_| 0).collect(),
        }
    }

    fn kill(&mut self, i: usize) -> String {
        match self {
            Servers::Pg { nodes, .. } => {
                if let Some(mut node) = nodes[i].2.take() {
                    node.proc.sigkill();
                }
                nodes[i].0.clone()
            }
            Servers::Sqlite(sked) => {
                if let Some(mut server) = sked.server.take() {
                    server.sigkill();
                }
                "server".to_string()
            }
        }
    }

    async fn start(&mut self, i: usize, logs: &Logs, http: &reqwest::Client) {
        match self {
            Servers::Pg { url, nodes } => {
                let (label, port, slot) = &mut nodes[i];
                let mut node = Node::spawn(logs, label, *port, url);
                node.ready(http, NODE_START).await;
                *slot = Some(node);
            }
            Servers::Sqlite(sked) => sked.start_server(&[]).await,
        }
    }
}

/// Kills a random server or worker every 2 to 5 s and restarts it 0.3 to 2.5 s later, for
/// `window`; at most one server is down at a time and at least two workers run. Then
/// everything is restarted. Returns (server kills, worker kills).
async fn run_chaos(
    servers: &mut Servers,
    workers: &mut [(String, Option<Proc>, Option<Instant>)],
    logs: &Logs,
    http: &reqwest::Client,
    rng: &mut Rng,
    window: Duration,
) -> (usize, usize) {
    let bases = servers.bases();
    let total = bases.len();
    let servers_line: Vec<String> = (0..WORKERS)
        .map(|i| {
            (0..total)
                .map(|k| bases[(i + k) % total].as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let started = Instant::now();
    let mut next_kill = started + rng.millis(1500, 4000);
    let mut server_down: Option<(usize, Instant)> = None;
    let (mut server_kills, mut worker_kills) = (0, 0);
    loop {
        let now = Instant::now();
        let over = now >= started + window;
        if let Some((i, at)) = server_down {
            if over || at <= now {
                servers.start(i, logs, http).await;
                println!("{:>7} ms: server {i} back", started.elapsed().as_millis());
                server_down = None;
            }
        }
        for (i, (name, proc, restart_at)) in workers.iter_mut().enumerate() {
            if restart_at.is_some_and(|at| over || at <= now) {
                *proc = Some(spawn_worker(logs, name, &servers_line[i]));
                *restart_at = None;
            }
        }
        if over {
            return (server_kills, worker_kills);
        }
        if now >= next_kill {
            let (kind, pick) = (rng.below(2), rng.below(1000) as usize);
            let pause = rng.millis(300, 2500);
            next_kill = now + rng.millis(2000, 5000);
            let alive: Vec<usize> = (0..workers.len())
                .filter(|&i| workers[i].1.is_some())
                .collect();
            let up = servers.up();
            let server_ok = server_down.is_none() && up.len() == total;
            let worker_ok = alive.len() >= 2;
            let kill_server = match (server_ok, worker_ok) {
                (true, true) => kind == 0,
                (ok, _) => ok,
            };
            let at = started.elapsed().as_millis();
            if kill_server {
                let i = up[pick % up.len()];
                let label = servers.kill(i);
                server_kills += 1;
                println!(
                    "{at:>7} ms: SIGKILL {label}, restart in {} ms",
                    pause.as_millis()
                );
                server_down = Some((i, Instant::now() + pause));
            } else if worker_ok {
                let i = alive[pick % alive.len()];
                if let Some(mut proc) = workers[i].1.take() {
                    proc.sigkill();
                }
                worker_kills += 1;
                println!(
                    "{at:>7} ms: SIGKILL {}, restart in {} ms",
                    workers[i].0,
                    pause.as_millis()
                );
                workers[i].2 = Some(Instant::now() + pause);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The whole scenario on `servers`: jobs, the control burst, the chaos under the event load,
/// then a drain until no run is active (read with `ledger`), and the check.
async fn scenario<F, Fut>(mut servers: Servers, logs: &Logs, store: &str, ledger: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<RunRow>>,
{
    let mut rng = Rng::from_env();
    let http = pg::http_client();
    let bases = servers.bases();
    create_jobs(&http, &bases[0]).await;
    let mut workers: Vec<(String, Option<Proc>, Option<Instant>)> = (0..WORKERS)
        .map(|i| {
            let line: Vec<&str> = (0..bases.len())
                .map(|k| bases[(i + k) % bases.len()].as_str())
                .collect();
            let name = format!("worker-{i}");
            let proc = spawn_worker(logs, &name, &line.join(","));
            (name, Some(proc), None)
        })
        .collect();
    post_control_burst(&http, &bases).await;

    let window = chaos();
    let stop = Arc::new(AtomicBool::new(false));
    let poster = start_posting(
        http.clone(),
        bases.clone(),
        rng.below(u64::MAX) | 1,
        stop.clone(),
    );
    let (server_kills, worker_kills) =
        run_chaos(&mut servers, &mut workers, logs, &http, &mut rng, window).await;
    stop.store(true, Ordering::Relaxed);
    let events = poster.await.expect("the event poster");
    println!(
        "{store}: {window:?} of chaos: {server_kills} server kills, {worker_kills} worker \
         kills, {events} events posted"
    );
    assert!(server_kills + worker_kills >= 1, "the chaos killed nothing");

    // Every run ends once nothing is killed any more.
    let began = Instant::now();
    let runs = loop {
        let runs = ledger().await;
        let active = runs
            .iter()
            .filter(|r| matches!(r.state.as_str(), "waiting" | "queued" | "running"))
            .count();
        if active == 0 || began.elapsed() > DRAIN {
            println!(
                "{store}: {active} runs active {} ms after the chaos",
                began.elapsed().as_millis()
            );
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let summary = check(&runs, store);
    println!("{summary}; {server_kills} server and {worker_kills} worker kills");
    drop(workers);
    drop(servers);
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keys_hold_their_limit_while_nodes_and_workers_are_killed() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    println!("schema {}, logs in {}", schema.name, logs.path().display());
    let http = pg::http_client();
    let mut servers = Servers::Pg {
        url: schema.url.clone(),
        nodes: (0..3)
            .map(|i| (format!("node-{i}"), free_port(), None))
            .collect(),
    };
    for i in 0..3 {
        servers.start(i, &logs, &http).await;
    }
    let db = schema.client().await;
    let db = &db;
    scenario(
        servers,
        &logs,
        "postgres",
        || async move { ledger_pg(db).await },
    )
    .await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keys_hold_their_limit_while_the_server_and_workers_are_killed() {
    let logs = Logs::new();
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let db = sked.data_dir().join("sked.db");
    let servers = Servers::Sqlite(sked);
    let db = &db;
    scenario(
        servers,
        &logs,
        "sqlite",
        || async move { ledger_sqlite(db) },
    )
    .await;
}

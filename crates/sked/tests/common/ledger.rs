//! The ledger check of a cluster under faults: jobs firing every second or two at an HTTP
//! sink that records each (run, attempt) that reaches it and when; then every job is paused,
//! every run must end, and the history is read from the tables and checked against what the
//! sink saw:
//! - every instant each schedule owed has exactly one run, and every run ended;
//! - no two attempts of a run succeeded, none shares another's fencing token, and a lost
//!   attempt (its lease taken away) carries no result, so its late report was refused;
//! - nothing reached the sink unrecorded (a fire or an attempt acknowledged to a worker and
//!   then lost), and every accepted success is a request the sink answered;
//! - no attempt reached the sink after its lease had ended, and no attempt of a run began
//!   before the one before it had ended.
//!
//! Shared by the scenarios that kill nodes and workers (`cluster.rs`) and those that cut, slow
//! or freeze their links (`partitions.rs`).

use super::pg::Schema;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the runs still active after pausing may take to end.
const DRAIN: Duration = Duration::from_secs(90);
/// Slack at either end of the window of owed instants.
const EDGE_MICROS: i64 = 2_000_000;
/// How long the ledger check waits for instants due before pausing to be recorded.
const SETTLE: Duration = Duration::from_secs(20);

/// The jobs' HTTP target: answers 200 at once and remembers which (run, attempt) reached it.
#[derive(Clone, Default)]
pub struct Sink {
    /// Each (run, attempt) that reached it, with when it first did (microseconds).
    pub seen: Arc<Mutex<HashMap<(i64, i64), i64>>>,
}

impl Sink {
    pub async fn start() -> (Sink, String) {
        let sink = Sink::default();
        let seen = sink.seen.clone();
        let app = axum::Router::new().route(
            "/hit",
            axum::routing::any(move |headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let number = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<i64>().ok())
                    };
                    if let (Some(run), Some(attempt)) =
                        (number("x-sked-run-id"), number("x-sked-attempt"))
                    {
                        seen.lock()
                            .expect("sink lock")
                            .entry((run, attempt))
                            .or_insert_with(|| Utc::now().timestamp_micros());
                    }
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the sink");
        let addr = listener.local_addr().expect("sink address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (sink, format!("http://{addr}/hit"))
    }
}

pub struct JobPlan {
    pub name: String,
    pub every_micros: i64,
    /// Just before the PUT was sent: the schedule's first instant is after this.
    pub created: DateTime<Utc>,
}

pub fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub fn at(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| us.to_string())
}

/// Pauses every job (a paused job's instants are recorded skipped), waits for the instants up
/// to the pause and for every run to end, then checks the ledger; the report, and how many
/// attempts were lost with a worker or a lease.
pub async fn pause_and_check_ledger(
    http: &reqwest::Client,
    bases: &[String],
    plans: &[JobPlan],
    schema: &Schema,
    sink: &Sink,
) -> (String, usize) {
    let pause_began = Utc::now();
    pause_jobs(http, bases, plans).await;
    println!(
        "paused every job in {} ms",
        (Utc::now() - pause_began).num_milliseconds()
    );
    let db = schema.client().await;
    await_firing_past_each_pause(&db, pause_began, plans.len()).await;
    drain(&db).await;
    check_ledger(&db, plans, pause_began, sink).await
}

/// Creates `jobs` jobs, a third through each node, several requests at a time. A third fire every
/// second, the others every two seconds: about 670 runs a second for 1,000 jobs.
pub async fn create_jobs(
    http: &reqwest::Client,
    bases: &[String],
    sink_url: &str,
    jobs: usize,
) -> Vec<JobPlan> {
    const LANES: usize = 12;
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..LANES {
        let http = http.clone();
        let bases = bases.to_vec();
        let sink_url = sink_url.to_string();
        lanes.spawn(async move {
            let mut plans = Vec::new();
            for i in (lane..jobs).step_by(LANES) {
                let every = if i % 3 == 0 { 1 } else { 2 };
                let name = format!("c{i:04}");
                let job = json!({
                    "schedule": {"every": format!("{every}s")},
                    "target": {"http": {"url": sink_url, "method": "GET", "timeout": "10s"}},
                });
                let base = &bases[i % bases.len()];
                let created = Utc::now();
                let resp = http
                    .put(format!("{base}/api/v1/jobs/{name}"))
                    .json(&job)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("PUT {name} on {base}: {e}"));
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                assert_eq!(status.as_u16(), 201, "PUT {name} on {base}: {body}");
                plans.push(JobPlan {
                    name,
                    every_micros: every * 1_000_000,
                    created,
                });
            }
            plans
        });
    }
    let mut plans = Vec::new();
    while let Some(lane) = lanes.join_next().await {
        plans.extend(lane.expect("a lane of job creation"));
    }
    plans.sort_by_key(|p| p.created);
    plans
}

pub async fn pause_jobs(http: &reqwest::Client, bases: &[String], plans: &[JobPlan]) {
    const LANES: usize = 12;
    let names: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..LANES {
        let http = http.clone();
        let bases = bases.to_vec();
        let names = names.clone();
        lanes.spawn(async move {
            for i in (lane..names.len()).step_by(LANES) {
                let base = &bases[i % bases.len()];
                let url = format!("{base}/api/v1/jobs/{}/pause", names[i]);
                let resp = http
                    .post(&url)
                    .send()
                    .await
                    // Debug, for the cause: a timeout, a refused or a dropped connection.
                    .unwrap_or_else(|e| panic!("POST {url}: {e:?}"));
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                assert_eq!(status.as_u16(), 200, "POST {url}: {body}");
            }
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane.expect("a lane of pausing");
    }
}

/// Waits (up to [`SETTLE`]) until the firing of every job has passed its pause: each has an
/// instant recorded `skipped (paused)`. A job's instants are recorded in order, so every
/// instant due before the job was paused is then in the ledger too. Pausing a thousand jobs
/// takes seconds, and an instant due between the first pause and a job's own is a run like
/// any other; fired late (a partition handed over during the pause is fired by its new node
/// only once that node has loaded it, and a loaded machine's loop runs behind), it would
/// reach the target after a drain that looked too early saw nothing running. An instant
/// recorded late is no problem of the ledger, one never recorded is, and `check_ledger`
/// reports it.
pub async fn await_firing_past_each_pause(
    db: &tokio_postgres::Client,
    pause_began: DateTime<Utc>,
    jobs: usize,
) {
    let began = Instant::now();
    loop {
        let caught_up: i64 = db
            .query_one(
                "SELECT count(DISTINCT job) FROM runs WHERE skip_reason = 'paused'",
                &[],
            )
            .await
            .expect("count jobs whose firing passed their pause")
            .get(0);
        if caught_up as usize >= jobs || began.elapsed() > SETTLE {
            println!(
                "{caught_up} of {jobs} jobs had fired past their pause {} ms after pausing",
                (Utc::now() - pause_began).num_milliseconds()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no run is waiting, queued or running.
pub async fn drain(db: &tokio_postgres::Client) {
    let began = Instant::now();
    let mut said = Instant::now();
    loop {
        let rows = db
            .query(
                "SELECT state, count(*) FROM runs \
                 WHERE state IN ('waiting', 'queued', 'running') GROUP BY state",
                &[],
            )
            .await
            .expect("count active runs");
        let active: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if active.is_empty() {
            println!(
                "every run ended {} ms after pausing",
                began.elapsed().as_millis()
            );
            return;
        }
        if began.elapsed() > DRAIN {
            let stuck = db
                .query(
                    "SELECT r.id, r.job, r.scheduled_for, r.state, r.attempts, \
                     coalesce(string_agg(a.state || '@' || a.worker_id, ', ' ORDER BY a.number), '') \
                     FROM runs r LEFT JOIN attempts a ON a.run_id = r.id \
                     WHERE r.state IN ('waiting', 'queued', 'running') \
                     GROUP BY r.id ORDER BY r.id LIMIT 10",
                    &[],
                )
                .await
                .expect("read stuck runs");
            let stuck: Vec<String> = stuck
                .iter()
                .map(|r| {
                    format!(
                        "run {} of {} for {}: {} after {} attempts [{}]",
                        r.get::<_, i64>(0),
                        r.get::<_, String>(1),
                        at(r.get(2)),
                        r.get::<_, String>(3),
                        r.get::<_, i32>(4),
                        r.get::<_, String>(5)
                    )
                })
                .collect();
            panic!(
                "runs still active {DRAIN:?} after pausing: {active:?}; the first ones:\n{}",
                stuck.join("\n")
            );
        }
        if said.elapsed() > Duration::from_secs(10) {
            println!("still active after pausing: {active:?}");
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct RunRow {
    id: i64,
    scheduled_for: i64,
    state: String,
    skip_reason: Option<String>,
    trigger: String,
    attempts: i32,
}

struct AttemptRow {
    number: i32,
    token: i64,
    state: String,
    exit_code: Option<i32>,
    http_status: Option<i32>,
    worker_id: String,
    /// Microseconds, as the node that wrote them saw the clock (this machine's).
    started_at: i64,
    lease_expires_at: i64,
    finished_at: Option<i64>,
}

/// The ledger check, straight from the tables. Collects every problem, then fails with the
/// first ones and how many there are; returns a summary when there is none.
pub async fn check_ledger(
    db: &tokio_postgres::Client,
    plans: &[JobPlan],
    pause_began: DateTime<Utc>,
    sink: &Sink,
) -> (String, usize) {
    // What reached the target, taken before the ledger is read: every attempt a worker ran by
    // then was recorded before it was handed out, so its row is in what is read next. (Taken
    // after, an attempt started between the two reads looked unrecorded.)
    let seen_before = sink.seen.lock().expect("sink lock").clone();
    let mut runs: BTreeMap<String, Vec<RunRow>> = BTreeMap::new();
    for r in db
        .query(
            "SELECT id, job, scheduled_for, state, skip_reason, trigger, attempts \
             FROM runs WHERE namespace = 'default' ORDER BY job, scheduled_for, id",
            &[],
        )
        .await
        .expect("read runs")
    {
        runs.entry(r.get(1)).or_default().push(RunRow {
            id: r.get(0),
            scheduled_for: r.get(2),
            state: r.get(3),
            skip_reason: r.get(4),
            trigger: r.get(5),
            attempts: r.get(6),
        });
    }
    let mut attempts: HashMap<i64, Vec<AttemptRow>> = HashMap::new();
    for a in db
        .query(
            "SELECT run_id, number, token, state, exit_code, http_status, worker_id, \
             started_at, lease_expires_at, finished_at \
             FROM attempts ORDER BY run_id, number",
            &[],
        )
        .await
        .expect("read attempts")
    {
        attempts.entry(a.get(0)).or_default().push(AttemptRow {
            number: a.get(1),
            token: a.get(2),
            state: a.get(3),
            exit_code: a.get(4),
            http_status: a.get(5),
            worker_id: a.get(6),
            started_at: a.get(7),
            lease_expires_at: a.get(8),
            finished_at: a.get(9),
        });
    }
    // And taken after: a success the ledger holds was answered by the target before it was
    // reported, so before this.
    let seen = sink.seen.lock().expect("sink lock").clone();

    let mut problems: Vec<String> = Vec::new();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let (mut checked, mut attempts_checked, mut lost) = (0usize, 0usize, 0usize);
    let planned: HashSet<&str> = plans.iter().map(|p| p.name.as_str()).collect();
    for job in runs.keys().filter(|j| !planned.contains(j.as_str())) {
        problems.push(format!("runs of a job the test never created: {job}"));
    }
    let window_end = micros(pause_began) - EDGE_MICROS;
    for plan in plans {
        let name = &plan.name;
        let Some(rows) = runs.get(name) else {
            problems.push(format!("{name}: no run at all"));
            continue;
        };
        // Owed instants: the schedule's grid, with nothing missing and nothing twice, from
        // just after the job's creation to just before pausing began (paused instants go on
        // being recorded as skipped after that).
        let created = micros(plan.created);
        let (first, last) = (rows[0].scheduled_for, rows[rows.len() - 1].scheduled_for);
        if first <= created || first - created > plan.every_micros + EDGE_MICROS {
            problems.push(format!(
                "{name}: first instant {} for a job created at {}",
                at(first),
                at(created)
            ));
        }
        if last < window_end {
            problems.push(format!(
                "{name}: last instant {} but pausing began at {}",
                at(last),
                pause_began.to_rfc3339()
            ));
        }
        for pair in rows.windows(2) {
            let gap = pair[1].scheduled_for - pair[0].scheduled_for;
            if gap != plan.every_micros {
                problems.push(format!(
                    "{name}: runs {} and {} for {} and {}: {} instead of one instant every {} ms",
                    pair[0].id,
                    pair[1].id,
                    at(pair[0].scheduled_for),
                    at(pair[1].scheduled_for),
                    if gap == 0 { "twice" } else { "a gap" },
                    plan.every_micros / 1000
                ));
            }
        }
        for run in rows {
            checked += 1;
            *states
                .entry(match &run.skip_reason {
                    Some(reason) => format!("{} ({reason})", run.state),
                    None => run.state.clone(),
                })
                .or_default() += 1;
            let tries = attempts.get(&run.id).map(Vec::as_slice).unwrap_or_default();
            attempts_checked += tries.len();
            lost += tries.iter().filter(|a| a.state == "lost").count();
            check_run(name, run, tries, &seen, &mut problems);
        }
    }
    // Workers get an attempt only once it is recorded, so nothing reaches the target unrecorded.
    let mut unrecorded: Vec<&(i64, i64)> = seen_before
        .keys()
        .filter(|(run, number)| {
            !attempts
                .get(run)
                .is_some_and(|tries| tries.iter().any(|a| i64::from(a.number) == *number))
        })
        .collect();
    unrecorded.sort();
    if !unrecorded.is_empty() {
        problems.push(format!(
            "{} (run, attempt) pairs reached the target with no attempt row: {:?}",
            unrecorded.len(),
            &unrecorded[..unrecorded.len().min(10)]
        ));
    }
    // Every job was paused and every run had ended before the reads: nothing starts after.
    let mut late: Vec<&(i64, i64)> = seen
        .keys()
        .filter(|pair| !seen_before.contains_key(pair))
        .collect();
    late.sort();
    if !late.is_empty() {
        problems.push(format!(
            "{} (run, attempt) pairs reached the target after every job was paused and every \
             run had ended: {:?}",
            late.len(),
            &late[..late.len().min(10)]
        ));
    }
    let shown: Vec<&String> = problems.iter().take(25).collect();
    assert!(
        problems.is_empty(),
        "{} problems in the ledger; the first ones:\n{}",
        problems.len(),
        shown
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let report = format!(
        "{checked} runs of {} jobs checked, by state {states:?}; {attempts_checked} attempts, \
         {lost} lost; the sink saw {} attempts",
        plans.len(),
        seen.len()
    );
    (report, lost)
}

/// One run and its attempts. The target always answers 200, so an attempt either succeeded or
/// was lost with its worker (or with its worker's lease); nothing else is legitimate.
fn check_run(
    job: &str,
    run: &RunRow,
    tries: &[AttemptRow],
    seen: &HashMap<(i64, i64), i64>,
    problems: &mut Vec<String>,
) {
    let id = run.id;
    let describe = || {
        let list: Vec<String> = tries
            .iter()
            .map(|a| {
                format!(
                    "#{} {} token {} on {} (exit {:?}, http {:?})",
                    a.number, a.state, a.token, a.worker_id, a.exit_code, a.http_status
                )
            })
            .collect();
        format!(
            "{job}: run {id} for {} is {} with {} attempts [{}]",
            at(run.scheduled_for),
            run.state,
            run.attempts,
            list.join("; ")
        )
    };
    if run.trigger != "schedule" {
        problems.push(format!("{}: trigger {}", describe(), run.trigger));
    }
    match run.state.as_str() {
        "succeeded" | "skipped" => {}
        "waiting" | "queued" | "running" => problems.push(format!("not ended: {}", describe())),
        _ => problems.push(format!("ended other than succeeded: {}", describe())),
    }
    let numbers: Vec<i32> = tries.iter().map(|a| a.number).collect();
    let expected: Vec<i32> = (1..=run.attempts).collect();
    if numbers != expected {
        problems.push(format!(
            "attempt numbers are not 1..{}: {}",
            run.attempts,
            describe()
        ));
    }
    let tokens: HashSet<i64> = tries.iter().map(|a| a.token).collect();
    if tokens.len() != tries.len() {
        problems.push(format!(
            "two attempts share a fencing token: {}",
            describe()
        ));
    }
    let succeeded: Vec<&AttemptRow> = tries.iter().filter(|a| a.state == "succeeded").collect();
    if succeeded.len() > 1 {
        problems.push(format!("two attempts succeeded: {}", describe()));
    }
    if run.state == "succeeded"
        && (succeeded.len() != 1 || tries.last().is_none_or(|a| a.state != "succeeded"))
    {
        problems.push(format!(
            "a succeeded run whose last attempt is not its one success: {}",
            describe()
        ));
    }
    // Time, as the history shows it: an attempt reached the target only while it held its
    // lease (a request that arrived after the lease ended was started by a worker that had
    // lost it), and a run's attempts followed one another: each began after the one before
    // it had ended.
    for a in tries {
        let Some(&arrived) = seen.get(&(id, i64::from(a.number))) else {
            continue;
        };
        let lease_ended = match a.finished_at {
            Some(finished) if a.state == "lost" => finished.min(a.lease_expires_at),
            _ => a.lease_expires_at,
        };
        if arrived > lease_ended {
            problems.push(format!(
                "attempt #{} reached the target {} ms after its lease ended: {}",
                a.number,
                (arrived - lease_ended) / 1000,
                describe()
            ));
        }
    }
    for pair in tries.windows(2) {
        let ended = pair[0].finished_at.unwrap_or(i64::MAX);
        if pair[1].started_at < ended {
            problems.push(format!(
                "attempt #{} began {} ms before attempt #{} had ended: {}",
                pair[1].number,
                (ended.min(i64::MAX / 2) - pair[1].started_at) / 1000,
                pair[0].number,
                describe()
            ));
        }
    }
    if run.state == "skipped" && !tries.is_empty() {
        problems.push(format!("a skipped run has attempts: {}", describe()));
    }
    for a in tries {
        match a.state.as_str() {
            // A lost attempt's lease was taken away: any report it sent afterwards was refused
            // as fenced, so it carries no result.
            "lost" if a.exit_code.is_some() || a.http_status.is_some() => problems.push(format!(
                "lost attempt #{} has a recorded result: {}",
                a.number,
                describe()
            )),
            "lost" => {}
            // An accepted success is a request the sink really answered.
            "succeeded" if a.http_status != Some(200) => problems.push(format!(
                "attempt #{} succeeded without HTTP 200: {}",
                a.number,
                describe()
            )),
            "succeeded" if !seen.contains_key(&(id, i64::from(a.number))) => {
                problems.push(format!(
                    "attempt #{} succeeded but never reached the target: {}",
                    a.number,
                    describe()
                ))
            }
            "succeeded" => {}
            other => problems.push(format!(
                "attempt #{} ended {other}, not succeeded or lost: {}",
                a.number,
                describe()
            )),
        }
    }
}

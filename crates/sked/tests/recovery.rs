//! sked's own failures cost nothing: downtime is resolved by each job's misfire policy with a
//! ledger row for every missed instant, and a worker killed mid-run hands its attempt to another
//! worker without spending the run's retry budget.

mod common;

use chrono::Utc;
use common::{instant, shell, Sked};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn misfired(runs: &[Value], from: chrono::DateTime<Utc>, to: chrono::DateTime<Utc>) -> Vec<Value> {
    runs.iter()
        .filter(|r| {
            let t = instant(&r["scheduled_for"]);
            t > from && t < to
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn downtime_is_resolved_by_each_misfire_policy() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    for (name, policy) in [("skip", "skip"), ("once", "run_once"), ("all", "run_all")] {
        let job = json!({
            "schedule": {"every": "1s"},
            "target": shell("true"),
            "misfire": {"policy": policy, "catchup_window": "1h"},
        });
        assert_eq!(sked.put_job(name, job).await.0, 201);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sked.server.as_mut().unwrap().stop(Duration::from_secs(10));
    let stopped = Utc::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let restarted = Utc::now();
    sked.start_dev(&[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    for name in ["skip", "once", "all"] {
        let runs = sked.wait_runs(name, 14, Duration::from_secs(10)).await;
        // Every instant from the first to the last has exactly one row.
        for pair in runs.windows(2) {
            let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
            assert_eq!(
                gap,
                chrono::Duration::seconds(1),
                "{name}: gap in the ledger {pair:?}"
            );
        }
        let missed = misfired(&runs, stopped, restarted);
        assert!(
            missed.len() >= 9,
            "{name}: {} missed instants recorded: {missed:?}",
            missed.len()
        );
        let skipped = missed
            .iter()
            .filter(|r| r["state"] == "skipped" && r["skip_reason"] == "misfire")
            .count();
        let ran = missed.iter().filter(|r| r["state"] == "succeeded").count();
        assert_eq!(skipped + ran, missed.len(), "{name}: {missed:?}");
        match name {
            "skip" => assert_eq!(ran, 0, "skip runs nothing missed: {missed:?}"),
            // The latest missed instant may fall after `restarted`, in the moment before load.
            "once" => assert!(
                ran <= 1 && skipped >= missed.len() - 1,
                "run_once: {missed:?}"
            ),
            _ => assert_eq!(skipped, 0, "run_all runs every missed instant: {missed:?}"),
        }
        if name == "once" {
            let catch_up = runs
                .iter()
                .filter(|r| instant(&r["scheduled_for"]) > stopped && r["state"] == "succeeded")
                .count();
            assert!(catch_up >= 1, "run_once ran its catch-up run: {runs:?}");
        }
    }

    // The restart's log says what loading did: three schedules, and the missed instants.
    let mut logs: Vec<_> = std::fs::read_dir(sked.dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dev-"))
        })
        .collect();
    logs.sort();
    let log = std::fs::read_to_string(logs.last().expect("the restart's log")).unwrap();
    let loaded = log
        .lines()
        .find(|l| l.contains("firing: schedules loaded"))
        .unwrap_or_else(|| panic!("no load line: {log}"));
    let field = |name: &str| -> u64 {
        loaded
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {loaded}"))
    };
    assert_eq!(field("schedules"), 3, "{loaded}");
    assert!(field("missed") >= 27, "{loaded}");
}

#[tokio::test]
async fn a_killed_worker_hands_its_attempt_to_another_worker() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let first = sked.start_worker("first", 2);
    let job = json!({"target": shell("echo started; sleep 3; echo finished"), "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("long", job).await.0, 201);
    let (status, run) = sked.post("/jobs/long/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().unwrap();

    let deadline = Instant::now() + Duration::from_secs(15);
    while sked.run(id).await["state"] != "running" {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sked.start_worker("second", 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    sked.workers[first].sigkill();

    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        let run = sked.run(id).await;
        if common::is_terminal(&run["state"]) {
            break run;
        }
        assert!(Instant::now() < deadline, "the run never finished: {run}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(run["failures"], 0, "a lost attempt spends no retry: {run}");
    let attempts = run["attempt_history"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{run}");
    assert_eq!(attempts[0]["state"], "lost", "{run}");
    assert_eq!(attempts[1]["state"], "succeeded", "{run}");
    assert_ne!(attempts[0]["worker_id"], attempts[1]["worker_id"], "{run}");
    // The lost attempt is counted as lost, not as a retry nor a failure.
    let (_, stats) = sked.get("/jobs/long/stats").await;
    assert_eq!(
        (&stats["lost"], &stats["retries"], &stats["failed"]),
        (&json!(1), &json!(0), &json!(0)),
        "{stats}"
    );
    let (_, workers) = sked.get("/workers").await;
    let dead = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["alive"] == false)
        .count();
    assert_eq!(dead, 1, "{workers}");
}

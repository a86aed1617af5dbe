//! Sharded and broadcast jobs through the real binary and real `sked worker` processes: an
//! instant of a job with `shards: N` is N runs that each learn their place from
//! `SKED_SHARD`/`SKED_SHARDS` and are spread over the workers; a broadcast's instant runs once
//! on each live worker, and the share of a worker killed before it ran fails saying so; and
//! the bounds and combinations a definition may not have are refused with the field at fault.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Waits until `n` workers are registered and alive.
async fn wait_workers(sked: &Sked, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, list) = sked.get("/workers").await;
        assert_eq!(status, 200, "{list}");
        let alive = list["workers"]
            .as_array()
            .map_or(0, |w| w.iter().filter(|w| w["alive"] == true).count());
        if alive >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} workers never came: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn each_shard_of_an_instant_runs_once_knowing_its_place_spread_over_workers() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w1", 2);
    sked.start_worker("w2", 2);
    wait_workers(&sked, 2).await;
    let (status, job) = sked
        .put_job(
            "split",
            json!({
                "target": {"shell": {"command": "echo shard=$SKED_SHARD/$SKED_SHARDS; sleep 1"}},
                "shards": 4,
            }),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["shards"], 4);

    let (status, first) = sked.post("/jobs/split/trigger", json!({})).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["shard"], json!({"index": 0, "count": 4}));
    let runs = sked.wait_runs("split", 4, Duration::from_secs(60)).await;
    assert_eq!(runs.len(), 4, "{}", Value::Array(runs.clone()));
    let instants: BTreeSet<&str> = runs
        .iter()
        .filter_map(|r| r["scheduled_for"].as_str())
        .collect();
    assert_eq!(instants.len(), 1, "the shards share one instant");
    let mut places = BTreeSet::new();
    let mut workers = BTreeSet::new();
    for summary in &runs {
        let id = summary["id"].as_i64().expect("a run id");
        let run = sked.run(id).await;
        assert_eq!(run["state"], "succeeded", "{run}");
        let index = run["shard"]["index"].as_i64().expect("a shard");
        assert_eq!(run["shard"]["count"], 4, "{run}");
        places.insert(index);
        let log = sked.run_log(id).await;
        assert_eq!(log.trim(), format!("shard={index}/4"), "run {id}");
        let attempts = run["attempt_history"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "each shard runs once: {run}");
        workers.insert(attempts[0]["worker_id"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(places, (0..4).collect(), "every place, once");
    // Two slots each and a second of work per shard: four shards need both workers.
    assert_eq!(workers.len(), 2, "spread over the workers: {workers:?}");
    // The command line says which shard each run is.
    let out = common::sked_command()
        .args(["run", "list", "--job", "split"])
        .env("SKED_SERVER", sked.base())
        .output()
        .expect("run sked");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    for index in 0..4 {
        assert!(
            listed.contains(&format!("split (shard {index} of 4)")),
            "{listed}"
        );
    }
}

/// The id of each live worker, by name.
async fn worker_ids(sked: &Sked) -> std::collections::BTreeMap<String, String> {
    let (status, list) = sked.get("/workers").await;
    assert_eq!(status, 200, "{list}");
    list["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter(|w| w["alive"] == true)
        .map(|w| {
            let text = |k: &str| w[k].as_str().unwrap_or_default().to_string();
            (text("name"), text("id"))
        })
        .collect()
}

#[tokio::test]
async fn a_broadcast_runs_once_on_each_worker_and_a_lost_workers_share_fails() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w1", 2);
    let w2 = sked.start_worker("w2", 2);
    wait_workers(&sked, 2).await;
    let ids = worker_ids(&sked).await;
    let (status, job) = sked
        .put_job(
            "everywhere",
            json!({
                "target": {"shell": {"command": "echo on=$SKED_SHARD/$SKED_SHARDS"}},
                "broadcast": true,
            }),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let (status, first) = sked.post("/jobs/everywhere/trigger", json!({})).await;
    assert_eq!(status, 201, "{first}");
    let runs = sked
        .wait_runs("everywhere", 2, Duration::from_secs(60))
        .await;
    assert_eq!(runs.len(), 2, "{}", Value::Array(runs.clone()));
    let mut ran_on = BTreeSet::new();
    for summary in &runs {
        let id = summary["id"].as_i64().expect("a run id");
        let run = sked.run(id).await;
        assert_eq!(run["state"], "succeeded", "{run}");
        let pinned = run["pinned_worker"].as_str().expect("pinned").to_string();
        let attempts = run["attempt_history"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "{run}");
        assert_eq!(
            attempts[0]["worker_id"],
            pinned.as_str(),
            "it ran where it was pinned"
        );
        let index = run["shard"]["index"].as_i64().expect("a shard");
        assert_eq!(sked.run_log(id).await.trim(), format!("on={index}/2"));
        ran_on.insert(pinned);
    }
    let everyone: BTreeSet<String> = ids.values().cloned().collect();
    assert_eq!(ran_on, everyone, "once on each worker");

    // w2 dies; an instant fired before it is declared dead still owes it a share, which fails
    // once it is, instead of waiting for ever or running elsewhere.
    sked.workers[w2].sigkill();
    let (status, second) = sked.post("/jobs/everywhere/trigger", json!({})).await;
    assert_eq!(status, 201, "{second}");
    let instant = second["scheduled_for"]
        .as_str()
        .expect("an instant")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let shares = loop {
        let shares: Vec<Value> = sked
            .runs("everywhere")
            .await
            .into_iter()
            .filter(|r| r["scheduled_for"] == instant.as_str())
            .collect();
        if !shares.is_empty() && shares.iter().all(|r| common::is_terminal(&r["state"])) {
            break shares;
        }
        assert!(Instant::now() < deadline, "the second instant never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(shares.len(), 2, "w2 was still alive when it fired");
    for share in shares {
        let run = sked.run(share["id"].as_i64().expect("an id")).await;
        if run["pinned_worker"] == ids["w2"].as_str() {
            assert_eq!(run["state"], "failed", "{run}");
            let error = run["error"].as_str().unwrap_or_default();
            assert!(error.contains("was lost before it ran its share"), "{run}");
        } else {
            assert_eq!(run["state"], "succeeded", "{run}");
        }
    }
}

#[tokio::test]
async fn a_backfill_of_a_sharded_job_is_bounded_by_the_runs_it_writes() {
    let mut sked = Sked::new();
    // No worker: the backfilled runs stay queued, which is all this test needs of them.
    sked.start_server(&[]).await;
    let (status, job) = sked
        .put_job(
            "wide",
            json!({
                "schedule": {"every": "1s", "anchor": "2026-01-01T00:00:00Z"},
                "target": {"shell": {"command": "true"}},
                "shards": 200,
            }),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    // 10,000 runs at 200 a instant: at most 50 instants.
    let (status, answer) = sked
        .post(
            "/jobs/wide/backfill",
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:01:00Z"}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "from", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("more than 50 instants"), "{message}");
    assert!(message.contains("200 runs each"), "{message}");
    let (status, answer) = sked
        .post(
            "/jobs/wide/backfill",
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:04Z"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["instants"].as_array().map(Vec::len), Some(5));
    assert_eq!(answer["recorded"].as_array().map(Vec::len), Some(1000));
    // The job's own schedule may fire the present instant meanwhile; only the past is counted.
    let backfilled = sked
        .runs("wide")
        .await
        .into_iter()
        .filter(|r| {
            r["scheduled_for"]
                .as_str()
                .is_some_and(|at| at < "2026-01-01T00:00:05")
        })
        .count();
    assert_eq!(backfilled, 1000);
}

#[tokio::test]
async fn shards_are_bounded_and_refused_where_they_cannot_apply() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let shell = json!({"shell": {"command": "true"}});
    for bad in [json!(0), json!(257)] {
        let (status, answer) = sked
            .put_job("bad", json!({"target": shell, "shards": bad}))
            .await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["field"], "shards", "{answer}");
    }
    for bad in [json!(-1), json!(70000), json!("4")] {
        let (status, answer) = sked
            .put_job("bad", json!({"target": shell, "shards": bad}))
            .await;
        assert_eq!(status, 400, "shards {bad}: {answer}");
    }
    let (status, answer) = sked
        .put_job(
            "beat",
            json!({
                "schedule": {"every": "1m"},
                "target": {"heartbeat": {"grace": "1m"}},
                "shards": 2,
            }),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "shards", "{answer}");
    for (bad, field) in [
        (
            json!({"target": shell, "broadcast": true, "shards": 2}),
            "shards",
        ),
        (
            json!({"target": {"heartbeat": {"grace": "1m"}}, "schedule": {"every": "1m"}, "broadcast": true}),
            "broadcast",
        ),
    ] {
        let (status, answer) = sked.put_job("bad", bad).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, jobs) = sked.get("/jobs").await;
    assert_eq!(status, 200);
    assert_eq!(jobs["jobs"], json!([]), "nothing refused was written");
}

//! Sharded jobs through the real binary and real `sked worker` processes: an instant of a job
//! with `shards: N` is N runs that each learn their place from `SKED_SHARD`/`SKED_SHARDS` and
//! are spread over the workers; and the bounds and combinations a definition may not have are
//! refused with the field at fault.

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
    let (status, jobs) = sked.get("/jobs").await;
    assert_eq!(status, 200);
    assert_eq!(jobs["jobs"], json!([]), "nothing refused was written");
}

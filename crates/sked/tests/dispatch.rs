//! Dispatch that knows load, through the real binary and the worker protocol: a worker whose
//! heartbeat reports a stall gauge over its pool's threshold gets no work until the gauge falls
//! back to the reset threshold, and a run nobody can take says why; a worker reporting a key
//! warm gets that key's runs; a pool that names its own overload control is held to it; what a
//! heartbeat may carry is bounded; and namespaces share a pool by weighted fair share, a
//! namespace's flood included.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::time::Duration;

async fn register(sked: &Sked, name: &str) -> String {
    let (status, answer) = sked
        .post("/workers", json!({"name": name, "slots": 4}))
        .await;
    assert_eq!(status, 201, "{answer}");
    answer["worker_id"].as_str().expect("an id").to_string()
}

async fn heartbeat(sked: &Sked, worker: &str, body: Value) -> (u16, Value) {
    sked.post(&format!("/workers/{worker}/heartbeat"), body)
        .await
}

/// Asks for work for `wait_ms` and returns the run ids handed over.
async fn lease(sked: &Sked, worker: &str, wait_ms: u64) -> Vec<i64> {
    let (status, answer) = sked
        .post(
            &format!("/workers/{worker}/lease"),
            json!({"max": 4, "wait_ms": wait_ms}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["run_id"].as_i64().expect("a run id"))
        .collect()
}

#[tokio::test]
async fn an_overloaded_worker_gets_nothing_until_it_recovers_and_a_waiting_run_says_why() {
    let mut sked = Sked::new();
    // The workers below are this test speaking the protocol: they must not be declared dead
    // between its heartbeats.
    sked.start_server(&[
        "--heartbeat-timeout",
        "60s",
        "--stall-trip",
        "6",
        "--stall-reset",
        "2",
    ])
    .await;
    let (status, job) = sked
        .put_job("work", json!({"target": {"shell": {"command": "true"}}}))
        .await;
    assert_eq!(status, 201, "{job}");
    let a = register(&sked, "a").await;
    let b = register(&sked, "b").await;

    // `a` reports 7 attempts stalled (over the server's --stall-trip 6): `b` gets the run,
    // though `a` asked first and for longer.
    let (status, answer) = heartbeat(&sked, &a, json!({"stall": 7})).await;
    assert_eq!(status, 200, "{answer}");
    let run = sked.trigger("work").await;
    let (from_a, from_b) = tokio::join!(lease(&sked, &a, 1500), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lease(&sked, &b, 1000).await
    });
    assert_eq!((from_a, from_b), (vec![], vec![run]));

    // Both over the threshold, both asking: the run waits, and says why.
    heartbeat(&sked, &b, json!({"stall": 9})).await;
    let run = sked.trigger("work").await;
    let ask = |w: String| {
        let sked = &sked;
        async move { lease(sked, &w, 2500).await }
    };
    let why = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, view) = sked.get(&format!("/runs/{run}")).await;
        assert_eq!(status, 200, "{view}");
        view
    };
    let (from_a, from_b, view) = tokio::join!(ask(a.clone()), ask(b.clone()), why);
    assert_eq!((from_a, from_b), (vec![], vec![]));
    assert_eq!(view["state"], "queued", "{view}");
    assert_eq!(
        view["waiting_for_workers"],
        "waiting for workers: 2 eligible, all over the breaker threshold",
        "{view}"
    );

    // The workers' list shows it.
    let (status, list) = sked.get("/workers").await;
    assert_eq!(status, 200, "{list}");
    for worker in list["workers"].as_array().expect("workers") {
        assert_eq!(worker["load"]["overload"], "breaker", "{worker}");
        assert_eq!(worker["load"]["overloaded"], true, "{worker}");
    }

    let metrics = sked
        .http
        .get(format!("{}/metrics", sked.base()))
        .send()
        .await
        .expect("GET /metrics");
    let metrics = metrics.text().await.expect("a body");
    assert!(
        metrics.contains("\nsked_workers_overloaded 2\n"),
        "{metrics}"
    );

    // Between the thresholds the breaker stays open (no flapping); at --stall-reset it closes.
    heartbeat(&sked, &a, json!({"stall": 4})).await;
    assert_eq!(lease(&sked, &a, 700).await, Vec::<i64>::new());
    heartbeat(&sked, &a, json!({"stall": 2})).await;
    assert_eq!(lease(&sked, &a, 2000).await, vec![run]);
    let (_, view) = sked.get(&format!("/runs/{run}")).await;
    assert!(view.get("waiting_for_workers").is_none(), "{view}");

    // A pool that names its own control is held to it: `b`'s pool sheds nothing.
    let none = json!({"policy": "none", "trip": 6, "reset": 2});
    heartbeat(&sked, &b, json!({"stall": 50, "overload": none})).await;
    let run = sked.trigger("work").await;
    assert_eq!(lease(&sked, &b, 2000).await, vec![run]);
}

#[tokio::test]
async fn a_key_goes_to_the_worker_that_holds_it_warm_then_to_the_one_that_had_it_last() {
    let mut sked = Sked::new();
    sked.start_server(&["--heartbeat-timeout", "60s"]).await;
    let job = json!({
        "target": {"shell": {"command": "true"}},
        "routing": {"strategy": "affinity", "affinity_key": "project-7"},
    });
    let (status, answer) = sked.put_job("feed", job).await;
    assert_eq!(status, 201, "{answer}");
    let cold = register(&sked, "cold").await;
    let warm = register(&sked, "warm").await;
    heartbeat(
        &sked,
        &warm,
        json!({"warm_keys": ["project-3", "project-7"]}),
    )
    .await;

    // Both ask before the run exists; the one holding the key warm gets it.
    let runs_to = |first: String, second: String| {
        let sked = &sked;
        async move {
            let asks =
                async { tokio::join!(lease(sked, &first, 3000), lease(sked, &second, 3000)) };
            let run = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                sked.trigger("feed").await
            };
            let ((a, b), run) = tokio::join!(asks, run);
            (a, b, run)
        }
    };
    let (to_cold, to_warm, run) = runs_to(cold.clone(), warm.clone()).await;
    assert_eq!((to_cold, to_warm), (vec![], vec![run]));

    // It forgets the key; `cold` reports nothing either, but `warm` was handed the key last:
    // assumed warm, it is still preferred.
    heartbeat(&sked, &warm, json!({"warm_keys": []})).await;
    let (to_cold, to_warm, run) = runs_to(cold.clone(), warm.clone()).await;
    assert_eq!((to_cold, to_warm), (vec![], vec![run]));
}

#[tokio::test]
async fn what_a_heartbeat_and_a_routing_may_carry_is_bounded() {
    let mut sked = Sked::new();
    sked.start_server(&["--heartbeat-timeout", "60s"]).await;
    let w = register(&sked, "w").await;
    let field = |answer: &Value| answer["error"]["field"].clone();

    let too_many: Vec<String> = (0..257).map(|i| format!("k{i}")).collect();
    let (status, answer) = heartbeat(&sked, &w, json!({"warm_keys": too_many})).await;
    assert_eq!(
        (status, field(&answer)),
        (400, json!("warm_keys")),
        "{answer}"
    );
    let (status, answer) = heartbeat(&sked, &w, json!({"warm_keys": ["k".repeat(201)]})).await;
    assert_eq!(
        (status, field(&answer)),
        (400, json!("warm_keys")),
        "{answer}"
    );
    let flapping = json!({"policy": "breaker", "trip": 5, "reset": 5});
    let (status, answer) = heartbeat(&sked, &w, json!({"overload": flapping})).await;
    assert_eq!(
        (status, field(&answer)),
        (400, json!("overload.reset")),
        "{answer}"
    );
    let unknown = json!({"policy": "dagor", "trip": 5, "reset": 1});
    let (status, answer) = heartbeat(&sked, &w, json!({"overload": unknown})).await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = heartbeat(&sked, &w, json!({"stall": -1})).await;
    assert_eq!(status, 400, "{answer}");
    // The largest allowed report is taken.
    let most: Vec<String> = (0..256).map(|i| format!("{i:0>200}")).collect();
    let (status, answer) = heartbeat(&sked, &w, json!({"warm_keys": most, "stall": 3})).await;
    assert_eq!(status, 200, "{answer}");

    let job = |key: String| {
        json!({
            "target": {"shell": {"command": "true"}},
            "routing": {"strategy": "affinity", "affinity_key": key},
        })
    };
    let (status, answer) = sked.put_job("long", job("k".repeat(201))).await;
    assert_eq!(
        (status, field(&answer)),
        (400, json!("routing.affinity_key")),
        "{answer}"
    );
    let (status, answer) = sked.put_job("empty", job(String::new())).await;
    assert_eq!(
        (status, field(&answer)),
        (400, json!("routing.affinity_key")),
        "{answer}"
    );
    let (status, answer) = sked.put_job("fine", job("k".repeat(200))).await;
    assert_eq!(status, 201, "{answer}");
}

async fn put(sked: &Sked, path: &str, body: Value) -> (u16, Value) {
    common::call(&sked.http, reqwest::Method::PUT, sked.url(path), Some(body)).await
}

/// Asks for at most `max` attempts for `wait_ms`; returns them as the server answered.
async fn lease_attempts(sked: &Sked, worker: &str, max: u32, wait_ms: u64) -> Vec<Value> {
    let (status, answer) = sked
        .post(
            &format!("/workers/{worker}/lease"),
            json!({"max": max, "wait_ms": wait_ms}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["attempts"].as_array().expect("attempts").clone()
}

/// Reports `attempts` succeeded.
async fn complete(sked: &Sked, worker: &str, attempts: &[Value]) {
    let completions: Vec<Value> = attempts
        .iter()
        .map(
            |a| json!({"attempt_id": a["attempt_id"], "token": a["token"], "outcome": "succeeded"}),
        )
        .collect();
    let (status, answer) = sked
        .post(
            &format!("/workers/{worker}/complete"),
            json!({ "completions": completions }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
}

/// Records the instants of `job` (in `namespace`) between `from_s` and `to_s` seconds ago;
/// returns how many runs it recorded.
async fn backfill(sked: &Sked, namespace: &str, job: &str, from_s: i64, to_s: i64) -> usize {
    let now = chrono::Utc::now();
    let (status, answer) = sked
        .post(
            &format!("/jobs/{job}/backfill?namespace={namespace}"),
            json!({
                "from": now - chrono::Duration::seconds(from_s),
                "to": now - chrono::Duration::seconds(to_s),
            }),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["recorded"].as_array().expect("recorded").len()
}

fn namespaces_of(attempts: &[Value]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| a["namespace"].as_str().expect("a namespace").to_string())
        .collect()
}

/// A tenant cannot stall dispatch for others by queueing runs nobody can take: 10,000 runs at
/// priority 100 that need a label no worker carries sit ahead of another namespace's run,
/// which an idle worker still gets at once; deleting their job takes them out of the node's
/// queue, so `sked_queue_depth` agrees with the store again.
#[tokio::test]
async fn runs_nobody_can_take_never_stall_another_namespace_and_leave_with_their_job() {
    let mut sked = Sked::new();
    sked.start_server(&[
        "--heartbeat-timeout",
        "60s",
        "--max-queued-per-job",
        "20000",
    ])
    .await;
    let hog = json!({
        "schedule": {"every": "1s"},
        "priority": 100,
        "routing": {"labels": {"gpu": "none"}},
        "target": {"shell": {"command": "true"}},
    });
    let (status, answer) = put(&sked, "/jobs/hog?namespace=team-y", hog).await;
    assert_eq!(status, 201, "{answer}");
    let recorded = backfill(&sked, "team-y", "hog", 10_000, 5_000).await
        + backfill(&sked, "team-y", "hog", 5_000, 0).await;
    assert!(recorded >= 9_990, "{recorded} runs recorded");
    assert!(sked.metric("sked_queue_depth").await >= 9_990);

    let worker = register(&sked, "idle").await;
    let (status, answer) = heartbeat(&sked, &worker, json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let small = json!({"target": {"shell": {"command": "true"}}});
    let (status, answer) = put(&sked, "/jobs/small?namespace=team-x", small).await;
    assert_eq!(status, 201, "{answer}");
    let (status, run) = sked
        .post("/jobs/small/trigger?namespace=team-x", json!({}))
        .await;
    assert_eq!(status, 201, "{run}");
    // Within one second of asking, the idle worker has it.
    let attempts = lease_attempts(&sked, &worker, 4, 1_000).await;
    let runs: Vec<&Value> = attempts.iter().map(|a| &a["run_id"]).collect();
    assert_eq!(runs, vec![&run["id"]], "{attempts:?}");

    let (status, answer) = common::call(
        &sked.http,
        reqwest::Method::DELETE,
        sked.url("/jobs/hog?namespace=team-y"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Nothing is queued in the store any more (the hog's runs were cancelled, the other
    // started), and the node's queue says the same at once.
    assert_eq!(sked.metric("sked_queue_depth").await, 0);
}

/// Namespaces share a worker pool by weighted fair share, whatever their priorities: one that
/// holds more than its share gets a freed slot only once the others waiting have theirs, and a
/// namespace of weight 3 holds three slots of four against one of weight 1.
#[tokio::test]
async fn namespaces_share_a_pool_by_weight_whatever_their_priorities() {
    let mut sked = Sked::new();
    sked.start_server(&["--heartbeat-timeout", "60s"]).await;
    for (namespace, priority) in [("team-a", 50), ("team-b", 0)] {
        let job = json!({
            "schedule": {"every": "1h"},
            "priority": priority,
            "target": {"shell": {"command": "true"}},
        });
        let (status, answer) = put(&sked, &format!("/jobs/work?namespace={namespace}"), job).await;
        assert_eq!(status, 201, "{answer}");
    }
    let worker = register(&sked, "pool").await;
    heartbeat(&sked, &worker, json!({})).await;

    // team-a alone: it takes every slot.
    assert!(backfill(&sked, "team-a", "work", 12 * 3600 + 1800, 1800).await >= 12);
    let mut held = lease_attempts(&sked, &worker, 4, 1_000).await;
    assert_eq!(namespaces_of(&held), vec!["team-a"; 4]);
    // team-b arrives with lower-priority runs: each slot team-a frees goes to team-b until
    // they hold as many.
    assert!(backfill(&sked, "team-b", "work", 12 * 3600 + 1800, 1800).await >= 12);
    let mut order = Vec::new();
    for _ in 0..3 {
        let at = held
            .iter()
            .position(|a| a["namespace"] == "team-a")
            .expect("a team-a attempt held");
        let done = held.remove(at);
        complete(&sked, &worker, &[done]).await;
        let next = lease_attempts(&sked, &worker, 1, 1_000).await;
        order.extend(namespaces_of(&next));
        held.extend(next);
    }
    assert_eq!(order, vec!["team-b", "team-b", "team-a"]);

    // Weight 3 against 1: three slots of four.
    let (status, answer) = put(&sked, "/namespaces/team-a", json!({"weight": 3})).await;
    assert_eq!(status, 201, "{answer}");
    complete(&sked, &worker, &held).await;
    let shared = namespaces_of(&lease_attempts(&sked, &worker, 4, 1_000).await);
    let a = shared.iter().filter(|n| *n == "team-a").count();
    assert_eq!((a, shared.len() - a), (3, 1), "{shared:?}");
}

/// A namespace that floods a saturated pool does not make another wait behind its backlog:
/// with team-a's thousands of runs queued first and every slot held by team-a, each run team-b
/// triggers later goes to the next slot that frees, ahead of all of team-a's; and while team-b
/// has nothing waiting, freed slots go back to team-a. (In queue order alone team-a's older runs
/// would come first: this is what keeps a trickling namespace's start lateness at the time a
/// slot takes to free, whatever the other's backlog.)
#[tokio::test]
async fn a_run_of_another_namespace_takes_the_next_freed_slot_ahead_of_a_flood() {
    let mut sked = Sked::new();
    sked.start_server(&[
        "--heartbeat-timeout",
        "60s",
        "--max-queued-per-job",
        "10000",
    ])
    .await;
    let flood = json!({
        "schedule": {"every": "1s"},
        "target": {"shell": {"command": "true"}},
    });
    let (status, answer) = put(&sked, "/jobs/flood?namespace=team-a", flood).await;
    assert_eq!(status, 201, "{answer}");
    let steady = json!({"target": {"shell": {"command": "true"}}});
    let (status, answer) = put(&sked, "/jobs/steady?namespace=team-b", steady).await;
    assert_eq!(status, 201, "{answer}");
    let worker = register(&sked, "pool").await;
    heartbeat(&sked, &worker, json!({})).await;

    let recorded = backfill(&sked, "team-a", "flood", 5_000, 1).await;
    assert!(recorded >= 4_990, "{recorded} runs recorded");
    // team-a takes the whole pool.
    let mut held = lease_attempts(&sked, &worker, 4, 1_000).await;
    assert_eq!(namespaces_of(&held), vec!["team-a"; 4]);

    for round in 0..3 {
        // team-b triggers a run behind thousands of team-a's, then one team-a attempt ends.
        let (status, run) = sked
            .post("/jobs/steady/trigger?namespace=team-b", json!({}))
            .await;
        assert_eq!(status, 201, "{run}");
        let at = held
            .iter()
            .position(|a| a["namespace"] == "team-a")
            .expect("a team-a attempt held");
        let done = held.remove(at);
        complete(&sked, &worker, &[done]).await;
        let next = lease_attempts(&sked, &worker, 1, 1_000).await;
        let runs: Vec<&Value> = next.iter().map(|a| &a["run_id"]).collect();
        assert_eq!(runs, vec![&run["id"]], "round {round}: {next:?}");
        // It ends; nothing of team-b waits, so the freed slot goes back to team-a.
        complete(&sked, &worker, &next).await;
        let refill = lease_attempts(&sked, &worker, 1, 1_000).await;
        assert_eq!(namespaces_of(&refill), vec!["team-a"], "round {round}");
        held.extend(refill);
    }
}

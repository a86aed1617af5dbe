//! Dispatch that knows load, through the real binary and the worker protocol: a worker whose
//! heartbeat reports a stall gauge over its pool's threshold gets no work until the gauge falls
//! back to the reset threshold, and a run nobody can take says why; a worker reporting a key
//! warm gets that key's runs; a pool that names its own overload control is held to it; and
//! what a heartbeat may carry is bounded.

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

async fn trigger(sked: &Sked, job: &str) -> i64 {
    let (status, run) = sked.post(&format!("/jobs/{job}/trigger"), json!({})).await;
    assert_eq!(status, 201, "{run}");
    run["id"].as_i64().expect("a run id")
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
    let run = trigger(&sked, "work").await;
    let (from_a, from_b) = tokio::join!(lease(&sked, &a, 1500), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lease(&sked, &b, 1000).await
    });
    assert_eq!((from_a, from_b), (vec![], vec![run]));

    // Both over the threshold, both asking: the run waits, and says why.
    heartbeat(&sked, &b, json!({"stall": 9})).await;
    let run = trigger(&sked, "work").await;
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
    let run = trigger(&sked, "work").await;
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
                trigger(sked, "feed").await
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

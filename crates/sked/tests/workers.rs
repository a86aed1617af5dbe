//! Many workers through the real binary: registrations are listed a bounded page at a time,
//! every one of them reachable by its cursor; reports from worker ids that do not exist are
//! refused as unknown; a heartbeat cannot carry an unbounded list of running attempts; a
//! drained worker finishes what it runs, takes nothing more and exits; registration is bounded
//! in labels and rate, and the list in bytes per page. (Dead
//! workers' deletion after the retention is the store contract's
//! `workers_page_by_id_and_dead_ones_are_deleted`.)

mod common;

use common::{client_for, Sked};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const WORKERS: usize = 3_000;

#[tokio::test]
async fn many_workers_are_paged_and_bogus_ids_cost_nothing() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;

    let mut registered = BTreeSet::new();
    for i in 0..WORKERS {
        let hello = json!({"name": format!("w{i}"), "slots": 1});
        let (status, answer) = sked.post("/workers", hello).await;
        assert_eq!(status, 201, "{answer}");
        registered.insert(answer["worker_id"].as_str().expect("an id").to_string());
    }

    // The default page is bounded, and the cursor walks every worker exactly once.
    let (status, first) = sked.get("/workers").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["workers"].as_array().map(Vec::len), Some(100));
    let mut listed = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/workers?limit=1000&cursor={c}"),
            None => "/workers?limit=1000".to_string(),
        };
        let (status, page) = sked.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let workers = page["workers"].as_array().expect("workers");
        assert!(workers.len() <= 1000);
        for worker in workers {
            let id = worker["id"].as_str().expect("an id").to_string();
            assert!(listed.insert(id), "a worker listed twice");
        }
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(listed, registered, "every worker listed, in {pages} pages");
    let (status, too_many) = sked.get("/workers?limit=1001").await;
    assert_eq!(
        (status, &too_many["error"]["field"]),
        (400, &json!("limit"))
    );

    // Reports from ids nobody registered are refused as such (found by the id's index, not by
    // scanning the workers), and the API answers as before.
    let completion =
        json!({"completions": [{"attempt_id": 1, "token": 1, "outcome": "succeeded"}]});
    for i in 0..200 {
        let path = format!("/workers/bogus-{i}/complete");
        let (status, answer) = sked.post(&path, completion.clone()).await;
        assert_eq!(status, 410, "{answer}");
        assert_eq!(answer["error"]["code"], "unknown_worker");
    }
    let (status, runs) = sked.get("/runs?limit=10").await;
    assert_eq!(status, 200, "{runs}");
    // A body that is not an object is refused as such (400), before the id is looked up.
    for body in [json!([null, null]), Value::Null, json!("stop"), json!(1)] {
        let (status, refused) = sked.post("/workers/bogus-0/deregister", body.clone()).await;
        assert_eq!(
            (status, &refused["error"]["code"]),
            (400, &json!("invalid_request")),
            "{body}: {refused}"
        );
    }

    // A heartbeat lists at most as many running attempts as a worker can have slots. (A worker
    // registered now: those above have been silent for longer than the heartbeat timeout on a
    // busy machine, and are dead.)
    let (status, answer) = sked
        .post("/workers", json!({"name": "beating", "slots": 1}))
        .await;
    assert_eq!(status, 201, "{answer}");
    let id = answer["worker_id"].as_str().expect("an id").to_string();
    let running: Vec<i64> = (1..=10_001).collect();
    let (status, refused) = sked
        .post(
            &format!("/workers/{id}/heartbeat"),
            json!({"running": running}),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["field"], "running");
    let (status, answer) = sked
        .post(&format!("/workers/{id}/heartbeat"), json!({"running": []}))
        .await;
    assert_eq!((status, &answer["stop"]), (200, &Value::Array(Vec::new())));
}

/// Draining a worker through the API (or `sked worker drain`): the server hands it nothing
/// more at once, its running attempt finishes and is recorded, and the worker process exits by
/// itself; the work queued meanwhile waits for another worker. Only an admin may drain.
#[tokio::test]
async fn a_drained_worker_finishes_its_attempts_takes_nothing_more_and_exits() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let first = sked.start_worker_with("first", 4, &["--drain-grace", "30s"]);
    let (status, body) = sked
        .put_job(
            "long",
            json!({"target": {"shell": {"command": "sleep 2; echo done"}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = sked
        .put_job("quick", json!({"target": {"shell": {"command": "true"}}}))
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, long) = sked.post("/jobs/long/trigger", json!({})).await;
    let long = long["id"].as_i64().expect("a run id");
    let deadline = Instant::now() + Duration::from_secs(20);
    let worker_id = loop {
        let run = sked.run(long).await;
        if run["state"] == "running" {
            break run["attempt_history"][0]["worker_id"]
                .as_str()
                .expect("the attempt's worker")
                .to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the long run never started: {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Only an admin may drain; an unknown worker is not found.
    let viewer = common::client_for(
        &sked,
        "viewer",
        json!({"role": "viewer", "namespaces": ["*"]}),
    )
    .await;
    let worker_token =
        common::client_for(&sked, "w", json!({"role": "worker", "namespaces": ["*"]})).await;
    for client in [&viewer, &worker_token] {
        let status = client
            .post(sked.url(&format!("/workers/{worker_id}/drain")))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 403);
    }
    let (status, _) = sked.post("/workers/nobody/drain", json!({})).await;
    assert_eq!(status, 404);

    let out = common::sked_command()
        .args(["worker", "drain", &worker_id, "--server", &sked.base()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("is draining"));
    let (_, quick) = sked.post("/jobs/quick/trigger", json!({})).await;
    let quick = quick["id"].as_i64().expect("a run id");

    // The worker exits by itself once its attempt is reported.
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = sked.workers[first].child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the drained worker did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let run = sked.wait_finished(long, Duration::from_secs(10)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(sked.run_log(long).await, "done\n");
    assert_eq!(sked.run(quick).await["state"], "queued");
    let (_, workers) = sked.get("/workers").await;
    let drained = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == worker_id.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(drained["draining"], true, "{workers}");
    let (_, audit) = sked.get("/audit?limit=10").await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "worker.drain" && e["object"] == worker_id.as_str()),
        "{audit}"
    );

    // Another worker takes what waited.
    sked.start_worker("second", 4);
    let run = sked.wait_finished(quick, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
}

/// A console page as the admin sees it: logs in with the admin token, then gets `path`.
async fn console_page(sked: &Sked, path: &str) -> String {
    let (client, cookie) = common::console_session(sked, common::ADMIN_TOKEN).await;
    let page = client
        .get(format!("{}{path}", sked.base()))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200, "{path}");
    page.text().await.unwrap_or_default()
}

/// The registered workers, by name.
async fn workers_by_name(sked: &Sked) -> std::collections::BTreeMap<String, Value> {
    let (status, list) = sked.get("/workers").await;
    assert_eq!(status, 200, "{list}");
    list["workers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|w| (w["name"].as_str().unwrap_or_default().to_string(), w))
        .collect()
}

/// A worker stopped with SIGTERM says so as it exits: it is `stopped` at once, not lost, and
/// the console shows it so, not in red. A node's broker publisher is listed apart from the
/// workers (`publisher`), and its 4,096 slots are in no slot count of the console.
#[tokio::test]
async fn a_stopped_worker_is_stopped_not_lost_and_the_publisher_is_no_worker() {
    let amqp = std::env::var("SKED_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());
    let mut sked = Sked::new();
    sked.start_server(&["--broker", &format!("main={amqp}")])
        .await;
    let worker = sked.start_worker("leaving", 3);
    let deadline = Instant::now() + Duration::from_secs(15);
    let publisher = loop {
        let workers = workers_by_name(&sked).await;
        let publisher = workers.values().find(|w| w["publisher"] == true).cloned();
        if let (Some(publisher), Some(_)) = (publisher, workers.get("leaving")) {
            break publisher;
        }
        assert!(Instant::now() < deadline, "not registered: {workers:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(publisher["slots"], 4096, "{publisher}");
    assert_eq!(publisher["state"], "active", "{publisher}");
    assert_eq!(workers_by_name(&sked).await["leaving"]["publisher"], false);
    let overview = console_page(&sked, "/").await;
    assert!(
        overview.contains("<dd>0 / 3</dd>"),
        "slots busy counts the worker only: {overview}"
    );

    sked.workers[worker].stop(Duration::from_secs(10));
    let stopped = workers_by_name(&sked).await["leaving"].clone();
    assert_eq!(
        (&stopped["state"], &stopped["alive"]),
        (&json!("stopped"), &json!(false)),
        "a clean stop is recorded as the worker exits: {stopped}"
    );
    // Past the heartbeat timeout and a reaper pass it is still stopped, not lost.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(workers_by_name(&sked).await["leaving"]["state"], "stopped");
    assert_eq!(
        sked.metric("sked_workers_declared_dead_total").await,
        0,
        "no worker was declared dead"
    );

    let page = console_page(&sked, "/workers").await;
    assert!(
        page.contains(r#"class="badge quiet">stopped"#),
        "the stopped worker is shown stopped, not red: {page}"
    );
    assert!(!page.contains(">lost<"), "{page}");
    assert!(page.contains("Broker publishers"), "{page}");
    let overview = console_page(&sked, "/").await;
    assert!(
        overview.contains("<dd>0 / 0</dd>") && !overview.contains("4096"),
        "no slot count holds the publisher's: {overview}"
    );
}

/// `count` labels whose keys and values take about `bytes` in all.
fn labels(count: usize, bytes: usize) -> Value {
    let value = "v".repeat((bytes / count).saturating_sub(4).max(1));
    let map: serde_json::Map<String, Value> = (0..count)
        .map(|i| (format!("k{i:03}"), json!(value)))
        .collect();
    Value::Object(map)
}

/// Registration is bounded: a worker's labels in count and bytes, a token's registrations in
/// rate (429 with `Retry-After`, another token unaffected); the list of workers comes in pages
/// bounded in bytes, every worker reachable, and the console's workers page answers whatever
/// the fleet's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_bounded_and_the_list_is_paged_by_size() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let grant = json!({"role": "worker", "namespaces": ["*"]});
    let pool = client_for(&sked, "pool", grant.clone()).await;
    let register = |client: &reqwest::Client, body: Value| {
        let request = client.post(sked.url("/workers")).json(&body);
        async move {
            let response = request.send().await.expect("register");
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, retry_after, body)
        }
    };

    // Labels: 64 within 8 KiB are taken; one more label, or more bytes, are refused.
    let (status, _, answer) = register(
        &pool,
        json!({"name": "wide", "slots": 1, "labels": labels(64, 8_000)}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    for too_many in [labels(65, 1_000), labels(2, 9_000), labels(1_100, 80_000)] {
        let (status, _, answer) = register(
            &pool,
            json!({"name": "wider", "slots": 1, "labels": too_many}),
        )
        .await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["field"], "labels", "{answer}");
    }

    // A token registering at line rate is held back with a clear 429.
    let started = Instant::now();
    let (mut accepted, mut refused) = (0u64, 0u64);
    for i in 0..300 {
        let (status, retry_after, answer) =
            register(&pool, json!({"name": format!("flood-{i}"), "slots": 1})).await;
        match status {
            201 => accepted += 1,
            429 => {
                refused += 1;
                assert_eq!(
                    answer["error"]["code"], "too_many_registrations",
                    "{answer}"
                );
                assert!(retry_after.is_some(), "429 without Retry-After");
            }
            other => panic!("registration answered {other}: {answer}"),
        }
    }
    let took = started.elapsed().as_secs_f64();
    println!("300 registrations in {took:.2} s: {accepted} accepted, {refused} refused");
    assert!(refused > 0, "no registration was refused");
    assert!(
        accepted as f64 <= 100.0 + 10.0 * took + 1.0,
        "{accepted} accepted in {took:.2} s"
    );
    // Another token is not held back by the first one's flood.
    let other = client_for(&sked, "other-pool", grant).await;
    let (status, _, answer) = register(&other, json!({"name": "other", "slots": 1})).await;
    assert_eq!(status, 201, "{answer}");

    // 150 workers with labels of about 8 KiB each (an admin registers at its own pace): the
    // list comes in pages of at most 1 MiB, and its cursors reach every worker once.
    for i in 0..150 {
        let body =
            json!({"name": format!("a-labelled-{i}"), "slots": 1, "labels": labels(64, 8_000)});
        let (status, answer) = sked.post("/workers", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let mut seen = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = sked.url("/workers?limit=1000");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let response = sked.http.get(&path).send().await.expect("list");
        assert_eq!(response.status().as_u16(), 200);
        let bytes = response.bytes().await.expect("body");
        assert!(
            bytes.len() <= 1024 * 1024 + 16 * 1024,
            "a page of {} bytes",
            bytes.len()
        );
        let page: Value = serde_json::from_slice(&bytes).expect("JSON");
        pages += 1;
        for w in page["workers"].as_array().expect("workers") {
            assert!(
                seen.insert(w["id"].as_str().expect("id").to_string()),
                "twice: {w}"
            );
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    println!("{} workers listed in {pages} pages", seen.len());
    assert!(pages >= 2, "1.2 MB of workers in one page");
    assert_eq!(seen.len() as u64, 1 + accepted + 1 + 150);

    // The console's workers page answers, a page at a time.
    let login = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .post(format!("{}/login", sked.base()))
        .form(&[("token", common::ADMIN_TOKEN), ("next", "/workers")])
        .send()
        .await
        .expect("login");
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = reqwest::Client::new()
        .get(format!("{}/workers", sked.base()))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("workers page");
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("Next page"), "no way to the next page");
    assert!(html.contains("and 52 more"), "labels are not cut short");
}

//! Admission through the real binary: with no worker to take them, runs of frequent jobs stop
//! piling up at the per-job and per-namespace caps. Every instant past a cap still gets its
//! ledger row, skipped with reason `backlog`, counted in stats and metrics; once a worker
//! comes, the backlog drains and instants queue runs again. Backfills and the runs events start
//! meet the same caps.

mod common;

use common::{instant, metric, shell, Sked};
use serde_json::json;
use std::time::{Duration, Instant};

const PER_JOB: u64 = 5;
const PER_NAMESPACE: u64 = 12;
const JOBS: u64 = 4;

#[tokio::test]
async fn a_backlog_is_capped_recorded_and_drains() {
    let mut sked = Sked::new();
    let per_job = PER_JOB.to_string();
    let per_namespace = PER_NAMESPACE.to_string();
    sked.start_server(&[
        "--max-queued-per-job",
        &per_job,
        "--max-queued-per-namespace",
        &per_namespace,
    ])
    .await;
    for i in 0..JOBS {
        let job = json!({"schedule": {"every": "100ms"}, "target": shell("true")});
        assert_eq!(sked.put_job(&format!("flood-{i}"), job).await.0, 201);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut queued_total = 0;
    for i in 0..JOBS {
        let name = format!("flood-{i}");
        let runs = sked.runs(&name).await;
        // Every instant has its row: a gapless grid 100 ms apart.
        for pair in runs.windows(2) {
            let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
            assert_eq!(gap, chrono::Duration::milliseconds(100), "{pair:?}");
        }
        let queued = runs.iter().filter(|r| r["state"] == "queued").count() as u64;
        let backlog = runs
            .iter()
            .filter(|r| r["state"] == "skipped" && r["skip_reason"] == "backlog")
            .count() as u64;
        assert!(queued <= PER_JOB, "{name}: {queued} queued");
        assert!(backlog > 0, "{name}: no instant was skipped for backlog");
        assert_eq!(queued + backlog, runs.len() as u64, "{name}: other states");
        let (_, stats) = sked.get(&format!("/jobs/{name}/stats")).await;
        assert_eq!(
            stats["skipped_by_reason"]["backlog"],
            json!(backlog),
            "{stats}"
        );
        queued_total += queued;
    }
    // Per namespace, each job may pass the cap by the one run that placed it there.
    assert!(
        queued_total <= PER_NAMESPACE + JOBS,
        "{queued_total} queued in the namespace"
    );
    let metrics = sked.metrics().await;
    assert!(
        metric(&metrics, "sked_fires_skipped_backlog_total") > 0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "sked_queue_depth") <= PER_NAMESPACE + JOBS,
        "{metrics}"
    );

    // A worker takes the backlog; later instants queue and run again.
    sked.start_worker("late", 8);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let runs = sked.runs("flood-0").await;
        let recent_succeeded = runs
            .iter()
            .rev()
            .take(5)
            .filter(|r| r["state"] == "succeeded")
            .count();
        if recent_succeeded >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog never drained");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A namespace's cap on queued runs, for the backfill and event tests.
const NAMESPACE_CAP: u64 = 20;
/// Instants per backfill: the most one request may record.
const BACKFILLED: usize = 10_000;

/// Queued runs of `namespace`, read a page at a time.
async fn queued_in(sked: &Sked, namespace: &str) -> u64 {
    let (status, page) = sked
        .get(&format!(
            "/runs?namespace={namespace}&state=queued&limit=1000"
        ))
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page["next_cursor"].is_null(), "more than a page queued");
    page["runs"].as_array().map_or(0, |r| r.len() as u64)
}

async fn cap_namespace(sked: &Sked, namespace: &str, cap: u64) {
    let answer = sked
        .http
        .put(sked.url(&format!("/namespaces/{namespace}")))
        .json(&json!({"max_queued_runs": cap}))
        .send()
        .await
        .expect("PUT namespace");
    assert_eq!(answer.status().as_u16(), 201, "{:?}", answer.text().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfills_at_once_meet_the_namespace_cap_and_every_instant_has_its_row() {
    const JOBS: usize = 5;
    let mut sked = Sked::new();
    // No worker: whatever queues stays queued.
    sked.start_server(&[]).await;
    cap_namespace(&sked, "capped", NAMESPACE_CAP).await;
    for i in 0..JOBS {
        let job = json!({
            "schedule": {"every": "1m", "anchor": "2026-01-01T00:00:00Z"},
            "target": shell("true"),
        });
        let (status, answer) = sked
            .http
            .put(sked.url(&format!("/jobs/fill-{i}?namespace=capped")))
            .json(&job)
            .send()
            .await
            .map(|r| (r.status().as_u16(), r))
            .expect("PUT job");
        assert_eq!(status, 201, "{:?}", answer.text().await);
    }
    // Five backfills of 10,000 instants each (a minute apart from New Year), all at once.
    let started = Instant::now();
    let sked_ref = &sked;
    let backfills = (0..JOBS).map(|i| async move {
        sked_ref
            .post(
                &format!("/jobs/fill-{i}/backfill?namespace=capped"),
                json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-07T22:39:00Z"}),
            )
            .await
    });
    let answers = futures_util::future::join_all(backfills).await;
    let took = started.elapsed();
    let mut admitted = 0;
    for (i, (status, answer)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "fill-{i}: {answer}");
        let recorded = answer["recorded"].as_array().map_or(0, Vec::len);
        assert_eq!(recorded, BACKFILLED, "fill-{i}: every instant has its row");
        let skipped = answer["skipped_backlog"].as_u64().expect("skipped_backlog");
        admitted += BACKFILLED as u64 - skipped;
    }
    let queued = queued_in(&sked, "capped").await;
    println!(
        "{JOBS} backfills of {BACKFILLED} instants in {took:?}: {admitted} admitted, {queued} \
         queued, {} skipped (backlog)",
        (JOBS * BACKFILLED) as u64 - admitted
    );
    // The backfills take turns, so together they admit no more than the cap; the job's own
    // schedule may fire the present minute meanwhile, under the same cap.
    assert!(admitted <= NAMESPACE_CAP, "{admitted} admitted");
    assert!(queued <= NAMESPACE_CAP + JOBS as u64, "{queued} queued");
    for i in 0..JOBS {
        let (_, stats) = sked
            .get(&format!("/jobs/fill-{i}/stats?namespace=capped"))
            .await;
        let runs = stats["runs"].as_u64().unwrap_or(0);
        let backlog = stats["skipped_by_reason"]["backlog"].as_u64().unwrap_or(0);
        let queued = stats["by_state"]["queued"].as_u64().unwrap_or(0);
        assert!(runs >= BACKFILLED as u64, "fill-{i}: {stats}");
        assert_eq!(backlog + queued, runs, "fill-{i}: other states in {stats}");
    }
    assert!(
        sked.metric("sked_queue_depth").await <= NAMESPACE_CAP + JOBS as u64,
        "the node's queue holds more than the namespace may queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_events_start_meet_the_namespace_cap() {
    const CAP: u64 = 5;
    const EVENTS: u64 = 15;
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    cap_namespace(&sked, "evented", CAP).await;
    let job = json!({"schedule": {"event": "orders.ready"}, "target": shell("true")});
    let answer = sked
        .http
        .put(sked.url("/jobs/on-orders?namespace=evented"))
        .json(&job)
        .send()
        .await
        .expect("PUT job");
    assert_eq!(answer.status().as_u16(), 201);
    for i in 0..EVENTS {
        let event = json!({"key": "orders.ready", "id": format!("batch-{i}")});
        let (status, posted) = sked.post("/events?namespace=evented", event).await;
        assert_eq!(status, 201, "{posted}");
    }
    let (_, stats) = sked.get("/jobs/on-orders/stats?namespace=evented").await;
    let queued = stats["by_state"]["queued"].as_u64().unwrap_or(0);
    let backlog = stats["skipped_by_reason"]["backlog"].as_u64().unwrap_or(0);
    println!("{EVENTS} events: {queued} runs queued, {backlog} skipped (backlog)");
    assert_eq!(
        stats["runs"],
        json!(EVENTS),
        "every event has its run: {stats}"
    );
    assert_eq!(queued, CAP, "{stats}");
    assert_eq!(backlog, EVENTS - CAP, "{stats}");
    assert_eq!(queued_in(&sked, "evented").await, CAP);
}

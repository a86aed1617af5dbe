//! Admission through the real binary: with no worker to take them, runs of frequent jobs stop
//! piling up at the per-job and per-namespace caps. Every instant past a cap still gets its
//! ledger row, skipped with reason `backlog`, counted in stats and metrics; once a worker
//! comes, the backlog drains and instants queue runs again.

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

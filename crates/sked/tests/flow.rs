//! Flow control, black-box, on `sked dev` with real shell runs: two jobs sharing a
//! concurrency key never run at once, and their waiting runs say which key holds them and how
//! full it is (the run's API, `/api/v1/limits`, the metrics); a rate key spaces starts by its
//! interval; a namespace limit is written, used, changed and refused deletion while used, each
//! change audited; and bad definitions are refused naming the field.

mod common;

use common::{instant, shell, Sked};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

async fn call(sked: &Sked, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    common::call(&sked.http, method, sked.url(path), body).await
}

/// The attempts of runs `ids` once all ended: `(started_at, finished_at)`, by start.
async fn intervals(
    sked: &Sked,
    ids: &[i64],
) -> Vec<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> {
    let mut spans = Vec::new();
    for id in ids {
        let run = sked.wait_finished(*id, Duration::from_secs(60)).await;
        assert_eq!(run["state"], "succeeded", "{run}");
        for attempt in run["attempt_history"].as_array().into_iter().flatten() {
            spans.push((
                instant(&attempt["started_at"]),
                instant(&attempt["finished_at"]),
            ));
        }
    }
    spans.sort();
    spans
}

#[tokio::test]
async fn jobs_sharing_a_key_run_one_at_a_time_and_their_waiting_runs_say_why() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    for job in ["a", "b"] {
        let (status, body) = sked
            .put_job(
                job,
                json!({
                    "target": shell("sleep 0.3"),
                    "overlap": "allow",
                    "concurrency": [{"key": "shared", "limit": 1}],
                }),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(sked.trigger("a").await);
        ids.push(sked.trigger("b").await);
    }

    // While they run: a waiting run names the key and how full it is, and so does /limits.
    let (mut said, mut listed) = (false, false);
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !(said && listed) && std::time::Instant::now() < until {
        for id in &ids {
            let run = sked.run(*id).await;
            if run["waiting_for_workers"]
                .as_str()
                .is_some_and(|w| w == "waiting for concurrency key shared: 1 of 1 running")
            {
                said = true;
            }
        }
        let (status, limits) = call(&sked, Method::GET, "/limits", None).await;
        assert_eq!(status, 200, "{limits}");
        for key in limits["keys"].as_array().into_iter().flatten() {
            assert_eq!(key["key"], "shared", "{limits}");
            let holders = key["holders"].as_array().map_or(0, Vec::len);
            assert!(
                holders <= 1,
                "a key of limit 1 with {holders} holders: {limits}"
            );
            if holders == 1 && key["waiting"].as_u64().unwrap_or(0) > 0 {
                listed = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(said, "no waiting run named its key");
    assert!(
        listed,
        "/limits never showed the key's holder and waiting runs"
    );

    // From the ledger: never two attempts of the key at once.
    let spans = intervals(&sked, &ids).await;
    assert_eq!(spans.len(), 6, "{spans:?}");
    for pair in spans.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "two attempts of one key overlap: {pair:?}"
        );
    }
    assert!(sked.metric("sked_flow_holds_total").await > 0);
}

#[tokio::test]
async fn a_rate_key_spaces_starts_by_its_interval() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, body) = sked
        .put_job(
            "partner-call",
            json!({
                "target": shell("true"),
                "overlap": "allow",
                "rate_limit": [{"key": "partner", "limit": 4, "per": "1s"}],
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(sked.trigger("partner-call").await);
    }
    let spans = intervals(&sked, &ids).await;
    assert_eq!(spans.len(), 5);
    // Four per second with no burst: each start at least a quarter second after the last
    // (the store admits a start at the very moment it records).
    for pair in spans.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            gap >= chrono::Duration::milliseconds(250),
            "starts {gap} apart: {spans:?}"
        );
    }
}

#[tokio::test]
async fn a_namespace_limit_is_used_changed_and_kept_while_used_and_bad_input_names_its_field() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // Bad limits.
    for (body, field) in [
        (json!({"concurrency": 0}), "concurrency"),
        (json!({}), "concurrency"),
        (json!({"rate": {"limit": 5, "per": "0s"}}), "rate.per"),
    ] {
        let (status, err) = call(&sked, Method::PUT, "/limits/partner", Some(body)).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["field"], field, "{err}");
    }
    let limit = json!({"concurrency": 2, "rate": {"limit": 5, "per": "1s"}});
    let (status, made) = call(&sked, Method::PUT, "/limits/partner", Some(limit.clone())).await;
    assert_eq!(status, 201, "{made}");
    let (status, _) = call(&sked, Method::PUT, "/limits/partner", Some(limit)).await;
    assert_eq!(status, 200);
    let (status, read) = call(&sked, Method::GET, "/limits/partner", None).await;
    assert_eq!(
        (status, read["concurrency"].as_u64()),
        (200, Some(2)),
        "{read}"
    );

    // Bad jobs, each named by its field.
    let job = |extra: Value| {
        let mut job = json!({"target": shell("true")});
        if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
            job.extend(extra.clone());
        }
        job
    };
    let nine: Vec<Value> = (0..9)
        .map(|i| json!({"key": format!("k{i}"), "limit": 1}))
        .collect();
    for (extra, field) in [
        (
            json!({"concurrency": [{"key": "c={{customer}}", "limit": 3}]}),
            "concurrency[0].key",
        ),
        (
            json!({"concurrency": [{"key": "c", "limit": 0}]}),
            "concurrency[0].limit",
        ),
        (
            json!({"rate_limit": [{"key": "r", "limit": 10, "per": "0s"}]}),
            "rate_limit[0].per",
        ),
        (
            json!({"debounce": {"key": "{{job}}", "period": "1m", "max_wait": "30s"}}),
            "debounce.period",
        ),
        (json!({"concurrency": nine}), "concurrency"),
        (
            json!({"concurrency": [{"use": "nope"}]}),
            "concurrency[0].use",
        ),
        (
            json!({"rate_limit": [{"use": "partner", "limit": 3}]}),
            "rate_limit[0].use",
        ),
    ] {
        let (status, err) = sked.put_job("bad", job(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {err}");
        assert_eq!(err["error"]["field"], field, "{extra}: {err}");
    }

    // A job uses it: the limit stays until the job lets go of it.
    let (status, body) = sked
        .put_job(
            "user",
            job(json!({"concurrency": [{"use": "partner"}], "rate_limit": [{"use": "partner"}]})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, err) = call(&sked, Method::DELETE, "/limits/partner", None).await;
    assert_eq!(status, 409, "{err}");
    assert!(err.to_string().contains("user"), "{err}");
    let run = sked.trigger("user").await;
    let run = sked.wait_finished(run, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let (status, _) = call(&sked, Method::DELETE, "/jobs/user", None).await;
    assert!(status == 200 || status == 204, "{status}");
    let (status, _) = call(&sked, Method::DELETE, "/limits/partner", None).await;
    assert_eq!(status, 204);
    let (status, _) = call(&sked, Method::GET, "/limits/partner", None).await;
    assert_eq!(status, 404);

    let (status, audit) = call(&sked, Method::GET, "/audit?object=partner", None).await;
    assert_eq!(status, 200, "{audit}");
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        ["limit.delete", "limit.put"],
        "the unchanged put is not audited"
    );
}

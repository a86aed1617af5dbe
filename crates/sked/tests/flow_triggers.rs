//! Triggers under flow control, through the real server and worker: trigger parameters reach
//! a shell attempt, dedup answers a second trigger with the first run, debounce folds a burst
//! into one run, events meet both, and bad parameters are refused naming the field.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::time::Duration;

fn instant(run: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    run[field]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(|| panic!("{field} of {run}"))
}

fn shell(command: &str, extra: Value) -> Value {
    let mut job = json!({
        "schedule": {"every": "1h"},
        "target": {"shell": {"command": command}},
    });
    if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
        job.extend(extra.clone());
    }
    job
}

#[tokio::test]
async fn triggers_carry_params_dedup_and_debounce() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;

    // Parameters reach the shell attempt and show on the run.
    let (status, _) = sked
        .put_job(
            "echo",
            shell(
                "echo \"$SKED_PARAM_REGION/$SKED_PARAM_ORDER_ID\"",
                json!({}),
            ),
        )
        .await;
    assert_eq!(status, 201);
    let (status, run) = sked
        .post(
            "/jobs/echo/trigger",
            json!({"params": {"region": "eu", "order-id": "42"}}),
        )
        .await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().unwrap();
    let done = sked.wait_finished(id, Duration::from_secs(30)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["params"]["region"], "eu");
    assert_eq!(sked.run_log(id).await.trim(), "eu/42");
    // No body stays valid.
    sked.trigger("echo").await;

    // Dedup: the same key within the window is the first run, answered 200.
    let dedup = json!({"dedup": {"key": "{{params.order}}", "window": "1m"}});
    sked.put_job("charge", shell("true", dedup)).await;
    let body = json!({"params": {"order": "7"}});
    let (first, a) = sked.post("/jobs/charge/trigger", body.clone()).await;
    let (second, b) = sked.post("/jobs/charge/trigger", body).await;
    assert_eq!((first, second), (201, 200), "{a} {b}");
    assert_eq!(a["id"], b["id"]);
    let (other, c) = sked
        .post("/jobs/charge/trigger", json!({"params": {"order": "8"}}))
        .await;
    assert_eq!(other, 201);
    assert_ne!(a["id"], c["id"]);

    // Debounce: five triggers with one key are one run, started a period after the last,
    // with the last parameters and four absorbed.
    let debounce = json!({"debounce": {"key": "{{params.customer}}", "period": "2s"}});
    sked.put_job("rebuild", shell("true", debounce)).await;
    let mut ids = Vec::new();
    let mut last = None;
    for n in 0..5 {
        let body = json!({"params": {"customer": "a", "n": n.to_string()}});
        let (status, run) = sked.post("/jobs/rebuild/trigger", body).await;
        assert_eq!(status, if n == 0 { 201 } else { 200 }, "{run}");
        ids.push(run["id"].as_i64().unwrap());
        last = Some(chrono::Utc::now());
    }
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    let done = sked.wait_finished(ids[0], Duration::from_secs(30)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["params"]["n"], "4");
    assert_eq!(done["absorbed"]["count"], 4, "{done}");
    assert_eq!(
        done["absorbed"]["triggers"].as_array().map(Vec::len),
        Some(4)
    );
    let last_absorbed = instant(&done["absorbed"]["triggers"][3], "at");
    assert!(last_absorbed <= last.unwrap());
    let ready_at = instant(&done, "ready_at");
    assert!(
        ready_at >= last_absorbed + chrono::Duration::seconds(2),
        "{done}"
    );
    assert!(instant(&done, "started_at") >= ready_at, "{done}");
    assert_eq!(sked.runs("rebuild").await.len(), 1);
}

#[tokio::test]
async fn events_meet_dedup_and_debounce() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let on = |extra: Value| {
        let mut job = json!({
            "schedule": {"event": "orders.placed"},
            "target": {"shell": {"command": "true"}},
        });
        if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
            job.extend(extra.clone());
        }
        job
    };
    sked.put_job(
        "once-per-customer",
        on(json!({"dedup": {"key": "{{event.payload.customer}}", "window": "1h"}})),
    )
    .await;
    sked.put_job(
        "settle",
        on(json!({"debounce": {"key": "{{event.payload.customer}}", "period": "2s"}})),
    )
    .await;
    let event = |id: &str| json!({"key": "orders.placed", "id": id, "payload": {"customer": "c1"}});
    let (status, first) = sked.post("/events", event("1")).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(
        first["started"].as_array().map(Vec::len),
        Some(2),
        "{first}"
    );
    let (status, second) = sked.post("/events", event("2")).await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(second["started"], json!([]), "{second}");
    let flowed = second["flowed"].as_array().cloned().unwrap_or_default();
    assert_eq!(flowed.len(), 2, "{second}");
    for f in &flowed {
        assert!(
            first["started"].as_array().unwrap().contains(&f["run_id"]),
            "{second}"
        );
        let expected = if f["job"] == "settle" {
            "absorbed"
        } else {
            "deduplicated"
        };
        assert_eq!(f["outcome"], expected, "{second}");
    }
    let settle = flowed.iter().find(|f| f["job"] == "settle").unwrap();
    let done = sked
        .wait_finished(settle["run_id"].as_i64().unwrap(), Duration::from_secs(30))
        .await;
    assert_eq!(done["event_id"], "2", "the last payload: {done}");
    assert_eq!(done["absorbed"]["count"], 1);
}

#[tokio::test]
async fn bad_trigger_params_are_refused_naming_the_field() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    sked.put_job("j", shell("true", json!({}))).await;
    let refused = |body: Value, field: &'static str| {
        let sked = &sked;
        async move {
            let (status, answer) = sked.post("/jobs/j/trigger", body).await;
            assert_eq!(status, 400, "{answer}");
            assert_eq!(answer["error"]["field"], field, "{answer}");
        }
    };
    refused(json!({"params": {"bad name": "x"}}), "params.bad name").await;
    refused(json!({"params": {"v": "x".repeat(1025)}}), "params.v").await;
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("p{i}"), json!("x"))).collect();
    refused(json!({"params": many}), "params").await;
    refused(json!({"params": {"n": 1}}), "params.n").await;
    refused(json!({"other": 1}), "other").await;
    // A body past 32 KiB is refused whole.
    let (status, _) = sked
        .post(
            "/jobs/j/trigger",
            json!({"params": {"v": "x".repeat(40 * 1024)}}),
        )
        .await;
    assert_eq!(status, 413);
    assert!(sked.runs("j").await.is_empty(), "nothing was recorded");
}

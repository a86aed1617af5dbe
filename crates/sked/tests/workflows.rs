//! Jobs that wait for other jobs, through the real binary: a pipeline carries one instant from
//! step to step, a waiting run says what it waits for and gives up after its timeout, and bad
//! dependencies are refused with the field that is wrong.

mod common;

use common::{instant, shell, Sked};
use serde_json::{json, Value};
use std::time::Duration;

/// The step of a pipeline: no schedule, waits for `upstream`, prints its instant.
fn step(upstream: &str) -> Value {
    json!({
        "target": shell("echo at=$SKED_SCHEDULED_FOR"),
        "depends_on": [{"job": upstream}],
    })
}

#[tokio::test]
async fn a_pipeline_carries_each_instant_through_its_steps() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let extract =
        json!({"schedule": {"every": "1s"}, "target": shell("echo at=$SKED_SCHEDULED_FOR")});
    assert_eq!(sked.put_job("extract", extract).await.0, 201);
    assert_eq!(sked.put_job("transform", step("extract")).await.0, 201);
    assert_eq!(sked.put_job("load", step("transform")).await.0, 201);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, _) = sked.post("/jobs/extract/pause", json!({})).await;
    assert_eq!(status, 200);
    let extracted: Vec<Value> = sked
        .wait_runs("extract", 3, Duration::from_secs(20))
        .await
        .into_iter()
        .filter(|r| r["state"] == "succeeded")
        .collect();
    assert!(extracted.len() >= 3, "{extracted:?}");
    let loaded = sked
        .wait_runs("load", extracted.len(), Duration::from_secs(20))
        .await;
    let transformed = sked.runs("transform").await;
    assert_eq!(transformed.len(), extracted.len(), "{transformed:?}");
    assert_eq!(loaded.len(), extracted.len(), "{loaded:?}");
    for ((e, t), l) in extracted.iter().zip(&transformed).zip(&loaded) {
        // One logical instant flows through the pipeline, each step after the one before.
        assert_eq!(e["scheduled_for"], t["scheduled_for"]);
        assert_eq!(t["scheduled_for"], l["scheduled_for"]);
        for (upstream, run) in [(e, t), (t, l)] {
            assert_eq!(run["state"], "succeeded", "{run}");
            assert_eq!(run["trigger"], "dependency", "{run}");
            assert!(
                instant(&run["started_at"]) >= instant(&upstream["finished_at"]),
                "{run} started before {upstream} ended"
            );
        }
        let log = sked.run_log(l["id"].as_i64().unwrap()).await;
        let at = instant(&e["scheduled_for"]);
        assert!(
            log.contains(&at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)[..19]),
            "load's SKED_SCHEDULED_FOR is extract's instant {at}: {log}"
        );
    }
}

#[tokio::test]
async fn a_waiting_run_says_what_it_waits_for_and_gives_up_in_time() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // `gate` runs only when triggered; `report` waits up to 3 s for a gate run in the hour
    // before its instant.
    assert_eq!(
        sked.put_job("gate", json!({"target": shell("true")}))
            .await
            .0,
        201
    );
    let report = json!({
        "schedule": {"every": "1s"},
        "target": shell("true"),
        "depends_on": [{"job": "gate", "window": {"before": "1h"}}],
        "deps_timeout": "3s",
    });
    let (status, body) = sked.put_job("report", report).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["deps_timeout"], "3s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = sked.runs("report").await.into_iter().next().expect("a run");
    let run = sked.run(first["id"].as_i64().unwrap()).await;
    assert_eq!(run["state"], "waiting", "{run}");
    assert_eq!(run["waiting_reason"], "dependencies", "{run}");
    let missing = run["waiting_for"][0].as_str().unwrap_or_default();
    assert!(missing.starts_with("gate succeeded between "), "{run}");
    assert!(run["waiting_until"].is_string(), "{run}");

    let skipped = sked
        .wait_finished(first["id"].as_i64().unwrap(), Duration::from_secs(10))
        .await;
    assert_eq!(skipped["state"], "skipped", "{skipped}");
    assert_eq!(
        skipped["skip_reason"], "dependencies_timed_out",
        "{skipped}"
    );

    // A gate run releases every waiting report whose window holds it, and later ones start.
    let (status, gate) = sked.post("/jobs/gate/trigger", json!({})).await;
    assert_eq!(status, 201, "{gate}");
    let gate = sked
        .wait_finished(gate["id"].as_i64().unwrap(), Duration::from_secs(10))
        .await;
    assert_eq!(gate["state"], "succeeded");
    tokio::time::sleep(Duration::from_secs(2)).await;
    sked.post("/jobs/report/pause", json!({})).await;
    let runs = sked.wait_runs("report", 1, Duration::from_secs(20)).await;
    let after_gate: Vec<&Value> = runs
        .iter()
        .filter(|r| instant(&r["scheduled_for"]) > instant(&gate["scheduled_for"]))
        .filter(|r| r["skip_reason"] != "paused")
        .collect();
    assert!(!after_gate.is_empty(), "{runs:?}");
    for run in after_gate {
        assert_eq!(run["state"], "succeeded", "{run}");
    }
}

#[tokio::test]
async fn bad_dependencies_are_refused_naming_the_field() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, body) = sked.put_job("load", step("extract")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "depends_on[0].job", "{body}");
    let (status, body) = sked.put_job("load", step("load")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "depends_on[0].job", "{body}");

    assert_eq!(
        sked.put_job("extract", json!({"target": shell("true")}))
            .await
            .0,
        201
    );
    assert_eq!(sked.put_job("transform", step("extract")).await.0, 201);
    assert_eq!(sked.put_job("load", step("transform")).await.0, 201);
    let (status, body) = sked.put_job("extract", step("load")).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("extract -> load -> transform -> extract"),
        "{body}"
    );
    let (status, body) = sked
        .put_job(
            "report",
            json!({"target": shell("true"), "depends_on": [{"job": "load", "window": {"before": "40d"}}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "depends_on[0].window.before");

    // The graph, through the API and drawn by the command line.
    let (status, graph) = sked.get("/jobs/transform/graph").await;
    assert_eq!(status, 200, "{graph}");
    assert_eq!(graph["edges"].as_array().map(Vec::len), Some(2), "{graph}");
    let out = common::sked_command()
        .args(["job", "graph", "transform"])
        .env("SKED_SERVER", sked.base())
        .output()
        .expect("run sked");
    let drawn = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        drawn,
        "transform waits for:\n└─ extract\ntransform\nwaiting for transform:\n└─ load\n"
    );
    let out = common::sked_command()
        .args(["job", "graph", "load", "--dot"])
        .env("SKED_SERVER", sked.base())
        .output()
        .expect("run sked");
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(dot.contains("\"extract\" -> \"transform\";"), "{dot}");

    let delete = |force: bool| {
        let url = sked.url(&format!("/jobs/transform?force={force}"));
        let http = sked.http.clone();
        async move {
            let resp = http.delete(url).send().await.expect("DELETE");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = delete(false).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "depended_on", "{body}");
    let (status, body) = delete(true).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["paused_dependants"], json!(["load"]));
    let (_, load) = sked.get("/jobs/load").await;
    assert_eq!(load["state"], "paused", "{load}");
    let (_, audit) = sked.get("/audit?object=load").await;
    assert!(
        audit["entries"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["action"] == "job.pause")),
        "{audit}"
    );
}

/// The command line's answer and output, through the real binary.
fn sked_cli(sked: &Sked, args: &[&str]) -> (bool, String) {
    let out = common::sked_command()
        .args(args)
        .env("SKED_SERVER", sked.base())
        .output()
        .expect("run sked");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn an_event_starts_a_job_whose_success_starts_the_next() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // `load` runs once per `sales.ready` event and emits `sales.loaded` when it succeeds;
    // `report` runs once per `sales.loaded`.
    let load = json!({
        "schedule": {"event": "sales.ready"},
        "target": shell("echo key=$SKED_EVENT_KEY id=$SKED_EVENT_ID payload=$SKED_EVENT_PAYLOAD"),
        "on_success": {"emit": "sales.loaded"},
    });
    assert_eq!(sked.put_job("load", load).await.0, 201);
    let report = json!({
        "schedule": {"event": "sales.loaded"},
        "target": shell("echo after=$SKED_EVENT_ID"),
    });
    assert_eq!(sked.put_job("report", report).await.0, 201);

    let send = [
        "event",
        "send",
        "sales.ready",
        "--id",
        "2026-11-24",
        "--payload",
        r#"{"rows":3}"#,
    ];
    let (ok, out) = sked_cli(&sked, &send);
    assert!(ok, "{out}");
    assert!(
        out.contains("event sales.ready 2026-11-24 recorded at"),
        "{out}"
    );
    assert!(out.contains("runs started: "), "{out}");
    let loaded = sked.wait_runs("load", 1, Duration::from_secs(20)).await;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    let run = &loaded[0];
    assert_eq!(
        (&run["state"], &run["trigger"]),
        (&json!("succeeded"), &json!("event"))
    );
    let log = sked.run_log(run["id"].as_i64().unwrap()).await;
    assert_eq!(
        log, "key=sales.ready id=2026-11-24 payload={\"rows\":3}\n",
        "the run sees its event"
    );
    let reported = sked.wait_runs("report", 1, Duration::from_secs(20)).await;
    assert_eq!(reported[0]["state"], "succeeded", "{reported:?}");
    let emitted_id = format!(
        "load@{}",
        instant(&run["scheduled_for"]).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    );
    assert_eq!(reported[0]["event_id"], json!(emitted_id));
    assert!(
        !instant(&reported[0]["started_at"]).lt(&instant(&run["finished_at"])),
        "report started after load ended"
    );

    // Sending it again changes nothing; the same id with another payload is refused.
    let (ok, out) = sked_cli(&sked, &send);
    assert!(ok && out.contains("was recorded before"), "{out}");
    let changed = [
        "event",
        "send",
        "sales.ready",
        "--id",
        "2026-11-24",
        "--payload",
        "other",
    ];
    let (ok, out) = sked_cli(&sked, &changed);
    assert!(!ok && out.contains("another payload"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sked.runs("load").await.len(), 1);

    let (ok, out) = sked_cli(&sked, &["event", "list"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("OCCURRED"), "{out}");
    assert!(
        out.contains("sales.loaded") && out.contains("sales.ready"),
        "{out}"
    );
    let (_, audit) = sked.get("/audit?object=sales.ready").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], "event.post", "{audit}");
    assert!(
        !entry.to_string().contains("rows"),
        "no payload in the audit trail: {entry}"
    );
}

#[tokio::test]
async fn a_backfill_records_past_instants_once_and_the_pipeline_follows() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let extract = json!({
        "schedule": {"every": "1h", "anchor": "2026-01-01T00:00:00Z"},
        "target": shell("echo at=$SKED_SCHEDULED_FOR"),
        "overlap": "skip",
    });
    assert_eq!(sked.put_job("extract", extract).await.0, 201);
    assert_eq!(sked.put_job("transform", step("extract")).await.0, 201);
    let range = [
        "job",
        "backfill",
        "extract",
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2026-01-01T02:00:00Z",
    ];
    let dry: Vec<&str> = range.iter().copied().chain(["--dry-run"]).collect();
    let (ok, out) = sked_cli(&sked, &dry);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "2026-01-01T00:00:00Z\n2026-01-01T01:00:00Z\n2026-01-01T02:00:00Z\n\
         3 instants would be backfilled\n"
    );
    assert!(
        sked.runs("extract").await.is_empty(),
        "a dry run records nothing"
    );
    let (ok, out) = sked_cli(&sked, &range);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "extract: 3 of 3 instants recorded as runs, 0 had one already\n"
    );
    let extracted = sked.wait_runs("extract", 3, Duration::from_secs(20)).await;
    let transformed = sked
        .wait_runs("transform", 3, Duration::from_secs(20))
        .await;
    for (e, t) in extracted.iter().zip(&transformed) {
        // Each instant ran (none skipped by overlap), and its step followed at it.
        assert_eq!(
            (&e["state"], &e["trigger"]),
            (&json!("succeeded"), &json!("backfill"))
        );
        assert_eq!(t["state"], "succeeded", "{t}");
        assert_eq!(e["scheduled_for"], t["scheduled_for"]);
    }
    let (ok, out) = sked_cli(&sked, &range);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "extract: 0 of 3 instants recorded as runs, 3 had one already\n"
    );
    let (ok, out) = sked_cli(
        &sked,
        &[
            "job",
            "backfill",
            "extract",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2999-01-01T00:00:00Z",
        ],
    );
    assert!(!ok && out.contains("must not be in the future"), "{out}");
}

#[tokio::test]
async fn a_retried_upstream_run_lets_its_skipped_pipeline_continue() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // `extract` fails until a file exists; `transform` follows it.
    let fixed = sked.data_dir().join("fixed");
    let extract = json!({
        "target": shell(&format!("test -f {}", fixed.display())),
    });
    assert_eq!(sked.put_job("extract", extract).await.0, 201);
    assert_eq!(sked.put_job("transform", step("extract")).await.0, 201);
    let (status, run) = sked.post("/jobs/extract/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().unwrap();
    let failed = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let skipped = sked
        .wait_runs("transform", 1, Duration::from_secs(20))
        .await;
    assert_eq!(skipped[0]["skip_reason"], "upstream_failed", "{skipped:?}");

    std::fs::write(&fixed, b"").expect("write the fix");
    let (ok, out) = sked_cli(&sked, &["run", "retry", &id.to_string()]);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        format!(
            "run {id} is queued again\nruns waiting for it again: {}\n",
            skipped[0]["id"]
        )
    );
    let succeeded = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(
        (&succeeded["state"], &succeeded["attempts"]),
        (&json!("succeeded"), &json!(2))
    );
    let transformed = sked
        .wait_finished(skipped[0]["id"].as_i64().unwrap(), Duration::from_secs(20))
        .await;
    assert_eq!(transformed["state"], "succeeded", "{transformed}");
    // A success is final.
    let (ok, out) = sked_cli(&sked, &["run", "retry", &id.to_string()]);
    assert!(!ok && out.contains("a success is final"), "{out}");
    let (_, audit) = sked.get(&format!("/audit?object={id}")).await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], "run.retry", "{audit}");
    assert_eq!(entry["before"]["state"], "failed", "{entry}");
}

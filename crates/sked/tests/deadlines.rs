//! Deadlines, black-box, on `sked dev` with real shell runs: a run that overruns its
//! `finish_by` and `max_duration` is marked with each and by how much, told once through a
//! webhook and counted in `sked_deadline_misses_total`; a run on time is marked with its
//! deadlines only; a run whose job's history says it will overrun is called at risk before its
//! `finish_by` passes; the runs API and the console's overview list them; and a deadline that
//! cannot be met is refused with the field at fault.

mod common;

use common::webhooks::Receiver;
use common::{instant, shell, Sked};
use serde_json::{json, Value};
use std::time::Duration;

fn rules(url: &str) -> Value {
    json!([{"on": ["deadline_missed", "at_risk"], "webhook": {"url": url}}])
}

/// Polls run `id` until `done` says so of it.
async fn wait_for(sked: &Sked, id: i64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let run = sked.run(id).await;
        if done(&run) {
            return run;
        }
        assert!(std::time::Instant::now() < until, "{what}: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn kinds(run: &Value) -> Vec<String> {
    run["deadline_missed"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["kind"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_overrun_is_marked_told_once_and_counted_and_a_run_on_time_is_not() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (receiver, url) = Receiver::start(0, 0).await;
    let (status, body) = sked
        .put_job(
            "overrun",
            json!({
                "target": shell("sleep 3"),
                "deadline": {"finish_by": "1s", "max_duration": "1500ms"},
                "notify": rules(&url),
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = sked
        .put_job(
            "on-time",
            json!({
                "target": shell("true"),
                "deadline": {"start_by": "20s", "finish_by": "30s"},
                "notify": rules(&url),
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let late = sked.trigger("overrun").await;
    let fine = sked.trigger("on-time").await;

    let fine = sked.wait_finished(fine, Duration::from_secs(30)).await;
    assert_eq!(fine["state"], "succeeded", "{fine}");
    let fine = wait_for(
        &sked,
        fine["id"].as_i64().unwrap_or_default(),
        "its deadline recorded",
        |r| r["deadline"].is_object(),
    )
    .await;
    assert_eq!(
        instant(&fine["deadline"]["finish_by"]) - instant(&fine["scheduled_for"]),
        chrono::Duration::seconds(30)
    );

    // Both deadlines pass while it runs: marked then, before it ends.
    let running = wait_for(&sked, late, "both misses while it runs", |r| {
        kinds(r).len() == 2
    })
    .await;
    assert_eq!(running["state"], "running", "{running}");
    let ended = sked.wait_finished(late, Duration::from_secs(30)).await;
    assert_eq!(ended["state"], "succeeded", "{ended}");
    // Once ended, the amounts become final: finish_by is missed by exactly how long after
    // it the run ended. (The amount marked while it ran is already over a second, so the
    // wait is for the exact figure, which the deadline duty's next pass writes.)
    let final_amount = |r: &Value| {
        let finish_by = instant(&r["deadline"]["finish_by"]);
        (instant(&r["finished_at"]) - finish_by).num_milliseconds()
    };
    let ended = wait_for(&sked, late, "the final amounts", |r| {
        r["deadline_missed"][0]["by_ms"].as_i64() == Some(final_amount(r))
    })
    .await;
    assert_eq!(kinds(&ended), ["finish_by", "max_duration"], "{ended}");
    assert!(
        final_amount(&ended) >= 1500,
        "it ended about 2 s late: {ended}"
    );

    let delivered = receiver.delivered(1, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = receiver.requests();
    assert_eq!(all.len(), 1, "told once, the on-time run never: {all:?}");
    let body = &delivered[0].body;
    assert_eq!(body["event"], "deadline_missed", "{body}");
    assert_eq!(body["job"], "overrun");
    assert_eq!(body["run_id"], late);
    assert_eq!(body["deadline"]["kind"], "finish_by", "{body}");

    let metrics = sked.metrics().await;
    let line = |kind: &str| {
        format!("sked_deadline_misses_total{{namespace=\"default\",kind=\"{kind}\"}} 1")
    };
    assert!(metrics.contains(&line("finish_by")), "{metrics}");
    assert!(metrics.contains(&line("max_duration")), "{metrics}");

    let (status, page) = sked.get("/runs?deadline_missed=true").await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<i64> = page["runs"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["id"].as_i64()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [late]);
    let (status, page) = sked.get("/runs?at_risk=maybe").await;
    assert_eq!(status, 400, "{page}");
    let (ok, out, err) = sked.cli(&["run", "list", "--deadline-missed"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert!(rows[0].starts_with(&late.to_string()), "{out}");
    assert!(rows[0].contains("missed finish_by +"), "{out}");
    assert!(rows[0].contains("missed max_duration +"), "{out}");
}

#[tokio::test]
async fn a_run_its_history_says_will_overrun_is_at_risk_before_its_finish_by() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (receiver, url) = Receiver::start(0, 0).await;
    let job = |deadline: Value| {
        json!({
            "target": shell("sleep 4"),
            "overlap": "allow",
            "deadline": deadline,
            "notify": rules(&url),
        })
    };
    // A history of five runs of about four seconds, each well within its deadline.
    let (status, body) = sked.put_job("slow", job(json!({"finish_by": "1m"}))).await;
    assert_eq!(status, 201, "{body}");
    let mut history = Vec::new();
    for _ in 0..5 {
        history.push(sked.trigger("slow").await);
    }
    for id in history {
        let run = sked.wait_finished(id, Duration::from_secs(60)).await;
        assert_eq!(run["state"], "succeeded", "{run}");
    }
    assert!(receiver.requests().is_empty(), "{:?}", receiver.requests());

    // Now it must finish within 3 s: its history says 4.
    let (status, body) = sked.put_job("slow", job(json!({"finish_by": "3s"}))).await;
    assert_eq!(status, 200, "{body}");
    let id = sked.trigger("slow").await;
    let risky = wait_for(&sked, id, "called at risk", |r| r["at_risk"].is_object()).await;
    let called = instant(&risky["at_risk"]["at"]);
    let finish_by = instant(&risky["deadline"]["finish_by"]);
    assert!(called < finish_by, "warned before the deadline: {risky}");
    assert!(
        instant(&risky["at_risk"]["estimated_finish"]) > finish_by,
        "{risky}"
    );
    let ended = sked.wait_finished(id, Duration::from_secs(30)).await;
    assert_eq!(ended["state"], "succeeded");
    wait_for(&sked, id, "the miss", |r| kinds(r) == ["finish_by"]).await;

    let delivered = receiver.delivered(2, Duration::from_secs(20)).await;
    let events: Vec<&str> = delivered
        .iter()
        .filter_map(|d| d.body["event"].as_str())
        .collect();
    assert_eq!(events, ["at_risk", "deadline_missed"], "{delivered:?}");
    assert!(delivered[0].body["deadline"]["estimated_finish"].is_string());

    let (status, page) = sked.get("/runs?at_risk=true").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page["runs"][0]["id"], id);

    // The console's overview lists it first of all.
    let (browser, cookie) = common::console_session(&sked, common::ADMIN_TOKEN).await;
    let html = browser
        .get(format!("{}/?namespace=default", sked.base()))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("the overview")
        .text()
        .await
        .unwrap_or_default();
    let late = html.find("Late and at risk").expect("the section");
    let figures = html.find("firing lateness p50").expect("the figures");
    assert!(late < figures, "late and at risk comes first");
    assert!(html.contains(&format!("href=\"/runs/{id}\"")), "{html}");
    assert!(html.contains("missed finish_by by"), "{html}");
}

#[tokio::test]
async fn deadlines_that_cannot_be_met_are_refused_with_their_field() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    for (deadline, field) in [
        (
            json!({"start_by": "30m", "finish_by": "10m"}),
            "deadline.finish_by",
        ),
        (json!({"finish_by": "8d"}), "deadline.finish_by"),
        (
            json!({"finish_by": "1h", "day_offset": 1}),
            "deadline.day_offset",
        ),
        (
            json!({"finish_by": "07:30", "day_offset": 40}),
            "deadline.day_offset",
        ),
        (
            json!({"start_by": "1h", "warn_before": "5m"}),
            "deadline.warn_before",
        ),
        (json!({}), "deadline"),
    ] {
        let (status, body) = sked
            .put_job(
                "impossible",
                json!({"target": shell("true"), "deadline": deadline}),
            )
            .await;
        assert_eq!(status, 400, "{deadline}: {body}");
        assert_eq!(body["error"]["field"], field, "{deadline}: {body}");
    }
    let (status, body) = sked
        .put_job(
            "impossible",
            json!({"target": shell("true"), "deadline": {"finish_by": "half past seven"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = sked.get("/jobs/impossible").await;
    assert_eq!(status, 404, "nothing was written");
}

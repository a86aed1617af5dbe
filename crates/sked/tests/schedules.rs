//! The schedule kinds fire on time through the real binary: `every`, ISO 8601 repeating
//! intervals, and manual triggers, with each run's lateness recorded.

mod common;

use chrono::Utc;
use common::{instant, shell, Sked};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn every_second_runs_nine_times_in_ten_seconds() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, job) = sked
        .put_job(
            "tick",
            json!({"schedule": {"every": "1s"}, "target": shell("true")}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let runs = sked.runs("tick").await;
    let succeeded: Vec<_> = runs.iter().filter(|r| r["state"] == "succeeded").collect();
    assert!(
        succeeded.len() >= 9,
        "only {} runs succeeded in 10 s: {runs:?}",
        succeeded.len()
    );
    // One run per instant, one second apart.
    for pair in runs.windows(2) {
        let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
        assert_eq!(gap, chrono::Duration::seconds(1), "{pair:?}");
    }
    let mut lateness = Vec::new();
    for run in &succeeded {
        let view = sked.run(run["id"].as_i64().unwrap()).await;
        let ms = view["lateness_ms"].as_f64().expect("lateness recorded");
        assert!((0.0..1000.0).contains(&ms), "lateness {ms} ms");
        lateness.push(ms);
    }
    let (status, stats) = sked.get("/jobs/tick/stats").await;
    assert_eq!(status, 200);
    assert!(
        stats["lateness_ms"]["count"].as_u64().unwrap() >= 9,
        "{stats}"
    );
    assert!(
        stats["lateness_ms"]["p99"].as_f64().unwrap() < 1000.0,
        "{stats}"
    );
    println!("lateness of {} runs (ms): {lateness:?}", lateness.len());
}

#[tokio::test]
async fn an_iso8601_r2_interval_runs_three_times_then_completes() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let start = (Utc::now() + chrono::Duration::seconds(1)).format("%Y-%m-%dT%H:%M:%SZ");
    let interval = format!("R2/{start}/PT1S");
    let (status, job) = sked
        .put_job(
            "thrice",
            json!({"schedule": {"iso8601": interval}, "target": shell("echo hi")}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let runs = sked.wait_runs("thrice", 3, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs_after = sked.runs("thrice").await;
    assert_eq!(runs_after.len(), 3, "exactly three runs: {runs_after:?}");
    assert!(runs.iter().all(|r| r["state"] == "succeeded"), "{runs:?}");
    let (_, job) = sked.get("/jobs/thrice").await;
    assert_eq!(job["state"], "completed", "{job}");
    assert!(job["next_fire_at"].is_null(), "{job}");
}

#[tokio::test]
async fn a_job_created_to_fire_in_one_second_fires_in_one_second() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let at = Utc::now() + chrono::Duration::seconds(1);
    let (status, _) = sked
        .put_job(
            "soon",
            json!({"schedule": {"at": at.to_rfc3339()}, "target": shell("true")}),
        )
        .await;
    assert_eq!(status, 201);
    let runs = sked.wait_runs("soon", 1, Duration::from_secs(5)).await;
    assert_eq!(runs.len(), 1);
    let view = sked.run(runs[0]["id"].as_i64().unwrap()).await;
    assert!(view["lateness_ms"].as_f64().unwrap() < 500.0, "{view}");
    let (_, job) = sked.get("/jobs/soon").await;
    assert_eq!(job["state"], "completed");
}

#[tokio::test]
async fn manual_trigger_pause_and_resume() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, _) = sked
        .put_job(
            "manual",
            json!({"target": shell("echo manual $SKED_SCHEDULED_FOR")}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, run) = sked.post("/jobs/manual/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["trigger"], "manual");
    let runs = sked.wait_runs("manual", 1, Duration::from_secs(10)).await;
    assert_eq!(runs[0]["state"], "succeeded");
    let log = sked
        .http
        .get(sked.url(&format!("/runs/{}/log", runs[0]["id"])))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // One run, one instant: what the attempt is told is what the ledger and the API say.
    let told = log
        .strip_prefix("manual ")
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("unexpected output {log:?}"));
    assert_eq!(
        instant(&json!(told)),
        instant(&run["scheduled_for"]),
        "the attempt saw {told}, the API says {}",
        run["scheduled_for"]
    );
    assert_eq!(runs[0]["scheduled_for"], run["scheduled_for"]);

    // A paused job keeps its ledger: each instant is recorded as skipped (paused).
    sked.put_job(
        "paused",
        json!({"schedule": {"every": "1s"}, "target": shell("true"), "paused": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let runs = sked.runs("paused").await;
    assert!(runs.len() >= 2, "{runs:?}");
    assert!(
        runs.iter()
            .all(|r| r["state"] == "skipped" && r["skip_reason"] == "paused"),
        "{runs:?}"
    );
    let (status, job) = sked.post("/jobs/paused/resume", json!({})).await;
    assert_eq!((status, job["state"].as_str()), (200, Some("active")));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let runs = sked.runs("paused").await;
    assert!(runs.iter().any(|r| r["state"] == "succeeded"), "{runs:?}");
}

/// What the schedule grammar and its previews say in the places a new user met them: `L-nW`
/// is refused as outside the grammar, a cron preview past its last year says why it is empty,
/// a step of 1 reads "every minute", and a refusal names a role with its article.
#[tokio::test]
async fn schedule_words_and_refusals_say_what_they_mean() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let target = json!({"http": {"url": "https://example.com/"}});
    let (status, answer) = sked
        .put_job(
            "month-end",
            json!({"schedule": {"cron": "0 0 L-5W * *"}, "target": target}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("L-nW is not in the grammar"), "{message}");
    assert!(!message.contains("must be 0-30"), "{message}");

    let (status, preview) = sked
        .post(
            "/schedules/preview",
            json!({"schedule": {"cron": "0 0 1 1 *"}, "from": "2199-06-01T00:00:00Z", "count": 3}),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["fire_times"], json!([]), "{preview}");
    let note = preview["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("cron schedules end with the year 2199"),
        "{preview}"
    );
    let (_, full) = sked
        .post(
            "/schedules/preview",
            json!({"schedule": {"every": "1m"}, "count": 3}),
        )
        .await;
    assert!(full.get("note").is_none(), "{full}");

    let (status, _) = sked
        .put_job(
            "minutely",
            json!({"schedule": {"cron": "0 */1 * * * *"}, "target": target}),
        )
        .await;
    assert_eq!(status, 201);
    let session = common::token(
        &sked,
        "words-editor",
        json!({"role": "editor", "namespaces": ["default"]}),
    )
    .await;
    let editor = common::client_with_token(Some(&session));
    let (status, refused) =
        common::call(&editor, reqwest::Method::GET, sked.url("/tokens"), None).await;
    assert_eq!(status, 403, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("an editor token may not"), "{message}");

    // The console's list reads the cron step as words.
    let (browser, cookie) = common::console_session(&sked, &session).await;
    let page = browser
        .get(format!("{}/jobs", sked.base()))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("every minute UTC"), "{page}");
    assert!(!page.contains("every 1 minutes"), "{page}");
}

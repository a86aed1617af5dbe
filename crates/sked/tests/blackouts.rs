//! Blackout windows, black-box: a job's instants inside one of its windows are in the ledger as
//! `skipped (blackout)` with the window's reason, one row an instant, and the job runs again
//! once the window is gone; repeating windows preview as they will apply, after a calendar's
//! moves; bad windows are refused naming the field, with nothing written. A window with
//! `cancel_running` (a job's, a namespace's, `sked namespace pause --cancel-running`) stops the
//! runs it finds running with its reason, each asked once in a cluster; one without leaves them.

mod common;

use chrono::{Duration as Span, Utc};
use common::{instant, shell, Sked};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

async fn call(sked: &Sked, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    common::call(&sked.http, method, sked.url(path), body).await
}

#[tokio::test]
async fn instants_in_a_window_are_recorded_skipped_with_its_reason_and_run_again_after_it() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let now = Utc::now();
    let window = json!({
        "from": (now - Span::minutes(1)).to_rfc3339(),
        "to": (now + Span::hours(1)).to_rfc3339(),
        "reason": "Database migration",
    });
    let job = json!({
        "schedule": {"every": "1s"},
        "target": shell("true"),
        "blackouts": [window],
    });
    let (status, answer) = sked.put_job("nightly", job).await;
    assert_eq!(status, 201, "{answer}");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let runs = sked.runs("nightly").await;
    assert!(runs.len() >= 2, "{runs:?}");
    for run in &runs {
        assert_eq!(
            (&run["state"], &run["skip_reason"], &run["error"]),
            (
                &json!("skipped"),
                &json!("blackout"),
                &json!("Database migration")
            ),
            "{run}"
        );
    }
    for pair in runs.windows(2) {
        let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
        assert_eq!(gap, Span::seconds(1), "one row an instant");
    }

    // The window dropped: the next instants run.
    let job = json!({"schedule": {"every": "1s"}, "target": shell("true")});
    let (status, answer) = sked.put_job("nightly", job).await;
    assert_eq!(status, 200, "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sked
        .runs("nightly")
        .await
        .iter()
        .any(|r| r["state"] == "succeeded")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no run after the window"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn repeating_windows_preview_after_the_calendar_and_bad_ones_are_refused() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let uk = json!({"timezone": "Europe/London"});
    let (status, _) = call(&sked, Method::PUT, "/calendars/uk", Some(uk)).await;
    assert_eq!(status, 201);
    // Daily at 22:30 London, on business days: a weekend's instants would move to Monday,
    // which has its own, so they are removed; Mondays from 22:00 for two hours are a
    // maintenance window, which removes Monday's. The calendar first, then the window on what
    // remains. (4 December 2037 is a Friday; London is on GMT then.)
    let job = json!({
        "schedule": {"cron": "30 22 * * *", "timezone": "Europe/London", "calendar": "uk",
                     "on_holiday": "next_business_day", "start": "2037-12-04T00:00:00Z"},
        "blackouts": [{"cron": "0 22 * * MON", "timezone": "Europe/London", "duration": "2h",
                       "reason": "Weekly maintenance"}],
        "target": shell("true"),
    });
    let (status, answer) = sked.put_job("report", job).await;
    assert_eq!(status, 201, "{answer}");
    let (status, preview) = call(&sked, Method::GET, "/jobs/report/preview?count=5", None).await;
    assert_eq!(status, 200, "{preview}");
    let outcomes = preview["outcomes"].as_array().expect("outcomes");
    let first: Vec<(String, Option<&str>)> = outcomes
        .iter()
        .map(|o| {
            (
                o["at"].as_str().unwrap_or_default().to_string(),
                o["skip_reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        first,
        [
            ("2037-12-04T22:30:00Z".to_string(), None),
            ("2037-12-05T22:30:00Z".to_string(), Some("calendar")),
            ("2037-12-06T22:30:00Z".to_string(), Some("calendar")),
            ("2037-12-07T22:30:00Z".to_string(), Some("blackout")),
            ("2037-12-08T22:30:00Z".to_string(), None),
        ],
        "{preview}"
    );
    assert_eq!(outcomes[3]["skipped"], "Weekly maintenance");

    // Bad windows name their field and write nothing.
    for (window, field) in [
        (
            json!({"from": "2026-12-20T00:00:00Z", "to": "2026-12-19T00:00:00Z", "reason": "x"}),
            "blackouts[0].to",
        ),
        (
            json!({"cron": "0 22 * * SAT", "duration": "40d", "reason": "x"}),
            "blackouts[0].duration",
        ),
        (
            json!({"cron": "0 22 * * SAT", "duration": "1h", "reason": ""}),
            "blackouts[0].reason",
        ),
        (
            json!({"from": "2026-12-20T00:00:00Z", "reason": "x"}),
            "blackouts[0]",
        ),
    ] {
        let job = json!({"schedule": {"every": "1h"}, "target": shell("true"),
                         "blackouts": [window]});
        let (status, answer) = sked.put_job("bad", job).await;
        assert_eq!(
            (status, &answer["error"]["field"]),
            (400, &json!(field)),
            "{answer}"
        );
    }
    let manual = json!({"target": shell("true"),
        "blackouts": [{"from": "2026-12-20T00:00:00Z", "to": "2026-12-21T00:00:00Z", "reason": "x"}]});
    let (status, answer) = sked.put_job("bad", manual).await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("blackouts"))
    );
    let (status, _) = call(&sked, Method::GET, "/jobs/bad", None).await;
    assert_eq!(status, 404, "nothing was written");
}

#[tokio::test]
async fn a_paused_namespace_records_its_instants_skipped_until_it_is_resumed() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let every_second = json!({"schedule": {"every": "1s"}, "target": shell("true")});
    for path in ["/jobs/tick?namespace=ops", "/jobs/tick"] {
        let (status, answer) = call(&sked, Method::PUT, path, Some(every_second.clone())).await;
        assert_eq!(status, 201, "{answer}");
    }
    let runs_of = |namespace: &'static str| {
        let sked = &sked;
        async move {
            let path = format!("/jobs/tick/runs?namespace={namespace}&limit=1000");
            let (status, page) = call(sked, Method::GET, &path, None).await;
            assert_eq!(status, 200, "{page}");
            page["runs"].as_array().cloned().unwrap_or_default()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !runs_of("ops")
        .await
        .iter()
        .any(|r| r["state"] == "succeeded")
    {
        assert!(std::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Settings the pause must keep: a weight and a default webhook (its URL a secret the
    // server hands back sealed).
    let settings = json!({"weight": 3, "notify": [{"on": ["failed"],
        "webhook": {"url": "https://hooks.example.com/sked?token=abc"}}]});
    let (status, answer) = call(&sked, Method::PUT, "/namespaces/ops", Some(settings)).await;
    assert_eq!(status, 201, "{answer}");
    let cli = |args: &[&str]| {
        let (ok, out, err) = sked.cli(args);
        assert!(ok, "sked {args:?}: {err}");
        out
    };
    let until = (Utc::now() + Span::hours(1)).to_rfc3339();
    let paused_at = Utc::now();
    let shown = cli(&[
        "namespace",
        "pause",
        "--namespace",
        "ops",
        "--until",
        &until,
        "--reason",
        "Incident 42",
    ]);
    assert!(shown.contains("Incident 42"), "{shown}");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let after = |runs: Vec<Value>, since| -> Vec<Value> {
        runs.into_iter()
            .filter(|r| instant(&r["scheduled_for"]) > since)
            .collect()
    };
    let paused = after(runs_of("ops").await, paused_at + Span::milliseconds(500));
    assert!(paused.len() >= 2, "{paused:?}");
    for run in &paused {
        assert_eq!(
            (&run["skip_reason"], &run["error"]),
            (&json!("blackout"), &json!("Incident 42")),
            "{run}"
        );
    }
    let elsewhere = after(
        runs_of("default").await,
        paused_at + Span::milliseconds(500),
    );
    assert!(
        elsewhere.iter().any(|r| r["state"] == "succeeded"),
        "another namespace runs on: {elsewhere:?}"
    );

    let resumed_at = Utc::now();
    cli(&["namespace", "resume", "--namespace", "ops"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let runs = after(runs_of("ops").await, resumed_at + Span::milliseconds(500));
        if runs.iter().any(|r| r["state"] == "succeeded") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not run again: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = cli(&["namespace", "show", "--namespace", "ops"]);
    assert!(!shown.contains("blackout"), "{shown}");
    let (_, kept) = call(&sked, Method::GET, "/namespaces/ops", None).await;
    assert_eq!(kept["weight"], 3, "{kept}");
    assert_eq!(
        kept["notify"].as_array().map(Vec::len),
        Some(1),
        "the default webhook survives a pause and a resume: {kept}"
    );
}

/// The first run of `job` (in `namespace`) to be running, once one is.
async fn running_run(sked: &Sked, namespace: &str, job: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let path = format!("/jobs/{job}/runs?namespace={namespace}&limit=1000");
        let (status, page) = call(sked, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        let runs = page["runs"].as_array().cloned().unwrap_or_default();
        if let Some(run) = runs.into_iter().find(|r| r["state"] == "running") {
            return run;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{namespace}/{job} never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for `run` to end, asserts that a window with `reason` cancelled it, and returns it.
async fn ends_cancelled_by(sked: &Sked, run: &Value, reason: &str) -> Value {
    let id = run["id"].as_i64().expect("run id");
    let ended = sked.wait_finished(id, Duration::from_secs(20)).await;
    let expected = format!("cancelled by a blackout window: {reason}");
    assert_eq!(
        (&ended["state"], &ended["error"]),
        (&json!("cancelled"), &json!(expected)),
        "{ended}"
    );
    ended
}

/// A job running `sleep`, one run at a time, with `blackouts`.
fn sleeper(blackouts: Value) -> Value {
    json!({
        "schedule": {"every": "1s"},
        "overlap": "skip",
        "target": shell("sleep 60"),
        "blackouts": blackouts,
    })
}

/// A window with `cancel_running` that opens while a job's run is running stops that run: it
/// ends cancelled with the window's reason. The same window without it leaves a run alone.
#[tokio::test]
async fn a_window_with_cancel_running_stops_the_runs_it_finds_running_and_others_go_on() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 4);
    let far = Utc::now() + Span::days(30);
    let later = |cancel: bool| {
        json!([{"from": far.to_rfc3339(), "to": (far + Span::hours(1)).to_rfc3339(),
                "reason": "Freeze", "cancel_running": cancel}])
    };
    for (name, cancel) in [("stopped", true), ("spared", false)] {
        let (status, answer) = sked.put_job(name, sleeper(later(cancel))).await;
        assert_eq!(status, 201, "{answer}");
    }
    let stopped = running_run(&sked, "default", "stopped").await;
    let spared = running_run(&sked, "default", "spared").await;

    // The windows move to open two seconds from now, while both runs run.
    let opens = Utc::now() + Span::seconds(2);
    for (name, cancel) in [("stopped", true), ("spared", false)] {
        let window = json!([{"from": opens.to_rfc3339(),
            "to": (opens + Span::hours(1)).to_rfc3339(),
            "reason": "Freeze", "cancel_running": cancel}]);
        let (status, answer) = sked.put_job(name, sleeper(window)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let ended = ends_cancelled_by(&sked, &stopped, "Freeze").await;
    assert!(
        instant(&ended["finished_at"]) >= opens,
        "stopped once the window opened, not before: {ended}"
    );
    let (_, job) = call(&sked, Method::GET, "/jobs/stopped", None).await;
    assert_eq!(
        job["blackouts"][0]["cancel_running"], true,
        "the definition keeps the flag: {job}"
    );

    // The window without the flag: its run is still running well after it opened.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = spared["id"].as_i64().expect("run id");
    assert_eq!(sked.run(id).await["state"], "running");
}

/// `sked namespace pause --cancel-running` stops the runs of the namespace's jobs running now,
/// with the pause's reason; a job of another namespace runs on.
#[tokio::test]
async fn a_pause_with_cancel_running_stops_the_namespaces_running_runs() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 4);
    for path in ["/jobs/batch?namespace=ops", "/jobs/batch"] {
        let (status, answer) = call(&sked, Method::PUT, path, Some(sleeper(json!([])))).await;
        assert_eq!(status, 201, "{answer}");
    }
    let in_ops = running_run(&sked, "ops", "batch").await;
    let elsewhere = running_run(&sked, "default", "batch").await;
    let until = (Utc::now() + Span::hours(1)).to_rfc3339();
    let (ok, out, err) = sked.cli(&[
        "namespace",
        "pause",
        "--namespace",
        "ops",
        "--until",
        &until,
        "--reason",
        "Incident 42",
        "--cancel-running",
    ]);
    assert!(ok, "{out}{err}");
    ends_cancelled_by(&sked, &in_ops, "Incident 42").await;
    let (_, settings) = call(&sked, Method::GET, "/namespaces/ops", None).await;
    assert_eq!(
        settings["blackouts"][0]["cancel_running"], true,
        "{settings}"
    );
    let id = elsewhere["id"].as_i64().expect("run id");
    assert_eq!(sked.run(id).await["state"], "running", "another namespace");
}

/// Two nodes on PostgreSQL, each holding partitions, jobs spread over them: a namespace window with
/// `cancel_running` stops every running run, each asked once (one node asks, each run once).
#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn in_a_cluster_each_run_a_window_stops_is_asked_once() {
    use common::pg::{self, Logs, Schema};
    const JOBS: usize = 6;
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let (a, b, _worker) = pg::two_nodes_and_a_worker(&logs, &schema.url, &http, 16).await;
    let api = |path: &str| format!("{}/api/v1{path}", a.base());
    for i in 0..JOBS {
        let (status, answer) = common::call(
            &http,
            Method::PUT,
            api(&format!("/jobs/j{i}")),
            Some(sleeper(json!([]))),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
    }
    let mut running = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for i in 0..JOBS {
        loop {
            let (_, page) = common::call(
                &http,
                Method::GET,
                api(&format!("/jobs/j{i}/runs?limit=100")),
                None,
            )
            .await;
            let runs = page["runs"].as_array().cloned().unwrap_or_default();
            if let Some(run) = runs.into_iter().find(|r| r["state"] == "running") {
                running.push(run["id"].as_i64().expect("run id"));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "j{i} never ran");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let now = Utc::now();
    let window = json!({"blackouts": [{"from": now.to_rfc3339(),
        "to": (now + Span::hours(1)).to_rfc3339(), "reason": "Failover drill",
        "cancel_running": true}]});
    let (status, answer) =
        common::call(&http, Method::PUT, api("/namespaces/default"), Some(window)).await;
    assert!(status == 200 || status == 201, "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for id in &running {
        loop {
            let (_, run) =
                common::call(&http, Method::GET, api(&format!("/runs/{id}")), None).await;
            if common::is_terminal(&run["state"]) {
                assert_eq!(
                    (&run["state"], &run["error"]),
                    (
                        &json!("cancelled"),
                        &json!("cancelled by a blackout window: Failover drill")
                    ),
                    "{run}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "run {id} not stopped: {run}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // One line a run asked, across both nodes.
    let asked: usize = [&a.log, &b.log]
        .iter()
        .map(|log| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .filter(|line| line.contains("cancelled by a blackout window: Failover drill"))
                .count()
        })
        .sum();
    assert_eq!(asked, running.len(), "each run asked once");
    drop(a);
    drop(b);
    schema.drop_schema().await;
}

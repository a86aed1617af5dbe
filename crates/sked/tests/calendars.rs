//! Calendars, black-box: a namespace's calendars of business days, named by schedules. Every
//! instant a holiday removes is in the ledger as `skipped (calendar)` with the holiday's label;
//! a changed calendar reaches the firing loop at once; business-day schedules and moved
//! instants preview as they will run; bad calendars and schedules are refused naming the field
//! with nothing written; a calendar in use is deleted only with `force`; tokens of another
//! namespace or without write access can do nothing with them. Also through the CLI, with an
//! iCalendar import.

mod common;

use chrono::{Duration as Days, Utc};
use common::{client_for, instant, shell, Sked};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

async fn call(sked: &Sked, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    common::call(&sked.http, method, sked.url(path), body).await
}

/// The actions of the audit entries `query` finds (`?object=...`), newest first.
async fn audit_actions(sked: &Sked, query: &str) -> Vec<String> {
    let (status, audit) = call(sked, Method::GET, &format!("/audit{query}"), None).await;
    assert_eq!(status, 200, "{audit}");
    audit["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e["action"].as_str()?.to_string()))
        .collect()
}

/// A calendar open every day of the week, closed from yesterday to tomorrow (UTC).
fn closed_around_today(label: &str) -> Value {
    let today = Utc::now().date_naive();
    json!({
        "weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        "holidays": [{
            "from": (today - Days::days(1)).to_string(),
            "to": (today + Days::days(1)).to_string(),
            "label": label,
        }],
    })
}

#[tokio::test]
async fn a_holiday_removes_instants_into_the_ledger_and_a_changed_calendar_applies_at_once() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, created) = call(
        &sked,
        Method::PUT,
        "/calendars/office",
        Some(closed_around_today("Office move")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["version"], 1);
    let job = json!({
        "schedule": {"every": "1s", "calendar": "office"},
        "target": shell("true"),
    });
    let (status, answer) = sked.put_job("heartbeat", job).await;
    assert_eq!(status, 201, "{answer}");
    tokio::time::sleep(Duration::from_millis(3500)).await;

    // Every instant so far is in the ledger, removed, with the holiday's label.
    let removed = sked.runs("heartbeat").await;
    assert!(removed.len() >= 2, "{removed:?}");
    for run in &removed {
        assert_eq!(
            (&run["state"], &run["skip_reason"]),
            (&json!("skipped"), &json!("calendar")),
            "{run}"
        );
        assert_eq!(run["error"], "holiday: Office move", "{run}");
    }
    for pair in removed.windows(2) {
        let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
        assert_eq!(gap, Days::seconds(1), "one instant a second, none missing");
    }
    let skipped = sked.metrics().await;
    assert!(
        skipped.contains("reason=\"calendar\""),
        "skips by calendar are counted"
    );

    // Reopened: the next instants run.
    let open = json!({"weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]});
    let (status, changed) = call(&sked, Method::PUT, "/calendars/office", Some(open)).await;
    assert_eq!((status, &changed["version"]), (200, &json!(2)), "{changed}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let runs = sked.runs("heartbeat").await;
        if runs.iter().any(|r| r["state"] == "succeeded") {
            // Still one instant a second across the change.
            for pair in runs.windows(2) {
                let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
                assert_eq!(gap, Days::seconds(1), "{pair:?}");
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no run after reopening: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The change is audited with its definition.
    assert_eq!(
        audit_actions(&sked, "?object=office").await,
        ["calendar.put", "calendar.put"]
    );
}

#[tokio::test]
async fn business_days_and_moved_instants_preview_as_they_will_run() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let ny = json!({
        "timezone": "America/New_York",
        "holidays": [{"date": "2026-03-31", "label": "Quarter close"}],
    });
    let (status, answer) = call(&sked, Method::PUT, "/calendars/ny", Some(ny)).await;
    assert_eq!(status, 201, "{answer}");
    let uk = json!({
        "timezone": "Europe/London",
        "holidays": [{"date": "2026-01-01", "label": "New Year's Day", "yearly": true}],
    });
    let (status, answer) = call(&sked, Method::PUT, "/calendars/uk", Some(uk)).await;
    assert_eq!(status, 201, "{answer}");

    // The last business day of each month at 18:00 in New York.
    let last = json!({
        "schedule": {"business_day": {"nth": -1, "at": "18:00"}, "calendar": "ny"},
        "from": "2026-01-01T00:00:00Z",
        "count": 3,
    });
    let (status, preview) = call(&sked, Method::POST, "/schedules/preview", Some(last)).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(
        preview["fire_times"],
        json!([
            "2026-01-30T23:00:00Z",
            "2026-02-27T23:00:00Z",
            "2026-03-30T22:00:00Z"
        ]),
        "31 January and 28 February are Saturdays; 31 March is closed; EDT from 8 March"
    );

    // The first of the month at 06:30 London, moved off holidays and weekends.
    let first = json!({
        "schedule": {"cron": "30 6 1 * *", "timezone": "Europe/London", "calendar": "uk",
                     "on_holiday": "next_business_day"},
        "from": "2025-12-15T00:00:00Z",
        "count": 4,
    });
    let (status, preview) = call(&sked, Method::POST, "/schedules/preview", Some(first)).await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(
        preview["outcomes"],
        json!([
            {"at": "2026-01-02T06:30:00Z", "moved_from": "2026-01-01T06:30:00Z"},
            {"at": "2026-02-02T06:30:00Z", "moved_from": "2026-02-01T06:30:00Z"},
            {"at": "2026-03-02T06:30:00Z", "moved_from": "2026-03-01T06:30:00Z"},
            {"at": "2026-04-01T05:30:00Z"},
        ])
    );

    // The same, skipping: the removed instants are listed with their reasons.
    let skip = json!({
        "schedule": {"cron": "30 6 1 * *", "timezone": "Europe/London", "calendar": "uk"},
        "from": "2025-12-15T00:00:00Z",
        "count": 2,
    });
    let (_, preview) = call(&sked, Method::POST, "/schedules/preview", Some(skip)).await;
    assert_eq!(
        preview["outcomes"],
        json!([
            {"at": "2026-01-01T06:30:00Z", "skip_reason": "calendar", "skipped": "holiday: New Year's Day"},
            {"at": "2026-02-01T06:30:00Z", "skip_reason": "calendar", "skipped": "not a working day (Sun)"},
        ])
    );
    assert_eq!(preview["fire_times"], json!([]));

    // The console's job page lists what became of each instant.
    let firsts: Vec<Value> = (1..=12)
        .map(|m| json!({"date": format!("2026-{m:02}-01"), "label": "First of the month", "yearly": true}))
        .collect();
    let closed = json!({"timezone": "Europe/London", "holidays": firsts});
    let (status, answer) = call(&sked, Method::PUT, "/calendars/no-firsts", Some(closed)).await;
    assert_eq!(status, 201, "{answer}");
    let job = json!({
        "schedule": {"cron": "30 6 1 * *", "timezone": "Europe/London", "calendar": "no-firsts"},
        "target": shell("true"),
    });
    let (status, answer) = sked.put_job("first-of-month", job).await;
    assert_eq!(status, 201, "{answer}");
    let (browser, cookie) = common::console_session(&sked, common::ADMIN_TOKEN).await;
    let page = browser
        .get(format!("{}/jobs/default/first-of-month", sked.base()))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("the job's page");
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap_or_default();
    assert_eq!(
        html.matches("skipped: holiday: First of the month").count(),
        10,
        "ten next instants, each removed: {html}"
    );

    // A job's preview reads its calendar too.
    let job = json!({
        "schedule": {"business_day": {"nth": 3, "at": "06:30"}, "calendar": "uk"},
        "target": shell("true"),
    });
    let (status, answer) = sked.put_job("third", job).await;
    assert_eq!(status, 201, "{answer}");
    let (status, preview) = call(&sked, Method::GET, "/jobs/third/preview?count=12", None).await;
    assert_eq!(status, 200, "{preview}");
    let times = preview["fire_times"].as_array().expect("fire times");
    assert_eq!(times.len(), 12, "{preview}");
    for t in times {
        // 06:30 in London is 06:30 UTC in winter and 05:30 in summer, on the same date.
        let utc = instant(t);
        let clock = utc.format("%H:%M").to_string();
        assert!(clock == "06:30" || clock == "05:30", "{t}");
        use chrono::Datelike;
        assert!(utc.weekday().num_days_from_monday() < 5, "{t}");
        assert!((3..=7).contains(&utc.day()), "the third business day: {t}");
    }
}

#[tokio::test]
async fn bad_calendars_and_schedules_are_refused_naming_the_field_and_nothing_is_written() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;

    // A job naming no calendar that exists.
    let job = json!({
        "schedule": {"cron": "0 6 * * *", "calendar": "nope"},
        "target": shell("true"),
    });
    let (status, answer) = sked.put_job("orphan", job).await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("schedule.calendar"))
    );
    let (status, _) = call(&sked, Method::GET, "/jobs/orphan", None).await;
    assert_eq!(status, 404, "nothing was written");

    // Out-of-range business days and a time that is not one.
    for (schedule, field) in [
        (
            json!({"business_day": {"nth": 0}}),
            "schedule.business_day.nth",
        ),
        (
            json!({"business_day": {"nth": 40}}),
            "schedule.business_day.nth",
        ),
        (
            json!({"business_day": {"nth": 1, "at": "25:00"}}),
            "schedule.business_day.at",
        ),
        (
            json!({"every_business_days": 0}),
            "schedule.every_business_days",
        ),
        (
            json!({"cron": "0 6 * * *", "on_holiday": "next_business_day"}),
            "schedule.on_holiday",
        ),
    ] {
        let job = json!({"schedule": schedule, "target": shell("true")});
        let (status, answer) = sked.put_job("bad", job).await;
        assert_eq!(
            (status, &answer["error"]["field"]),
            (400, &json!(field)),
            "{answer}"
        );
    }

    // Calendars: an unknown include, a cycle, a backwards range, a bad zone.
    let (status, answer) = call(
        &sked,
        Method::PUT,
        "/calendars/a",
        Some(json!({"include": ["b"]})),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("include[0]"))
    );
    let (status, _) = call(&sked, Method::PUT, "/calendars/b", Some(json!({}))).await;
    assert_eq!(status, 201);
    let (status, _) = call(
        &sked,
        Method::PUT,
        "/calendars/a",
        Some(json!({"include": ["b"]})),
    )
    .await;
    assert_eq!(status, 201);
    let (status, answer) = call(
        &sked,
        Method::PUT,
        "/calendars/b",
        Some(json!({"except": ["a"]})),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("except[0]"))
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("b -> a -> b")),
        "{answer}"
    );
    let (_, b) = call(&sked, Method::GET, "/calendars/b", None).await;
    assert_eq!(b["version"], 1, "the refused change wrote nothing: {b}");
    for (body, field) in [
        (
            json!({"holidays": [{"from": "2026-08-10", "to": "2026-08-01", "label": "x"}]}),
            "holidays[0].to",
        ),
        (json!({"timezone": "Mars/Olympus"}), "timezone"),
        (json!({"weekdays": ["funday"]}), "weekdays[0]"),
        (
            json!({"holidays": [{"date": "2026-01-01", "label": ""}]}),
            "holidays[0].label",
        ),
    ] {
        let (status, answer) = call(&sked, Method::PUT, "/calendars/c", Some(body)).await;
        assert_eq!(
            (status, &answer["error"]["field"]),
            (400, &json!(field)),
            "{answer}"
        );
    }
    let (_, list) = call(&sked, Method::GET, "/calendars", None).await;
    let names: Vec<&str> = list["calendars"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b"], "{list}");

    // In use: refused without force; with it, the users are named.
    let job = json!({"schedule": {"cron": "0 6 * * *", "calendar": "a"}, "target": shell("true")});
    let (status, _) = sked.put_job("uses-a", job).await;
    assert_eq!(status, 201);
    let (status, answer) = call(&sked, Method::DELETE, "/calendars/b", None).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &json!("in_use")),
        "{answer}"
    );
    let (_, shown) = call(&sked, Method::GET, "/calendars/a", None).await;
    assert_eq!(shown["used_by"]["jobs"], json!(["uses-a"]), "{shown}");
    let (status, answer) = call(&sked, Method::DELETE, "/calendars/a", None).await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = call(&sked, Method::DELETE, "/calendars/a?force=true", None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["still_named_by"]["jobs"], json!(["uses-a"]));
    let (status, _) = call(&sked, Method::DELETE, "/calendars/a", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn only_writers_of_the_namespace_change_its_calendars_and_others_see_none() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let (status, _) = call(
        &sked,
        Method::PUT,
        "/calendars/uk?namespace=team-a",
        Some(json!({"timezone": "Europe/London"})),
    )
    .await;
    assert_eq!(status, 201);
    let viewer = client_for(
        &sked,
        "a-viewer",
        json!({"role": "viewer", "namespaces": ["team-a"]}),
    )
    .await;
    let outsider = client_for(
        &sked,
        "b-editor",
        json!({"role": "editor", "namespaces": ["team-b"]}),
    )
    .await;
    let url = |path: &str| sked.url(path);
    let (status, _) = common::call(
        &viewer,
        Method::GET,
        url("/calendars/uk?namespace=team-a"),
        None,
    )
    .await;
    assert_eq!(status, 200, "a viewer reads");
    let (status, _) = common::call(
        &viewer,
        Method::PUT,
        url("/calendars/uk?namespace=team-a"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "a viewer does not write");
    for method in [Method::GET, Method::DELETE] {
        let (status, _) = common::call(
            &outsider,
            method,
            url("/calendars/uk?namespace=team-a"),
            None,
        )
        .await;
        assert_eq!(status, 403, "another namespace's editor");
    }
    let (status, list) = common::call(
        &outsider,
        Method::GET,
        url("/calendars?namespace=team-b"),
        None,
    )
    .await;
    assert_eq!((status, &list["calendars"]), (200, &json!([])));
    // Its own namespace's job cannot name team-a's calendar.
    let job = json!({"schedule": {"cron": "0 6 * * *", "calendar": "uk"}, "target": {"http": {"url": "https://example.com/"}}});
    let (status, answer) = common::call(
        &outsider,
        Method::PUT,
        url("/jobs/j?namespace=team-b"),
        Some(job),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("schedule.calendar"))
    );
}

const BANK_HOLIDAYS: &str = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//test//EN\r\n\
BEGIN:VEVENT\r\nUID:1\r\nDTSTART;VALUE=DATE:20261225\r\nDTEND;VALUE=DATE:20261226\r\n\
SUMMARY:Christmas Day\r\nEND:VEVENT\r\n\
BEGIN:VEVENT\r\nUID:2\r\nDTSTART;VALUE=DATE:20261228\r\nDTEND;VALUE=DATE:20261229\r\n\
SUMMARY:Boxing Day (substitute day)\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";

#[tokio::test]
async fn the_cli_imports_an_icalendar_file_and_refuses_what_is_not_one() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ics = dir.path().join("uk.ics");
    std::fs::write(&ics, BANK_HOLIDAYS).expect("write ics");
    let cli = |args: &[&str]| sked.cli(args);
    let ics_arg = ics.to_str().expect("utf-8 path");
    let (ok, out, err) = cli(&[
        "calendar",
        "import",
        "uk",
        "--ics",
        ics_arg,
        "--timezone",
        "Europe/London",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("2 holidays"), "{out}");
    let (ok, out, err) = cli(&["calendar", "show", "uk"]);
    assert!(ok, "{err}");
    assert!(out.contains("Boxing Day (substitute day)"), "{out}");
    assert!(out.contains("Europe/London"), "{out}");

    let not_ics = dir.path().join("notes.ics");
    std::fs::write(&not_ics, "just some notes\n").expect("write");
    let (ok, _, err) = cli(&[
        "calendar",
        "import",
        "other",
        "--ics",
        not_ics.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(err.contains("ics"), "{err}");
    let huge = dir.path().join("huge.ics");
    std::fs::write(&huge, "X".repeat(3 * 1024 * 1024)).expect("write");
    let (ok, _, err) = cli(&[
        "calendar",
        "import",
        "other",
        "--ics",
        huge.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(err.contains("at most"), "{err}");
    let (_, list) = call(&sked, Method::GET, "/calendars", None).await;
    assert_eq!(
        list["calendars"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
}

/// Two nodes on PostgreSQL: a calendar written through one reaches the schedules the other
/// fires at once, through the store's change events. Sixteen jobs spread over the partitions,
/// so that (short of one chance in 65,536) both nodes fire some of them.
#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_calendar_written_on_one_node_applies_on_every_node() {
    use common::pg::{self, Logs, Schema};
    const JOBS: usize = 16;
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let (a, b, _worker) = pg::two_nodes_and_a_worker(&logs, &schema.url, &http, 16).await;
    let api = |path: &str| format!("{}/api/v1{path}", a.base());
    let every_day = json!({"weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]});
    let (status, _) = common::call(
        &http,
        Method::PUT,
        api("/calendars/office"),
        Some(every_day),
    )
    .await;
    assert_eq!(status, 201);
    for i in 0..JOBS {
        let job = json!({
            "schedule": {"every": "1s", "calendar": "office"},
            "target": shell("true"),
        });
        let (status, answer) =
            common::call(&http, Method::PUT, api(&format!("/jobs/j{i}")), Some(job)).await;
        assert_eq!(status, 201, "{answer}");
    }
    let runs_of = |i: usize| {
        let http = http.clone();
        let url = api(&format!("/jobs/j{i}/runs?limit=100"));
        async move {
            let (status, page) = common::call(&http, Method::GET, url, None).await;
            assert_eq!(status, 200, "{page}");
            page["runs"].as_array().cloned().unwrap_or_default()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for i in 0..JOBS {
        while !runs_of(i).await.iter().any(|r| r["state"] == "succeeded") {
            assert!(std::time::Instant::now() < deadline, "job j{i} never ran");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let changed = Utc::now();
    let (status, answer) = common::call(
        &http,
        Method::PUT,
        api("/calendars/office"),
        Some(closed_around_today("Closed for the audit")),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // A second for the change to reach both loops; every instant after it is removed.
    let after = changed + Days::seconds(1);
    for i in 0..JOBS {
        let later: Vec<Value> = runs_of(i)
            .await
            .into_iter()
            .filter(|r| instant(&r["scheduled_for"]) > after)
            .collect();
        assert!(later.len() >= 2, "job j{i}: {later:?}");
        for run in &later {
            assert_eq!(
                (&run["skip_reason"], &run["error"]),
                (&json!("calendar"), &json!("holiday: Closed for the audit")),
                "job j{i} ran past the change: {run}"
            );
        }
    }
    drop(a);
    drop(b);
    schema.drop_schema().await;
}

#[tokio::test]
async fn a_job_whose_calendar_is_deleted_fires_nothing_until_it_is_written_again() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let open = json!({"weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]});
    let (status, _) = call(&sked, Method::PUT, "/calendars/ops", Some(open.clone())).await;
    assert_eq!(status, 201);
    let job = json!({"schedule": {"every": "1s", "calendar": "ops"}, "target": shell("true")});
    let (status, answer) = sked.put_job("tick", job).await;
    assert_eq!(status, 201, "{answer}");
    sked.wait_runs("tick", 1, Duration::from_secs(10)).await;
    let (status, answer) = call(&sked, Method::DELETE, "/calendars/ops?force=true", None).await;
    assert_eq!(status, 200, "{answer}");
    // Past the instant that may have been on its way when the calendar went.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = sked.runs("tick").await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        sked.runs("tick").await.len(),
        before,
        "nothing fires while the calendar is missing"
    );
    let (status, _) = call(&sked, Method::PUT, "/calendars/ops", Some(open)).await;
    assert_eq!(status, 201);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sked.runs("tick").await.len() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "the job did not fire again once its calendar was back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The instants it owed meanwhile are in the ledger, resolved by its misfire policy (the
    // latest runs, the others are skipped): one row a second throughout.
    let runs = sked.runs("tick").await;
    for pair in runs.windows(2) {
        let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
        assert_eq!(gap, Days::seconds(1), "{pair:?}");
    }
    let missed = runs
        .iter()
        .filter(|r| r["skip_reason"] == "misfire")
        .count();
    assert!(missed >= 2, "{runs:?}");
}

/// `sked job apply` with calendars in the file: they are written with the jobs, the jobs fire
/// through them at once (one of the file's calendars includes another, and a stored one), a
/// dry run tells what would change in them field by field, and `--prune` leaves them alone.
#[tokio::test]
async fn a_file_of_jobs_brings_its_calendars_and_they_apply_at_once() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let (status, answer) = call(
        &sked,
        Method::PUT,
        "/calendars/stored",
        Some(json!({"holidays": [{"date": "2001-01-01", "label": "Long ago"}]})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("jobs.yaml");
    let closed = closed_around_today("Office move");
    let mut office = closed.clone();
    office["name"] = json!("office");
    let text = |office: &Value| {
        json!({
            "calendars": [
                {"name": "site", "include": ["office", "stored"], "weekdays": closed["weekdays"]},
                office,
            ],
            "jobs": [{
                "name": "heartbeat",
                "schedule": {"every": "1s", "calendar": "site"},
                "target": shell("true"),
            }],
        })
        .to_string()
    };
    std::fs::write(&file, text(&office)).expect("write file");
    let path = file.to_str().expect("utf-8 path");
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("created   calendar site"), "{out}");
    assert!(out.contains("created   calendar office"), "{out}");
    assert!(out.contains("created   heartbeat"), "{out}");
    assert!(out.contains("1 job(s) and 2 calendar(s) applied"), "{out}");

    // The job meets the file's calendars from its first instant.
    let removed = sked
        .wait_runs("heartbeat", 2, Duration::from_secs(10))
        .await;
    for run in &removed {
        assert_eq!(run["skip_reason"], "calendar", "{run}");
        assert_eq!(run["error"], "holiday: Office move", "{run}");
    }
    let (_, site) = call(&sked, Method::GET, "/calendars/site", None).await;
    assert_eq!(site["used_by"]["jobs"], json!(["heartbeat"]), "{site}");

    // A dry run says what would change, field by field, and changes nothing.
    office["description"] = json!("The office");
    std::fs::write(&file, text(&office)).expect("write file");
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path, "--dry-run"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("unchanged calendar site"), "{out}");
    assert!(out.contains("update    calendar office"), "{out}");
    assert!(out.contains("+ description: \"The office\""), "{out}");
    assert!(out.contains("unchanged heartbeat"), "{out}");
    let (_, stored) = call(&sked, Method::GET, "/calendars/office", None).await;
    assert_eq!(stored["version"], 1, "{stored}");

    // Applied: a new version, audited like a PUT of the calendar.
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("updated   calendar office"), "{out}");
    let (_, stored) = call(&sked, Method::GET, "/calendars/office", None).await;
    assert_eq!(
        (&stored["version"], &stored["spec"]["description"]),
        (&json!(2), &json!("The office")),
        "{stored}"
    );
    assert_eq!(
        audit_actions(&sked, "?object=office").await,
        ["calendar.put", "calendar.put"]
    );

    // --prune deletes the jobs the file no longer lists, never a calendar.
    std::fs::write(&file, json!({"jobs": []}).to_string()).expect("write file");
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path, "--prune", "--dry-run"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("delete    heartbeat"), "{out}");
    assert!(!out.contains("calendar"), "{out}");
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path, "--prune"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("deleted   heartbeat"), "{out}");
    let (_, list) = call(&sked, Method::GET, "/calendars", None).await;
    assert_eq!(
        list["calendars"].as_array().map(Vec::len),
        Some(3),
        "{list}"
    );
}

/// `POST /apply` with calendars: each bad calendar, a name given twice, a job naming a
/// calendar that neither the file nor the namespace has, a cycle of the file's calendars or
/// through a stored one, too many calendars, and a refused job beside good calendars: each a
/// 400 naming the field, and nothing written. A dry run answers the calendars' changes and
/// writes nothing; a viewer may not apply.
#[tokio::test]
async fn bad_calendars_in_an_apply_are_refused_naming_the_field_and_nothing_is_written() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let (status, _) = call(&sked, Method::PUT, "/calendars/base", Some(json!({}))).await;
    assert_eq!(status, 201);
    let (status, _) = call(
        &sked,
        Method::PUT,
        "/calendars/stored",
        Some(json!({"include": ["base"]})),
    )
    .await;
    assert_eq!(status, 201);
    let job = |calendar: &str| {
        json!({
            "name": "payroll",
            "schedule": {"cron": "0 9 * * *", "calendar": calendar},
            "target": shell("true"),
        })
    };
    let good = json!({"name": "uk", "timezone": "Europe/London"});
    let many: Vec<Value> = (0..=100)
        .map(|i| json!({"name": format!("c{i}")}))
        .collect();
    let cases = [
        (
            json!({"calendars": [good, {"name": "mars", "timezone": "Mars/Olympus"}]}),
            "calendars[1].timezone",
        ),
        (
            json!({"calendars": [{"name": "uk", "holidays": [{"date": "2026-12-25", "label": ""}]}]}),
            "calendars[0].holidays[0].label",
        ),
        (
            json!({"calendars": [good, {"name": "uk"}]}),
            "calendars[1].name",
        ),
        (
            json!({"calendars": [{"timezone": "UTC"}]}),
            "calendars[0].name",
        ),
        (
            json!({"calendars": [{"name": "Not A Name!"}]}),
            "calendars[0].name",
        ),
        (
            json!({"calendars": [{"name": "uk", "colour": "red"}]}),
            "calendars[0]",
        ),
        (
            json!({"calendars": [good], "jobs": [job("nope")]}),
            "jobs[0].schedule.calendar",
        ),
        (
            json!({"calendars": [{"name": "a", "include": ["b"]}, {"name": "b", "except": ["a"]}]}),
            "calendars[0].include[0]",
        ),
        (
            json!({"calendars": [{"name": "uk", "include": ["missing"]}]}),
            "calendars[0].include[0]",
        ),
        // Through a stored calendar: stored includes base, which would include stored.
        (
            json!({"calendars": [{"name": "base", "include": ["stored"]}]}),
            "calendars[0].include[0]",
        ),
        (json!({"calendars": many}), "calendars"),
        (
            json!({"calendars": [good], "jobs": [{"name": "payroll", "schedule": {"business_day": {"nth": 0}, "calendar": "uk"}, "target": shell("true")}]}),
            "jobs[0].schedule.business_day.nth",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = call(&sked, Method::POST, "/apply", Some(body.clone())).await;
        assert_eq!(
            (status, &answer["error"]["field"]),
            (400, &json!(field)),
            "{body}: {answer}"
        );
    }
    // Nothing was written: no job, no calendar but the two stored first, unchanged.
    let (_, jobs) = call(&sked, Method::GET, "/jobs", None).await;
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");
    let (_, list) = call(&sked, Method::GET, "/calendars", None).await;
    let names: Vec<(&str, u64)> = list["calendars"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c["name"].as_str()?, c["version"].as_u64()?)))
        .collect();
    assert_eq!(names, [("base", 1), ("stored", 1)], "{list}");
    let actions = audit_actions(&sked, "").await;
    assert!(
        actions.iter().all(|a| a == "calendar.put"),
        "only the two stored first: {actions:?}"
    );
    assert_eq!(actions.len(), 2, "{actions:?}");

    // A dry run answers the calendars' changes and writes nothing.
    let body = json!({
        "calendars": [good, {"name": "base", "include": ["uk"]}, {"name": "stored", "include": ["base"]}],
        "jobs": [job("base")],
        "dry_run": true,
    });
    let (status, answer) = call(&sked, Method::POST, "/apply", Some(body.clone())).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["calendars"],
        json!([
            {"name": "uk", "change": "created"},
            {"name": "base", "change": "updated"},
            {"name": "stored", "change": "unchanged"},
        ]),
        "{answer}"
    );
    assert_eq!(answer["jobs"][0]["change"], "created", "{answer}");
    let (status, _) = call(&sked, Method::GET, "/calendars/uk", None).await;
    assert_eq!(status, 404, "a dry run writes nothing");

    // A viewer may not apply calendars.
    let viewer = client_for(
        &sked,
        "viewer",
        json!({"role": "viewer", "namespaces": ["default"]}),
    )
    .await;
    let mut applied = body;
    applied["dry_run"] = json!(false);
    let (status, _) = common::call(
        &viewer,
        Method::POST,
        sked.url("/apply"),
        Some(applied.clone()),
    )
    .await;
    assert_eq!(status, 403);
    // The same file applied for real.
    let (status, answer) = call(&sked, Method::POST, "/apply", Some(applied)).await;
    assert_eq!(status, 200, "{answer}");
    let (_, base) = call(&sked, Method::GET, "/calendars/base", None).await;
    assert_eq!(
        (&base["version"], &base["used_by"]["jobs"]),
        (&json!(2), &json!(["payroll"])),
        "{base}"
    );
}

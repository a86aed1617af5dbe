//! The runs grid (`/grid`) in a real browser: Chromium through ChromeDriver against a real
//! `sked dev --require-token` and its worker. Jobs whose runs end in each state make the rows;
//! the test reads each cell's colour, link and title, filters by schedule kind and by label
//! (through the form too), follows a cell to its run, sees a viewer of another namespace shown
//! none of them, and checks that the page fits a phone's width without the body scrolling
//! sideways.
//!
//! With `SKED_UI_SCREENSHOTS=DIR` it saves `grid.png` (1280x800) and `grid-phone.png`
//! (375x812) there. Needs `SKED_TEST_CHROMEDRIVER`, as `console.rs` does.

mod common;

#[path = "common/browser.rs"]
mod browser;

use browser::{Browser, PATIENCE};
use common::{shell, token, Sked, ADMIN_TOKEN};
use serde_json::json;
use std::time::{Duration, Instant};

/// The cell linking to run `id`.
fn cell(id: i64) -> String {
    format!("table.grid td a[href='/runs/{id}']")
}

/// The row of job `name`.
fn row(name: &str) -> String {
    format!("table.grid tbody th a[href='/jobs/default/{name}']")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn the_runs_grid_shows_each_jobs_runs_by_instant() {
    let mut sked = Sked::new();
    sked.start_dev(&["--require-token", "--slots", "4"]).await;

    // Two jobs every second (one failing on every third), and jobs run by hand: one that
    // succeeds, one that fails, one no worker can take (its runs stay queued; one cancelled).
    let every_second = |command: &str| json!({"schedule": {"cron": "* * * * * *"}, "target": shell(command), "overlap": "allow"});
    for (name, job) in [
        ("etl-extract", every_second("true")),
        (
            "etl-load",
            every_second("test $(( $(date +%s) % 3 )) -ne 0"),
        ),
        ("report", json!({"target": shell("sleep 0.2")})),
        ("broken", json!({"target": shell("exit 3")})),
        (
            "on-hold",
            json!({"target": shell("true"), "routing": {"labels": {"zone": "nowhere"}}}),
        ),
    ] {
        let (status, body) = sked.put_job(name, job).await;
        assert_eq!(status, 201, "{name}: {body}");
    }
    let succeeded = sked.trigger("report").await;
    let failed = sked.trigger("broken").await;
    let queued = sked.trigger("on-hold").await;
    let cancelled = sked.trigger("on-hold").await;
    let (status, body) = sked
        .post(&format!("/runs/{cancelled}/cancel"), json!(null))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        sked.wait_finished(succeeded, PATIENCE).await["state"],
        "succeeded"
    );
    assert_eq!(
        sked.wait_finished(failed, PATIENCE).await["state"],
        "failed"
    );
    // A few seconds of instants for the jobs every second, then they stop.
    sked.wait_runs("etl-load", 8, PATIENCE).await;
    for name in ["etl-extract", "etl-load"] {
        let (status, body) = sked.post(&format!("/jobs/{name}/pause"), json!(null)).await;
        assert_eq!(status, 200, "{body}");
    }
    let deadline = Instant::now() + PATIENCE;
    while !sked
        .runs("etl-load")
        .await
        .iter()
        .all(|r| common::is_terminal(&r["state"]))
    {
        assert!(
            Instant::now() < deadline,
            "the runs every second never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let browser = Browser::start(&sked.base()).await;
    browser.log_in(ADMIN_TOKEN).await;
    // Read before the page: a paused job's instants go on being recorded, as skipped runs.
    let load_runs = sked.runs("etl-load").await;
    browser.open("/grid").await;
    assert_eq!(browser.text("h1").await, "Runs grid");
    assert!(
        browser
            .exists("header nav a[href='/grid'][aria-current='page']")
            .await
    );
    for name in ["broken", "etl-extract", "etl-load", "on-hold", "report"] {
        assert!(browser.exists(&row(name)).await, "a row for {name}");
    }

    // Each cell is coloured by its run's state and says in its title what it is.
    for (id, class, job, state) in [
        (succeeded, "g", "report", "succeeded"),
        (failed, "b", "broken", "failed"),
        (queued, "w", "on-hold", "queued"),
        (cancelled, "c", "on-hold", "cancelled"),
    ] {
        let link = browser.find(&cell(id)).await;
        let classes = link.attr("class").await.unwrap().unwrap_or_default();
        assert!(
            classes.split(' ').any(|c| c == class),
            "run {id} ({state}): {classes}"
        );
        let title = link.attr("title").await.unwrap().unwrap_or_default();
        assert!(
            title.starts_with(&format!("{job} · ")) && title.contains(state),
            "run {id}: {title}"
        );
    }
    let took = browser
        .find(&cell(succeeded))
        .await
        .attr("title")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(
        took.ends_with(" ms") || took.ends_with(" s"),
        "a duration: {took}"
    );
    // The jobs every second share their columns (their instants are whole seconds).
    assert!(load_runs.len() >= 8);
    let mut states = std::collections::BTreeSet::new();
    for run in &load_runs {
        let id = run["id"].as_i64().unwrap();
        assert!(
            browser.exists(&cell(id)).await,
            "run {id} has a cell: {run}"
        );
        states.insert(run["state"].as_str().unwrap_or_default().to_string());
    }
    assert!(
        states.contains("failed") && states.contains("succeeded"),
        "{states:?}"
    );
    let columns = browser
        .client
        .execute(
            "return document.querySelectorAll('table.grid thead th').length - 1",
            vec![],
        )
        .await
        .unwrap();
    let columns = columns.as_u64().unwrap_or_default() as usize;
    assert!(
        columns < 2 * load_runs.len(),
        "one column an instant, shared between jobs: {columns}"
    );
    browser.shot("grid").await;

    // Filters: the schedule's kind, and a label, as a link and through the form.
    browser.open("/grid?kind=cron").await;
    assert!(browser.exists(&row("etl-load")).await);
    assert!(!browser.exists(&row("report")).await);
    browser.open("/grid?kind=manual").await;
    assert!(browser.exists(&row("report")).await);
    assert!(!browser.exists(&row("etl-load")).await);
    browser.open("/grid").await;
    browser
        .fill("form.filters input[name=label]", "zone=nowhere")
        .await;
    browser.click("form.filters button[type=submit]").await;
    assert!(browser.path().await.contains("label=zone%3Dnowhere"));
    assert!(browser.exists(&row("on-hold")).await);
    assert!(!browser.exists(&row("report")).await);
    assert!(browser.exists(&cell(queued)).await);

    // A cell goes to its run.
    browser.click(&cell(queued)).await;
    assert_eq!(browser.path().await, format!("/runs/{queued}"));

    // On a phone's width the grid scrolls inside its box; the page does not.
    browser.viewport(375, 812).await;
    browser.open("/grid").await;
    let overflow = browser
        .client
        .execute(
            "return [document.documentElement.scrollWidth, document.body.scrollWidth, \
             window.innerWidth]",
            vec![],
        )
        .await
        .unwrap();
    let width = |i: usize| overflow[i].as_u64().unwrap_or(u64::MAX);
    assert!(
        width(0) <= width(2) && width(1) <= width(2),
        "the page is wider than the screen: {overflow}"
    );
    let sticky = browser
        .client
        .execute(
            "return getComputedStyle(document.querySelector('table.grid tbody th')).position",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(sticky, json!("sticky"), "job names stay in view");
    browser.shot("grid-phone").await;
    browser.viewport(1280, 800).await;

    // A viewer of another namespace sees none of these runs, and may not name this one.
    let viewer = token(
        &sked,
        "grid-viewer",
        json!({"role": "viewer", "namespaces": ["other"]}),
    )
    .await;
    browser.click("form[action='/logout'] button").await;
    browser.log_in(&viewer).await;
    browser.open("/grid").await;
    assert!(!browser.exists("table.grid td a").await);
    browser.open("/grid?namespace=other").await;
    assert!(browser.exists("p.empty").await);
    assert!(!browser.exists("table.grid td a").await);
    browser.open("/grid?namespace=default").await;
    assert!(browser.exists("p.error").await);
    assert!(!browser.exists(&cell(succeeded)).await);
    browser.close().await;
}

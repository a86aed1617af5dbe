//! The console's dependency graph and chart axes in a real browser (Chromium through
//! ChromeDriver) against a real `sked dev --require-token`: a small pipeline (a -> b -> c,
//! a -> d, where c fails) runs, then a job's page draws the jobs around it as SVG, each box
//! linking to its job and coloured by its newest run, with the pipeline's next instant; the
//! namespace's graph page draws every job that has dependencies and none that has not; the
//! duration chart has labelled axes; no page logs a JavaScript error; and at a phone's
//! 375x812 the page itself does not scroll sideways.
//!
//! With `SKED_UI_SCREENSHOTS=DIR` it saves `graph.png` and `job.png` (1280x800) and
//! `graph-phone.png` (375x812) there (`docs/ui/`, shown in docs/UI.md). Needs
//! `SKED_TEST_CHROMEDRIVER`, like `console.rs`.

#[path = "common/browser.rs"]
mod browser;
mod common;

use browser::{Browser, PATIENCE};
use common::{is_terminal, shell, Sked, ADMIN_TOKEN};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A step of the pipeline: no schedule, runs after `upstream`.
fn step(upstream: &str, command: &str) -> Value {
    json!({"target": shell(command), "depends_on": [{"job": upstream}]})
}

/// Attribute `name` of the element `css`, or "".
async fn attr(browser: &Browser, css: &str, name: &str) -> String {
    browser
        .find(css)
        .await
        .attr(name)
        .await
        .expect("attribute")
        .unwrap_or_default()
}

/// Whether the page scrolls sideways: the document wider than the window.
async fn overflows(browser: &Browser) -> bool {
    let wide = browser
        .client
        .execute(
            "return document.documentElement.scrollWidth > window.innerWidth \
             || document.body.scrollWidth > window.innerWidth",
            vec![],
        )
        .await
        .expect("measure the page");
    wide != json!(false)
}

/// Checks the node of job `name` on the open page: a link to its page, coloured by its
/// newest run's state, which it also says.
async fn node(browser: &Browser, name: &str, state: &str, tone: &str) {
    let css = format!("svg.dag a[data-job='{name}']");
    assert_eq!(
        attr(browser, &css, "href").await,
        format!("/jobs/default/{name}")
    );
    assert_eq!(attr(browser, &css, "data-run-state").await, state, "{name}");
    let class = attr(browser, &css, "class").await;
    assert!(class.split(' ').any(|c| c == tone), "{name}: {class}");
    let status = browser.text(&format!("{css} text.status")).await;
    assert!(
        status.starts_with(&state.replace('_', " ")),
        "{name}: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn the_console_draws_the_dependency_graph_and_charts_with_axes() {
    let mut sked = Sked::new();
    sked.start_dev(&["--require-token", "--slots", "4"]).await;

    let a = json!({"schedule": {"every": "1s"}, "target": shell("sleep 0.2")});
    assert_eq!(sked.put_job("a", a.clone()).await.0, 201);
    assert_eq!(sked.put_job("b", step("a", "sleep 0.1")).await.0, 201);
    assert_eq!(sked.put_job("c", step("b", "exit 3")).await.0, 201);
    assert_eq!(sked.put_job("d", step("a", "true")).await.0, 201);
    let alone = json!({"target": shell("true")});
    assert_eq!(sked.put_job("alone", alone).await.0, 201);
    sked.wait_runs("c", 3, PATIENCE).await;
    // Then a far instant, so the newest runs stay as they are and there is a next one to show.
    let mut hourly = a;
    hourly["schedule"] = json!({"every": "1h"});
    assert_eq!(sked.put_job("a", hourly).await.0, 200);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut settled = true;
        for job in ["a", "b", "c", "d"] {
            settled &= sked
                .runs(job)
                .await
                .iter()
                .all(|r| is_terminal(&r["state"]));
        }
        if settled {
            break;
        }
        assert!(Instant::now() < deadline, "the pipeline's runs never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let browser = Browser::start(&sked.base()).await;
    browser.log_in(ADMIN_TOKEN).await;

    // A job's page: the jobs around it, each a link coloured by its newest run.
    browser.open("/jobs/default/b").await;
    node(&browser, "a", "succeeded", "good").await;
    node(&browser, "b", "succeeded", "good").await;
    node(&browser, "c", "failed", "bad").await;
    let class = attr(&browser, "svg.dag a[data-job='b']", "class").await;
    assert!(class.contains("current"), "{class}");
    // d waits for a, not for b: it is not around b.
    assert!(!browser.exists("svg.dag a[data-job='d']").await);
    let next = browser.text("svg.dag a[data-job='a'] text.status").await;
    assert!(
        next.contains("· next "),
        "the pipeline's next instant: {next}"
    );
    assert_eq!(
        browser
            .client
            .find_all(fantoccini::Locator::Css("svg.dag .edges path"))
            .await
            .expect("edges")
            .len(),
        2
    );
    // The text alternative lists the same jobs.
    assert!(
        browser
            .exists("details.graph-list a[href='/jobs/default/c']")
            .await
    );

    // The chart's axes are labelled, and each point has its figures.
    let values = browser.text("figure.chart.axes .value-axis").await;
    assert!(values.contains("0 ms"), "value axis: {values}");
    let times = browser.text("figure.chart.axes .time-axis").await;
    assert!(times.contains(':'), "time axis: {times}");
    let titles = browser.text("figure.chart.axes").await;
    assert!(titles.contains("instant (UTC)"), "{titles}");
    assert!(
        browser
            .exists("figure.chart.axes circle.point.succeeded title")
            .await
    );
    browser.shot("job").await;

    // The link to the namespace's graph, and the graph: every job with dependencies.
    browser.click("p.lead a[href^='/graph']").await;
    assert_eq!(browser.path().await, "/graph?namespace=default");
    node(&browser, "a", "succeeded", "good").await;
    node(&browser, "b", "succeeded", "good").await;
    node(&browser, "c", "failed", "bad").await;
    node(&browser, "d", "succeeded", "good").await;
    assert!(!browser.exists("svg.dag a[data-job='alone']").await);
    // Upstreams stand left of what waits for them.
    let x = |name: &'static str| {
        let browser = &browser;
        async move {
            attr(browser, &format!("svg.dag a[data-job='{name}'] rect"), "x")
                .await
                .parse::<f64>()
                .expect("a box's x")
        }
    };
    assert!(x("a").await < x("b").await && x("b").await < x("c").await);
    assert!(x("a").await < x("d").await);
    browser.shot("graph").await;
    browser.click("svg.dag a[data-job='c']").await;
    assert_eq!(browser.path().await, "/jobs/default/c");

    // From the job list too.
    browser.open("/jobs").await;
    assert!(
        browser
            .exists("a.button[href='/graph?namespace=default']")
            .await
    );

    // A phone: the graph scrolls in its own box, never the page.
    browser.viewport(375, 812).await;
    browser.open("/graph?namespace=default").await;
    assert!(
        !overflows(&browser).await,
        "/graph scrolls sideways at 375 px"
    );
    browser.shot("graph-phone").await;
    browser.open("/jobs/default/b").await;
    assert!(
        !overflows(&browser).await,
        "a job's page scrolls sideways at 375 px"
    );
    browser.viewport(1280, 800).await;
    browser.close().await;
}

//! The web console in a real browser: Debian's Chromium, driven through ChromeDriver, against a
//! real `sked dev` that requires tokens. A person's path through it: log in, create a job
//! through the form (a bad cron is refused beside its input), watch its runs appear, follow a
//! run's output live, pause and resume, clone, delete; a viewer's token sees no write buttons.
//!
//! Every page visited is checked for JavaScript errors in the browser's log and for requests
//! outside sked's origin. With `SKED_UI_SCREENSHOTS=DIR` the pages are saved there at
//! 1280x800 (`docs/ui/`, shown in docs/UI.md).
//!
//! Needs `SKED_TEST_CHROMEDRIVER` (the `chromedriver` to start; Chromium is
//! `SKED_TEST_CHROMIUM`, else `/usr/bin/chromium`). Without it the test is reported as ignored
//! (see build.rs); under CI it runs, and a missing driver fails it.

#[path = "common/browser.rs"]
mod browser;
mod common;

use browser::{Browser, PATIENCE};
use common::{shell, token, Sked, ADMIN_TOKEN};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn a_person_runs_jobs_from_the_console() {
    let mut sked = Sked::new();
    sked.start_dev(&["--require-token", "--slots", "4"]).await;
    let browser = Browser::start(&sked.base()).await;

    // Without a session every page sends to the login form, which says what was wrong.
    browser.open("/jobs").await;
    assert!(browser.path().await.starts_with("/login"));
    browser.shot("login").await;
    browser.fill("#token", "sked_not-a-token").await;
    browser.click("form button[type=submit]").await;
    assert!(!browser.text("#token-error").await.is_empty());

    browser.log_in(ADMIN_TOKEN).await;
    browser.open("/jobs").await;
    assert_eq!(browser.text("h1").await, "Jobs");

    // A job through the form: a bad cron is refused beside its input, and nothing is made.
    browser.click("a.button[href^='/jobs/new']").await;
    browser.fill("#name", "from-the-console").await;
    browser.fill("#cron", "61 * * * * *").await;
    browser
        .fill("#command", "echo first; sleep 3; echo second")
        .await;
    browser.click("form.job button[type=submit]").await;
    let error = browser.text("#cron-error").await;
    assert!(error.contains("61"), "{error}");
    assert_eq!(
        browser
            .find("#cron")
            .await
            .attr("aria-invalid")
            .await
            .unwrap(),
        Some("true".into())
    );
    browser.shot("job-form-error").await;
    assert_eq!(sked.get("/jobs/from-the-console").await.0, 404);

    browser.fill("#cron", "*/2 * * * * *").await;
    browser.click("form.job button[type=submit]").await;
    assert_eq!(browser.path().await, "/jobs/default/from-the-console");
    assert!(browser.text("p.lead").await.contains("every 2 seconds UTC"));

    // Its runs appear on its page.
    browser
        .reload_until("/jobs/default/from-the-console", "table.runs tbody tr")
        .await;

    // The job list filters by schedule kind and by how the newest run went.
    let listed = "a[href='/jobs/default/from-the-console']";
    browser.open("/jobs?kind=cron").await;
    assert!(browser.exists(listed).await);
    browser.open("/jobs?kind=every").await;
    assert!(!browser.exists(listed).await);
    browser.open("/jobs?last=failed").await;
    assert!(!browser.exists(listed).await);

    // A triggered run's output arrives while it runs, without reloading.
    browser.open("/jobs/default/from-the-console").await;
    browser.click("form[action$='/trigger'] button").await;
    assert!(browser.path().await.starts_with("/runs/"));
    let deadline = Instant::now() + PATIENCE;
    let mut seen_live = false;
    loop {
        let output = browser.text("#output").await;
        if output.contains("first") && !output.contains("second") {
            seen_live = browser.exists("#live").await;
            browser.shot("run").await;
        }
        if output.contains("second") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the output never ended: {output:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen_live,
        "the first line showed before the run ended, live"
    );
    browser.check_page().await;

    // Pause and resume.
    browser.open("/jobs/default/from-the-console").await;
    browser.shot("job").await;
    browser.click("form[action$='/pause'] button").await;
    assert!(browser.exists("form[action$='/resume']").await);
    assert_eq!(
        sked.get("/jobs/from-the-console").await.1["state"],
        "paused"
    );
    browser.click("form[action$='/resume'] button").await;
    assert!(browser.exists("form[action$='/pause']").await);
    assert_eq!(
        sked.get("/jobs/from-the-console").await.1["state"],
        "active"
    );

    // Edit: what the form changes changes, and the rest of the definition stays.
    browser.click("a.button[href$='/edit']").await;
    browser.fill("#description", "edited in the console").await;
    browser.click("form.job button[type=submit]").await;
    assert_eq!(browser.path().await, "/jobs/default/from-the-console");
    let (_, edited) = sked.get("/jobs/from-the-console").await;
    assert_eq!(edited["description"], "edited in the console");
    assert_eq!(edited["schedule"]["cron"], "*/2 * * * * *");
    assert_eq!(
        edited["target"]["shell"]["command"],
        "echo first; sleep 3; echo second"
    );

    // Clone: the form starts from the job's definition.
    browser.click("a.button[href*='clone=']").await;
    assert_eq!(
        browser.find("#name").await.prop("value").await.unwrap(),
        Some("from-the-console-copy".into())
    );
    assert_eq!(
        browser.find("#cron").await.prop("value").await.unwrap(),
        Some("*/2 * * * * *".into())
    );
    browser.click("form.job button[type=submit]").await;
    assert_eq!(browser.path().await, "/jobs/default/from-the-console-copy");
    let (_, copy) = sked.get("/jobs/from-the-console-copy").await;
    assert_eq!(
        copy["target"]["shell"]["command"],
        "echo first; sleep 3; echo second"
    );

    // Delete asks first.
    browser.mark_page().await;
    browser
        .find("form[action$='/delete'] button")
        .await
        .click()
        .await
        .expect("click delete");
    browser.client.accept_alert().await.expect("confirm");
    browser.wait_next_page().await;
    assert!(browser.path().await.starts_with("/jobs?"));
    assert_eq!(sked.get("/jobs/from-the-console-copy").await.0, 404);

    for (path, name) in [
        ("/jobs", "jobs"),
        ("/workers", "workers"),
        ("/audit", "audit"),
        ("/tokens", "tokens"),
    ] {
        browser.open(path).await;
        browser.shot(name).await;
    }
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("resize");
    browser.open("/jobs/default/from-the-console").await;
    browser.shot("job-phone").await;
    browser
        .client
        .set_window_size(1280, 800)
        .await
        .expect("resize");

    // A viewer's token reads everything of its namespace and is offered no change.
    let viewer = token(
        &sked,
        "console-viewer",
        json!({"role": "viewer", "namespaces": ["default"]}),
    )
    .await;
    browser.click("form[action='/logout'] button").await;
    assert!(browser.path().await.starts_with("/login"));
    browser.log_in(&viewer).await;
    browser.open("/jobs").await;
    assert!(
        browser
            .exists("a[href='/jobs/default/from-the-console']")
            .await
    );
    assert!(!browser.exists("a.button[href^='/jobs/new']").await);
    browser.open("/jobs/default/from-the-console").await;
    assert!(browser.exists("table.runs").await);
    for write in ["/trigger", "/pause", "/delete", "/edit"] {
        assert!(
            !browser
                .exists(&format!("[action$='{write}'], a[href$='{write}']"))
                .await,
            "a viewer is offered {write}"
        );
    }
    assert!(!browser.exists("a[href='/tokens']").await);
    browser.close().await;
}

/// What an on-call engineer opens first: the overview says what runs now and what waits and
/// why; the audit trail filters and shows a change as the fields it touched, never a secret;
/// times read in the zone they chose; the keyboard reaches search and pages; every page fits a
/// phone's width and passes axe-core's rules at both sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn an_on_call_engineer_sees_what_runs_what_waits_and_what_changed() {
    let mut sked = Sked::new();
    sked.start_dev(&["--require-token", "--slots", "1"]).await;
    // One slot: a long run holds it, and the next waits behind it in the queue.
    for (name, command) in [("long-report", "sleep 60"), ("next-report", "true")] {
        let (status, body) = sked.put_job(name, json!({"target": shell(command)})).await;
        assert!(status < 300, "{body}");
    }
    let nightly = |cron: &str, secret: &str| {
        json!({"schedule": {"cron": cron, "timezone": "Asia/Tokyo"},
               "target": {"shell": {"command": "true", "env": {"API_SECRET": secret}}}})
    };
    let (status, body) = sked
        .put_job("nightly", nightly("0 2 * * *", "first-secret-value"))
        .await;
    assert!(status < 300, "{body}");
    let (status, body) = sked
        .put_job("nightly", nightly("30 3 * * *", "second-secret-value"))
        .await;
    assert!(status < 300, "{body}");
    let long = sked.trigger("long-report").await;
    let deadline = Instant::now() + PATIENCE;
    while sked.run(long).await["state"] != "running" {
        assert!(Instant::now() < deadline, "the long run never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let next = sked.trigger("next-report").await;

    let browser = Browser::start(&sked.base()).await;
    browser.log_in(ADMIN_TOKEN).await;

    // Now: what runs, and what waits with its reason.
    browser.open("/").await;
    assert!(
        browser
            .exists(&format!("#running ~ * a[href='/runs/{long}']"))
            .await
    );
    let why = browser
        .text(&format!("tr:has(a[href='/runs/{next}']) td:last-child"))
        .await;
    assert!(!why.trim().is_empty(), "a queued run says why it waits");
    assert_eq!(sked.run(next).await["state"], "queued");
    browser.shot("overview").await;

    // The audit trail: filtered to the job, the change shown as the fields it touched.
    browser.open("/audit?object=nightly").await;
    browser
        .find("details.diff summary")
        .await
        .click()
        .await
        .expect("open");
    let change = browser.text("details.diff[open] li.changed").await;
    assert!(change.contains("schedule.cron"), "{change}");
    assert!(change.contains("30 3 * * *"), "{change}");
    let source = browser.client.source().await.expect("source");
    assert!(
        !source.contains("secret-value"),
        "a secret reached the audit page"
    );
    browser.fill("input[name=actor]", "someone-else").await;
    browser.click("form.filters button[type=submit]").await;
    assert!(browser.exists("p.empty").await, "no entry of another actor");
    browser.open("/audit?until=2000-01-01T00:00").await;
    assert!(browser.exists("p.empty").await, "nothing before 2000");
    browser.open("/audit?since=yesterday").await;
    assert!(browser.text("p.error").await.contains("since"));
    browser.open("/audit?object=nightly").await;
    browser.shot("audit").await;

    // Times: relative on the page, exact on hover, in the zone the visitor chose.
    browser.open("/preferences").await;
    browser
        .find("input[value=named]")
        .await
        .click()
        .await
        .expect("named");
    browser.fill("input[name=named]", "America/New_York").await;
    browser.click("form.preferences button[type=submit]").await;
    assert_eq!(browser.text("header a.zone").await, "America/New_York");
    browser.open(&format!("/runs/{long}")).await;
    assert!(browser.exists("time[title$='EST']").await);
    browser.open("/preferences").await;
    browser
        .find("input[value=job]")
        .await
        .click()
        .await
        .expect("job");
    browser.click("form.preferences button[type=submit]").await;
    browser.open("/jobs/default/nightly").await;
    let next_instant = browser.text("ol.instants li time").await;
    assert!(
        next_instant.ends_with("03:30:00 JST"),
        "the job's instants read in its zone: {next_instant}"
    );
    browser.open("/preferences").await;
    browser
        .find("input[value=browser]")
        .await
        .click()
        .await
        .expect("browser");
    browser.click("form.preferences button[type=submit]").await;
    assert!(browser.text("p.notice").await.starts_with("Saved"));
    browser.open("/preferences?zone=moon").await;
    browser.shot("preferences").await;

    // The keyboard: "/" to search, "g j" to the jobs.
    browser.open("/workers").await;
    browser.press("/").await;
    let focused = browser
        .client
        .active_element()
        .await
        .expect("focus")
        .attr("id")
        .await
        .expect("id");
    assert_eq!(focused.as_deref(), Some("search"));
    browser.mark_page().await;
    browser.press("nightly\u{e007}").await;
    browser.wait_next_page().await;
    assert!(browser.path().await.starts_with("/search?q=nightly"));
    assert!(browser.exists("a[href='/jobs/default/nightly']").await);
    browser.mark_page().await;
    browser
        .find("h1")
        .await
        .click()
        .await
        .expect("focus the page");
    browser.press("gj").await;
    browser.wait_next_page().await;
    assert_eq!(browser.path().await, "/jobs");
    browser.open(&format!("/search?q={long}")).await;
    assert!(browser.exists(&format!("a[href='/runs/{long}']")).await);
    browser
        .open(&format!("/search?q={}", "x".repeat(300)))
        .await;
    assert!(browser.exists("p.error").await);

    // Every page at a desktop's size and a phone's: it fits, and it passes axe-core.
    let pages = [
        "/".to_string(),
        "/jobs".into(),
        "/jobs/default/nightly".into(),
        "/jobs/new".into(),
        format!("/runs/{long}"),
        "/workers".into(),
        "/audit".into(),
        "/tokens".into(),
        "/preferences".into(),
        "/search?q=report".into(),
        "/graph".into(),
        "/grid".into(),
    ];
    for (width, height) in [(1280, 800), (375, 812)] {
        browser.viewport(width, height).await;
        for page in &pages {
            browser.open(page).await;
            browser.fits_the_width().await;
            browser.is_accessible().await;
        }
    }
    browser.open("/").await;
    browser.shot("overview-phone").await;
    browser.viewport(1280, 800).await;
    browser.close().await;
    let _ = sked
        .post(&format!("/runs/{long}/cancel"), json!(null))
        .await;
}

/// Serves `page` as HTML to every request on a loopback port of its own: a site the developer
/// happens to visit. Returns its origin.
async fn serve_page(page: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65_536 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    origin
}

/// A page of another origin, open in the developer's browser, tries every request a page may
/// send without asking (no CORS preflight) to an open `sked dev` on loopback: create a shell
/// job (as `text/plain`, as a `Blob` of no type, as a `text/plain` form), and trigger an
/// existing one (a POST without a body). None is obeyed: no job is made, no run started, no
/// file written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn a_page_of_another_site_cannot_make_an_open_sked_dev_run_anything() {
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "2"]).await;
    let planted = sked.dir.path().join("planted");
    let triggered = sked.dir.path().join("triggered");
    let (status, body) = sked
        .put_job(
            "victim",
            json!({"target": {"shell": {"command": format!("touch {}", triggered.display())}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let job = json!({
        "name": "planted",
        "schedule": {"every": "1s"},
        "target": {"shell": {"command": format!("touch {}", planted.display())}}
    })
    .to_string();
    let api = format!("{}/api/v1", sked.base());
    let page = format!(
        r#"<!doctype html><html><head><title>loading</title></head><body>
<form id="f" method="post" enctype="text/plain" action="{api}/jobs" target="sink">
<input type="hidden" name='{{"x":"' value='"}}'></form>
<iframe name="sink"></iframe>
<script>
const job = {job};
const api = "{api}";
const tries = [
  fetch(api + "/jobs", {{method: "POST", mode: "no-cors", body: JSON.stringify(job)}}),
  fetch(api + "/jobs", {{method: "POST", mode: "no-cors",
                          headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify(job)}}),
  fetch(api + "/jobs", {{method: "POST", mode: "no-cors", body: new Blob([JSON.stringify(job)])}}),
  fetch(api + "/jobs/victim/trigger", {{method: "POST", mode: "no-cors"}}),
  fetch(api + "/jobs", {{method: "POST", headers: {{"Content-Type": "application/json"}},
                          body: JSON.stringify(job)}}),
];
document.getElementById("f").submit();
Promise.allSettled(tries).then(() => setTimeout(() => {{ document.title = "done"; }}, 500));
</script></body></html>"#
    );
    let evil = serve_page(page).await;
    let browser = Browser::start(&evil).await;
    browser
        .client
        .goto(&format!("{evil}/"))
        .await
        .expect("open the other site's page");
    let deadline = Instant::now() + PATIENCE;
    while browser.client.title().await.unwrap_or_default() != "done" {
        assert!(
            Instant::now() < deadline,
            "the page never finished its requests"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a run to start and write, had anything been obeyed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, jobs) = sked.get("/jobs").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = jobs["jobs"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|j| j["name"].as_str())
        .collect();
    assert_eq!(names, ["victim"], "{jobs}");
    assert!(
        sked.runs("victim").await.is_empty(),
        "the victim was triggered"
    );
    assert!(!planted.exists(), "a planted job ran");
    assert!(!triggered.exists(), "the victim ran");
    browser.close().await;
}

/// Logging in through a real OpenID Connect provider (oidc-provider, under Node): a person in
/// a mapped group gets a session with their group's role and namespaces, which ends when its
/// time is up; a person in no mapped group is refused and gets no token; a callback this
/// browser did not start is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(sked_browser_tests),
    ignore = "needs SKED_TEST_CHROMEDRIVER (Chromium and ChromeDriver)"
)]
async fn a_person_logs_in_through_an_identity_provider() {
    use common::oidc::{Provider, CLIENT_ID, CLIENT_SECRET};
    let mut sked = Sked::new();
    let provider = Provider::start(
        &format!("{}/login/oidc/callback", sked.base()),
        &sked.dir.path().join("provider.log"),
    )
    .await;
    let secret_file = sked.dir.path().join("client-secret");
    std::fs::write(&secret_file, format!("{CLIENT_SECRET}\n")).expect("secret file");
    let base = sked.base();
    let session_seconds = 8;
    let session = format!("{session_seconds}s");
    sked.start_dev(&[
        "--require-token",
        "--public-url",
        &base,
        "--oidc-issuer",
        &provider.issuer,
        "--oidc-client-id",
        CLIENT_ID,
        "--oidc-client-secret-file",
        secret_file.to_str().expect("utf-8 path"),
        "--oidc-group",
        "sked-operators=editor:default",
        "--oidc-group",
        "sked-viewers=viewer:*",
        "--oidc-scopes",
        "profile email groups",
        "--oidc-session",
        &session,
        "--oidc-name",
        "the test provider",
    ])
    .await;
    let browser = Browser::start(&base).await;

    // The login page offers the provider beside the token, at any width.
    browser.open("/jobs").await;
    assert!(browser.path().await.starts_with("/login"));
    assert_eq!(browser.text("#sso").await, "Log in with the test provider");
    browser.is_accessible().await;
    browser.shot("login-sso").await;
    browser.viewport(375, 812).await;
    browser.fits_the_width().await;
    browser.is_accessible().await;
    browser.viewport(1280, 800).await;

    // alice is in sked-operators: an editor of `default`, back where she was going.
    log_in_at_provider(&browser, "alice").await;
    let logged_in = Instant::now();
    assert_eq!(browser.path().await, "/jobs");
    browser.check_page().await;
    let who = browser.text(".who").await;
    assert!(
        who.contains("sso-alice-") && who.contains("editor"),
        "{who}"
    );
    assert!(browser.exists("a.button[href^='/jobs/new']").await);
    let (_, tokens) = sked.get("/tokens").await;
    let alice: Vec<&serde_json::Value> = tokens["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter(|t| {
            t["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("sso-alice-")
        })
        .collect();
    assert_eq!(alice.len(), 1, "{tokens}");
    assert_eq!(alice[0]["role"], "editor");
    assert_eq!(alice[0]["namespaces"], json!(["default"]));
    assert!(alice[0]["expires_at"].is_string());
    let name = alice[0]["name"].as_str().expect("a name");
    let (_, audit) = sked.get(&format!("/audit?actor={name}")).await;
    let entry = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["action"] == "auth.login")
        .unwrap_or_else(|| panic!("no login in {audit}"));
    assert_eq!(entry["after"]["login"], "alice", "{audit}");
    assert_eq!(entry["after"]["through"], "oidc");
    assert!(!audit.to_string().contains(CLIENT_SECRET));

    // The session ends with its time: the next page is the login form.
    let over = Duration::from_secs(session_seconds + 1);
    tokio::time::sleep(over.saturating_sub(logged_in.elapsed())).await;
    browser.open("/jobs").await;
    assert!(
        browser.path().await.starts_with("/login"),
        "{}",
        browser.path().await
    );

    // mallory is only in `marketing`: refused, with why, and no token is made.
    browser.client.delete_all_cookies().await.expect("cookies");
    browser.open("/login?next=/jobs").await;
    log_in_at_provider(&browser, "mallory").await;
    assert!(browser.path().await.starts_with("/login/oidc/callback"));
    browser.check_page().await;
    let refusal = browser.text("#sso-error").await;
    assert!(
        refusal.contains("mallory") && refusal.contains("none of their groups"),
        "{refusal}"
    );
    let (_, tokens) = sked.get("/tokens").await;
    assert!(!tokens.to_string().contains("sso-mallory"), "{tokens}");
    assert!(
        browser.exists("#sso").await,
        "the refusal offers to log in again"
    );

    // A callback this browser did not start (no flow cookie, or a state of another login) is
    // refused before sked asks the provider anything.
    browser.client.delete_all_cookies().await.expect("cookies");
    browser
        .open("/login/oidc/callback?code=stolen&state=guessed")
        .await;
    assert!(browser
        .text("#sso-error")
        .await
        .contains("not started in this browser"));
    browser.close().await;
}

/// Goes from sked's login page through the provider's login and consent forms as `account`,
/// and back to sked.
async fn log_in_at_provider(browser: &Browser, account: &str) {
    browser.check_page().await;
    browser.click_away("#sso").await;
    assert!(
        !browser.path().await.starts_with("/login"),
        "the login button went to the provider"
    );
    browser.fill("input[name=login]", account).await;
    browser.fill("input[name=password]", "any password").await;
    browser.forget_log().await;
    browser.click_away("button[type=submit]").await;
    // The provider asks for consent the first time: its form has a submit button too.
    let deadline = Instant::now() + PATIENCE;
    while !browser
        .client
        .current_url()
        .await
        .expect("url")
        .as_str()
        .starts_with(&browser.base)
    {
        assert!(
            Instant::now() < deadline,
            "the provider never sent the browser back"
        );
        if browser.exists("button[type=submit]").await {
            browser.forget_log().await;
            browser.click_away("button[type=submit]").await;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The callback's page moves on by itself.
    let deadline = Instant::now() + PATIENCE;
    while browser.path().await.starts_with("/login/oidc/callback")
        && !browser.exists("#sso-error").await
    {
        assert!(
            Instant::now() < deadline,
            "the callback page never moved on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

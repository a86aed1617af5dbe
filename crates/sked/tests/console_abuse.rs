//! The web console against misuse, over plain HTTP (no browser): forged forms, foreign
//! origins, tampered or missing cookies, tokens that may not log in, a viewer posting what it
//! is not offered, a login that would send elsewhere, and secrets in a job's page.

mod common;

use common::{token, Sked, ADMIN_TOKEN};
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::{Client, StatusCode};
use serde_json::json;
use std::time::Duration;

/// A console address of `sked`.
fn at(sked: &Sked, path: &str) -> String {
    format!("{}{path}", sked.base())
}

/// A client that follows no redirect and keeps no cookie: each test says what it sends.
fn bare() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Logs in with `secret`; the session cookie (`sked_session=...`) when it was taken.
async fn log_in(sked: &Sked, secret: &str, next: &str) -> (StatusCode, Option<String>, String) {
    let response = bare()
        .post(at(sked, "/login"))
        .form(&[("token", secret), ("next", next)])
        .send()
        .await
        .expect("login");
    let status = response.status();
    let cookie = response
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .filter(|v| v.len() > "sked_session=".len())
        .map(str::to_string);
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, cookie, location)
}

/// The page at `path` with `cookie`, and the CSRF token its forms carry.
async fn page(sked: &Sked, cookie: &str, path: &str) -> (StatusCode, String, Option<String>) {
    let response = bare()
        .get(at(sked, path))
        .header(COOKIE, cookie)
        .send()
        .await
        .expect("page");
    let status = response.status();
    let body = response.text().await.expect("body");
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_string);
    (status, body, csrf)
}

async fn post_form(
    sked: &Sked,
    cookie: &str,
    path: &str,
    form: &[(&str, &str)],
    origin: Option<&str>,
) -> StatusCode {
    let mut request = bare()
        .post(at(sked, path))
        .header(COOKIE, cookie)
        .form(form);
    if let Some(origin) = origin {
        request = request.header(ORIGIN, origin);
    }
    request.send().await.expect("post").status()
}

async fn started() -> Sked {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let (status, _) = sked
        .put_job(
            "guarded",
            json!({
                "target": {"shell": {"command": "true", "env": {"PASSWORD": {"secret": "hunter2-clear"}}}},
                "paused": false
            }),
        )
        .await;
    assert_eq!(status, 201);
    sked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_without_their_csrf_token_or_from_another_origin_change_nothing() {
    let sked = started().await;
    let (status, cookie, _) = log_in(&sked, ADMIN_TOKEN, "/").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = cookie.expect("a session cookie");
    let (status, body, csrf) = page(&sked, &cookie, "/jobs/default/guarded").await;
    assert_eq!(status, StatusCode::OK);
    let csrf = csrf.expect("the page's forms carry a CSRF token");

    let trigger = "/jobs/default/guarded/trigger";
    for (form, origin) in [
        (vec![], None),
        (vec![("csrf", "forged")], None),
        (vec![("csrf", csrf.as_str())], Some("http://evil.example")),
    ] {
        let status = post_form(&sked, &cookie, trigger, &form, origin).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{form:?} {origin:?}");
    }
    // Another session's token does not open this one's forms.
    let (_, other, _) = log_in(&sked, ADMIN_TOKEN, "/").await;
    let (_, _, other_csrf) = page(&sked, &other.unwrap(), "/jobs").await;
    let status = post_form(
        &sked,
        &cookie,
        trigger,
        &[("csrf", &other_csrf.unwrap())],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        sked.runs("guarded").await.is_empty(),
        "nothing was triggered"
    );

    // With its token, from this origin, the same form works.
    let origin = at(&sked, "");
    let status = post_form(&sked, &cookie, trigger, &[("csrf", &csrf)], Some(&origin)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(sked.runs("guarded").await.len(), 1);

    // The page never shows a secret, and says who is logged in.
    assert!(!body.contains("hunter2-clear"));
    assert!(body.contains("admin"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_good_session_every_page_sends_to_the_login() {
    let sked = started().await;
    for cookie in [
        "",
        "sked_session=",
        "sked_session=AAAA",
        "sked_session=not*base64",
    ] {
        let response = bare()
            .get(at(&sked, "/jobs?namespace=default"))
            .header(COOKIE, cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{cookie:?}");
        let location = response.headers()[LOCATION].to_str().unwrap();
        assert!(location.starts_with("/login?next=%2Fjobs"), "{location}");
    }
    // A tampered cookie does not open.
    let (_, cookie, _) = log_in(&sked, ADMIN_TOKEN, "/").await;
    let mut cookie = cookie.unwrap();
    let last = cookie.pop().unwrap();
    cookie.push(if last == 'A' { 'B' } else { 'A' });
    let (status, _, _) = page(&sked, &cookie, "/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER);

    // The login page and the assets need no session, and every page forbids framing and
    // foreign scripts.
    let login = bare().get(at(&sked, "/login")).send().await.unwrap();
    assert_eq!(login.status(), StatusCode::OK);
    let csp = login.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    let css = bare()
        .get(at(&sked, "/assets/console.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(css.status(), StatusCode::OK);
    let missing = bare()
        .get(at(&sked, "/assets/../../etc/passwd"))
        .send()
        .await
        .unwrap();
    assert_ne!(missing.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tokens_that_read_may_log_in_and_a_revoked_one_is_logged_out() {
    let sked = started().await;
    for secret in ["", "sked_unknown", &"x".repeat(10_000)] {
        let (status, cookie, _) = log_in(&sked, secret, "/").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(cookie.is_none());
    }
    let worker = token(
        &sked,
        "a-worker",
        json!({"role": "worker", "namespaces": ["*"]}),
    )
    .await;
    let (status, cookie, _) = log_in(&sked, &worker, "/").await;
    assert_eq!((status, cookie), (StatusCode::UNAUTHORIZED, None));

    // After a login, only a path of this console is followed.
    let (_, _, location) = log_in(&sked, ADMIN_TOKEN, "//evil.example/").await;
    assert_eq!(location, "/");
    let (_, _, location) = log_in(&sked, ADMIN_TOKEN, "/jobs?namespace=default").await;
    assert_eq!(location, "/jobs?namespace=default");

    let viewer = token(
        &sked,
        "a-viewer",
        json!({"role": "viewer", "namespaces": ["default"]}),
    )
    .await;
    let (status, cookie, _) = log_in(&sked, &viewer, "/").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = cookie.unwrap();
    let (status, body, csrf) = page(&sked, &cookie, "/jobs/default/guarded").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains("/trigger") && !body.contains("/edit"));
    // A viewer posting what it is not offered meets the API's refusal.
    let csrf = csrf.expect("the logout form carries the token");
    let status = post_form(
        &sked,
        &cookie,
        "/jobs/default/guarded/trigger",
        &[("csrf", &csrf)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(sked.runs("guarded").await.is_empty());
    // The tokens page is the admin's.
    let (status, _, _) = page(&sked, &cookie, "/tokens").await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Revoking the token ends its sessions.
    let revoked = sked
        .http
        .delete(sked.url("/tokens/a-viewer"))
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, _, _) = page(&sked, &cookie, "/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

/// A login's `next` is followed only when it is a path of this console: one `/`, then neither
/// `/`, `\` nor a control character (browsers read `/<TAB>/host` as another site), and never a
/// 500 for a CR or LF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_returns_only_to_a_path_of_this_console_and_a_broken_next_is_no_error() {
    let sked = started().await;
    for next in [
        "/\t/evil.example",
        "/\n/evil.example",
        "/jobs\r\nSet-Cookie: planted=1",
        "/\r",
        "/\\evil.example",
        "//evil.example",
        "\t/jobs",
        "https://evil.example/",
    ] {
        let (status, cookie, location) = log_in(&sked, ADMIN_TOKEN, next).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{next:?}");
        assert!(cookie.is_some(), "{next:?}");
        assert_eq!(location, "/", "{next:?}");
    }
    // The same through the login page's query: percent-encoded tabs and line ends.
    for query in [
        "next=/%09/evil.example",
        "next=/jobs%0d%0aX:1",
        "next=%2F%2Fevil",
    ] {
        let response = bare()
            .get(at(&sked, &format!("/login?{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{query}");
        let body = response.text().await.unwrap();
        assert!(
            body.contains("name=\"next\" value=\"/\""),
            "{query}: the form carries `/`"
        );
    }
    let (_, _, location) = log_in(&sked, ADMIN_TOKEN, "/runs/1?x=%2F").await;
    assert_eq!(location, "/runs/1?x=%2F");
}

/// A logout ends the session on the server: the cookie, copied before, opens nothing
/// afterwards; the token itself still works for the API and for a new login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_ends_the_session_so_a_copied_cookie_opens_nothing() {
    let sked = started().await;
    let editor = token(
        &sked,
        "an-editor",
        json!({"role": "editor", "namespaces": ["default"]}),
    )
    .await;
    let (_, cookie, _) = log_in(&sked, &editor, "/").await;
    let cookie = cookie.expect("a session");
    let copied = cookie.clone();
    let (status, _, csrf) = page(&sked, &cookie, "/jobs").await;
    assert_eq!(status, StatusCode::OK);
    let csrf = csrf.expect("the logout form carries the CSRF token");
    let status = post_form(&sked, &cookie, "/logout", &[("csrf", &csrf)], None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, _, _) = page(&sked, &copied, "/jobs").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the copied cookie still opens pages"
    );
    let status = post_form(
        &sked,
        &copied,
        "/jobs/default/guarded/trigger",
        &[("csrf", &csrf)],
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the copied cookie still posts"
    );
    assert!(sked.runs("guarded").await.is_empty());
    // The token is not revoked: the API takes it, and a new login makes a new session.
    let api = common::client_with_token(Some(&editor));
    let (status, _) = common::call(&api, reqwest::Method::GET, sked.url("/jobs"), None).await;
    assert_eq!(status, 200);
    let (_, fresh, _) = log_in(&sked, &editor, "/").await;
    let (status, _, _) = page(&sked, &fresh.expect("a new session"), "/jobs").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = page(&sked, &copied, "/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "the old session stays over");
}

/// The pages that came with the overview's "now": a preference set only by its own form and
/// only to a zone that exists, a forged zone cookie read as UTC, searches and audit filters
/// bounded and held to the token's namespaces, and a secret never in the audit's diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferences_search_and_audit_filters_take_only_what_they_should() {
    let sked = started().await;
    let (_, cookie, _) = log_in(&sked, ADMIN_TOKEN, "/").await;
    let cookie = cookie.expect("a session cookie");
    let (_, _, csrf) = page(&sked, &cookie, "/preferences").await;
    let csrf = csrf.expect("the preferences form carries a CSRF token");

    // A zone is set by the form with its token, never by a forged or cross-origin post.
    let (sked_ref, cookie_ref) = (&sked, &cookie);
    let choose = |csrf: String, zone: &'static str, named: &'static str| async move {
        bare()
            .post(at(sked_ref, "/preferences"))
            .header(COOKIE, cookie_ref)
            .form(&[("csrf", csrf.as_str()), ("zone", zone), ("named", named)])
            .send()
            .await
            .expect("post")
    };
    let forged = choose("forged".into(), "named", "Asia/Tokyo").await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(forged.headers().get(SET_COOKIE).is_none());
    for (zone, named) in [
        ("named", "Mars/Olympus"),
        ("named", ""),
        ("browser", ""),
        ("moon", ""),
    ] {
        let refused = choose(csrf.clone(), zone, named).await;
        assert_eq!(
            refused.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{zone} {named}"
        );
        assert!(
            refused.headers().get(SET_COOKIE).is_none(),
            "{zone} {named}"
        );
    }
    let saved = choose(csrf.clone(), "named", "Asia/Tokyo").await;
    assert_eq!(saved.status(), StatusCode::SEE_OTHER);
    let zone_cookie = saved
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("the zone's cookie")
        .to_string();
    assert!(
        zone_cookie.starts_with("sked_zone=zone:Asia/Tokyo;"),
        "{zone_cookie}"
    );
    assert!(zone_cookie.contains("SameSite=Strict"), "{zone_cookie}");

    // A zone cookie made up by hand is read as no choice at all: UTC.
    for value in ["zone:Mars/Olympus", "zone:<script>", &"x".repeat(5000)] {
        let both = format!("{cookie}; sked_zone={value}");
        let (status, body, _) = page(&sked, &both, "/preferences").await;
        assert_eq!(status, StatusCode::OK, "{value:.40}");
        assert!(body.contains("data-zone=\"utc\""), "{value:.40}");
        assert!(!body.contains("<script>"), "{value:.40}");
    }

    // Searches and filters are bounded and say what was wrong.
    let long = "x".repeat(201);
    let (status, _, _) = page(&sked, &cookie, &format!("/search?q={long}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body, _) = page(&sked, &cookie, "/audit?since=not-a-time").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("since"));

    // A viewer of another namespace finds nothing of this one by search, and cannot ask
    // the audit trail for it.
    let viewer = token(
        &sked,
        "elsewhere-viewer",
        json!({"role": "viewer", "namespaces": ["elsewhere"]}),
    )
    .await;
    let (_, viewer_cookie, _) = log_in(&sked, &viewer, "/").await;
    let viewer_cookie = viewer_cookie.expect("a viewer's session");
    let (status, body, _) = page(&sked, &viewer_cookie, "/search?q=guarded").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !body.contains("/jobs/default/guarded"),
        "found another namespace's job"
    );
    let (status, _, _) = page(&sked, &viewer_cookie, "/audit?namespace=default").await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A change to the job's secret shows in the audit trail without the secret.
    let (status, _) = sked
        .put_job(
            "guarded",
            json!({"target": {"shell": {"command": "true",
                   "env": {"PASSWORD": {"secret": "hunter3-clear"}}}}}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body, _) = page(&sked, &cookie, "/audit?object=guarded").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("details"), "the change is shown");
    assert!(!body.contains("hunter2-clear") && !body.contains("hunter3-clear"));
}

/// Logins through an identity provider, misused without one: a server with none has no such
/// route; one whose provider is down says so and makes no session; a callback this browser did
/// not start (no flow cookie, a forged one, a huge code) is refused before the provider is
/// asked, and each refusal is audited. The client secret appears in no page and no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_through_an_identity_provider_takes_only_its_own_callback() {
    let plain = started().await;
    let (status, body, _) = page(&plain, "", "/login/oidc").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, login, _) = page(&plain, "", "/login").await;
    assert!(!login.contains("id=\"sso\""));

    let mut sked = Sked::new();
    let secret = "the-client-secret-that-never-shows";
    let secret_file = sked.dir.path().join("oidc-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).expect("secret file");
    // A provider on a port nothing listens on.
    let down = format!("http://127.0.0.1:{}", common::free_port());
    let base = sked.base();
    sked.start_server(&[
        "--public-url",
        &base,
        "--oidc-issuer",
        &down,
        "--oidc-client-id",
        "sked",
        "--oidc-client-secret-file",
        secret_file.to_str().expect("utf-8 path"),
        "--oidc-group",
        "ops=viewer:*",
    ])
    .await;
    let (_, login, _) = page(&sked, "", "/login?next=/jobs").await;
    assert!(login.contains("id=\"sso\""), "{login}");
    assert!(login.contains("/login/oidc?next=%2Fjobs"), "{login}");

    let response = bare()
        .get(at(&sked, "/login/oidc?next=/jobs"))
        .send()
        .await
        .expect("start");
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert!(response.headers().get(SET_COOKIE).is_none());
    let body = response.text().await.expect("body");
    assert!(body.contains("could not be used"), "{body}");

    let forged_flow = "sked_oidc=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let huge = "c".repeat(5000);
    for (cookie, query) in [
        ("", "code=abc&state=xyz".to_string()),
        (forged_flow, "code=abc&state=xyz".to_string()),
        ("", format!("code={huge}&state=xyz")),
        ("", "error=access_denied&state=xyz".to_string()),
        ("", String::new()),
    ] {
        let (status, body, _) = page(&sked, cookie, &format!("/login/oidc/callback?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(body.contains("not started in this browser"), "{body}");
    }
    let (_, audit) = sked.get("/audit?actor=unauthenticated").await;
    assert!(
        audit.to_string().contains("/login/oidc/callback"),
        "the refusals are audited: {audit}"
    );
    assert!(!audit.to_string().contains(secret));
    for entry in std::fs::read_dir(sked.dir.path()).expect("logs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "log") {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !log.contains(secret),
                "{} holds the client secret",
                path.display()
            );
        }
    }
}

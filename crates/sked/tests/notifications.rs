//! Alerts, black-box: a job's `notify` rules send a webhook or an email when a run fails,
//! recovers or is missed; a send that fails is retried, survives a SIGKILL of the server, and
//! each notification is delivered once; secrets in webhook headers reach only the request (never
//! another origin a redirect names), a namespace's default webhook URL is a secret no answer
//! shows, and definitions a rule cannot honour are refused with the field at fault.

mod common;

use common::webhooks::{Delivery, Receiver};
use common::{free_port, shell, Sked};

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

async fn notifications(sked: &Sked, job: &str) -> Vec<Value> {
    let (status, page) = sked.get(&format!("/notifications?job={job}")).await;
    assert_eq!(status, 200, "{page}");
    page["notifications"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

const SECRET_HEADER: &str = "Bearer s3cret-hook-token";

#[tokio::test]
async fn a_failure_and_its_recovery_are_each_delivered_once_with_secrets_only_in_the_request() {
    // The first request is refused (503): its notification is retried 5 s later.
    let (receiver, url) = Receiver::start(0, 1).await;
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "2"]).await;
    let flag = sked.dir.path().join("broken");
    std::fs::write(&flag, "").unwrap();
    let job = json!({
        "target": shell(&format!("test ! -e {}", flag.display())),
        "notify": [{
            "on": ["failed", "recovered"],
            "webhook": {"url": url, "headers": {"Authorization": {"secret": SECRET_HEADER}}}
        }]
    });
    let (status, body) = sked.put_job("flaky", job).await;
    assert_eq!(status, 201, "{body}");
    assert!(!body.to_string().contains("s3cret"), "{body}");

    let failed = sked.trigger("flaky").await;
    assert_eq!(
        sked.wait_finished(failed, Duration::from_secs(20)).await["state"],
        "failed"
    );
    std::fs::remove_file(&flag).unwrap();
    let succeeded = sked.trigger("flaky").await;
    assert_eq!(
        sked.wait_finished(succeeded, Duration::from_secs(20)).await["state"],
        "succeeded"
    );
    let fine = sked.trigger("flaky").await;
    sked.wait_finished(fine, Duration::from_secs(20)).await;

    let delivered = receiver.delivered(2, Duration::from_secs(30)).await;
    let by_event: HashMap<String, &Delivery> = delivered
        .iter()
        .map(|d| (d.body["event"].as_str().unwrap_or_default().to_string(), d))
        .collect();
    assert_eq!(by_event.len(), 2, "{delivered:?}");
    let fail = by_event["failed"];
    assert_eq!(fail.body["namespace"], "default");
    assert_eq!(fail.body["job"], "flaky");
    assert_eq!(fail.body["run_id"], failed);
    assert_eq!(fail.body["state"], "failed");
    assert!(fail.body["scheduled_for"].is_string(), "{:?}", fail.body);
    assert_eq!(fail.headers["authorization"], SECRET_HEADER);
    assert_eq!(fail.headers["sked-event"], "failed");
    assert_eq!(fail.headers["content-type"], "application/json");
    let recovered = by_event["recovered"];
    assert_eq!(recovered.body["run_id"], succeeded);
    assert_eq!(recovered.body["state"], "succeeded");

    // Nothing more comes: the third run is no recovery, and nothing is sent twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = receiver.requests();
    assert_eq!(
        requests.len(),
        3,
        "one refused, two delivered: {requests:?}"
    );
    let mut ids: Vec<&str> = requests
        .iter()
        .filter(|d| d.answered == 200)
        .map(|d| d.headers["sked-notification-id"].as_str())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        2,
        "each notification delivered once: {requests:?}"
    );

    let listed = notifications(&sked, "flaky").await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    for n in &listed {
        assert_eq!(n["state"], "sent", "{n}");
        assert_eq!(n["channel"], "webhook");
    }
    // Whichever was sent first met the 503 and went again.
    let sends: Vec<u64> = listed
        .iter()
        .map(|n| n["sends"].as_u64().unwrap())
        .collect();
    assert!(sends.contains(&1) && sends.contains(&2), "{listed:?}");
    let retried = listed.iter().find(|n| n["sends"] == 2).unwrap();
    let shown = format!("{listed:?}");
    assert!(
        !shown.contains("s3cret") && !shown.contains("/hook"),
        "{shown}"
    );
    let (_, job) = sked.get("/jobs/flaky").await;
    assert!(!job.to_string().contains("s3cret"), "{job}");
    let (_, audit) = sked.get("/audit").await;
    assert!(!audit.to_string().contains("s3cret"), "{audit}");
    let metrics = sked.metrics().await;
    let event = retried["event"].as_str().unwrap();
    for (event, outcome) in [
        (event, "retried"),
        ("failed", "sent"),
        ("recovered", "sent"),
    ] {
        let line = format!(r#"sked_notifications_total{{event="{event}",outcome="{outcome}"}} 1"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    let logs = std::fs::read_dir(sked.dir.path())
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    assert!(!logs.contains("s3cret"), "a secret reached a log line");
}

/// Runs `job` once and waits for its end; the state it ended in.
async fn run_once(sked: &Sked, job: &str) -> Value {
    let id = sked.trigger(job).await;
    sked.wait_finished(id, Duration::from_secs(20)).await["state"].clone()
}

/// Alert controls per rule, through a webhook receiver on loopback: `failures: first` tells the
/// first failure of a streak and its recovery, `repeat` tells a streak again at most that
/// often, and a rule without them still tells every failure.
#[tokio::test]
async fn a_failing_streak_is_told_once_again_after_repeat_and_at_its_recovery() {
    let (receiver, url) = Receiver::start(0, 0).await;
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "2"]).await;
    let flag = sked.dir.path().join("broken");
    std::fs::write(&flag, "").unwrap();
    let hook = |rule: &str| json!({"url": url, "headers": {"X-Rule": rule}});
    let job = json!({
        "target": shell(&format!("test ! -e {}", flag.display())),
        "notify": [
            {"on": ["failed", "recovered"], "failures": "first", "webhook": hook("first")},
            {"on": ["failed"], "failures": "first", "repeat": "5s", "webhook": hook("repeat")},
            {"on": ["failed"], "webhook": hook("every")},
        ]
    });
    let (status, body) = sked.put_job("streaky", job).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["notify"][1]["repeat"], "5s", "{body}");

    // A streak of three failures: the third comes after `repeat` has passed.
    let started = Instant::now();
    assert_eq!(run_once(&sked, "streaky").await, "failed");
    assert_eq!(run_once(&sked, "streaky").await, "failed");
    let second_within = started.elapsed();
    assert!(
        second_within < Duration::from_secs(5),
        "two runs took {second_within:?}: the test needs them inside `repeat`"
    );
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_eq!(run_once(&sked, "streaky").await, "failed");
    // Recovery, then a new streak.
    std::fs::remove_file(&flag).unwrap();
    assert_eq!(run_once(&sked, "streaky").await, "succeeded");
    std::fs::write(&flag, "").unwrap();
    assert_eq!(run_once(&sked, "streaky").await, "failed");

    let expected: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        ("first", vec!["failed", "recovered", "failed"]),
        ("repeat", vec!["failed", "failed", "failed"]),
        ("every", vec!["failed", "failed", "failed", "failed"]),
    ]);
    let total = expected.values().map(Vec::len).sum();
    receiver.delivered(total, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // By rule, in the order of the runs they tell of.
    let mut told: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for d in receiver.requests() {
        told.entry(d.headers.get("x-rule").cloned().unwrap_or_default())
            .or_default()
            .push((
                d.body["run_id"].as_i64().unwrap_or_default(),
                d.body["event"].as_str().unwrap_or_default().to_string(),
            ));
    }
    let told: BTreeMap<&str, Vec<&str>> = told
        .iter_mut()
        .map(|(rule, events)| {
            events.sort();
            (
                rule.as_str(),
                events.iter().map(|(_, e)| e.as_str()).collect(),
            )
        })
        .collect();
    println!(
        "told by rule: {told:?} (the second failure ended {second_within:?} after the first began)"
    );
    assert_eq!(told, expected);
}

#[tokio::test]
async fn a_notification_its_receiver_missed_is_sent_after_the_server_is_killed_and_back() {
    // Nothing listens at the webhook's address yet: every send fails until it does.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({
        "target": shell("exit 3"),
        "notify": [{"on": ["failed"], "webhook": {"url": url}}]
    });
    let (status, body) = sked.put_job("doomed", job).await;
    assert_eq!(status, 201, "{body}");
    let run = sked.trigger("doomed").await;
    sked.wait_finished(run, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = notifications(&sked, "doomed").await;
        if listed
            .first()
            .is_some_and(|n| n["sends"].as_u64() >= Some(1))
        {
            assert_eq!(listed[0]["state"], "pending", "{listed:?}");
            assert!(listed[0]["last_error"].is_string(), "{listed:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no send was tried: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sked.server.as_mut().unwrap().sigkill();

    let (receiver, _) = Receiver::start(port, 0).await;
    sked.start_dev(&[]).await;
    let delivered = receiver.delivered(1, Duration::from_secs(30)).await;
    assert_eq!(delivered[0].body["run_id"], run);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.requests().len(), 1, "sent once");
    let listed = notifications(&sked, "doomed").await;
    assert_eq!(listed[0]["state"], "sent", "{listed:?}");
}

/// The emails an SMTP sink kept: each one's recipients and its text.
type Mailbox = Arc<Mutex<Vec<(Vec<String>, String)>>>;

/// An SMTP relay that keeps what it is given: speaks just enough SMTP for one client.
async fn smtp_sink() -> (u16, Mailbox) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the sink");
    let port = listener.local_addr().unwrap().port();
    let mail: Mailbox = Arc::default();
    let kept = mail.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write.write_all(b"220 sink ESMTP\r\n").await;
                let mut recipients = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    let verb = line.to_ascii_uppercase();
                    let answer: &[u8] = if verb.starts_with("EHLO") || verb.starts_with("HELO") {
                        b"250 sink\r\n"
                    } else if verb.starts_with("RCPT TO:") {
                        recipients.push(line[8..].trim().to_string());
                        b"250 OK\r\n"
                    } else if verb.starts_with("DATA") {
                        let _ = write.write_all(b"354 go on\r\n").await;
                        let mut message = String::new();
                        while let Ok(Some(line)) = lines.next_line().await {
                            if line == "." {
                                break;
                            }
                            message.push_str(&line);
                            message.push('\n');
                        }
                        kept.lock()
                            .unwrap()
                            .push((std::mem::take(&mut recipients), message));
                        b"250 queued\r\n"
                    } else if verb.starts_with("QUIT") {
                        let _ = write.write_all(b"221 bye\r\n").await;
                        return;
                    } else {
                        b"250 OK\r\n"
                    };
                    if write.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, mail)
}

#[tokio::test]
async fn a_failed_run_is_emailed_through_the_relay() {
    let (port, mail) = smtp_sink().await;
    let relay = format!("smtp://127.0.0.1:{port}");
    let mut sked = Sked::new();
    sked.start_dev(&["--smtp-url", &relay, "--smtp-from", "sked@example.com"])
        .await;
    let job = json!({
        "target": shell("exit 2"),
        "notify": [{"on": ["failed"], "email": {"to": ["ops@example.com", "oncall@example.com"]}}]
    });
    let (status, body) = sked.put_job("nightly", job).await;
    assert_eq!(status, 201, "{body}");
    let run = sked.trigger("nightly").await;
    sked.wait_finished(run, Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (recipients, message) = loop {
        if let Some(first) = mail.lock().unwrap().first().cloned() {
            break first;
        }
        assert!(Instant::now() < deadline, "no email reached the relay");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(recipients, ["<ops@example.com>", "<oncall@example.com>"]);
    assert!(
        message.contains("Subject: [sked] default/nightly failed"),
        "{message}"
    );
    assert!(message.contains("From: sked@example.com"), "{message}");
    assert!(
        message.contains(&format!("run:           {run}")),
        "{message}"
    );
    assert!(message.contains("exited with code 2"), "{message}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while notifications(&sked, "nightly").await[0]["state"] != "sent" {
        assert!(Instant::now() < deadline, "the send was not recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn rules_that_cannot_be_honoured_are_refused_with_the_field_at_fault() {
    let mut sked = Sked::new();
    // `sked server` keeps webhooks, like HTTP targets, off internal addresses.
    sked.start_server(&[]).await;
    let refused = |notify: Value| json!({"target": shell("true"), "notify": notify});
    for (notify, field) in [
        (
            json!([{"on": ["failed"], "webhook": {"url": "http://127.0.0.1:9/hook"}}]),
            "notify.webhook.url",
        ),
        (
            json!([{"on": ["failed"], "webhook": {"url": "ftp://example.com/x"}}]),
            "notify[0].webhook.url",
        ),
        (
            json!([{"on": ["failed"], "email": {"to": ["ops@example.com\r\nBcc: all@example.com"]}}]),
            "notify[0].email.to",
        ),
        (
            json!([{"on": ["late"], "webhook": {"url": "https://hooks.example.com/x"}}]),
            "notify[0].late_after",
        ),
        (
            json!([{"on": ["failed"], "webhook": {"url": "https://hooks.example.com/x",
                "headers": {"X-A": "v\r\nX-Injected: 1"}}}]),
            "notify[0].webhook.headers.X-A",
        ),
    ] {
        let (status, body) = sked.put_job("refused", refused(notify.clone())).await;
        assert_eq!(status, 400, "{notify}: {body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let (status, _) = sked.get("/jobs/refused").await;
    assert_eq!(status, 404, "nothing was written");
    let (status, body) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/namespaces/default"),
        Some(json!({"notify": [{"on": ["failed"], "webhook": {"url": "http://10.0.0.1/hook"}}]})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "notify.webhook.url");
    let (status, body) = sked.get("/notifications?state=lost").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "state");
}

/// What a capturing receiver got: each request's URI and headers.
type Captured = Arc<Mutex<Vec<(String, BTreeMap<String, String>)>>>;

/// A receiver that records every request to `/capture` and sends any request to
/// `/redirect/HOST:PORT/PATH` on to `http://HOST:PORT/PATH` (307: still a POST with its body).
async fn capturing_receiver() -> (u16, Captured) {
    let got: Captured = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new()
        .route(
            "/capture",
            axum::routing::any(
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let seen = seen.clone();
                    async move {
                        let headers = headers
                            .iter()
                            .map(|(k, v)| {
                                (k.to_string(), v.to_str().unwrap_or_default().to_string())
                            })
                            .collect();
                        seen.lock().unwrap().push((uri.to_string(), headers));
                        "captured"
                    }
                },
            ),
        )
        .route(
            "/redirect/{*to}",
            axum::routing::any(
                |axum::extract::Path(to): axum::extract::Path<String>| async move {
                    axum::response::Redirect::temporary(&format!("http://{to}"))
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, got)
}

/// Waits until `got` holds `count` requests.
async fn captured(got: &Captured, count: usize) -> Vec<(String, BTreeMap<String, String>)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = got.lock().unwrap().clone();
        if now.len() >= count {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {count}: {now:?}",
            now.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_webhook_redirected_to_another_origin_carries_no_secret_header() {
    let (a, _) = capturing_receiver().await;
    let (b, got_b) = capturing_receiver().await;
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({
        "target": shell("exit 1"),
        "notify": [{
            "on": ["failed"],
            "webhook": {
                "url": format!("http://127.0.0.1:{a}/redirect/127.0.0.1:{b}/capture"),
                "headers": {
                    "X-Api-Key": {"secret": "sealed-hook-key"},
                    "Authorization": "Bearer clear-hook-token",
                    "X-Plain": "visible"
                }
            }
        }]
    });
    let (status, body) = sked.put_job("fails", job).await;
    assert_eq!(status, 201, "{body}");
    let run = sked.trigger("fails").await;
    sked.wait_finished(run, Duration::from_secs(20)).await;
    let got = captured(&got_b, 1).await;
    let sent = &got[0].1;
    assert_eq!(
        sent.get("sked-event").map(String::as_str),
        Some("failed"),
        "{sent:?}"
    );
    assert_eq!(
        sent.get("x-plain").map(String::as_str),
        Some("visible"),
        "{sent:?}"
    );
    for dropped in ["x-api-key", "authorization"] {
        assert!(
            !sent.contains_key(dropped),
            "{dropped} went to another origin: {sent:?}"
        );
    }
}

#[tokio::test]
async fn a_namespaces_default_webhook_url_is_a_secret_no_answer_shows() {
    const TOKEN: &str = "hook-token-in-url-77e1";
    let (port, got) = capturing_receiver().await;
    let mut sked = Sked::new();
    sked.start_server(&["--http-target-allow", "127.0.0.1/32"])
        .await;
    sked.start_worker("w", 2);
    let url = format!("http://127.0.0.1:{port}/capture?token={TOKEN}");
    let settings = json!({"notify": [{"on": ["failed"], "webhook": {"url": url}}]});
    let (status, body) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/namespaces/team-a"),
        Some(settings),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let shown = body["notify"][0]["webhook"]["url"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        shown.starts_with("v2:") && !body.to_string().contains(TOKEN),
        "{body}"
    );

    // Neither a viewer nor the admin reads it back in clear, in any answer.
    let viewer = common::client_for(
        &sked,
        "viewer-a",
        json!({"role": "viewer", "namespaces": ["team-a"]}),
    )
    .await;
    for client in [&viewer, &sked.http] {
        for path in ["/namespaces/team-a", "/namespaces"] {
            let (status, body) =
                common::call(client, reqwest::Method::GET, sked.url(path), None).await;
            assert_eq!(status, 200, "{body}");
            assert!(!body.to_string().contains(TOKEN), "{path}: {body}");
        }
    }
    let (_, audit) = sked.get("/audit?limit=100").await;
    assert!(!audit.to_string().contains(TOKEN), "{audit}");

    // Sent back as it was read, it is kept; a failed run of the namespace is delivered to it.
    let (status, body) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/namespaces/team-a"),
        Some(json!({"notify": [{"on": ["failed"], "webhook": {"url": shown}}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/jobs/fails?namespace=team-a"),
        Some(json!({"target": shell("exit 1")})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, run) = sked
        .post("/jobs/fails/trigger?namespace=team-a", json!(null))
        .await;
    assert_eq!(status, 201, "{run}");
    let got = captured(&got, 1).await;
    assert_eq!(got[0].0, format!("/capture?token={TOKEN}"), "{got:?}");
    let (_, listed) = sked.get("/notifications?namespace=team-a").await;
    assert!(!listed.to_string().contains(TOKEN), "{listed}");
    // Pasted into another namespace's settings, the sealed URL does not open.
    let (status, body) = common::call(
        &sked.http,
        reqwest::Method::PUT,
        sked.url("/namespaces/team-b"),
        Some(json!({"notify": [{"on": ["failed"], "webhook": {"url": shown}}]})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "notify[0].webhook.url", "{body}");
}

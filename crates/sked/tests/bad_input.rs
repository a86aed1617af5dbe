//! Bad input gets a 4xx naming the field, and changes nothing.

mod common;

use common::{shell, Sked};
use serde_json::{json, Value};

async fn job_names(sked: &Sked) -> Vec<String> {
    let (status, page) = sked.get("/jobs").await;
    assert_eq!(status, 200);
    page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn bad_definitions_are_rejected_with_the_field_named() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    assert_eq!(
        sked.put_job(
            "good",
            json!({"schedule": {"every": "1h"}, "target": shell("true")})
        )
        .await
        .0,
        201
    );
    let before = job_names(&sked).await;

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "cron",
            json!({"schedule": {"cron": "61 * * * *"}, "target": shell("true")}),
            "schedule.cron",
        ),
        (
            "cron2",
            json!({"schedule": {"cron": "* * *"}, "target": shell("true")}),
            "schedule.cron",
        ),
        (
            "tz",
            json!({"schedule": {"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "target": shell("true")}),
            "schedule.timezone",
        ),
        (
            "neg",
            json!({"schedule": {"every": "-5s"}, "target": shell("true")}),
            "schedule.every",
        ),
        (
            "two",
            json!({"target": {"shell": {"command": "true"}, "http": {"url": "http://127.0.0.1:1/"}}}),
            "target",
        ),
        (
            "unknown",
            json!({"target": shell("true"), "colour": "blue"}),
            "colour",
        ),
        (
            "nested",
            json!({"target": {"shell": {"command": "true", "shel": 1}}}),
            "target.shell.shel",
        ),
        (
            "retry",
            json!({"target": shell("true"), "retry": {"max_attempts": 0}}),
            "retry.max_attempts",
        ),
        (
            "url",
            json!({"target": {"http": {"url": "ftp://x"}}}),
            "target.http.url",
        ),
        (
            "good",
            json!({"name": "other", "target": shell("true")}),
            "name",
        ),
        // Values that used to be accepted and fail only when a run starts.
        (
            "nulcmd",
            json!({"target": shell("echo a\u{0}b")}),
            "target.shell.command",
        ),
        (
            "nularg",
            json!({"target": {"shell": {"command": "echo", "args": ["a\u{0}"]}}}),
            "target.shell.args",
        ),
        (
            "nulenv",
            json!({"target": {"shell": {"command": "true", "env": {"X": "a\u{0}b"}}}}),
            "target.shell.env.X",
        ),
        (
            "nulcwd",
            json!({"target": {"shell": {"command": "true", "cwd": "/tmp\u{0}x"}}}),
            "target.shell.cwd",
        ),
        (
            "hdrname",
            json!({"target": {"http": {"url": "http://127.0.0.1:9/", "headers": {"Bad Name": "x"}}}}),
            "target.http.headers",
        ),
        (
            "hdrcrlf",
            json!({"target": {"http": {"url": "http://127.0.0.1:9/", "headers": {"X-A": "a\r\nInjected: 1"}}}}),
            "target.http.headers.X-A",
        ),
        (
            "v6",
            json!({"target": {"http": {"url": "http://[::1"}}}),
            "target.http.url",
        ),
        (
            "port",
            json!({"target": {"http": {"url": "http://127.0.0.1:99999/"}}}),
            "target.http.url",
        ),
        // Values whose arithmetic overflowed, leaving the job silently completed.
        (
            "anchor",
            json!({"schedule": {"every": "1h", "anchor": "1700-01-01T00:00:00Z"}, "target": shell("true")}),
            "schedule.anchor",
        ),
        (
            "century",
            json!({"schedule": {"every": "300years"}, "target": shell("true")}),
            "schedule.every",
        ),
        (
            "jitter",
            json!({"schedule": {"every": "1m", "jitter": "500years"}, "target": shell("true")}),
            "schedule.jitter",
        ),
        (
            "before1970",
            json!({"schedule": {"at": "1969-07-20T20:17:00Z"}, "target": shell("true")}),
            "schedule.at",
        ),
    ];
    for (name, body, field) in cases {
        let (status, err) = sked.put_job(name, body).await;
        assert_eq!(status, 400, "{name}: {err}");
        assert_eq!(err["error"]["field"], field, "{name}: {err}");
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}: {err}"
        );
        assert!(err["error"]["code"].is_string(), "{name}: {err}");
    }

    let resp = sked
        .http
        .put(sked.url("/jobs/huge"))
        .header("content-type", "application/json")
        .body(vec![b' '; 50 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["field"], "body", "{err}");

    let resp = sked
        .http
        .put(sked.url("/jobs/broken"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // A body that is not JSON by its type is refused before it is read.
    let resp = sked
        .http
        .put(sked.url("/jobs/broken"))
        .header("content-type", "text/plain")
        .body(r#"{"target": {"shell": {"command": "true"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);

    let (status, err) = sked
        .post("/jobs", json!({"name": "good", "target": shell("true")}))
        .await;
    assert_eq!(status, 409, "{err}");
    let (status, err) = sked.get("/jobs/nope").await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, err) = sked.get("/jobs?limit=0").await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (400, Some("limit"))
    );

    assert_eq!(
        job_names(&sked).await,
        before,
        "rejected requests wrote nothing"
    );
    let (_, good) = sked.get("/jobs/good").await;
    assert_eq!(
        good["schedule"]["every"], "1h",
        "the existing job is untouched: {good}"
    );
}

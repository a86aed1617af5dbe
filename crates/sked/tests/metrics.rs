//! `/metrics` through the real binary: the histograms and labelled counters an operator graphs
//! fill as jobs run, no job's name reaches a label unless the job asks, and a job's own series
//! are served only to a token that sees its namespace. (That the Grafana dashboard queries
//! only metrics the server has is checked beside the registry, in `sked-server`'s metrics.)

mod common;

use common::{call, client_with_token, shell, token, Sked};
use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};

/// The value of the sample of `name` whose labels include every pair of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        let has_all = labels
            .iter()
            .all(|(k, v)| set.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
        if has_all {
            value.trim().parse().ok()
        } else {
            None
        }
    })
}

#[tokio::test]
async fn runs_fill_the_histograms_and_counters_by_namespace_outcome_and_reason() {
    let mut sked = Sked::new();
    // A connection whose broker is not there: `sked_broker_up` is exposed (at 0) all the same.
    sked.start_dev(&["--broker", "main=amqp://guest:guest@127.0.0.1:1/%2f"])
        .await;
    let jobs = [
        (
            "quiet-success-job",
            json!({"schedule": {"every": "200ms"}, "target": shell("true")}),
        ),
        (
            "loud-failure-job",
            json!({"schedule": {"every": "300ms"}, "target": shell("exit 3")}),
        ),
        (
            "overlapping-slow-job",
            json!({"schedule": {"every": "200ms"}, "overlap": "skip", "target": shell("sleep 1")}),
        ),
    ];
    for (name, job) in &jobs {
        let (status, body) = sked.put_job(name, job.clone()).await;
        assert_eq!(status, 201, "{body}");
    }
    // One job asks to be counted by name.
    let (status, body) = sked
        .put_job(
            "named-job",
            json!({"schedule": {"every": "300ms"}, "target": shell("true"), "job_metrics": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let ns = ("namespace", "default");
    let wanted: [(&str, Vec<(&str, &str)>); 7] = [
        (
            "sked_job_runs_total",
            vec![ns, ("job", "named-job"), ("outcome", "succeeded")],
        ),
        ("sked_runs_total", vec![ns, ("outcome", "succeeded")]),
        ("sked_runs_total", vec![ns, ("outcome", "failed")]),
        (
            "sked_runs_total",
            vec![ns, ("outcome", "skipped"), ("reason", "overlap")],
        ),
        ("sked_fire_lateness_seconds_count", vec![ns]),
        ("sked_start_lateness_seconds_count", vec![ns]),
        (
            "sked_attempt_duration_seconds_count",
            vec![ns, ("outcome", "failed")],
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = sked.metrics().await;
        let missing: Vec<_> = wanted
            .iter()
            .filter(|(name, labels)| sample(&text, name, labels).unwrap_or(0.0) < 1.0)
            .collect();
        if missing.is_empty() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "still zero or absent after 30 s: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // The histograms count what the counters count: every succeeded run's attempt was timed.
    let succeeded = sample(&text, "sked_runs_total", &[ns, ("outcome", "succeeded")]).unwrap();
    let timed = sample(
        &text,
        "sked_attempt_duration_seconds_count",
        &[ns, ("outcome", "succeeded")],
    )
    .unwrap_or(0.0);
    assert!(
        timed >= succeeded,
        "{timed} timed, {succeeded} succeeded\n{text}"
    );
    // A no-op's fire lateness lands in the small buckets, not at +Inf.
    let fired = sample(&text, "sked_fire_lateness_seconds_count", &[ns]).unwrap();
    let within_a_second = sample(
        &text,
        "sked_fire_lateness_seconds_bucket",
        &[ns, ("le", "1.0")],
    )
    .expect("a 1 s bucket");
    assert!(within_a_second >= fired * 0.9, "{text}");
    assert!(
        sample(
            &text,
            "sked_store_call_seconds_count",
            &[("call", "record_fires")]
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "sked_broker_up", &[("connection", "main")]),
        Some(0.0),
        "{text}"
    );
    // Bounded labels: no job's name is ever a label value, unless the job asked.
    for (name, _) in &jobs {
        assert!(!text.contains(name), "job name {name} in /metrics:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[tokio::test]
async fn metrics_are_served_as_openmetrics_text() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let resp = reqwest::get(format!("{}/metrics", sked.base()))
        .await
        .expect("metrics");
    assert_eq!(resp.status().as_u16(), 200);
    let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("# TYPE sked_fires counter\nsked_fires_total 0\n"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

/// `/metrics` as `client` gets it: the status and the text.
async fn metrics_as(sked: &Sked, client: &reqwest::Client) -> (u16, String) {
    let resp = client
        .get(format!("{}/metrics", sked.base()))
        .send()
        .await
        .expect("metrics");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

#[tokio::test]
async fn a_jobs_own_series_are_served_only_to_a_token_that_sees_its_namespace() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 4);
    for (namespace, name) in [("team-a", "alpha-named-job"), ("team-b", "bravo-named-job")] {
        let job =
            json!({"schedule": {"every": "200ms"}, "target": shell("true"), "job_metrics": true});
        let url = sked.url(&format!("/jobs/{name}?namespace={namespace}"));
        let (status, body) = call(&sked.http, Method::PUT, url, Some(job)).await;
        assert_eq!(status, 201, "{body}");
    }
    let named = |text: &str, job: &str| {
        text.lines()
            .any(|l| l.starts_with("sked_job_runs_total{") && l.contains(job))
    };
    // The admin token sees every namespace, so both jobs' series.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = metrics_as(&sked, &sked.http).await;
        if named(&text, "alpha-named-job") && named(&text, "bravo-named-job") {
            break;
        }
        assert!(Instant::now() < deadline, "no per-job series yet:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Without a token: the aggregate series, no job's name.
    let (status, text) = metrics_as(&sked, &client_with_token(None)).await;
    assert_eq!(status, 200);
    assert!(
        sample(
            &text,
            "sked_runs_total",
            &[("namespace", "team-a"), ("outcome", "succeeded")]
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    for job in ["alpha-named-job", "bravo-named-job"] {
        assert!(!text.contains(job), "{job} shown without a token:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");

    // A viewer of team-a: team-a's job, not team-b's.
    let viewer = token(
        &sked,
        "viewer-a",
        json!({"role": "viewer", "namespaces": ["team-a"]}),
    )
    .await;
    let (status, text) = metrics_as(&sked, &client_with_token(Some(&viewer))).await;
    assert_eq!(status, 200);
    assert!(named(&text, "alpha-named-job"), "{text}");
    assert!(!text.contains("bravo-named-job"), "{text}");

    // A token that is sent must be valid.
    let (status, _) = metrics_as(&sked, &client_with_token(Some("sked_not-a-token"))).await;
    assert_eq!(status, 401);
}

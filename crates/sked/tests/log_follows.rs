//! Followed logs through the real binary: a follow ends as soon as its client goes, and
//! follows beyond the server's bound, or beyond a token's or a namespace's share of it, are
//! refused with 429 and `Retry-After`; a revoked token's follows end within a second.

mod common;

use common::{shell, Sked};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[tokio::test]
async fn abandoned_follows_end_and_extra_ones_are_refused() {
    let mut sked = Sked::new();
    sked.start_dev(&["--max-log-follows", "4"]).await;
    let job = json!({"target": shell("echo started; sleep 30")});
    assert_eq!(sked.put_job("long", job).await.0, 201);
    let (status, run) = sked.post("/jobs/long/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("run id");
    let url = sked.url(&format!("/runs/{id}/log?follow=true"));

    // Each follower on a client of its own, so dropping it closes its connection.
    let mut open = Vec::new();
    for _ in 0..4 {
        let client = reqwest::Client::new();
        let mut resp = client.get(&url).send().await.expect("follow");
        assert_eq!(resp.status().as_u16(), 200);
        // Everything the run will print for 30 s has arrived: from here on, only the
        // client's going can end the follow.
        let first = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("output within 10 s")
            .expect("a chunk");
        assert_eq!(first.as_deref(), Some(&b"started\n"[..]));
        open.push((client, resp));
    }
    assert_eq!(sked.metric("sked_log_follows").await, 4);
    let resp = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect("fifth follow");
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"), "{resp:?}");
    let body: Value = resp.json().await.expect("error body");
    assert_eq!(body["error"]["code"], "too_many_follows", "{body}");

    // The clients go while the run still runs and prints nothing: their follows end.
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sked.metric("sked_log_follows").await > 0 {
        assert!(
            Instant::now() < deadline,
            "abandoned follows still polling: {}",
            sked.metric("sked_log_follows").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resp = reqwest::Client::new()
        .get(&url)
        .send()
        .await
        .expect("follow again");
    assert_eq!(
        resp.status().as_u16(),
        200,
        "room again after the others left"
    );
}

/// The follows are shared: one viewer holds at most its part (a third of them alone), another
/// token of its namespace and a token of another namespace still get one; and when the first
/// viewer's token is revoked, its open follows end, and its console session stops working,
/// within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_are_shared_between_tokens_and_end_when_the_token_is_revoked() {
    let mut sked = Sked::new();
    // No worker: the triggered runs stay queued, and their follows stay open.
    sked.start_server(&["--max-log-follows", "12"]).await;
    let mut runs = Vec::new();
    for namespace in ["team-a", "team-b"] {
        let answer = sked
            .http
            .put(sked.url(&format!("/namespaces/{namespace}")))
            .json(&json!({}))
            .send()
            .await
            .expect("PUT namespace");
        assert_eq!(answer.status().as_u16(), 201);
        let job = json!({"target": shell("true")});
        let answer = sked
            .http
            .put(sked.url(&format!("/jobs/waits?namespace={namespace}")))
            .json(&job)
            .send()
            .await
            .expect("PUT job");
        assert_eq!(answer.status().as_u16(), 201);
        let (status, run) = sked
            .post(
                &format!("/jobs/waits/trigger?namespace={namespace}"),
                json!({}),
            )
            .await;
        assert_eq!(status, 201, "{run}");
        runs.push(run["id"].as_i64().expect("run id"));
    }
    let viewer = |namespace: &str| json!({"role": "viewer", "namespaces": [namespace]});
    let flooder = common::token(&sked, "flooder", viewer("team-a")).await;
    let neighbour = common::token(&sked, "neighbour", viewer("team-a")).await;
    let stranger = common::token(&sked, "stranger", viewer("team-b")).await;
    let follow = |secret: &str, run: i64| {
        let request = common::client_with_token(Some(secret))
            .get(sked.url(&format!("/runs/{run}/log?follow=true")));
        async move { request.send().await.expect("follow") }
    };

    // One viewer takes follows until refused: a third of the node's twelve.
    let mut held = Vec::new();
    loop {
        let response = follow(&flooder, runs[0]).await;
        if response.status().as_u16() == 429 {
            assert!(response.headers().contains_key("retry-after"));
            let body: Value = response.json().await.expect("error body");
            assert_eq!(body["error"]["code"], "too_many_follows", "{body}");
            break;
        }
        assert_eq!(response.status().as_u16(), 200);
        held.push(response);
        assert!(held.len() <= 12, "one viewer took every follow");
    }
    println!("one viewer holds {} of 12 follows", held.len());
    assert_eq!(held.len(), 4);
    let neighbours = follow(&neighbour, runs[0]).await;
    assert_eq!(neighbours.status().as_u16(), 200, "another token of team-a");
    let strangers = follow(&stranger, runs[1]).await;
    assert_eq!(strangers.status().as_u16(), 200, "a token of team-b");

    // The flooder's console session, opened before the revocation.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = no_redirect
        .post(format!("{}/login", sked.base()))
        .form(&[("token", flooder.as_str()), ("next", "/")])
        .send()
        .await
        .expect("login");
    assert_eq!(login.status().as_u16(), 303);
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let console_page = |path: &str| {
        no_redirect
            .get(format!("{}{path}", sked.base()))
            .header("cookie", &cookie)
            .send()
    };
    assert_eq!(
        console_page("/jobs?namespace=team-a")
            .await
            .expect("page")
            .status()
            .as_u16(),
        200
    );

    // Revoked: its follows end, and its session is refused, within a second.
    let ends: Vec<_> = held
        .into_iter()
        .map(|mut response| {
            tokio::spawn(async move {
                while let Ok(Some(_)) = response.chunk().await {}
                Instant::now()
            })
        })
        .collect();
    let revoked = sked
        .http
        .delete(sked.url("/tokens/flooder"))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    let revoked_at = Instant::now();
    for end in ends {
        let ended = tokio::time::timeout(Duration::from_secs(3), end)
            .await
            .expect("a follow of the revoked token still streams after 3 s")
            .expect("reader");
        let after = ended.saturating_duration_since(revoked_at);
        println!("a follow of the revoked token ended {after:?} after the revocation");
        assert!(after < Duration::from_secs(1), "{after:?}");
    }
    loop {
        let status = console_page("/jobs?namespace=team-a")
            .await
            .expect("page")
            .status()
            .as_u16();
        if status == 303 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "the revoked token's console session still works"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "the console session ended {:?} after the revocation",
        revoked_at.elapsed()
    );
    // The others' follows go on.
    drop((neighbours, strangers));
}

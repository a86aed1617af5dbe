//! Every refusal is JSON `{"error": {"code", "message", "field"}}` with a 4xx status, including
//! the ones axum's router and extractors produce (DESIGN.md, section 1, point 4): values of the
//! wrong type in the query or the path, a wrong method, an unknown path. Also: a 413 quotes the
//! limit of the route it came from, and a completion from a worker the server does not know (or
//! declared dead) is refused with 410 as a lease is.

mod common;

use common::Server;

use serde_json::{json, Value};
use sked_server::ServerConfig;
use std::time::Duration;

/// Longest any one test may take, server start included.
const TEST_LIMIT: Duration = Duration::from_secs(60);

/// An answer: status, headers, and the body as JSON (`Value::Null` when it is not JSON).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    json: Value,
    text: String,
}

impl Answer {
    /// Asserts that this is an API error with `status` and `code`, and returns its `field`.
    fn error(&self, status: u16, code: &str, what: &str) -> Option<String> {
        assert_eq!(self.status, status, "{what}: {}", self.text);
        let content_type = self
            .headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        assert!(
            content_type.starts_with("application/json"),
            "{what}: content-type {content_type:?}, body {:?}",
            self.text
        );
        let error = &self.json["error"];
        assert_eq!(error["code"], code, "{what}: {}", self.text);
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: no message: {}",
            self.text
        );
        assert!(
            error.as_object().unwrap().contains_key("field"),
            "{what}: no field: {}",
            self.text
        );
        error["field"].as_str().map(str::to_string)
    }
}

/// Requests whose answers are read as JSON.
trait Ask {
    async fn try_ask(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, reqwest::Error>;
    async fn ask(&self, method: &str, path: &str, body: Option<Value>) -> Answer;
    async fn ask_too_big(&self, path: &str, size: usize) -> Answer;
}

impl Ask for Server {
    async fn try_ask(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, reqwest::Error> {
        // Sent as the route's clients send it: output as bytes, everything else as JSON.
        let content_type = if path.starts_with("/api/v1/attempts/") {
            "application/octet-stream"
        } else {
            "application/json"
        };
        let body = body.map(|bytes| (content_type, bytes));
        let (status, headers, bytes) = self.try_send(method, path, body).await?;
        Ok(Answer {
            status,
            headers,
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    async fn ask(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let body = body.map(|v| serde_json::to_vec(&v).unwrap());
        match self.try_ask(method, path, body).await {
            Ok(answer) => answer,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// Sends a body over a limit. The server answers before it has read the whole body, so the
    /// upload itself may be cut short: try a few times for the answer.
    async fn ask_too_big(&self, path: &str, size: usize) -> Answer {
        for _ in 0..5 {
            if let Ok(answer) = self.try_ask("POST", path, Some(vec![b' '; size])).await {
                return answer;
            }
        }
        panic!("no answer to a body of {size} bytes to {path}");
    }
}

async fn run_test(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, test)
        .await
        .expect("the test took too long");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_and_path_values_of_the_wrong_type_are_json_naming_the_parameter() {
    run_test(async {
        let server = Server::start(ServerConfig::default()).await;
        for (method, path, field) in [
            ("GET", "/api/v1/jobs?limit=abc", "limit"),
            ("GET", "/api/v1/jobs?limit=-1", "limit"),
            ("GET", "/api/v1/runs?limit=1.5", "limit"),
            ("GET", "/api/v1/jobs/j/runs?limit=x", "limit"),
            ("GET", "/api/v1/jobs/j/preview?count=many", "count"),
            ("GET", "/api/v1/runs/abc", "id"),
            ("GET", "/api/v1/runs/99999999999999999999", "id"),
            ("POST", "/api/v1/runs/abc/cancel", "id"),
            ("GET", "/api/v1/runs/abc/log", "id"),
            ("GET", "/api/v1/runs/1/log?follow=maybe", "follow"),
            ("GET", "/api/v1/runs/1/log?attempt=first", "attempt"),
            ("POST", "/api/v1/attempts/1/log", "token"),
            ("POST", "/api/v1/attempts/1/log?token=abc", "token"),
            ("POST", "/api/v1/attempts/abc/log?token=1", "id"),
            ("GET", "/api/v1/jobs/%FF", "name"),
        ] {
            let what = format!("{method} {path}");
            let answer = server.ask(method, path, None).await;
            let got = answer.error(400, "invalid_request", &what);
            assert_eq!(got.as_deref(), Some(field), "{what}: {}", answer.text);
        }
        // A refused request changed nothing.
        let runs = server.ask("GET", "/api/v1/runs", None).await;
        assert_eq!(runs.json["runs"], json!([]));
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_or_an_unknown_path_is_json() {
    run_test(async {
        let server = Server::start(ServerConfig::default()).await;
        for (method, path, allowed) in [
            ("PATCH", "/api/v1/jobs", "GET,HEAD,POST"),
            ("DELETE", "/api/v1/runs/1", "GET,HEAD"),
            ("GET", "/api/v1/workers/w/complete", "POST"),
            ("PUT", "/api/v1/openapi.json", "GET,HEAD"),
            ("POST", "/healthz", "GET,HEAD"),
            ("DELETE", "/metrics", "GET,HEAD"),
        ] {
            let what = format!("{method} {path}");
            let answer = server.ask(method, path, None).await;
            assert_eq!(answer.error(405, "method_not_allowed", &what), None);
            let allow = answer.headers.get("allow").map(|v| v.to_str().unwrap());
            let mut allow: Vec<&str> = allow
                .unwrap_or_else(|| panic!("{what}: no Allow header"))
                .split(',')
                .map(str::trim)
                .collect();
            allow.sort_unstable();
            assert_eq!(allow.join(","), allowed, "{what}");
        }
        for (method, path) in [
            ("GET", "/nope"),
            ("POST", "/nope"),
            ("GET", "/api"),
            ("GET", "/api/v1"),
            ("GET", "/api/v1/"),
            ("GET", "/api/v1/nope"),
            ("DELETE", "/api/v2/jobs"),
            ("GET", "/api/v1/jobs/j/nope"),
        ] {
            let what = format!("{method} {path}");
            let answer = server.ask(method, path, None).await;
            assert_eq!(answer.error(404, "not_found", &what), None);
        }
        // `/` is the web console: without a session, its login form.
        let console = server.ask("GET", "/", None).await;
        assert_eq!(console.status, 200);
        assert!(console.text.contains("name=\"token\""), "{}", console.text);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_told_the_limit_of_its_route() {
    run_test(async {
        let server = Server::start(ServerConfig::default()).await;
        let mib = 1024 * 1024;

        let answer = server.ask_too_big("/api/v1/jobs", 2 * mib).await;
        assert_eq!(
            answer
                .error(413, "invalid_body", "a job of 2 MiB")
                .as_deref(),
            Some("body")
        );
        let message = answer.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(&mib.to_string()), "{message}");

        // Output may be 8 MiB per request: 2 MiB reaches the handler (no such worker) ...
        let path = "/api/v1/attempts/1/log?token=1&worker=nobody";
        let answer = server
            .try_ask("POST", path, Some(vec![b' '; 2 * mib]))
            .await
            .unwrap();
        answer.error(410, "unknown_worker", "2 MiB of output");
        // ... and past 8 MiB the 413 says 8 MiB, not the 1 MiB of the other routes.
        let answer = server.ask_too_big(path, 9 * mib).await;
        assert_eq!(
            answer
                .error(413, "invalid_body", "9 MiB of output")
                .as_deref(),
            Some("body")
        );
        let message = answer.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(&(8 * mib).to_string()), "{message}");
        assert!(!message.contains(&mib.to_string()), "{message}");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_refuses_an_unknown_or_dead_worker_with_410() {
    run_test(async {
        let server = Server::start(ServerConfig {
            heartbeat_interval: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_millis(500),
            ..ServerConfig::default()
        })
        .await;
        let nothing = json!({"completions": []});

        // Never registered.
        let answer = server
            .ask(
                "POST",
                "/api/v1/workers/no-such-worker/complete",
                Some(nothing.clone()),
            )
            .await;
        answer.error(410, "unknown_worker", "complete of an unknown worker");

        // Registered: it leases a run, then falls silent and is declared dead.
        let hello = json!({"name": "w", "slots": 1});
        let registered = server.ask("POST", "/api/v1/workers", Some(hello)).await;
        assert_eq!(registered.status, 201, "{}", registered.text);
        let worker = registered.json["worker_id"].as_str().unwrap().to_string();
        let complete = format!("/api/v1/workers/{worker}/complete");
        let answer = server.ask("POST", &complete, Some(nothing.clone())).await;
        assert_eq!(answer.status, 200, "{}", answer.text);

        let job = json!({"target": {"shell": {"command": "true"}}});
        let put = server.ask("PUT", "/api/v1/jobs/j", Some(job)).await;
        assert_eq!(put.status, 201, "{}", put.text);
        let run = server.ask("POST", "/api/v1/jobs/j/trigger", None).await;
        assert_eq!(run.status, 201, "{}", run.text);
        let run_id = run.json["id"].as_i64().unwrap();
        let lease = format!("/api/v1/workers/{worker}/lease");
        let ask = json!({"max": 1, "wait_ms": 200});
        let leased = server.ask("POST", &lease, Some(ask.clone())).await;
        let attempt = leased.json["attempts"][0].clone();
        assert_eq!(attempt["run_id"], run_id, "{}", leased.text);

        let mut dead = false;
        for _ in 0..100 {
            let workers = server.ask("GET", "/api/v1/workers", None).await;
            if workers.json["workers"][0]["alive"] == false {
                dead = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(dead, "the silent worker was not declared dead");

        let report = json!({"completions": [{
            "attempt_id": attempt["attempt_id"], "token": attempt["token"], "outcome": "succeeded",
        }]});
        let answer = server.ask("POST", &complete, Some(report)).await;
        answer.error(410, "unknown_worker", "complete of a dead worker");
        // As lease and heartbeat say.
        let answer = server.ask("POST", &lease, Some(ask)).await;
        answer.error(410, "unknown_worker", "lease of a dead worker");
        let beat = format!("/api/v1/workers/{worker}/heartbeat");
        let answer = server.ask("POST", &beat, Some(json!({}))).await;
        answer.error(410, "unknown_worker", "heartbeat of a dead worker");

        // The completion was not needed: the attempt was taken away when the worker was
        // declared dead, and the run is queued again for another worker.
        let view = server
            .ask("GET", &format!("/api/v1/runs/{run_id}"), None)
            .await;
        assert_eq!(view.json["state"], "queued", "{}", view.text);
        assert_eq!(view.json["attempt_history"][0]["state"], "lost");
        server.stop().await;
    })
    .await;
}

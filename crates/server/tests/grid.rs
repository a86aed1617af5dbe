//! `GET /api/v1/runs/grid` over HTTP: rows are the job list's page (its filters, the label
//! filter, its cursor), cells each job's newest runs in the window; every bound is refused with
//! the API's 400 naming its parameter, and a token sees only the namespaces it reaches.

mod common;

use common::Server;
use serde_json::{json, Value};
use sked_server::ServerConfig;
use std::time::Duration;

const TEST_LIMIT: Duration = Duration::from_secs(60);

async fn call(
    server: &Server,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server
        .http
        .request(method, format!("{}{path}", server.base));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn put_job(server: &Server, name: &str, spec: Value) {
    let (status, body) = call(
        server,
        None,
        "PUT",
        &format!("/api/v1/jobs/{name}"),
        Some(spec),
    )
    .await;
    assert!(status == 201 || status == 200, "{name}: {status} {body}");
}

async fn trigger(server: &Server, name: &str) -> i64 {
    let (status, body) = call(
        server,
        None,
        "POST",
        &format!("/api/v1/jobs/{name}/trigger"),
        None,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_i64().unwrap()
}

fn names(page: &Value) -> Vec<String> {
    page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grid_pages_jobs_with_their_runs_and_refuses_what_is_out_of_bounds() {
    tokio::time::timeout(TEST_LIMIT, async {
        let server = Server::start(ServerConfig::default()).await;
        let shell = json!({"shell": {"command": "true"}});
        put_job(
            &server,
            "grid-a",
            json!({"target": shell, "routing": {"labels": {"zone": "eu"}}}),
        )
        .await;
        put_job(
            &server,
            "grid-b",
            json!({"target": shell, "schedule": {"every": "1h"}}),
        )
        .await;
        let first = trigger(&server, "grid-a").await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = trigger(&server, "grid-a").await;
        let cancel = format!("/api/v1/runs/{first}/cancel");
        let (status, _) = call(&server, None, "POST", &cancel, None).await;
        assert_eq!(status, 200);

        let (status, page) = call(&server, None, "GET", "/api/v1/runs/grid", None).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(names(&page), ["grid-a", "grid-b"]);
        let a = &page["jobs"][0];
        assert_eq!(a["kind"], "manual");
        assert_eq!(a["state"], "active");
        let runs: Vec<(i64, &str)> = a["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["id"].as_i64().unwrap(), r["state"].as_str().unwrap()))
            .collect();
        assert_eq!(
            runs,
            [(second, "queued"), (first, "cancelled")],
            "newest first"
        );
        assert_eq!(page["jobs"][1]["runs"], json!([]));
        assert_eq!(page["next_cursor"], Value::Null);

        // One run a job, one job a page, and the next page by its cursor.
        let (_, one) = call(
            &server,
            None,
            "GET",
            "/api/v1/runs/grid?jobs=1&instants=1",
            None,
        )
        .await;
        assert_eq!(names(&one), ["grid-a"]);
        assert_eq!(one["jobs"][0]["runs"].as_array().unwrap().len(), 1);
        let cursor = one["next_cursor"]
            .as_str()
            .expect("a next page")
            .to_string();
        let next = format!("/api/v1/runs/grid?jobs=1&cursor={cursor}");
        let (_, two) = call(&server, None, "GET", &next, None).await;
        assert_eq!(names(&two), ["grid-b"]);

        // The job list's filters, and the label filter.
        for (query, expected) in [
            ("kind=every", vec!["grid-b"]),
            ("kind=manual", vec!["grid-a"]),
            ("label=zone%3Deu", vec!["grid-a"]),
            ("label=zone%3Dus", vec![]),
            ("search=B", vec!["grid-b"]),
            ("state=paused", vec![]),
        ] {
            let (status, page) = call(
                &server,
                None,
                "GET",
                &format!("/api/v1/runs/grid?{query}"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{query}: {page}");
            assert_eq!(names(&page), expected, "{query}");
            let (_, listed) =
                call(&server, None, "GET", &format!("/api/v1/jobs?{query}"), None).await;
            assert_eq!(names(&listed), expected, "the job list agrees on {query}");
        }

        // A window before the runs holds none of them.
        let (_, old) = call(
            &server,
            None,
            "GET",
            "/api/v1/runs/grid?from=2020-01-01T00:00:00Z&to=2020-01-02T00:00:00Z",
            None,
        )
        .await;
        assert_eq!(old["jobs"][0]["runs"], json!([]));
        assert_eq!(old["from"], "2020-01-01T00:00:00Z");

        for (query, field) in [
            ("jobs=501", "jobs"),
            ("jobs=0", "jobs"),
            ("jobs=many", "jobs"),
            ("instants=101", "instants"),
            ("instants=0", "instants"),
            ("from=yesterday", "from"),
            ("to=2026-02-30T00:00:00Z", "to"),
            ("from=2020-01-01T00:00:00Z&to=2020-03-01T00:00:00Z", "from"),
            ("from=2020-01-02T00:00:00Z&to=2020-01-01T00:00:00Z", "from"),
            ("label=zone", "label"),
            ("label=%3Deu", "label"),
            ("state=asleep", "state"),
            ("kind=hourly", "kind"),
            ("cursor=not-a-cursor", "cursor"),
            ("namespace=Not%20A%20Name", "namespace"),
        ] {
            let (status, body) = call(
                &server,
                None,
                "GET",
                &format!("/api/v1/runs/grid?{query}"),
                None,
            )
            .await;
            assert_eq!(status, 400, "{query}: {body}");
            assert_eq!(body["error"]["code"], "invalid_request", "{query}: {body}");
            if !field.is_empty() {
                assert_eq!(body["error"]["field"], field, "{query}: {body}");
            }
        }
        let (status, body) = call(&server, None, "GET", "/api/v1/jobs?label=zone", None).await;
        assert_eq!((status, &body["error"]["field"]), (400, &json!("label")));

        // A token of another namespace: `default` is forbidden, its own holds nothing of it.
        let request = json!({"name": "grid-elsewhere", "role": "viewer", "namespaces": ["other"]});
        let (status, created) = call(&server, None, "POST", "/api/v1/tokens", Some(request)).await;
        assert_eq!(status, 201, "{created}");
        let other = created["token"].as_str().unwrap().to_string();
        let (status, body) = call(&server, Some(&other), "GET", "/api/v1/runs/grid", None).await;
        assert_eq!(status, 403, "{body}");
        let (status, body) = call(
            &server,
            Some(&other),
            "GET",
            "/api/v1/runs/grid?namespace=default",
            None,
        )
        .await;
        assert_eq!(status, 403, "{body}");
        let (status, own) = call(
            &server,
            Some(&other),
            "GET",
            "/api/v1/runs/grid?namespace=other",
            None,
        )
        .await;
        assert_eq!(status, 200, "{own}");
        assert_eq!(own["jobs"], json!([]));
        let (status, _) = call(
            &server,
            Some("sked_not-a-token"),
            "GET",
            "/api/v1/runs/grid",
            None,
        )
        .await;
        assert_eq!(status, 401);
        server.stop().await;
    })
    .await
    .expect("the test took too long");
}

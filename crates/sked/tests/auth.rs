//! Identity and tenancy, black-box: a real `sked server` refuses every route but health without
//! a token, each role reaches exactly the routes of its permission, namespaces are walls (404
//! for another namespace's runs), shell targets need the shell flag, a worker speaks only for
//! itself and claims only the labels and namespaces its token allows, tokens expire and are
//! revoked at once, changes land in the audit trail without secrets, and `sked dev` is open
//! only on loopback.

mod common;

use common::pg::{self, Logs, Node, Schema};
use common::{
    call, client_for, client_with_token, free_port, sha256_prefix, shell, sked_command, token,
    Sked, ADMIN_TOKEN,
};
use reqwest::Method;
use serde_json::{json, Value};
use sked_core::auth::{Permission, Role};
use std::time::{Duration, Instant};

/// A route's path with its parameters filled with values that name nothing.
fn filled(path: &str) -> String {
    path.replace("{name}", "nothing-here")
        .replace("{id}", "999999")
}

#[tokio::test]
async fn every_route_but_health_needs_a_valid_token() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let anonymous = client_with_token(None);
    let forged = client_with_token(Some("sked_not-a-token-this-server-issued-000"));
    let routes = sked_server::api::routes();
    assert!(routes.len() >= 30, "the route table lists every route");
    for route in routes {
        let url = format!("{}{}", sked.base(), filled(route.path));
        for (who, client) in [("no token", &anonymous), ("a forged token", &forged)] {
            let (status, answer) = call(client, route.method.clone(), url.clone(), None).await;
            if route.permission == Permission::Open {
                // `/metrics` is open, but a token sent there must be valid: it decides which
                // per-job series the answer holds (`docs/SECURITY.md`, Metrics).
                if who == "no token" || route.path != "/metrics" {
                    assert_ne!(status, 401, "{} {} is open", route.method, route.path);
                } else {
                    assert_eq!(status, 401, "{} {} with {who}", route.method, route.path);
                }
            } else {
                assert_eq!(
                    status, 401,
                    "{} {} with {who}: {answer}",
                    route.method, route.path
                );
                assert_eq!(answer["error"]["code"], "unauthorized", "{answer}");
            }
        }
    }
}

#[tokio::test]
async fn each_role_reaches_exactly_the_routes_of_its_permission() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let mut clients = Vec::new();
    for role in Role::ALL {
        let secret = token(
            &sked,
            &format!("matrix-{role}"),
            json!({"role": role.as_str(), "namespaces": ["*"]}),
        )
        .await;
        clients.push((role, client_with_token(Some(&secret))));
    }
    let mut checked = 0;
    for route in sked_server::api::routes() {
        // Revoking the tokens under test would end the test; following a log holds it open.
        if route.path == "/api/v1/tokens/{name}" || route.path.ends_with("/log") {
            continue;
        }
        for (role, client) in &clients {
            let url = format!("{}{}", sked.base(), filled(route.path));
            let (status, answer) = call(client, route.method.clone(), url, None).await;
            let what = format!(
                "{role} token, {} {}: {status} {answer}",
                route.method, route.path
            );
            if role.allows(route.permission) {
                assert!(status != 401 && status != 403, "allowed: {what}");
            } else {
                assert_eq!(status, 403, "refused: {what}");
                assert_eq!(answer["error"]["code"], "forbidden", "{what}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked} route and role pairs");
}

#[tokio::test]
async fn namespaces_are_walls_and_viewers_only_read() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let editor_a = client_for(
        &sked,
        "editor-a",
        json!({"role": "editor", "namespaces": ["a"]}),
    )
    .await;
    let viewer_b = client_for(
        &sked,
        "viewer-b",
        json!({"role": "viewer", "namespaces": ["b"]}),
    )
    .await;
    // A run in namespace b, waiting: no worker runs it.
    let url = |path: &str| sked.url(path);
    let (status, job) = call(
        &sked.http,
        Method::PUT,
        url("/jobs/secret-job?namespace=b"),
        Some(json!({"target": shell("echo b")})),
    )
    .await;
    assert_eq!(status, 201, "{job}");
    let (status, run) = call(
        &sked.http,
        Method::POST,
        url("/jobs/secret-job/trigger?namespace=b"),
        None,
    )
    .await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("run id");

    // Editor of a: b's run does not exist for it, by id, log or cancel.
    for (method, path) in [
        (Method::GET, format!("/runs/{id}")),
        (Method::GET, format!("/runs/{id}/log")),
        (Method::POST, format!("/runs/{id}/cancel")),
    ] {
        let (status, answer) = call(&editor_a, method.clone(), url(&path), None).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found");
    }
    // Naming b is refused; a's own namespace is open to it.
    for (method, path) in [
        (Method::GET, "/jobs?namespace=b"),
        (Method::GET, "/runs?namespace=b"),
        (Method::GET, "/jobs/secret-job?namespace=b"),
        (Method::POST, "/jobs/secret-job/trigger?namespace=b"),
        (Method::DELETE, "/jobs/secret-job?namespace=b"),
        (Method::GET, "/audit?namespace=b"),
    ] {
        let (status, answer) = call(&editor_a, method.clone(), url(path), None).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
    }
    let (status, page) = call(&editor_a, Method::GET, url("/jobs?namespace=a"), None).await;
    assert_eq!((status, page["jobs"].clone()), (200, json!([])));

    // Viewer of b: reads b, changes nothing.
    let (status, answer) = call(&viewer_b, Method::GET, url(&format!("/runs/{id}")), None).await;
    assert_eq!(status, 200, "{answer}");
    for (method, path) in [
        (Method::POST, format!("/runs/{id}/cancel")),
        (
            Method::POST,
            "/jobs/secret-job/trigger?namespace=b".to_string(),
        ),
        (Method::DELETE, "/jobs/secret-job?namespace=b".to_string()),
        (
            Method::POST,
            "/jobs/secret-job/pause?namespace=b".to_string(),
        ),
    ] {
        let (status, answer) = call(&viewer_b, method.clone(), url(&path), None).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
    }
    let (status, answer) = call(
        &viewer_b,
        Method::PUT,
        url("/jobs/other?namespace=b"),
        Some(json!({"target": {"http": {"url": "http://127.0.0.1:9/"}}})),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    // Nothing the refused calls named changed.
    assert_eq!(sked.run(id).await["state"], "queued");
}

#[tokio::test]
async fn shell_targets_need_a_token_with_the_shell_flag() {
    let mut sked = Sked::new();
    // The HTTP job below names a loopback address, which `sked server` refuses by default.
    sked.start_server(&["--http-target-allow", "127.0.0.1"])
        .await;
    let plain = client_for(
        &sked,
        "plain",
        json!({"role": "editor", "namespaces": ["ops"]}),
    )
    .await;
    let shell_editor = client_for(
        &sked,
        "shell",
        json!({"role": "editor", "namespaces": ["ops"], "shell": true}),
    )
    .await;
    let url = sked.url("/jobs/cleanup?namespace=ops");
    let command = json!({"target": shell("rm -rf /tmp/x")});
    let (status, answer) = call(&plain, Method::PUT, url.clone(), Some(command.clone())).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("shell"));
    let (status, answer) = call(
        &plain,
        Method::POST,
        sked.url("/jobs?namespace=ops"),
        Some(json!({"name": "c2", "target": shell("id")})),
    )
    .await;
    assert_eq!(status, 403, "POST /jobs too: {answer}");
    let (status, _) = call(&sked.http, Method::GET, url.clone(), None).await;
    assert_eq!(status, 404, "nothing was written");
    let http = json!({"target": {"http": {"url": "http://127.0.0.1:9/"}}});
    let (status, answer) = call(&plain, Method::PUT, url.clone(), Some(http)).await;
    assert_eq!(status, 201, "an HTTP target needs no shell flag: {answer}");
    // Nor may it turn an existing job into a shell job.
    let (status, answer) = call(&plain, Method::PUT, url.clone(), Some(command.clone())).await;
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = call(&shell_editor, Method::PUT, url, Some(command)).await;
    assert_eq!(status, 200, "{answer}");
}

/// A worker as an attacker would drive one: the protocol by hand.
struct HandWorker {
    http: reqwest::Client,
    base: String,
    id: String,
}

impl HandWorker {
    async fn register(
        sked: &Sked,
        secret: &str,
        labels: Value,
    ) -> Result<HandWorker, (u16, Value)> {
        let http = client_with_token(Some(secret));
        let body = json!({"name": "hand", "labels": labels, "slots": 4});
        let (status, answer) = call(&http, Method::POST, sked.url("/workers"), Some(body)).await;
        if status != 201 {
            return Err((status, answer));
        }
        Ok(HandWorker {
            http,
            base: sked.url(""),
            id: answer["worker_id"].as_str().expect("worker id").to_string(),
        })
    }

    /// Leases with a short wait; returns the attempts handed out.
    async fn lease(&self, as_worker: &str) -> (u16, Value) {
        let url = format!("{}/workers/{as_worker}/lease", self.base);
        call(
            &self.http,
            Method::POST,
            url,
            Some(json!({"max": 4, "wait_ms": 1500})),
        )
        .await
    }
}

#[tokio::test]
async fn a_worker_speaks_only_for_itself_under_its_own_token() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let w1 = token(&sked, "w1", json!({"role": "worker", "namespaces": ["*"]})).await;
    let w2 = token(&sked, "w2", json!({"role": "worker", "namespaces": ["*"]})).await;
    let honest = HandWorker::register(&sked, &w1, json!({}))
        .await
        .expect("register");
    let rogue = HandWorker::register(&sked, &w2, json!({}))
        .await
        .expect("register");

    assert_eq!(
        sked.put_job("slow", json!({"target": shell("sleep 30")}))
            .await
            .0,
        201
    );
    let (_, run) = sked.post("/jobs/slow/trigger", json!(null)).await;
    let run_id = run["id"].as_i64().expect("run id");
    let (status, lease) = honest.lease(&honest.id).await;
    assert_eq!(status, 200, "{lease}");
    let attempt = lease["attempts"][0].clone();
    assert_eq!(attempt["run_id"], run_id, "{lease}");
    let (attempt_id, fencing) = (attempt["attempt_id"].clone(), attempt["token"].clone());

    // The rogue knows the honest worker's id and even the attempt's fencing token.
    let forged = json!({"completions": [{"attempt_id": attempt_id, "token": fencing, "outcome": "failed", "error": "forged"}]});
    let as_honest = |what: &str| format!("{}/workers/{}/{what}", sked.url(""), honest.id);
    for (what, body) in [
        ("complete", forged.clone()),
        ("heartbeat", json!({"running": []})),
        ("lease", json!({"max": 1, "wait_ms": 0})),
    ] {
        let (status, answer) = call(&rogue.http, Method::POST, as_honest(what), Some(body)).await;
        assert_eq!(status, 403, "{what} for another token's worker: {answer}");
    }
    let log_url = format!(
        "{}/attempts/{attempt_id}/log?token={fencing}&worker={}",
        sked.url(""),
        honest.id
    );
    let response = rogue
        .http
        .post(&log_url)
        .header("content-type", "application/octet-stream")
        .body("forged output")
        .send()
        .await
        .expect("log");
    assert_eq!(
        response.status().as_u16(),
        403,
        "output for another token's worker"
    );
    // Through its own worker id, the forged report is not accepted either.
    let (status, answer) = call(
        &rogue.http,
        Method::POST,
        format!("{}/workers/{}/complete", sked.url(""), rogue.id),
        Some(forged),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["accepted"], false, "{answer}");
    let run = sked.run(run_id).await;
    assert_eq!(
        run["state"], "running",
        "nothing the rogue sent changed the run: {run}"
    );

    // The worker that holds the attempt reports it.
    let done = json!({"completions": [{"attempt_id": attempt_id, "token": fencing, "outcome": "succeeded", "exit_code": 0}]});
    let (status, answer) = call(
        &honest.http,
        Method::POST,
        as_honest("complete"),
        Some(done),
    )
    .await;
    assert_eq!(
        (status, answer["results"][0]["accepted"].clone()),
        (200, json!(true)),
        "{answer}"
    );
    assert_eq!(sked.run(run_id).await["state"], "succeeded");
}

#[tokio::test]
async fn a_worker_token_bounds_the_labels_and_namespaces_its_workers_claim() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let general = token(
        &sked,
        "general-pool",
        json!({"role": "worker", "namespaces": ["team-a"], "labels": ["pool=general", "zone=*"]}),
    )
    .await;
    let refused = HandWorker::register(&sked, &general, json!({"pool": "secure"})).await;
    let Err((status, answer)) = refused else {
        panic!("a rogue claimed pool=secure");
    };
    assert_eq!(status, 403, "{answer}");
    assert!(HandWorker::register(&sked, &general, json!({"gpu": "yes"}))
        .await
        .is_err());
    let worker = HandWorker::register(&sked, &general, json!({"pool": "general", "zone": "eu"}))
        .await
        .expect("allowed labels");

    // Team b's run waits for a worker that may serve team b; team a's is handed out.
    let target = json!({"target": shell("true")});
    for ns in ["team-b", "team-a"] {
        let url = sked.url(&format!("/jobs/j?namespace={ns}"));
        let (status, answer) = call(&sked.http, Method::PUT, url, Some(target.clone())).await;
        assert_eq!(status, 201, "{answer}");
        let url = sked.url(&format!("/jobs/j/trigger?namespace={ns}"));
        assert_eq!(call(&sked.http, Method::POST, url, None).await.0, 201);
    }
    let mut leased = Vec::new();
    for _ in 0..2 {
        let (status, lease) = worker.lease(&worker.id).await;
        assert_eq!(status, 200, "{lease}");
        leased.extend(lease["attempts"].as_array().cloned().unwrap_or_default());
    }
    let namespaces: Vec<&str> = leased
        .iter()
        .filter_map(|a| a["namespace"].as_str())
        .collect();
    assert_eq!(namespaces, ["team-a"], "{leased:?}");
    // And team b's viewers do not see the worker.
    let viewer = client_for(
        &sked,
        "viewer-b",
        json!({"role": "viewer", "namespaces": ["team-b"]}),
    )
    .await;
    let (_, list) = call(&viewer, Method::GET, sked.url("/workers"), None).await;
    assert_eq!(list["workers"], json!([]), "{list}");
    let (_, list) = call(&sked.http, Method::GET, sked.url("/workers"), None).await;
    assert_eq!(
        list["workers"][0]["namespaces"],
        json!(["team-a"]),
        "{list}"
    );
}

#[tokio::test]
async fn tokens_expire_are_revoked_at_once_and_record_their_last_use() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let brief = client_for(
        &sked,
        "brief",
        json!({"role": "viewer", "namespaces": ["*"], "expires": "1s"}),
    )
    .await;
    let viewer_secret = token(
        &sked,
        "reader",
        json!({"role": "viewer", "namespaces": ["*"]}),
    )
    .await;
    let reader = client_with_token(Some(&viewer_secret));
    assert_eq!(
        call(&brief, Method::GET, sked.url("/jobs"), None).await.0,
        200
    );
    assert_eq!(
        call(&reader, Method::GET, sked.url("/jobs"), None).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, answer) = call(&brief, Method::GET, sked.url("/jobs"), None).await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("expired"));

    let (_, list) = sked.get("/tokens").await;
    let reader_row = list["tokens"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "reader").cloned())
        .expect("the reader token is listed");
    assert!(reader_row["last_used_at"].is_string(), "{reader_row}");
    assert!(
        !list.to_string().contains(&viewer_secret),
        "a secret is never listed"
    );

    let (status, answer) = call(&sked.http, Method::DELETE, sked.url("/tokens/reader"), None).await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = call(&reader, Method::GET, sked.url("/jobs"), None).await;
    assert_eq!(
        status, 401,
        "a revoked token is refused at once by the node that revoked it"
    );
}

#[tokio::test]
async fn changes_are_audited_with_who_and_from_where_but_no_secret() {
    const SECRET: &str = "hunter2-never-shown";
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let editor_secret = token(
        &sked,
        "auditor-editor",
        json!({"role": "editor", "namespaces": ["default"], "shell": true}),
    )
    .await;
    let editor = client_with_token(Some(&editor_secret));
    let with_secret = |command: &str| json!({"target": {"shell": {"command": command, "env": {"DB_PASSWORD": SECRET}}}});
    let job = with_secret("sleep 30");
    let url = |p: &str| sked.url(p);
    assert_eq!(
        call(&editor, Method::PUT, url("/jobs/backup"), Some(job))
            .await
            .0,
        201
    );
    let changed = with_secret("sleep 31");
    assert_eq!(
        call(&editor, Method::PUT, url("/jobs/backup"), Some(changed))
            .await
            .0,
        200
    );
    for action in ["pause", "resume"] {
        let path = format!("/jobs/backup/{action}");
        assert_eq!(call(&editor, Method::POST, url(&path), None).await.0, 200);
    }
    let (_, run) = call(&editor, Method::POST, url("/jobs/backup/trigger"), None).await;
    let run_id = run["id"].as_i64().expect("run id");
    let cancel = format!("/runs/{run_id}/cancel");
    assert_eq!(call(&editor, Method::POST, url(&cancel), None).await.0, 200);
    assert_eq!(
        call(&editor, Method::DELETE, url("/jobs/backup"), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(
            &sked.http,
            Method::DELETE,
            url("/tokens/auditor-editor"),
            None
        )
        .await
        .0,
        200
    );
    let guess = client_with_token(Some("sked_a-guess-at-a-token-000000000000"));
    assert_eq!(call(&guess, Method::GET, url("/jobs"), None).await.0, 401);

    // A refused authentication is recorded beside the 401, not before it: wait for it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let page = loop {
        let (status, page) = sked.get("/audit?limit=100").await;
        assert_eq!(status, 200, "{page}");
        if page["entries"][0]["action"] == "auth.failed" || Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let entries = page["entries"].as_array().cloned().unwrap_or_default();
    let actions: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    for expected in [
        "token.create",
        "job.put",
        "job.pause",
        "job.resume",
        "job.trigger",
        "run.cancel",
        "job.delete",
        "token.revoke",
        "auth.failed",
    ] {
        assert!(actions.contains(&expected), "{expected} in {actions:?}");
    }
    let put = entries
        .iter()
        .find(|e| e["action"] == "job.put" && e["before"].is_object())
        .expect("the second put, with its before");
    assert_eq!(put["actor"], "auditor-editor");
    assert!(put["actor_id"].is_i64());
    assert!(
        put["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{put}"
    );
    assert_eq!(put["namespace"], "default");
    assert_eq!(put["object"], "backup");
    assert_eq!(put["before"]["target"]["shell"]["command"], "sleep 30");
    assert_eq!(put["after"]["target"]["shell"]["command"], "sleep 31");
    assert_eq!(
        put["after"]["target"]["shell"]["env"]["DB_PASSWORD"],
        "(redacted)"
    );
    // Newest first.
    assert_eq!(actions[0], "auth.failed", "{actions:?}");
    // A viewer of every namespace reads the namespaces' entries, not the admin's.
    let everywhere = client_for(
        &sked,
        "all-viewer",
        json!({"role": "viewer", "namespaces": ["*"]}),
    )
    .await;
    let (_, seen) = call(&everywhere, Method::GET, url("/audit?limit=100"), None).await;
    let seen = seen["entries"].as_array().cloned().unwrap_or_default();
    assert!(seen.iter().any(|e| e["action"] == "job.put"));
    assert!(
        seen.iter().all(|e| e["namespace"].is_string()),
        "token changes and failed logins are for admins: {seen:?}"
    );

    let text = page.to_string();
    assert!(
        !text.contains(SECRET),
        "an env value reached the audit trail"
    );
    assert!(!text.contains(&editor_secret) && !text.contains(ADMIN_TOKEN));
    sked.server
        .as_mut()
        .expect("server")
        .stop(Duration::from_secs(10));
    let log = std::fs::read_dir(sked.dir.path())
        .expect("logs")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    for secret in [SECRET, editor_secret.as_str(), ADMIN_TOKEN] {
        assert!(!log.contains(secret), "a secret reached a log line");
    }
}

#[tokio::test]
async fn a_new_server_writes_its_admin_token_privately_and_never_logs_it() {
    let mut sked = Sked::new();
    let file = sked.dir.path().join("fresh").join("admin.token");
    let file_arg = file.to_str().expect("utf-8").to_string();
    sked.start_server(&["--admin-token-file", &file_arg]).await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file)
        .expect("the token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let secret = std::fs::read_to_string(&file)
        .expect("read")
        .trim()
        .to_string();
    assert!(secret.len() >= 40, "256 random bits: {}", secret.len());
    let admin = client_with_token(Some(&secret));
    assert_eq!(
        call(&admin, Method::GET, sked.url("/tokens"), None).await.0,
        200
    );
    // Started again, it reads the same file.
    sked.server
        .as_mut()
        .expect("server")
        .stop(Duration::from_secs(10));
    sked.start_server(&["--admin-token-file", &file_arg]).await;
    assert_eq!(std::fs::read_to_string(&file).expect("read").trim(), secret);
    assert_eq!(
        call(&admin, Method::GET, sked.url("/tokens"), None).await.0,
        200
    );
    sked.server
        .as_mut()
        .expect("server")
        .stop(Duration::from_secs(10));
    let logs = std::fs::read_dir(sked.dir.path())
        .expect("logs")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|text| text.contains("admin token"))
        .collect::<String>();
    assert!(logs.contains(&file_arg), "the path is logged: {logs}");
    assert!(!logs.contains(&secret), "the token is not");
}

/// Starts `sked server` with `args` and waits for it to exit: the exit status and what it printed.
fn start_that_stops(sked: &Sked, args: &[&str]) -> (std::process::ExitStatus, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let data = sked.data_dir();
    let mut all = vec!["server", "--listen", &listen, "--data-dir"];
    all.push(data.to_str().expect("utf-8"));
    all.extend_from_slice(args);
    let log = sked.dir.path().join(format!("refused-{}.log", free_port()));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = sked_command()
        // The key file is the data directory's unless the arguments name one.
        .env_remove("SKED_SECRET_KEY_FILE")
        .args(&all)
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("start sked");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return (status, std::fs::read_to_string(&log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sked server {args:?} did not stop: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn a_key_or_token_file_others_may_read_stops_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let sked = Sked::new();
    let dir = sked.dir.path();
    let (token_file, key_file) = (dir.join("admin.token"), dir.join("elsewhere.key"));
    std::fs::write(&token_file, ADMIN_TOKEN).expect("write");
    std::fs::write(&key_file, common::SECRET_KEY).expect("write");
    let chmod = |path: &std::path::Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    let (token_arg, key_arg) = (
        token_file.to_str().expect("utf-8"),
        key_file.to_str().expect("utf-8"),
    );
    let args = [
        "--admin-token-file",
        token_arg,
        "--secret-key-file",
        key_arg,
    ];
    // A file root owns may be readable by its group (the next test): these are a service
    // user's, as when the tests run as one.
    if is_roots(&token_file) {
        for path in [&token_file, &key_file] {
            std::os::unix::fs::chown(path, Some(SERVICE_USER), Some(SERVICE_USER)).expect("chown");
        }
    }
    for (exposed, mode) in [(&token_file, 0o644), (&key_file, 0o640), (&key_file, 0o604)] {
        chmod(&token_file, 0o600);
        chmod(&key_file, 0o600);
        chmod(exposed, mode);
        let (status, said) = start_that_stops(&sked, &args);
        assert!(!status.success(), "{said}");
        let fix = format!("chmod 600 {}", exposed.display());
        assert!(said.contains(&fix), "names the file and the fix: {said}");
        assert!(!said.contains(ADMIN_TOKEN), "{said}");
    }
    // The key file in the data directory is judged the same way.
    chmod(&token_file, 0o600);
    let own_key = sked.data_dir().join("secret.key");
    std::fs::create_dir_all(sked.data_dir()).expect("mkdir");
    std::fs::write(&own_key, common::SECRET_KEY).expect("write");
    chmod(&own_key, 0o644);
    let (status, said) = start_that_stops(&sked, &["--admin-token-file", token_arg]);
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!("chmod 600 {}", own_key.display())),
        "{said}"
    );
}

/// A uid no test process runs as, for files a service user owns.
const SERVICE_USER: u32 = 10001;

fn is_roots(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").uid() == 0
}

/// A key and token file root owns may be readable by its group, as PostgreSQL allows for its
/// key: an administrator's `root:sked 0640`, and what Kubernetes makes of a Secret volume under
/// `fsGroup` (0440). Others may still read neither.
#[tokio::test]
async fn a_key_or_token_file_root_owns_may_be_read_by_its_group() {
    use std::os::unix::fs::PermissionsExt;
    let mut sked = Sked::new();
    let dir = sked.dir.path();
    let (token_file, key_file) = (dir.join("granted.token"), dir.join("granted.key"));
    std::fs::write(&token_file, ADMIN_TOKEN).expect("write");
    std::fs::write(&key_file, common::SECRET_KEY).expect("write");
    if !is_roots(&token_file) {
        // Only root can make a file root's; CI runs as root.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this test as root, to make files root owns"
        );
        eprintln!("skipped: files root owns can be made only as root");
        return;
    }
    for path in [&token_file, &key_file] {
        std::os::unix::fs::chown(path, None, Some(SERVICE_USER)).expect("chown");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o440)).expect("chmod");
    }
    let (token_arg, key_arg) = (
        token_file.to_str().expect("utf-8"),
        key_file.to_str().expect("utf-8"),
    );
    let args = [
        "--admin-token-file",
        token_arg,
        "--secret-key-file",
        key_arg,
    ];
    // Readable by all: refused, root's or not.
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let (status, said) = start_that_stops(&sked, &args);
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!("chmod 600 {}", key_file.display())),
        "{said}"
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o440)).expect("chmod");
    sked.start_server(&args).await;
    let (status, _) = sked.get("/jobs").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_cli_creates_lists_and_revokes_tokens() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let cli = |args: &[&str]| sked.cli(args);
    let (ok, out, err) = cli(&[
        "token",
        "create",
        "--name",
        "deploy",
        "--role",
        "editor",
        "--namespace",
        "a,b",
        "--shell",
        "--expires",
        "30d",
    ]);
    assert!(ok, "{out}{err}");
    let secret = out
        .lines()
        .last()
        .expect("the secret is the last line")
        .trim();
    assert!(secret.starts_with("sked_"), "{out}");
    let deploy = client_with_token(Some(secret));
    assert_eq!(
        call(&deploy, Method::GET, sked.url("/jobs?namespace=b"), None)
            .await
            .0,
        200
    );
    let (ok, out, _) = cli(&["token", "list"]);
    assert!(ok && out.contains("deploy") && out.contains("a,b"), "{out}");
    assert!(!out.contains(secret));
    let (ok, out, err) = cli(&["token", "revoke", "deploy"]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        call(&deploy, Method::GET, sked.url("/jobs"), None).await.0,
        401
    );
    let (ok, out, _) = cli(&["audit", "--all"]);
    assert!(
        ok && out.contains("token.revoke") && out.contains("deploy"),
        "{out}"
    );
    // An empty token file is an error of its own, not a worker with no token.
    let empty = sked.dir.path().join("empty.token");
    std::fs::write(&empty, "\n").expect("write");
    let out = sked_command()
        .args(["worker", "--server", &sked.base(), "--token-file"])
        .arg(&empty)
        .output()
        .expect("run sked worker");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is empty"), "{err}");
    // Without a token the CLI says what to do.
    let out = std::process::Command::new(common::BIN)
        .args(["job", "list"])
        .env("SKED_SERVER", sked.base())
        .env_remove("SKED_TOKEN")
        .output()
        .expect("run sked");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("SKED_TOKEN"), "{err}");
}

#[tokio::test]
async fn sked_dev_is_open_only_on_loopback() {
    // Open on a non-loopback address: refused before anything starts.
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = format!("0.0.0.0:{}", free_port());
    let out = sked_command()
        .args(["dev", "--listen", &listen, "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .expect("run sked dev");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sked dev started open on {listen}");
    assert!(
        err.contains("refusing to start open") && err.contains("--require-token"),
        "{err}"
    );
    assert!(!dir.path().join("data").exists(), "nothing was written");

    // On loopback it is open, and says so first.
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let anonymous = client_with_token(None);
    assert_eq!(
        call(&anonymous, Method::GET, sked.url("/jobs"), None)
            .await
            .0,
        200
    );
    // With --require-token it is not.
    let mut closed = Sked::new();
    closed.start_dev(&["--require-token"]).await;
    assert_eq!(
        call(&anonymous, Method::GET, closed.url("/jobs"), None)
            .await
            .0,
        401
    );
    // Its own worker runs jobs with the admin token.
    assert_eq!(
        closed
            .put_job("hello", json!({"target": shell("echo hi")}))
            .await
            .0,
        201
    );
    let (_, run) = closed.post("/jobs/hello/trigger", json!(null)).await;
    let run = closed
        .wait_finished(run["id"].as_i64().expect("run id"), Duration::from_secs(20))
        .await;
    assert_eq!(run["state"], "succeeded", "{run}");
    for (deployment, open) in [(&sked, true), (&closed, false)] {
        let first = std::fs::read_dir(deployment.dir.path())
            .expect("logs")
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .find_map(|text| {
                text.lines()
                    .find(|l| l.contains("sked dev listening"))
                    .map(str::to_string)
            })
            .expect("the first line");
        assert_eq!(first.contains("open: no token needed"), open, "{first}");
    }
}

/// Sends `request` (a whole HTTP/1.1 request) to `port` on loopback as is; the answer's status.
async fn raw_status(port: u16, request: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer");
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"))
}

/// What a web page could send an open `sked dev` (tried in a real browser in `console.rs`),
/// as raw requests: a change from another origin (403), a body that is not JSON (415), and
/// any request under another host name than loopback's (421, so that DNS rebinding reads
/// nothing). None of them writes anything; the same requests from the server's own origin
/// and under loopback names are served.
#[tokio::test]
async fn an_open_sked_dev_takes_no_change_from_another_site_and_no_other_host_name() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let port = sked.port;
    let job = json!({"name": "planted", "target": shell("true")}).to_string();
    let post = |host: &str, origin: Option<&str>, content_type: &str| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        format!(
            "POST /api/v1/jobs HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{job}",
            job.len()
        )
    };
    let own = format!("127.0.0.1:{port}");
    let cases = [
        (
            "another origin",
            post(&own, Some("http://evil.example"), "application/json"),
            403,
        ),
        (
            "another loopback port",
            post(&own, Some("http://127.0.0.1:1"), "application/json"),
            403,
        ),
        (
            "an opaque origin",
            post(&own, Some("null"), "application/json"),
            403,
        ),
        ("text/plain", post(&own, None, "text/plain"), 415),
        (
            "a form",
            post(&own, None, "application/x-www-form-urlencoded"),
            415,
        ),
        (
            "text/plain from its own origin",
            post(&own, Some(&format!("http://{own}")), "text/plain"),
            415,
        ),
        (
            "a rebinding host",
            post(
                &format!("rebind.evil.example:{port}"),
                None,
                "application/json",
            ),
            421,
        ),
    ];
    for (what, request, status) in &cases {
        assert_eq!(raw_status(port, request).await, *status, "{what}");
    }
    let get = |host: &str, path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    for path in ["/api/v1/jobs", "/", "/healthz", "/api/v1/tokens"] {
        assert_eq!(
            raw_status(port, &get(&format!("rebind.evil.example:{port}"), path)).await,
            421,
            "{path} under another name"
        );
    }
    for host in [
        own.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        assert_eq!(
            raw_status(port, &get(&host, "/api/v1/jobs")).await,
            200,
            "{host}"
        );
    }
    let (_, jobs) = sked.get("/jobs").await;
    assert_eq!(
        jobs["jobs"],
        json!([]),
        "nothing refused was written: {jobs}"
    );
    // The server's own origin, and clients that send no Origin, are served.
    let own_origin = format!("http://{own}");
    assert_eq!(
        raw_status(
            port,
            &post(&own, Some(&own_origin), "application/json; charset=utf-8")
        )
        .await,
        201
    );
    let (status, _) = sked.post("/jobs/planted/trigger", json!(null)).await;
    assert_eq!(status, 201, "the command line's requests are served");
}

/// Random bearer tokens from one address are throttled: past 100 failed authentications in a
/// second, the address is answered 429 with `Retry-After` without a store lookup, while a
/// token this node remembers as valid is still taken from it and other addresses are not
/// held up.
#[tokio::test]
async fn failed_authentications_are_throttled_per_address() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    // Made valid and remembered before the flood.
    assert_eq!(sked.get("/jobs").await.0, 200);
    let started = Instant::now();
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for i in 0..300 {
        let guess = client_with_token(Some(&format!("sked_guess-{i:040}")));
        let response = guess.get(sked.url("/jobs")).send().await.expect("request");
        let status = response.status().as_u16();
        if status == 429 {
            retry_after = retry_after.or_else(|| {
                response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            });
            if sked.get("/jobs").await.0 != 200 {
                panic!("a valid, remembered token was refused from a throttled address");
            }
        }
        statuses.push(status);
    }
    let elapsed = started.elapsed();
    let refused = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    println!(
        "300 guessed tokens in {elapsed:?}: {refused} looked up and refused (401), {limited} \
         throttled (429)"
    );
    assert_eq!(refused + limited, 300, "{statuses:?}");
    let seconds = elapsed.as_secs() as usize + 1;
    assert!(
        refused <= 100 * seconds,
        "{refused} lookups in {elapsed:?}: not throttled"
    );
    assert!(limited > 0, "{statuses:?}");
    assert_eq!(retry_after, Some(1), "429 says when to come back");
    // From another address, a guess is looked up as usual.
    let other = reqwest::Client::builder()
        .local_address(Some("127.0.0.2".parse().expect("address")))
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                "Bearer sked_another-guess".parse().expect("header"),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .expect("client");
    let status = other
        .get(sked.url("/jobs"))
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status.as_u16(), 401, "another address is not held up");
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_token_revoked_on_one_node_is_refused_by_every_node_within_a_second() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, Duration::from_secs(30)).await;
    b.ready(&http, Duration::from_secs(30)).await;
    let (status, created) = call(
        &http,
        Method::POST,
        format!("{}/api/v1/tokens", a.base()),
        Some(json!({"name": "roaming", "role": "viewer", "namespaces": ["*"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let viewer = client_with_token(created["token"].as_str());
    let on_b = format!("{}/api/v1/jobs", b.base());
    assert_eq!(
        call(&viewer, Method::GET, on_b.clone(), None).await.0,
        200,
        "B knows a token made on A"
    );
    let (status, _) = call(
        &http,
        Method::DELETE,
        format!("{}/api/v1/tokens/roaming", a.base()),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let revoked = Instant::now();
    loop {
        let (status, _) = call(&viewer, Method::GET, on_b.clone(), None).await;
        if status == 401 {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "node B still takes the revoked token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "node B refused the revoked token after {:?}",
        revoked.elapsed()
    );
    // Audit entries written on either node are read on both.
    let (_, page) = call(
        &http,
        Method::GET,
        format!("{}/api/v1/audit?object=roaming", b.base()),
        None,
    )
    .await;
    let actions: Vec<&str> = page["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(actions, ["token.revoke", "token.create"], "{page}");
    drop((a, b));
    schema.drop_schema().await;
}

/// A console login on `base` with `secret`: the session cookie.
async fn console_login(base: &str, secret: &str) -> String {
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = bare
        .post(format!("{base}/login"))
        .form(&[("token", secret), ("next", "/")])
        .send()
        .await
        .expect("login");
    assert_eq!(response.status().as_u16(), 303);
    response.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("cookie value")
        .to_string()
}

/// The status of console page `path` on `base` with `cookie`, and the CSRF token its forms carry.
async fn console_page(base: &str, cookie: &str, path: &str) -> (u16, Option<String>) {
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let response = bare
        .get(format!("{base}{path}"))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("page");
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_string);
    (status, csrf)
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_logout_on_one_node_ends_the_session_on_every_node_within_a_second() {
    let schema = Schema::create().await;
    let logs = Logs::new();
    let http = pg::http_client();
    let mut a = Node::spawn(&logs, "node-a", free_port(), &schema.url);
    let mut b = Node::spawn(&logs, "node-b", free_port(), &schema.url);
    a.ready(&http, Duration::from_secs(30)).await;
    b.ready(&http, Duration::from_secs(30)).await;
    let (status, created) = call(
        &http,
        Method::POST,
        format!("{}/api/v1/tokens", a.base()),
        Some(json!({"name": "person", "role": "viewer", "namespaces": ["*"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let secret = created["token"].as_str().expect("secret");
    let cookie = console_login(&a.base(), secret).await;
    let (status, csrf) = console_page(&a.base(), &cookie, "/jobs").await;
    assert_eq!(status, 200);
    assert_eq!(
        console_page(&b.base(), &cookie, "/jobs").await.0,
        200,
        "B opens a session made on A"
    );
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let out = bare
        .post(format!("{}/logout", a.base()))
        .header(reqwest::header::COOKIE, &cookie)
        .form(&[("csrf", csrf.expect("csrf").as_str())])
        .send()
        .await
        .expect("logout");
    assert_eq!(out.status().as_u16(), 303);
    let logged_out = Instant::now();
    assert_eq!(console_page(&a.base(), &cookie, "/jobs").await.0, 303);
    loop {
        if console_page(&b.base(), &cookie, "/jobs").await.0 == 303 {
            break;
        }
        assert!(
            logged_out.elapsed() < Duration::from_secs(1),
            "node B still opens the session logged out on A"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "node B refused the logged-out session after {:?}",
        logged_out.elapsed()
    );
    drop((a, b));
    schema.drop_schema().await;
}

#[tokio::test]
async fn a_secret_is_sealed_at_rest_never_shown_and_opened_only_for_the_run() {
    const SECRET: &str = "correct-horse-battery-staple-7f3a";
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    // The job proves it received the secret without printing it.
    let check = format!(
        "test \"$(printf %s \"$DB_PASSWORD\" | sha256sum | cut -c1-16)\" = {} && echo opened",
        sha256_prefix(SECRET)
    );
    let job = json!({"target": {"shell": {"command": check, "env": {"DB_PASSWORD": {"secret": SECRET}, "LEVEL": "full"}}}});
    let (status, created) = sked.put_job("uses-secret", job).await;
    assert_eq!(status, 201, "{created}");
    let env = &created["target"]["shell"]["env"];
    assert_eq!(env["LEVEL"], "full");
    let sealed = env["DB_PASSWORD"]["sealed"]
        .as_str()
        .expect("a sealed value")
        .to_string();
    assert!(sealed.starts_with("v2:"), "{sealed}");

    let (_, run) = sked.post("/jobs/uses-secret/trigger", json!(null)).await;
    let id = run["id"].as_i64().expect("run id");
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let log = sked.run_log(id).await;
    assert_eq!(log, "opened\n");

    // Sent back as it was read, the definition keeps its secret.
    let (_, read) = sked.get("/jobs/uses-secret").await;
    let again = json!({"target": read["target"].clone()});
    let (status, answer) = sked.put_job("uses-secret", again).await;
    assert_eq!(status, 200, "{answer}");
    let (_, run) = sked.post("/jobs/uses-secret/trigger", json!(null)).await;
    let run = sked
        .wait_finished(run["id"].as_i64().expect("run id"), Duration::from_secs(20))
        .await;
    assert_eq!(
        run["state"], "succeeded",
        "the re-sent sealed value still opens: {run}"
    );

    // A made-up sealed value is refused, naming the field.
    let forged = json!({"target": {"shell": {"command": "true", "env": {"X": {"sealed": "v2:00000000:AAAA"}}}}});
    let (status, answer) = sked.put_job("forged", forged).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "target.shell.env.X", "{answer}");

    // Nowhere to be read: not in any answer, not in the store's files, not in a log line.
    let mut answers = String::new();
    for path in ["/jobs/uses-secret", "/jobs", "/runs", "/audit?limit=100"] {
        answers.push_str(&sked.get(path).await.1.to_string());
    }
    assert!(!answers.contains(SECRET), "an answer holds the secret");
    sked.server
        .as_mut()
        .expect("dev")
        .stop(Duration::from_secs(10));
    let mut files = Vec::new();
    for entry in std::fs::read_dir(sked.data_dir())
        .expect("data dir")
        .flatten()
    {
        files.extend(std::fs::read(entry.path()).unwrap_or_default());
    }
    for entry in std::fs::read_dir(sked.dir.path()).expect("logs").flatten() {
        files.extend(std::fs::read(entry.path()).unwrap_or_default());
    }
    let needle = SECRET.as_bytes();
    assert!(
        !files.windows(needle.len()).any(|w| w == needle),
        "the secret is in a file of the data directory or a log"
    );
}

/// `method path` (under `/api/v1`) as `client`.
async fn api(
    sked: &Sked,
    client: &reqwest::Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call(client, method, sked.url(path), body).await
}

/// Triggers `job` of `namespace` and waits for its run: the run and its log.
async fn run_job(sked: &Sked, namespace: &str, job: &str) -> (Value, String) {
    let path = format!("/jobs/{job}/trigger?namespace={namespace}");
    let (status, run) = sked.post(&path, json!(null)).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("run id");
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    let log = sked.run_log(id).await;
    (run, log)
}

/// The embedded store of a stopped deployment, as the files hold it.
fn stopped_store(sked: &mut Sked) -> sked_store::SqliteStore {
    sked.server
        .as_mut()
        .expect("server")
        .stop(Duration::from_secs(10));
    sked_store::SqliteStore::open(&sked.data_dir().join("sked.db")).expect("open the store")
}

#[tokio::test]
async fn a_sealed_value_opens_only_in_the_namespace_and_job_it_was_sealed_for() {
    use sked_store::{SealedColumn, Store};
    const SECRET: &str = "team-a-only-secret-5d1c0e";
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 2);
    let admin = sked.http.clone();
    let viewer_a = client_for(
        &sked,
        "viewer-a",
        json!({"role": "viewer", "namespaces": ["team-a"]}),
    )
    .await;
    let editor_b = client_for(
        &sked,
        "editor-b",
        json!({"role": "editor", "namespaces": ["team-b"], "shell": true}),
    )
    .await;
    let printing = |env: Value| json!({"target": {"shell": {"command": "printf %s \"$PASSWORD\"", "env": env}}});
    let (status, answer) = api(
        &sked,
        &admin,
        Method::PUT,
        "/jobs/nightly?namespace=team-a",
        Some(printing(json!({"PASSWORD": {"secret": SECRET}}))),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // A viewer of team-a reads the sealed value; an editor of team-b pastes it in vain.
    let (status, read) = api(
        &sked,
        &viewer_a,
        Method::GET,
        "/jobs/nightly?namespace=team-a",
        None,
    )
    .await;
    assert_eq!(status, 200, "{read}");
    let sealed = read["target"]["shell"]["env"]["PASSWORD"].clone();
    assert!(
        sealed["sealed"]
            .as_str()
            .is_some_and(|s| s.starts_with("v2:")),
        "{read}"
    );
    let pasted = printing(json!({"PASSWORD": sealed}));
    let (status, answer) = api(
        &sked,
        &editor_b,
        Method::PUT,
        "/jobs/steal?namespace=team-b",
        Some(pasted.clone()),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["field"], "target.shell.env.PASSWORD",
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("opens only in the job")),
        "{answer}"
    );
    let (status, _) = api(
        &sked,
        &editor_b,
        Method::GET,
        "/jobs/steal?namespace=team-b",
        None,
    )
    .await;
    assert_eq!(status, 404, "nothing was written");
    // Nor does it open in another job of its own namespace.
    let (status, answer) = api(
        &sked,
        &admin,
        Method::PUT,
        "/jobs/other?namespace=team-a",
        Some(pasted),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    let (run, log) = run_job(&sked, "team-a", "nightly").await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(log, SECRET, "it opens where it was sealed");

    // A namespace secret's sealed value copied in the store into another namespace.
    for (namespace, value) in [("team-a", SECRET), ("team-b", "team-b-own-value")] {
        let path = format!("/secrets/db?namespace={namespace}");
        let (status, answer) = api(
            &sked,
            &admin,
            Method::PUT,
            &path,
            Some(json!({"value": value})),
        )
        .await;
        assert_eq!(status, 201, "{answer}");
    }
    let uses_db = json!({"target": {"shell": {"command": "printf %s \"$PASSWORD\"", "env": {"PASSWORD": {"secret_ref": "db"}}}}});
    let (status, answer) = api(
        &sked,
        &editor_b,
        Method::PUT,
        "/jobs/uses-db?namespace=team-b",
        Some(uses_db),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let (run, log) = run_job(&sked, "team-b", "uses-db").await;
    assert_eq!(
        (run["state"].as_str(), log.as_str()),
        (Some("succeeded"), "team-b-own-value")
    );
    let store = stopped_store(&mut sked);
    let stored = store.sealed_texts("v2:").await.expect("read the store");
    let of = |namespace: &str| {
        stored
            .iter()
            .find(|s| s.column == SealedColumn::Secret(namespace.into(), "db".into()))
            .cloned()
            .expect("the secret's row")
    };
    let (theirs, ours) = (of("team-a"), of("team-b"));
    assert!(store
        .replace_sealed(&ours, &theirs.text)
        .await
        .expect("copy"));
    drop(store);
    sked.start_server(&[]).await;
    let (run, log) = run_job(&sked, "team-b", "uses-db").await;
    assert_eq!(run["state"], "failed", "{run}");
    assert!(!log.contains(SECRET), "{log}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("PASSWORD") && !error.contains(SECRET),
        "{run}"
    );
}

#[tokio::test]
async fn unbound_sealed_values_of_an_older_store_are_bound_where_they_are_at_start() {
    use sked_server::secrets::{seal_unbound, SecretKey};
    use sked_store::{SealedColumn, Store};
    const SECRET: &str = "sealed-before-bindings-8c2e";
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    sked.start_worker("w", 2);
    let job = json!({"target": {"shell": {"command": "printf %s \"$PASSWORD\"", "env": {"PASSWORD": {"secret": SECRET}}}}});
    let (status, answer) = sked.put_job("keeper", job).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = call(
        &sked.http,
        Method::PUT,
        sked.url("/secrets/db"),
        Some(json!({"value": SECRET})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // The store as a server before bindings left it: every value `v1:`.
    let key = SecretKey::from_base64(common::SECRET_KEY).expect("the test key");
    let store = stopped_store(&mut sked);
    let v1 = seal_unbound(&key, SECRET);
    for stored in store.sealed_texts("v2:").await.expect("read") {
        let text = match stored.column {
            SealedColumn::Secret(..) => v1.clone(),
            _ => {
                let json: Value = serde_json::from_str(&stored.text).expect("JSON");
                let v2 = json["target"]["shell"]["env"]["PASSWORD"]["sealed"]
                    .as_str()
                    .expect("the sealed value")
                    .to_string();
                stored.text.replace(&v2, &v1)
            }
        };
        assert!(store.replace_sealed(&stored, &text).await.expect("write"));
    }
    assert!(store.sealed_texts("v2:").await.expect("read").is_empty());
    drop(store);

    sked.start_server(&[]).await;
    let (run, log) = run_job(&sked, "default", "keeper").await;
    assert_eq!(
        (run["state"].as_str(), log.as_str()),
        (Some("succeeded"), SECRET),
        "{run}"
    );
    let (_, read) = sked.get("/jobs/keeper").await;
    let sealed = read["target"]["shell"]["env"]["PASSWORD"]["sealed"]
        .as_str()
        .unwrap_or_default();
    assert!(sealed.starts_with("v2:"), "{read}");
    let uses_db = json!({"target": {"shell": {"command": "printf %s \"$PASSWORD\"", "env": {"PASSWORD": {"secret_ref": "db"}}}}});
    assert_eq!(sked.put_job("uses-db", uses_db).await.0, 201);
    let (run, log) = run_job(&sked, "default", "uses-db").await;
    assert_eq!(
        (run["state"].as_str(), log.as_str()),
        (Some("succeeded"), SECRET),
        "{run}"
    );
    // The old text opens nowhere now: pasted elsewhere, it is refused.
    let pasted =
        json!({"target": {"shell": {"command": "true", "env": {"PASSWORD": {"sealed": v1}}}}});
    let (status, answer) = call(
        &sked.http,
        Method::PUT,
        sked.url("/jobs/pasted?namespace=team-b"),
        Some(pasted),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("v1")),
        "{answer}"
    );
    let store = stopped_store(&mut sked);
    assert_eq!(store.sealed_texts("v1:").await.expect("read"), Vec::new());
}

#[tokio::test]
async fn a_token_past_its_request_rate_is_told_to_wait_and_workers_are_not_counted() {
    let mut sked = Sked::new();
    sked.start_server(&["--rate-limit", "5"]).await;
    let reader = client_for(
        &sked,
        "busy",
        json!({"role": "viewer", "namespaces": ["*"]}),
    )
    .await;
    let other = client_for(
        &sked,
        "calm",
        json!({"role": "viewer", "namespaces": ["*"]}),
    )
    .await;
    let mut refused = None;
    for _ in 0..30 {
        let response = reader.get(sked.url("/jobs")).send().await.expect("GET");
        if response.status().as_u16() == 429 {
            refused = Some(response);
            break;
        }
    }
    let refused = refused.expect("a burst of 30 requests at 5/s is refused");
    let retry_after = refused.headers().get("retry-after").cloned();
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(
        retry_after.as_ref().and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (status, _) = call(&other, Method::GET, sked.url("/jobs"), None).await;
    assert_eq!(status, 200, "another token is not held up");
    // A worker's protocol calls are not counted.
    let worker = token(&sked, "w", json!({"role": "worker", "namespaces": ["*"]})).await;
    let hand = HandWorker::register(&sked, &worker, json!({}))
        .await
        .expect("register");
    for _ in 0..30 {
        let url = format!("{}/workers/{}/heartbeat", sked.url(""), hand.id);
        let (status, answer) =
            call(&hand.http, Method::POST, url, Some(json!({"running": []}))).await;
        assert_eq!(status, 200, "{answer}");
    }
    // After the wait, the token is served again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _) = call(&reader, Method::GET, sked.url("/jobs"), None).await;
    assert_eq!(status, 200);
}

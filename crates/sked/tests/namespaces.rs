//! Namespaces as objects, black-box: an administrator forbids shell targets in a namespace and
//! caps its jobs and queued runs; namespace secrets are set once, named by jobs with
//! `secret_ref`, rotated without touching a job, reach only runs of their own namespace, and
//! appear in no answer, audit entry, store file or log line. Also through the CLI.

mod common;

use common::{client_for, client_with_token, sha256_prefix, shell, sked_command, Sked};
use reqwest::Method;
use serde_json::{json, Value};
use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

/// Sends `method path` (under `/api/v1`) with `body` as `client`.
async fn call(
    sked: &Sked,
    client: &reqwest::Client,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    common::call(client, method, sked.url(path), body).await
}

fn http_target() -> Value {
    json!({"http": {"url": "https://example.com/"}})
}

/// Runs `sked` with `args` against `sked`, `stdin` piped in; success, stdout and stderr.
fn cli(sked: &Sked, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = sked_command()
        .args(args)
        .env("SKED_SERVER", sked.base())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sked");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("stdin");
    }
    let out = child.wait_with_output().expect("sked output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_namespace_can_forbid_shell_targets_and_cap_its_jobs() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let admin = client_with_token(Some(common::ADMIN_TOKEN));
    let editor = client_for(
        &sked,
        "locked-editor",
        json!({"role": "editor", "namespaces": ["locked", "team"], "shell": true}),
    )
    .await;

    // Only an admin sets a namespace's settings; a bad cap names its field.
    let settings = json!({"allow_shell": false, "max_jobs": 2});
    let path = "/namespaces/locked";
    let (status, _) = call(&sked, &editor, Method::PUT, path, Some(settings.clone())).await;
    assert_eq!(status, 403);
    let bad = json!({"max_jobs": 0});
    let (status, answer) = call(&sked, &admin, Method::PUT, path, Some(bad)).await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("max_jobs"))
    );
    let (status, set) = call(&sked, &admin, Method::PUT, path, Some(settings)).await;
    assert_eq!(status, 201, "{set}");
    assert_eq!(
        (&set["allow_shell"], &set["max_jobs"], &set["configured"]),
        (&json!(false), &json!(2), &json!(true))
    );

    // Shell targets are refused there, even to an editor with `shell` and to an admin.
    let shell_job = json!({"target": shell("true")});
    for (who, client) in [("editor", &editor), ("admin", &admin)] {
        let (status, answer) = call(
            &sked,
            client,
            Method::PUT,
            "/jobs/run-it?namespace=locked",
            Some(shell_job.clone()),
        )
        .await;
        assert_eq!(status, 403, "{who}: {answer}");
        assert_eq!(answer["error"]["code"], "shell_forbidden", "{answer}");
    }

    // Two jobs fit; the third is refused and not written; the two may still be changed.
    for name in ["one", "two"] {
        let path = format!("/jobs/{name}?namespace=locked");
        let job = json!({"target": http_target()});
        let (status, answer) = call(&sked, &editor, Method::PUT, &path, Some(job)).await;
        assert_eq!(status, 201, "{answer}");
    }
    let job = json!({"target": http_target(), "paused": true});
    let (status, answer) = call(
        &sked,
        &editor,
        Method::POST,
        "/jobs?namespace=locked",
        Some(json!({"name": "three", "target": http_target()})),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &json!("limit_reached")),
        "{answer}"
    );
    let (status, _) = call(
        &sked,
        &editor,
        Method::GET,
        "/jobs/three?namespace=locked",
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, answer) = call(
        &sked,
        &editor,
        Method::PUT,
        "/jobs/two?namespace=locked",
        Some(job),
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // Forbidding shell targets waits until the namespace has none.
    let (status, _) = call(
        &sked,
        &editor,
        Method::PUT,
        "/jobs/backup?namespace=team",
        Some(shell_job),
    )
    .await;
    assert_eq!(status, 201);
    let forbid = json!({"allow_shell": false});
    let (status, answer) = call(&sked, &admin, Method::PUT, "/namespaces/team", Some(forbid)).await;
    assert_eq!(status, 409, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("backup"), "{answer}");
    let (_, team) = call(&sked, &admin, Method::GET, "/namespaces/team", None).await;
    assert_eq!(
        (&team["allow_shell"], &team["configured"]),
        (&json!(true), &json!(false))
    );

    // A token sees the settings of its own namespaces only.
    let outsider = client_for(
        &sked,
        "outsider",
        json!({"role": "viewer", "namespaces": ["elsewhere"]}),
    )
    .await;
    let (status, _) = call(&sked, &outsider, Method::GET, "/namespaces/locked", None).await;
    assert_eq!(status, 403);
    let (_, listed) = call(&sked, &outsider, Method::GET, "/namespaces", None).await;
    // Its own namespace only, with the defaults.
    let names: Vec<&str> = listed["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["elsewhere"], "{listed}");
    let (_, listed) = call(&sked, &editor, Method::GET, "/namespaces", None).await;
    assert_eq!(listed["namespaces"][0]["name"], "locked", "{listed}");

    // The change is in the audit trail with its before and after.
    let (_, audit) = sked.get("/audit?namespace=locked&object=locked").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], "namespace.put", "{audit}");
    assert_eq!(
        entry["after"],
        json!({"allow_shell": false, "max_jobs": 2}),
        "{entry}"
    );

    // The CLI changes only what it is given, shows the settings, and forgets them.
    let (ok, out, err) = cli(
        &sked,
        &["namespace", "set", "-n", "locked", "--max-jobs", "none"],
        "",
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("forbidden") && out.contains("max jobs        none"),
        "{out}"
    );
    let (ok, out, err) = cli(&sked, &["namespace", "list"], "");
    assert!(ok && out.contains("locked"), "{out}{err}");
    let (ok, out, err) = cli(&sked, &["namespace", "reset", "-n", "locked"], "");
    assert!(ok, "{out}{err}");
    let (ok, out, _) = cli(&sked, &["namespace", "show", "-n", "locked"], "");
    assert!(ok && out.contains("the defaults"), "{out}");
    let (status, _) = call(
        &sked,
        &editor,
        Method::PUT,
        "/jobs/now-allowed?namespace=locked",
        Some(json!({"target": shell("true")})),
    )
    .await;
    assert_eq!(status, 201, "the defaults allow shell targets again");
}

#[tokio::test]
async fn a_namespace_cap_on_queued_runs_turns_further_instants_into_backlog_skips() {
    let mut sked = Sked::new();
    // No worker: runs stay queued. The server-wide caps are far above the namespace's.
    sked.start_server(&[]).await;
    let (status, answer) = sked
        .http
        .put(sked.url("/namespaces/default"))
        .json(&json!({"max_queued_runs": 3}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .expect("PUT namespace");
    assert_eq!(status, 201, "{:?}", answer.text().await);
    let job = json!({"schedule": {"every": "200ms"}, "target": shell("true")});
    assert_eq!(sked.put_job("flood", job).await.0, 201);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = sked.runs("flood").await;
    let queued = runs.iter().filter(|r| r["state"] == "queued").count();
    let backlog = runs
        .iter()
        .filter(|r| r["state"] == "skipped" && r["skip_reason"] == "backlog")
        .count();
    assert_eq!(queued, 3, "{runs:?}");
    assert!(backlog >= 5, "{backlog} backlog skips of {}", runs.len());
    assert_eq!(queued + backlog, runs.len());
}

#[tokio::test]
async fn namespace_secrets_are_named_by_jobs_rotated_and_never_shown() {
    const FIRST: &str = "namespace-secret-one-9d2c41";
    const SECOND: &str = "namespace-secret-two-51be07";
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;

    // Set through the CLI from standard input: in no command line.
    let (ok, out, err) = cli(
        &sked,
        &["secret", "set", "db-password"],
        &format!("{FIRST}\n"),
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("created"), "{out}");
    let (ok, out, err) = cli(&sked, &["secret", "list"], "");
    assert!(ok && out.contains("db-password"), "{out}{err}");

    // The job prints a digest of the value it was given, never the value.
    let print = "printf %s \"$DB_PASSWORD\" | sha256sum | cut -c1-16";
    let env = json!({"DB_PASSWORD": {"secret_ref": "db-password"}});
    let job = json!({"target": {"shell": {"command": print, "env": env}}});
    let (status, created) = sked.put_job("uses-ref", job.clone()).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["target"]["shell"]["env"], env,
        "the reference is kept as given"
    );

    let run_once = |job: &'static str, namespace: &'static str| {
        let sked = &sked;
        async move {
            let path = format!("/jobs/{job}/trigger?namespace={namespace}");
            let (_, run) = sked.post(&path, json!(null)).await;
            let id = run["id"].as_i64().unwrap_or_else(|| panic!("{run}"));
            let run = sked.wait_finished(id, Duration::from_secs(20)).await;
            let log = sked.run_log(id).await;
            (run, log)
        }
    };
    let (run, log) = run_once("uses-ref", "default").await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(log.trim(), sha256_prefix(FIRST));

    // Rotated through the API: the next run has the new value, the job unchanged.
    let (status, answer) = call(
        &sked,
        &sked.http,
        Method::PUT,
        "/secrets/db-password",
        Some(json!({"value": SECOND})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["name"], "db-password");
    let (run, log) = run_once("uses-ref", "default").await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(log.trim(), sha256_prefix(SECOND));

    // Another namespace's job naming it gets nothing: its attempt fails, saying why.
    let (status, _) = call(
        &sked,
        &sked.http,
        Method::PUT,
        "/jobs/borrows?namespace=other",
        Some(job),
    )
    .await;
    assert_eq!(status, 201);
    let (run, _) = run_once("borrows", "other").await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("DB_PASSWORD") && error.contains("does not have"),
        "{run}"
    );

    // Deleted, it is gone for the job's own namespace too.
    let (status, _) = call(
        &sked,
        &sked.http,
        Method::DELETE,
        "/secrets/db-password",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (run, _) = run_once("uses-ref", "default").await;
    assert_eq!(run["state"], "failed", "{run}");

    // Bounded and validated: a bad name, an oversized value, an unknown field.
    let long = "x".repeat(64 * 1024 + 1);
    for (path, body) in [
        ("/secrets/bad%20name", json!({"value": "v"})),
        ("/secrets/big", json!({"value": long})),
        ("/secrets/odd", json!({"value": "v", "colour": 1})),
    ] {
        let (status, answer) = call(&sked, &sked.http, Method::PUT, path, Some(body)).await;
        assert_eq!(status, 400, "{path}: {answer}");
    }

    // Nowhere to be read: not in any answer, not in the store's files, not in a log line.
    let mut answers = String::new();
    for path in ["/secrets", "/jobs/uses-ref", "/runs", "/audit?limit=100"] {
        answers.push_str(&sked.get(path).await.1.to_string());
    }
    assert!(
        answers.contains("secret.put"),
        "the changes are audited: {answers}"
    );
    for secret in [FIRST, SECOND] {
        assert!(!answers.contains(secret), "an answer holds a secret");
    }
    sked.server
        .as_mut()
        .expect("dev")
        .stop(Duration::from_secs(10));
    let mut files = Vec::new();
    for dir in [sked.data_dir(), sked.dir.path().to_path_buf()] {
        for entry in std::fs::read_dir(&dir).expect("dir").flatten() {
            files.extend(std::fs::read(entry.path()).unwrap_or_default());
        }
    }
    for secret in [FIRST, SECOND] {
        let needle = secret.as_bytes();
        assert!(
            !files.windows(needle.len()).any(|w| w == needle),
            "a secret is in a file of the data directory or a log"
        );
    }
}

/// Every namespace the caller may see is listed, those that only hold jobs included, in the
/// API, `sked namespace list` and the console's picker; a viewer of one empty namespace finds
/// it there, and the console shows it that namespace rather than a refusal.
#[tokio::test]
async fn namespaces_that_only_hold_jobs_are_listed_for_those_who_see_them() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let admin = client_with_token(Some(common::ADMIN_TOKEN));
    for namespace in ["team-x", "team-z"] {
        let path = format!("/jobs/nightly?namespace={namespace}");
        let job = json!({"target": http_target()});
        let (status, body) = call(&sked, &admin, Method::PUT, &path, Some(job)).await;
        assert_eq!(status, 201, "{body}");
    }
    let names = |answer: &Value| -> Vec<String> {
        answer["namespaces"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|n| n["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let (status, listed) = call(&sked, &admin, Method::GET, "/namespaces", None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(names(&listed), ["team-x", "team-z"], "{listed}");
    assert_eq!(listed["namespaces"][0]["configured"], false, "{listed}");
    let (ok, out, err) = cli(&sked, &["namespace", "list"], "");
    assert!(ok, "{err}");
    assert!(out.contains("team-x") && out.contains("team-z"), "{out}");

    // A viewer of team-x sees it and no other; a viewer of an empty namespace sees that one.
    let secret = common::token(
        &sked,
        "x-viewer",
        json!({"role": "viewer", "namespaces": ["team-x"]}),
    )
    .await;
    let viewer = client_with_token(Some(&secret));
    let (_, listed) = call(&sked, &viewer, Method::GET, "/namespaces", None).await;
    assert_eq!(names(&listed), ["team-x"], "{listed}");
    let empty = client_for(
        &sked,
        "y-viewer",
        json!({"role": "viewer", "namespaces": ["team-y"]}),
    )
    .await;
    let (_, listed) = call(&sked, &empty, Method::GET, "/namespaces", None).await;
    assert_eq!(names(&listed), ["team-y"], "{listed}");

    // The console: the viewer lands on its namespace, with it in the picker.
    let (browser, cookie) = common::console_session(&sked, &secret).await;
    for path in ["/jobs", "/"] {
        let page = browser
            .get(format!("{}{path}", sked.base()))
            .header(reqwest::header::COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        let status = page.status();
        let body = page.text().await.unwrap();
        assert_eq!(status, 200, "{path}: {body}");
        assert!(
            body.contains(r#"<option value="team-x" selected>team-x</option>"#),
            "{path}: {body}"
        );
        assert!(!body.contains("team-z"), "{path}: {body}");
    }
}

/// An editor without the shell grant may re-apply a file holding shell jobs someone else wrote,
/// as long as they are unchanged; changing one still needs the grant.
#[tokio::test]
async fn an_unchanged_shell_job_needs_no_shell_grant_to_apply_again() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let file = sked.dir.path().join("jobs.yaml");
    let path = file.to_str().unwrap();
    let jobs = "
jobs:
  - name: backup
    schedule: {every: 1h}
    target: {shell: {command: 'echo backup'}}
  - name: ping
    schedule: {every: 1h}
    target: {http: {url: 'https://example.com/'}}
";
    std::fs::write(&file, jobs).unwrap();
    let (ok, out, err) = cli(&sked, &["job", "apply", "-f", path], "");
    assert!(ok, "{out}{err}");
    let editor = common::token(
        &sked,
        "no-shell-editor",
        json!({"role": "editor", "namespaces": ["default"]}),
    )
    .await;
    let as_editor = |args: &[&str]| {
        let out = sked_command()
            .args(args)
            .env("SKED_SERVER", sked.base())
            .env("SKED_TOKEN", &editor)
            .output()
            .expect("run sked");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = as_editor(&["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("unchanged backup") && out.contains("unchanged ping"),
        "{out}"
    );
    // So is a PUT of the same definition.
    let client = client_with_token(Some(&editor));
    let same = json!({"schedule": {"every": "1h"}, "target": shell("echo backup")});
    let (status, body) = call(&sked, &client, Method::PUT, "/jobs/backup", Some(same)).await;
    assert_eq!(status, 200, "{body}");

    // A changed shell job is refused, and the file with it writes nothing.
    std::fs::write(
        &file,
        jobs.replace("echo backup", "echo changed")
            .replace("example.com/", "example.com/other"),
    )
    .unwrap();
    let (ok, out, err) = as_editor(&["job", "apply", "-f", path]);
    assert!(!ok, "{out}{err}");
    assert!(err.contains("shell permission"), "{err}");
    let (_, ping) = sked.get("/jobs/ping").await;
    assert_eq!(
        ping["target"]["http"]["url"], "https://example.com/",
        "{ping}"
    );
    let changed = json!({"schedule": {"every": "1h"}, "target": shell("echo changed")});
    let (status, body) = call(&sked, &client, Method::PUT, "/jobs/backup", Some(changed)).await;
    assert_eq!(status, 403, "{body}");
}

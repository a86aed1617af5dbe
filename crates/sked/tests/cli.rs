//! The command line against a real server: `sked job apply` reports what changed and a bad file
//! changes nothing; the other client commands print what the API holds; a config file sets
//! what flags and variables leave unset, and a bad one starts nothing.

mod common;

use common::{shell, sked_command, Proc, Sked};
use serde_json::json;
use std::time::Duration;

fn sked_cli(sked: &Sked, args: &[&str]) -> (bool, String, String) {
    sked.cli(args)
}

#[tokio::test]
async fn apply_reports_created_updated_and_unchanged() {
    let mut sked = Sked::new();
    // `ping` below names a loopback address, which `sked server` refuses by default.
    sked.start_server(&["--http-target-allow", "127.0.0.1"])
        .await;
    let file = sked.dir.path().join("jobs.yaml");
    let v1 = "
jobs:
  - name: report
    schedule: {cron: '0 30 2 * * *', timezone: Europe/London}
    target: {shell: {command: 'echo report'}}
  - name: ping
    schedule: {every: 5m}
    target: {http: {url: 'http://127.0.0.1:9/health'}}
";
    std::fs::write(&file, v1).unwrap();
    let path = file.to_str().unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("created   report") && out.contains("created   ping"),
        "{out}"
    );

    std::fs::write(&file, v1.replace("5m", "10m")).unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("unchanged report") && out.contains("updated   ping"),
        "{out}"
    );

    // One bad job: nothing is applied, and the error names it.
    std::fs::write(
        &file,
        v1.replace("5m", "-5s")
            .replace("echo report", "echo changed"),
    )
    .unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("nothing was applied") && err.contains("ping"),
        "{err}"
    );
    let (_, report) = sked.get("/jobs/report").await;
    assert_eq!(report["target"]["shell"]["command"], "echo report");

    let (ok, out, _) = sked_cli(&sked, &["job", "list"]);
    assert!(ok);
    assert!(
        out.contains("report") && out.contains("cron 0 30 2 * * * Europe/London"),
        "{out}"
    );
    let (ok, out, _) = sked_cli(&sked, &["job", "preview", "report", "--count", "3"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 3, "{out}");

    let (ok, out, err) = sked_cli(&sked, &["job", "get", "missing"]);
    assert!(!ok, "{out}");
    assert!(err.contains("does not exist"), "{err}");
}

/// `--dry-run` prints the change per job and field and writes nothing; `--prune` deletes the
/// jobs the file no longer lists, dependants before their upstreams, and only in its namespace.
#[tokio::test]
async fn apply_dry_run_shows_the_diff_and_prune_deletes_what_the_file_dropped() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let file = sked.dir.path().join("jobs.yaml");
    let path = file.to_str().unwrap();
    let v1 = "
jobs:
  - name: extract
    schedule: {every: 1h}
    target: {shell: {command: 'echo extract'}}
  - name: transform
    target: {shell: {command: 'echo transform'}}
    depends_on: [{job: extract}]
  - name: report
    schedule: {every: 5m}
    target: {shell: {command: 'echo report'}}
";
    std::fs::write(&file, v1).unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--dry-run"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("create    extract") && out.contains("create    report"),
        "{out}"
    );
    assert!(out.contains("nothing was changed"), "{out}");
    let (status, _) = sked.get("/jobs/extract").await;
    assert_eq!(status, 404, "a dry run writes nothing");

    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    // A job in another namespace, which a prune of `default` must leave alone.
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--namespace", "other"]);
    assert!(ok, "{out}{err}");

    let v2 = "
jobs:
  - name: report
    schedule: {every: 10m}
    target: {shell: {command: 'echo report'}}
    timeout: 30s
";
    std::fs::write(&file, v2).unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--dry-run", "--prune"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("update    report"), "{out}");
    assert!(out.contains("~ schedule.every: \"5m\" -> \"10m\""), "{out}");
    assert!(out.contains("+ timeout: \"30s\""), "{out}");
    let deleted: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("delete    "))
        .collect();
    assert_eq!(deleted, ["transform", "extract"], "dependants first: {out}");
    assert_eq!(
        sked.get("/jobs/extract").await.0,
        200,
        "a dry run deletes nothing"
    );

    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--prune"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("deleted   transform") && out.contains("deleted   extract"),
        "{out}"
    );
    assert_eq!(sked.get("/jobs/extract").await.0, 404);
    assert_eq!(sked.get("/jobs/transform").await.0, 404);
    let (_, report) = sked.get("/jobs/report").await;
    assert_eq!(report["schedule"]["every"], "10m", "{report}");
    let (status, _) = sked.get("/jobs/extract?namespace=other").await;
    assert_eq!(status, 200, "the other namespace keeps its jobs");

    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--dry-run", "--prune"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("unchanged report") && !out.contains("delete"),
        "{out}"
    );
}

/// Every change keeps the definition it replaced: `sked job history` lists them with what
/// each changed, a run names the version it ran under, and `sked job rollback` puts an earlier
/// one back as a new version (audited as such). A version that is not kept is refused by field.
#[tokio::test]
async fn history_lists_versions_and_rollback_restores_one_as_a_new_version() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = |command: &str| json!({"target": shell(command)});
    assert_eq!(sked.put_job("versioned", job("echo one")).await.0, 201);
    let (status, run) = sked.post("/jobs/versioned/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let first_run = run["id"].as_i64().unwrap();
    assert_eq!(sked.put_job("versioned", job("echo two")).await.0, 200);
    let (status, body) = sked
        .put_job(
            "versioned",
            json!({"target": shell("echo two"), "timeout": "30s"}),
        )
        .await;
    assert_eq!((status, body["version"].as_u64()), (200, Some(3)), "{body}");

    let (ok, out, err) = sked_cli(&sked, &["job", "history", "versioned"]);
    assert!(ok, "{out}{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows[0].starts_with("3*") && rows[0].contains("timeout"),
        "{out}"
    );
    assert!(
        rows[1].starts_with("2 ") && rows[1].contains("target.shell.command"),
        "{out}"
    );
    assert!(
        rows[2].starts_with("1 ") && rows[2].contains("(created)"),
        "{out}"
    );

    let (ok, out, err) = sked_cli(&sked, &["job", "rollback", "versioned", "--to", "1"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("version 4"), "{out}");
    let (_, current) = sked.get("/jobs/versioned").await;
    assert_eq!(
        current["target"]["shell"]["command"], "echo one",
        "{current}"
    );
    assert!(current.get("timeout").is_none(), "{current}");
    let (_, versions) = sked.get("/jobs/versioned/versions").await;
    assert_eq!(versions["current"], 4, "{versions}");
    assert_eq!(
        versions["versions"].as_array().unwrap().len(),
        4,
        "{versions}"
    );

    let (status, run) = sked.post("/jobs/versioned/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["job_version"], 4, "{run}");
    assert_eq!(sked.run(first_run).await["job_version"], 1);

    let (status, body) = sked
        .post("/jobs/versioned/rollback", json!({"to": 9}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "to", "{body}");
    let (status, _) = sked
        .post("/jobs/nothing-here/rollback", json!({"to": 1}))
        .await;
    assert_eq!(status, 404);
    let (_, audit) = sked.get("/audit?object=versioned").await;
    let entries = audit["entries"].as_array().cloned().unwrap_or_default();
    assert!(
        entries.iter().any(|e| e["action"] == "job.rollback"),
        "the rollback is audited: {audit}"
    );
}

/// A server started with a config file listens where the file says; a flag and an
/// environment variable each win over the file.
#[tokio::test]
async fn config_file_settings_rank_below_flags_and_environment() {
    let mut sked = Sked::new();
    let file_port = common::free_port();
    let file = sked.dir.path().join("sked.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = \"127.0.0.1:{file_port}\"\ndata-dir = \"{}\"\n\
             heartbeat-timeout = \"7s\"\n",
            sked.data_dir().display()
        ),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let log = |name: &str| sked.dir.path().join(format!("{name}.log"));

    // From the file alone.
    sked.port = file_port;
    sked.server = Some(Proc::spawn(
        "server",
        &["server", "--config", path],
        &log("file"),
    ));
    sked.wait_ready().await;
    sked.server.take().unwrap().stop(Duration::from_secs(10));

    // A flag wins over the file.
    let flag_port = common::free_port();
    let flag_listen = format!("127.0.0.1:{flag_port}");
    sked.port = flag_port;
    sked.server = Some(Proc::spawn(
        "server",
        &["server", "--config", path, "--listen", &flag_listen],
        &log("flag"),
    ));
    sked.wait_ready().await;
    sked.server.take().unwrap().stop(Duration::from_secs(10));

    // So does the environment, and the file is named by it too.
    let env_port = common::free_port();
    let out = std::fs::File::create(log("env")).unwrap();
    let child = sked_command()
        .args(["server"])
        .env("SKED_CONFIG", path)
        .env("SKED_LISTEN", format!("127.0.0.1:{env_port}"))
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    sked.port = env_port;
    sked.server = Some(Proc {
        child,
        name: "server".into(),
    });
    sked.wait_ready().await;
}

/// `sked config check` and a start with a bad file both name the table and the key at fault;
/// a bad file starts nothing.
#[test]
fn a_bad_config_file_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[server]\nlisten = \"127.0.0.1:0\"\n[worker]\nslots = 4\nlabels = [\"zone=eu\"]\n",
    )
    .unwrap();
    let out = sked_command()
        .args(["config", "check", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with(": ok\n"));

    let bad = dir.path().join("bad.toml");
    for (text, expected) in [
        (
            "[server]\nlisen = \"127.0.0.1:0\"\n",
            "[server] has no setting `lisen`",
        ),
        (
            "[server]\nheartbeat-timeout = \"soon\"\n",
            "[server] heartbeat-timeout",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let checked = sked_command()
            .args(["config", "check", bad.to_str().unwrap()])
            .output()
            .unwrap();
        let started = sked_command()
            .args(["server", "--config", bad.to_str().unwrap()])
            .env("SKED_DATA_DIR", dir.path().join("data"))
            .output()
            .unwrap();
        for out in [checked, started] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{text}: {out:?}");
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
    // The refused start wrote no store.
    assert!(!dir.path().join("data").exists());
}

/// `--log-format json` writes one JSON object per line, the start banner too, and the lines about an attempt carry
/// its run id, attempt id, namespace and job as keys.
#[tokio::test]
async fn json_logs_carry_the_attempts_fields() {
    let mut sked = Sked::new();
    sked.start_dev(&["--log-format", "json"]).await;
    let (status, body) = sked
        .put_job(
            "nightly-export",
            serde_json::json!({"target": {"shell": {"command": "true"}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, run) = sked
        .post("/jobs/nightly-export/trigger", serde_json::json!({}))
        .await;
    assert!(status < 300, "{run}");
    let run_id = run["id"].as_i64().expect("a run id");
    let done = sked.wait_finished(run_id, Duration::from_secs(30)).await;
    assert_eq!(done["state"], "succeeded", "{done}");

    let log_path = std::fs::read_dir(sked.dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dev-") && n.ends_with(".log"))
        })
        .expect("the dev log");
    // The attempt ended before its run was recorded, so its line is written by now. The file
    // holds standard output too: every line of both is JSON, the start banner included.
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let banner = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("sked dev listening on http://"))
        })
        .unwrap_or_else(|| panic!("no start banner: {text}"));
    assert_eq!(banner["level"], "INFO", "{banner}");
    let ended = lines
        .iter()
        .find(|l| l["message"] == "attempt ended" && l["span"]["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no `attempt ended` line for run {run_id}: {text}"));
    assert_eq!(ended["outcome"], "succeeded", "{ended}");
    assert_eq!(ended["span"]["job"], "nightly-export", "{ended}");
    assert_eq!(ended["span"]["namespace"], "default", "{ended}");
    assert!(ended["span"]["attempt_id"].is_i64(), "{ended}");
    assert!(
        ended["level"] == "INFO" && ended["timestamp"].is_string(),
        "{ended}"
    );
}

#[tokio::test]
async fn a_backfill_followed_to_its_end_says_how_its_runs_ended() {
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "2"]).await;
    for (name, command) in [("daily-export", "true"), ("daily-broken", "exit 1")] {
        let job = json!({"schedule": {"cron": "0 0 3 * * *"}, "target": shell(command)});
        let (status, body) = sked.put_job(name, job).await;
        assert_eq!(status, 201, "{body}");
    }
    let range = [
        "--from",
        "2026-11-01T00:00:00Z",
        "--to",
        "2026-11-05T23:59:59Z",
    ];
    let mut args = vec!["job", "backfill", "daily-export", "--wait"];
    args.extend(range);
    let (ok, out, err) = sked_cli(&sked, &args);
    assert!(ok, "{out}{err}");
    assert!(out.contains("5 of 5 instants recorded as runs"), "{out}");
    assert!(
        err.contains("daily-export: 5 of 5 runs ended (5 succeeded)"),
        "{err}"
    );

    let mut args = vec!["job", "backfill", "daily-broken", "--wait"];
    args.extend(range);
    let (ok, out, err) = sked_cli(&sked, &args);
    assert!(!ok, "{out}{err}");
    assert!(err.contains("5 of 5 runs ended (5 failed)"), "{err}");
    assert!(
        err.contains("5 of 5 backfilled runs did not succeed"),
        "{err}"
    );
}

/// `sked job apply -f` writes the whole file or nothing: a file whose second job names a broker
/// connection the server does not have creates neither job, and `--dry-run` refuses it the
/// same way (non-zero, naming the job and the connection); a good file's dry run still writes
/// nothing.
#[tokio::test]
async fn apply_writes_the_whole_file_or_nothing_and_a_dry_run_refuses_the_same() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let file = sked.dir.path().join("jobs.yaml");
    let path = file.to_str().unwrap();
    std::fs::write(
        &file,
        "
jobs:
  - name: first
    schedule: {every: 1h}
    target: {http: {url: 'https://example.com/'}}
  - name: second
    schedule: {every: 1h}
    target: {amqp: {connection: events, exchange: orders, routing_key: new}}
",
    )
    .unwrap();
    for dry_run in [true, false] {
        let mut args = vec!["job", "apply", "-f", path];
        if dry_run {
            args.push("--dry-run");
        }
        let (ok, out, err) = sked_cli(&sked, &args);
        assert!(!ok, "dry run {dry_run}: {out}{err}");
        assert!(
            err.contains("nothing was applied")
                && err.contains("job \"second\"")
                && err.contains("no broker connection named \"events\""),
            "dry run {dry_run}: {err}"
        );
        assert!(!out.contains("create"), "dry run {dry_run}: {out}");
        let (status, body) = sked.get("/jobs/first").await;
        assert_eq!(
            status, 404,
            "dry run {dry_run}: the first job was written: {body}"
        );
    }
    let (status, answer) = sked
        .post(
            "/apply",
            json!({"jobs": [
                {"name": "first", "target": {"http": {"url": "https://example.com/"}}},
                {"name": "second", "target": {"amqp": {"connection": "events", "exchange": "o", "routing_key": "n"}}},
            ]}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["field"], "jobs[1].target.amqp.connection",
        "{answer}"
    );

    // Without the bad job: the dry run says what applying does and writes nothing.
    std::fs::write(
        &file,
        "
jobs:
  - name: second
    target: {http: {url: 'https://example.com/b'}}
    depends_on: [{job: first}]
  - name: first
    schedule: {every: 1h}
    target: {http: {url: 'https://example.com/'}}
",
    )
    .unwrap();
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path, "--dry-run"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("create    first") && out.contains("create    second"),
        "{out}"
    );
    assert_eq!(sked.get("/jobs/first").await.0, 404);
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("created   first") && out.contains("created   second"),
        "{out}"
    );
    let (ok, out, err) = sked_cli(&sked, &["job", "apply", "-f", path]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("unchanged first") && out.contains("unchanged second"),
        "{out}"
    );
}

/// A client command whose reader has gone (`sked job list | head -0`) ends quietly: by
/// SIGPIPE, as Unix tools do, or with status 0, never with a panic.
#[tokio::test]
async fn a_client_whose_output_pipe_closed_exits_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    for i in 0..3 {
        let job = json!({"schedule": {"every": "1h"}, "target": shell("true")});
        assert_eq!(sked.put_job(&format!("job-{i}"), job).await.0, 201);
    }
    let mut child = sked_command()
        .args(["job", "list"])
        .env("SKED_SERVER", sked.base())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes before the command has read its answer from the server.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || out.status.signal() == Some(13),
        "{:?}: {err}",
        out.status
    );
    assert!(!err.contains("panicked") && err.is_empty(), "{err}");
}

/// `sked health`, what a container's health check runs, succeeds only when the server answers
/// 200, and otherwise says what answered or why nothing did, within its timeout. Without
/// `--server` it finds the server at the address `SKED_LISTEN` names, on loopback when that
/// address is every address.
#[tokio::test]
async fn health_succeeds_only_when_the_server_answers_200() {
    let mut sked = Sked::new();
    let listen_everywhere = format!("0.0.0.0:{}", sked.port);
    let health = |args: &[&str]| {
        let out = sked_command()
            .arg("health")
            .args(args)
            .env("SKED_LISTEN", &listen_everywhere)
            .output()
            .expect("run sked health");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let base = sked.base();

    let (ok, out, err) = health(&[]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!("cannot reach the sked server at {base}")),
        "{err}"
    );

    sked.start_server(&[]).await;
    let (ok, out, err) = health(&[]);
    assert!(ok, "{out}{err}");
    assert_eq!(out.trim(), format!("{base}/readyz: ready"));
    let (ok, out, err) = health(&["--live"]);
    assert!(ok, "{out}{err}");
    assert_eq!(out.trim(), format!("{base}/healthz: ok"));

    // An answer other than 200 fails, naming the status.
    let elsewhere = format!("{base}/nowhere");
    let (ok, out, err) = health(&["--server", &elsewhere]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!("{elsewhere}/readyz answered 404 Not Found")),
        "{err}"
    );

    // A server that takes the connection and never answers fails the check in time.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let (ok, out, err) = health(&["--server", &silent_url, "--timeout", "1s"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!("cannot reach the sked server at {silent_url}")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Once the server has stopped, the check fails again.
    if let Some(server) = sked.server.as_mut() {
        server.stop(Duration::from_secs(10));
    }
    let (ok, _, err) = health(&[]);
    assert!(!ok);
    assert!(err.contains("cannot reach the sked server"), "{err}");
}

/// `sked config check` reports every mistake of a file at once, with the nearest known name
/// for a misspelt table or key.
#[test]
fn config_check_reports_every_mistake_with_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sked.toml");
    std::fs::write(
        &file,
        "[servr]\nlisten = \"x\"\n[server]\nlisen = \"127.0.0.1:0\"\nretention = \"soon\"\n\
         [worker]\nslots = \"many\"\nlables = [\"zone=eu\"]\n",
    )
    .unwrap();
    let out = sked_command()
        .args(["config", "check", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for expected in [
        "[servr] is not a command that reads a config file (one of: server, worker, dev); did \
         you mean [server]?",
        "[server] has no setting `lisen`; did you mean `listen`?",
        "[server] retention",
        "[worker] slots",
        "[worker] has no setting `lables`; did you mean `labels`?",
        "5 mistake(s) in",
    ] {
        assert!(err.contains(expected), "{expected:?} not in:\n{err}");
    }
}

/// A job that runs after another (`depends_on`, no schedule) is listed as "after <upstream>"
/// with the upstream's next instant, in the CLI, the API and the console; its history tells a
/// pause from a resume.
#[tokio::test]
async fn a_dependant_without_a_schedule_runs_after_its_upstream() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let extract = json!({"schedule": {"every": "1h"}, "target": shell("true")});
    let (status, extract) = sked.put_job("extract", extract).await;
    assert_eq!(status, 201, "{extract}");
    let load = json!({"target": shell("true"), "depends_on": [{"job": "extract"}]});
    assert_eq!(sked.put_job("load", load).await.0, 201);
    let next = extract["next_fire_at"]
        .as_str()
        .expect("extract's next instant");

    let (_, view) = sked.get("/jobs/load").await;
    assert_eq!(view["after"]["upstreams"], json!(["extract"]), "{view}");
    assert_eq!(view["after"]["next_fire_at"], next, "{view}");
    let (_, listing) = sked.get("/jobs").await;
    let listed = listing["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "load")
        .cloned()
        .expect("load listed");
    assert_eq!(listed["after"]["next_fire_at"], next, "{listed}");

    let (ok, out, err) = sked_cli(&sked, &["job", "list"]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("load"))
        .expect("load listed");
    assert!(line.contains("after extract"), "{out}");
    assert!(line.contains(&format!("{next} (upstream)")), "{out}");
    assert!(!line.contains("manual"), "{out}");

    let page = common::http_client()
        .get(format!("{}/jobs/default/load", sked.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("after extract"), "{page}");
    assert!(!page.contains("only when triggered"), "{page}");
    assert!(page.contains("the upstream's next instant"), "{page}");

    // History: a pause and a resume each read as what they were.
    for action in ["pause", "resume"] {
        let (ok, out, err) = sked_cli(&sked, &["job", action, "load"]);
        assert!(ok, "{out}{err}");
    }
    let (ok, out, err) = sked_cli(&sked, &["job", "history", "load"]);
    assert!(ok, "{err}");
    let changed: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(changed, ["resumed", "paused", "(created)"], "{out}");
}

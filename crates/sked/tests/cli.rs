//! The command line against a real server: `sked job apply` reports what changed and a bad file
//! changes nothing; the other client commands print what the API holds; a config file sets
//! what flags and variables leave unset, and a bad one starts nothing.

mod common;

use common::{shell, sked_command, Proc, Sked};
use serde_json::json;
use std::time::Duration;

fn sked_cli(sked: &Sked, args: &[&str]) -> (bool, String, String) {
    let out = sked_command()
        .args(args)
        .env("SKED_SERVER", sked.base())
        .output()
        .expect("run sked");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

/// `--log-format json` writes one JSON object per line, and the lines about an attempt carry
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
    // holds standard output too, where the one banner line is for people.
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.starts_with("sked dev listening on"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
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

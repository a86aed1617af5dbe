//! The embedded store when its disk or its file goes wrong, through the real binary: a database
//! emptied or damaged since the store was created is refused at start with the file named, an
//! operator can check it with `sked store check`, and when writes fail (the file can no longer
//! grow, as on a full disk) `/readyz` says so, the log does not flood, and both recover once
//! writes commit again. A new store is readable by its owner only.

mod common;

use common::{shell, sked_command, Sked, FAST_HEARTBEATS};
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `sked ARGS` to its end (bounded) and returns whether it succeeded and what it printed.
fn sked_to_end(args: &[&str]) -> (bool, String) {
    let mut child = sked_command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sked");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sked {args:?} did not end within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A store with `jobs` jobs in `sked.data_dir()`, stopped cleanly (its WAL folded back).
async fn stopped_store(jobs: usize) -> Sked {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    for i in 0..jobs {
        let job = json!({"schedule": {"every": "1h"}, "target": shell("true"),
                         "description": "x".repeat(200)});
        assert_eq!(sked.put_job(&format!("job-{i}"), job).await.0, 201);
    }
    if let Some(server) = sked.server.as_mut() {
        server.stop(Duration::from_secs(10));
    }
    sked
}

fn db(sked: &Sked) -> PathBuf {
    sked.data_dir().join("sked.db")
}

fn start_args(sked: &Sked) -> Vec<String> {
    let port = sked.port.to_string();
    vec![
        "server".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--data-dir".into(),
        sked.data_dir().display().to_string(),
    ]
}

fn refused(sked: &Sked) -> String {
    let args = start_args(sked);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, text) = sked_to_end(&args);
    assert!(!ok, "sked started on a bad store: {text}");
    text
}

#[tokio::test]
async fn an_emptied_database_is_refused_not_started_afresh() {
    let sked = stopped_store(3).await;
    let path = db(&sked);
    std::fs::write(&path, b"").expect("empty the database");
    let text = refused(&sked);
    assert!(
        text.contains(&path.display().to_string()) && text.contains("empty"),
        "the refusal names the file and says why: {text}"
    );
    // A missing file is refused the same way.
    std::fs::remove_file(&path).expect("remove the database");
    let text = refused(&sked);
    assert!(text.contains("missing"), "{text}");
    assert!(!path.exists(), "the refusal created nothing");
    let dir = sked.data_dir().display().to_string();
    let (ok, text) = sked_to_end(&["store", "check", "--data-dir", &dir]);
    assert!(!ok && text.contains("missing"), "{text}");
}

#[tokio::test]
async fn a_damaged_page_is_refused_at_start_and_found_by_store_check() {
    let sked = stopped_store(200).await;
    let path = db(&sked);
    let dir = sked.data_dir().display().to_string();
    let (ok, text) = sked_to_end(&["store", "check", "--data-dir", &dir]);
    assert!(ok && text.contains("ok"), "a sound store checks ok: {text}");

    // Overwrite pages 2 to 5 (4 KiB pages), where the tables' first pages are, and drop the
    // write-ahead log, whose newer copies of pages would otherwise be read instead.
    for side in ["sked.db-wal", "sked.db-shm"] {
        let _ = std::fs::remove_file(sked.data_dir().join(side));
    }
    let mut bytes = std::fs::read(&path).expect("read the database");
    assert!(bytes.len() > 6 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096..5 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).expect("damage the database");

    let text = refused(&sked);
    assert!(
        text.contains(&path.display().to_string()) && text.contains("damaged"),
        "the refusal names the file and says why: {text}"
    );
    let (ok, text) = sked_to_end(&["store", "check", "--data-dir", &dir]);
    assert!(!ok, "store check reports the damage: {text}");
    assert!(text.contains("problem"), "{text}");
}

/// `prlimit` on a running process: the largest size its writes may grow a file to.
fn limit_file_size(pid: u32, limit: &str) {
    let status = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--fsize={limit}:unlimited"),
        ])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success(), "prlimit --fsize={limit} failed");
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test]
async fn when_writes_fail_readyz_says_so_and_the_log_does_not_flood() {
    let mut sked = Sked::new();
    let log_path = sked.dir.path().join("dev.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut args = start_args(&sked);
    args[0] = "dev".into();
    args.extend(FAST_HEARTBEATS.iter().map(|a| a.to_string()));
    // Past the file size limit a write fails with EFBIG, as on a full disk, once SIGXFSZ
    // (which would kill the process) is ignored; the disposition survives exec.
    let mut command = sked_command();
    command
        .args(&args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    // SAFETY: sigaction is async-signal-safe, as a pre_exec closure must be.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGXFSZ,
                nix::sys::signal::SigHandler::SigIgn,
            )
            .map(|_| ())
            .map_err(std::io::Error::from)
        });
    }
    let child = command.spawn().expect("start sked dev");
    let pid = child.id();
    sked.server = Some(common::Proc {
        child,
        name: "dev".into(),
    });
    sked.wait_ready().await;

    // A job that writes 64 KiB of output five times a second.
    let job = json!({"schedule": {"every": "200ms"},
                     "target": shell("head -c 65536 /dev/zero | tr '\\0' x")});
    assert_eq!(sked.put_job("chatty", job).await.0, 201);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let data = sked.data_dir();
    let largest = ["sked.db", "sked.db-wal"]
        .iter()
        .map(|f| file_size(&data.join(f)))
        .max()
        .unwrap_or(0);
    limit_file_size(pid, &(largest + 256 * 1024).to_string());

    let readyz = || async {
        let resp = sked
            .http
            .get(format!("{}/readyz", sked.base()))
            .send()
            .await
            .expect("readyz");
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, body) = loop {
        let (status, body) = readyz().await;
        if status == 503 {
            break (status, body);
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("cannot commit"), "{status}: {body}");
    let failing_since = Instant::now();
    // Writes keep failing for a while: ten a second of them, before.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (status, _) = readyz().await;
    assert_eq!(status, 503, "still failing");
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let failure_lines = text
        .lines()
        .filter(|l| l.contains("checkpoint failed") || l.contains("store:"))
        .count();
    let seconds = failing_since.elapsed().as_secs() + 2;
    println!("{failure_lines} failure lines in about {seconds} s of failing writes");
    assert!(
        failure_lines as u64 <= 4 * seconds,
        "{failure_lines} failure lines in about {seconds} s:\n{text}"
    );

    // The disk has room again: the next write commits and the node is ready.
    limit_file_size(pid, "unlimited");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = readyz().await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_new_store_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({"target": {"shell": {"command": "true", "env": {"TOKEN": "s3cret"}}}});
    assert_eq!(sked.put_job("private", job).await.0, 201);
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let dir = sked.data_dir();
    assert_eq!(mode(&dir), 0o700, "the data directory");
    for file in ["sked.db", "sked.db-wal", "sked.db-shm"] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
}

/// `sked store backup` copies a store that is in use, with a run in flight and the newest
/// writes still in the WAL; the copy is private, passes `sked store check`, and a server
/// started on it has every job. It never overwrites a file, and a store that is not there is
/// an error that leaves no file behind.
#[tokio::test]
async fn a_running_store_is_backed_up_and_the_copy_restores() {
    use std::os::unix::fs::PermissionsExt;
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    for i in 0..5 {
        let job = json!({"schedule": {"every": "1h"}, "target": shell("true")});
        assert_eq!(sked.put_job(&format!("job-{i}"), job).await.0, 201);
    }
    assert_eq!(
        sked.put_job("long", json!({"target": shell("sleep 5")}))
            .await
            .0,
        201
    );
    let (_, run) = sked.post("/jobs/long/trigger", json!({})).await;
    assert!(run["id"].is_i64(), "{run}");

    let backup = sked.dir.path().join("backup.db");
    let data = sked.data_dir();
    let data = data.to_str().unwrap();
    let to = backup.to_str().unwrap();
    let (ok, out) = sked_to_end(&["store", "backup", "--data-dir", data, "--to", to]);
    assert!(ok && out.contains("backed up to"), "{out}");
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Never over an existing file, which stays as it was.
    let before = std::fs::read(&backup).unwrap();
    let (ok, out) = sked_to_end(&["store", "backup", "--data-dir", data, "--to", to]);
    assert!(!ok && out.contains("exists already"), "{out}");
    assert_eq!(std::fs::read(&backup).unwrap(), before);
    // No store there: an error, and no file.
    let nowhere = sked.dir.path().join("nowhere");
    let stray = sked.dir.path().join("stray.db");
    let (ok, out) = sked_to_end(&[
        "store",
        "backup",
        "--data-dir",
        nowhere.to_str().unwrap(),
        "--to",
        stray.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(!stray.exists() && !sked.dir.path().join("stray.db.partial").exists());

    // Restored into a directory of its own, the copy checks out and serves every job.
    let mut restored = Sked::new();
    std::fs::create_dir_all(restored.data_dir()).unwrap();
    std::fs::copy(&backup, restored.data_dir().join("sked.db")).unwrap();
    let restored_dir = restored.data_dir();
    let (ok, out) = sked_to_end(&[
        "store",
        "check",
        "--data-dir",
        restored_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    restored.start_dev(&[]).await;
    for name in ["job-0", "job-4", "long"] {
        assert_eq!(
            restored.get(&format!("/jobs/{name}")).await.0,
            200,
            "{name}"
        );
    }
}

/// The audit trail's entries, newest first, as `(action, object)`.
async fn audit_trail(sked: &Sked) -> Vec<(String, String)> {
    let (status, page) = sked.get("/audit?limit=100").await;
    assert_eq!(status, 200, "{page}");
    page["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (text(&e["action"]), text(&e["object"]))
        })
        .collect()
}

/// A change and its audit entry commit together or not at all, for every audited write. While
/// the store refuses audit entries (a trigger on the table stands in for a disk that refuses
/// them), each change fails with nothing changed and no entry, and `/readyz` says the store
/// cannot commit; once entries are taken again, the node is ready and the same changes are
/// made with their entries.
#[tokio::test]
async fn a_change_is_made_only_with_its_audit_entry_and_readyz_says_when_writes_fail() {
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let job = json!({"target": shell("sleep 30")});
    assert_eq!(sked.put_job("kept", job.clone()).await.0, 201);
    let (status, run) = sked.post("/jobs/kept/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let run_id = run["id"].as_i64().expect("run id");
    let (status, _) = sked
        .post(
            "/tokens",
            json!({"name": "old", "role": "viewer", "namespaces": ["default"]}),
        )
        .await;
    assert_eq!(status, 201);
    let trail = audit_trail(&sked).await;

    let db = rusqlite::Connection::open(db(&sked)).expect("open the store beside the server");
    db.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    db.execute_batch(
        "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit \
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .expect("refuse audit entries");

    // Each audited write, with a look that says whether it was made.
    let changes: [(reqwest::Method, &str, serde_json::Value); 9] = [
        (reqwest::Method::PUT, "/jobs/fresh", job.clone()),
        (
            reqwest::Method::PUT,
            "/jobs/kept",
            json!({"target": shell("sleep 31")}),
        ),
        (reqwest::Method::POST, "/jobs/kept/trigger", json!({})),
        (reqwest::Method::POST, "/jobs/kept/pause", json!({})),
        (
            reqwest::Method::POST,
            &format!("/runs/{run_id}/cancel"),
            json!({}),
        ),
        (
            reqwest::Method::POST,
            "/tokens",
            json!({"name": "new", "role": "viewer", "namespaces": ["default"]}),
        ),
        (
            reqwest::Method::DELETE,
            "/tokens/old",
            serde_json::Value::Null,
        ),
        (
            reqwest::Method::PUT,
            "/namespaces/team",
            json!({"max_jobs": 5}),
        ),
        (
            reqwest::Method::PUT,
            "/secrets/pw?namespace=default",
            json!({"value": "x"}),
        ),
    ];
    let runs_before = sked.runs("kept").await.len();
    for (method, path, body) in &changes {
        let body = (!body.is_null()).then(|| body.clone());
        let (status, answer) = common::call(&sked.http, method.clone(), sked.url(path), body).await;
        assert_eq!(status, 500, "{method} {path} without its entry: {answer}");
    }
    let (status, body) = readyz(&sked).await;
    assert_eq!(
        status, 503,
        "a failed API write makes the node unready: {body}"
    );
    assert!(body.contains("cannot commit"), "{body}");

    // Nothing changed.
    assert_eq!(sked.get("/jobs/fresh").await.0, 404);
    let (_, kept) = sked.get("/jobs/kept").await;
    assert_eq!(kept["target"]["shell"]["command"], "sleep 30", "{kept}");
    assert_eq!(kept["paused"], json!(false), "{kept}");
    assert_eq!(sked.runs("kept").await.len(), runs_before);
    assert_eq!(sked.run(run_id).await["state"], "queued");
    let (_, tokens) = sked.get("/tokens").await;
    let names: Vec<&str> = tokens["tokens"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"old") && !names.contains(&"new"),
        "{tokens}"
    );
    assert_eq!(
        sked.get("/namespaces/team").await.1["configured"],
        json!(false)
    );
    let (_, secrets) = sked.get("/secrets?namespace=default").await;
    assert_eq!(secrets["secrets"], json!([]), "{secrets}");
    assert_eq!(audit_trail(&sked).await, trail);

    // Entries are taken again: the node is ready once a write commits past the hold, and the
    // same changes are made, each with its entry.
    db.execute_batch("DROP TRIGGER refuse_audit;")
        .expect("take audit entries again");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = readyz(&sked).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        // A write of its own, in case nothing else writes meanwhile.
        let (status, _) = sked.put_job("kept", job.clone()).await;
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (method, path, body) in &changes {
        let body = (!body.is_null()).then(|| body.clone());
        let (status, answer) = common::call(&sked.http, method.clone(), sked.url(path), body).await;
        assert!(status < 300, "{method} {path}: {status} {answer}");
    }
    let actions: Vec<String> = audit_trail(&sked)
        .await
        .into_iter()
        .take(changes.len())
        .map(|(action, _)| action)
        .collect();
    assert_eq!(
        actions,
        [
            "secret.put",
            "namespace.put",
            "token.revoke",
            "token.create",
            "run.cancel",
            "job.pause",
            "job.trigger",
            "job.put",
            "job.put",
        ],
    );
}

async fn readyz(sked: &Sked) -> (u16, String) {
    let resp = sked
        .http
        .get(format!("{}/readyz", sked.base()))
        .send()
        .await
        .expect("readyz");
    (
        resp.status().as_u16(),
        resp.text().await.unwrap_or_default(),
    )
}

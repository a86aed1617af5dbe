//! `sked import` as a person uses it: a crontab and a CronJob manifest become job files that
//! `sked job apply` takes on a real `sked dev`, and the jobs read back as translated; the exit
//! status says whether everything was translated; `--out` is never overwritten without
//! `--force`; and a huge, binary or unreadable input is refused with nothing written.

mod common;

use common::{sked_command, Sked};
use serde_json::{json, Value};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CRONTAB: &str = "\
# Backups of the database
MAILTO=ops@example.com
LEVEL=full
CRON_TZ=Europe/Paris
30 2 * * 1-5 /usr/local/bin/backup.sh --full /srv/db
# Rotate and say so
0 3 * * * /usr/sbin/logrotate /etc/logrotate.conf%rotated
@reboot /usr/local/bin/warm-cache
";

const CRONJOB: &str = "\
# Hourly cleanup
apiVersion: batch/v1
kind: CronJob
metadata:
  name: cleanup
spec:
  schedule: \"15 * * * *\"
  timeZone: Etc/UTC
  concurrencyPolicy: Forbid
  suspend: true
  jobTemplate:
    spec:
      activeDeadlineSeconds: 600
      backoffLimit: 1
      template:
        spec:
          containers:
          - name: cleanup
            image: docker.io/library/busybox:1.36
            command: [\"sh\", \"-c\"]
            args: [\"rm -rf /tmp/old\"]
            env:
            - {name: KEEP_DAYS, value: \"7\"}
            resources:
              limits: {memory: 64Mi, cpu: 250m}
";

/// `sked import ARGS`, with `stdin` as its standard input: exit status, stdout, stderr.
fn import(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let mut command = sked_command();
    command.arg("import").args(args);
    command.stdin(std::process::Stdio::piped());
    command.stdout(std::process::Stdio::piped());
    command.stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("run sked import");
    if let Some(mut input) = child.stdin.take() {
        use std::io::Write;
        if let Some(bytes) = stdin {
            // sked stops reading past its bound: the rest meets a closed pipe.
            let _ = input.write_all(bytes);
        }
    }
    let out = child.wait_with_output().expect("sked import");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Lists the files of `dir`, to show nothing was left behind.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn an_imported_crontab_and_cronjob_apply_to_a_real_server_and_read_back() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let dir = sked.dir.path().join("import");
    std::fs::create_dir_all(&dir).unwrap();

    // The crontab: written to --out, @reboot reported on stderr with its line, exit 3.
    let crontab = dir.join("crontab");
    std::fs::write(&crontab, CRONTAB).unwrap();
    let jobs = dir.join("cron-jobs.yaml");
    let (code, out, err) = import(
        &[
            "crontab",
            path(&crontab),
            "--out",
            path(&jobs),
            "--namespace",
            "team",
        ],
        None,
    );
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.is_empty(), "the file went to --out: {out}");
    assert!(
        err.contains("line 8: not translated: @reboot /usr/local/bin/warm-cache -- @reboot"),
        "{err}"
    );
    assert!(
        err.contains("apply it with: sked job apply -f") && err.contains("--namespace team"),
        "{err}"
    );
    let file = std::fs::read_to_string(&jobs).unwrap();
    assert!(file.contains("# Backups of the database"), "{file}");
    assert!(file.contains("--namespace team"), "{file}");

    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path(&jobs), "--namespace", "team"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("created") && out.contains("backup.sh-db"),
        "{out}"
    );
    let (status, backup) = sked.get("/jobs/backup.sh-db?namespace=team").await;
    assert_eq!(status, 200, "{backup}");
    let spec = definition(&backup);
    assert_eq!(
        spec["schedule"],
        json!({"cron": "30 2 * * 1-5", "timezone": "Europe/Paris"})
    );
    assert_eq!(
        spec["target"]["shell"],
        json!({"command": "/usr/local/bin/backup.sh --full /srv/db", "env": {"LEVEL": "full"}})
    );
    assert_eq!(
        spec["notify"],
        json!([{"on": ["failed", "timed_out"], "email": {"to": ["ops@example.com"]}}])
    );
    let (_, rotate) = sked
        .get("/jobs/logrotate-logrotate.conf?namespace=team")
        .await;
    assert_eq!(
        definition(&rotate)["target"]["shell"]["command"],
        "{ /usr/sbin/logrotate /etc/logrotate.conf\n} <<'SKED_STDIN'\nrotated\nSKED_STDIN"
    );
    // The next instants, as the command the guide names shows them.
    let (ok, out, err) = sked.cli(&[
        "job",
        "preview",
        "backup.sh-db",
        "--count",
        "3",
        "--namespace",
        "team",
    ]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("T00:30:00Z") || out.contains("T01:30:00Z"),
        "{out}"
    );

    // The CronJob: standard output, nothing left out, exit 0.
    let manifest = dir.join("cronjob.yaml");
    std::fs::write(&manifest, CRONJOB).unwrap();
    let (code, out, err) = import(&["k8s-cronjob", path(&manifest)], None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 job(s) written to standard output"), "{err}");
    let jobs = dir.join("k8s-jobs.yaml");
    std::fs::write(&jobs, &out).unwrap();
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path(&jobs)]);
    assert!(ok, "{out}{err}");
    let (status, cleanup) = sked.get("/jobs/cleanup").await;
    assert_eq!(status, 200, "{cleanup}");
    assert_eq!(cleanup["state"], "paused", "suspend: true");
    let spec = definition(&cleanup);
    assert_eq!(spec["overlap"], "skip");
    assert_eq!(spec["timeout"], "10m");
    assert_eq!(spec["retry"]["max_attempts"], 2);
    let container = &spec["target"]["container"];
    assert_eq!(container["image"], "docker.io/library/busybox:1.36");
    assert_eq!(container["entrypoint"], "sh");
    assert_eq!(container["command"], "-c");
    assert_eq!(container["args"], json!(["rm -rf /tmp/old"]));
    assert_eq!(container["env"], json!({"KEEP_DAYS": "7"}));
    assert_eq!(container["cpus"], 0.25);
    assert_eq!(container["memory"], "64MiB");

    // The systemd timer: its service found beside it, by the timer's name.
    let timer = dir.join("report.timer");
    std::fs::write(&timer, TIMER).unwrap();
    std::fs::write(dir.join("report.service"), SERVICE).unwrap();
    let (code, out, err) = import(&["systemd-timer", path(&timer)], None);
    assert_eq!(code, 0, "{out}{err}");
    let jobs = dir.join("systemd-jobs.yaml");
    std::fs::write(&jobs, &out).unwrap();
    let (ok, out, err) = sked.cli(&["job", "apply", "-f", path(&jobs)]);
    assert!(ok, "{out}{err}");
    let (status, report) = sked.get("/jobs/report").await;
    assert_eq!(status, 200, "{report}");
    let spec = definition(&report);
    assert_eq!(
        spec["schedule"],
        json!({"cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin", "jitter": "5m"})
    );
    assert_eq!(spec["misfire"]["policy"], "run_once");
    assert_eq!(spec["timeout"], "30m");
    assert_eq!(
        spec["target"]["shell"]["command"],
        "/usr/local/bin/report --to \"${DEST}\""
    );
    assert_eq!(
        spec["target"]["shell"]["env"],
        json!({"DEST": "/srv/reports"})
    );
    // Without its service, the timer's command is unknown: nothing is written, and it says so.
    let (code, out, err) = import(&["systemd-timer", "-"], Some(TIMER.as_bytes()));
    assert_eq!(code, 3, "{out}{err}");
    assert!(err.contains("import again with the .service file"), "{err}");
}

const TIMER: &str = "[Unit]\nDescription=Weekday report\n\n[Timer]\n\
OnCalendar=Mon..Fri *-*-* 09:00 Europe/Berlin\nRandomizedDelaySec=5min\nPersistent=true\n";

const SERVICE: &str = "[Service]\nType=oneshot\nEnvironment=DEST=/srv/reports\n\
ExecStart=/usr/local/bin/report --to ${DEST}\nTimeoutStartSec=30min\n";

/// A job's definition as the API shows it.
fn definition(job: &Value) -> &Value {
    if job.get("spec").is_some() {
        &job["spec"]
    } else {
        job
    }
}

#[test]
fn out_is_never_overwritten_without_force_and_a_failed_import_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let crontab = dir.path().join("crontab");
    std::fs::write(&crontab, "0 1 * * * /bin/backup\n").unwrap();
    let out = dir.path().join("jobs.yaml");
    let (code, _, err) = import(&["crontab", path(&crontab), "--out", path(&out)], None);
    assert_eq!(code, 0, "{err}");
    let first = std::fs::read_to_string(&out).unwrap();

    std::fs::write(&crontab, "0 2 * * * /bin/other\n").unwrap();
    let (code, _, err) = import(&["crontab", path(&crontab), "--out", path(&out)], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exists") && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);

    let (code, _, err) = import(
        &["crontab", path(&crontab), "--out", path(&out), "--force"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("/bin/other"));

    // Unknown syntax: the line, exit 1, --out untouched.
    std::fs::write(&crontab, "0 1 * * * ok\nevery day at noon\n").unwrap();
    let fresh = dir.path().join("fresh.yaml");
    let (code, _, err) = import(&["crontab", path(&crontab), "--out", path(&fresh)], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert_eq!(files(dir.path()), ["crontab", "jobs.yaml"]);
}

#[test]
fn a_huge_or_binary_input_is_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge");
    let line = "0 1 * * * /bin/backup\n";
    std::fs::write(&huge, line.repeat(50 * 1024 * 1024 / line.len())).unwrap();
    let out = dir.path().join("jobs.yaml");
    let (code, stdout, err) = import(&["crontab", path(&huge), "--out", path(&out)], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("bytes; sked import reads at most"), "{err}");
    assert!(stdout.is_empty());
    // Through standard input, where the size is not known beforehand.
    let (code, stdout, err) = import(
        &["crontab", "-"],
        Some(line.repeat(6 * 1024 * 1024 / line.len()).as_bytes()),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the most sked import reads"), "{err}");
    assert!(stdout.is_empty());

    let binary = dir.path().join("binary");
    std::fs::write(&binary, b"0 1 * * * a\n0 2 * * * b\n\x7fELF\x00\x01\x02").unwrap();
    let (code, _, err) = import(&["k8s-cronjob", path(&binary), "--out", path(&out)], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not text (line 3"), "{err}");
    assert_eq!(files(dir.path()), ["binary", "huge"]);
}

#[test]
fn standard_input_and_kinds_this_build_lacks() {
    let (code, out, err) = import(&["crontab", "-"], Some(b"@hourly /bin/tick\n"));
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_yaml::from_str(&out).unwrap();
    assert_eq!(doc["jobs"][0]["name"], "tick");
    // celery-beat needs the broker connection its tasks go through; pg-cron reads a database.
    for (kind, says) in [
        ("celery-beat", "--connection NAME"),
        ("pg-cron", "PostgreSQL URL"),
    ] {
        let (code, out, err) = import(&[kind, "-"], Some(b""));
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(out.is_empty());
    }
    let (code, _, err) = import(&["crontab", "postgres://localhost/db"], None);
    assert_eq!(code, 1);
    assert!(err.contains("celery-beat"), "{err}");
}

/// Serves `body` once per connection on loopback, as a plain HTTP/1.1 response.
async fn serve(body: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}/crontab")
}

#[tokio::test]
async fn a_url_is_fetched_within_the_size_bound() {
    let url = serve(b"*/10 * * * * /bin/poll\n".to_vec()).await;
    let (code, out, err) = tokio::task::spawn_blocking(move || import(&["crontab", &url], None))
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("name: poll"), "{out}");

    let url = serve(vec![b'#'; 5 * 1024 * 1024]).await;
    let (code, out, err) = tokio::task::spawn_blocking(move || import(&["crontab", &url], None))
        .await
        .unwrap();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("sked import reads at most"), "{err}");
    assert!(out.is_empty());
}

//! The command line against a real server: `sked job apply` reports what changed and a bad file
//! changes nothing; the other client commands print what the API holds.

mod common;

use common::{sked_command, Sked};

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

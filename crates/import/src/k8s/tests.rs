use super::*;
use crate::MAX_INPUT_BYTES;

fn at(s: &str) -> Instant {
    s.parse().unwrap()
}

fn read(text: &str) -> Import {
    import_with(
        text,
        &Options {
            as_of: Some(at("2026-01-01T00:00:00Z")),
            ..Options::default()
        },
    )
    .unwrap()
}

const REPORT: &str = "\
# Nightly sales report
apiVersion: batch/v1
kind: CronJob
metadata:
  name: sales-report
  namespace: analytics
spec:
  schedule: \"30 1 * * *\"
  timeZone: Europe/London
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: 300
  suspend: true
  jobTemplate:
    spec:
      activeDeadlineSeconds: 1800
      backoffLimit: 2
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: report
            image: registry.example.com/analytics/report:1.4
            imagePullPolicy: Always
            command: [\"/bin/report\", \"--quiet\"]
            args: [\"--since\", \"yesterday\"]
            workingDir: /work
            securityContext:
              runAsUser: 1000
              runAsGroup: 1000
            env:
            - name: LEVEL
              value: full
            - name: DB_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: db
                  key: password
            resources:
              limits:
                memory: 256Mi
                cpu: 500m
";

#[test]
fn a_cronjob_becomes_a_container_job_with_its_policies() {
    let import = read(REPORT);
    assert_eq!(import.jobs.len(), 1, "{:?}", import.untranslated);
    let job = &import.jobs[0];
    assert_eq!(job.line, 3);
    assert_eq!(job.comments[0], "Nightly sales report");
    assert!(job
        .comments
        .iter()
        .any(|c| c == "Kubernetes namespace analytics"));
    assert_eq!(
        job.job,
        json!({
            "name": "sales-report",
            "schedule": {"cron": "30 1 * * *", "timezone": "Europe/London"},
            "target": {"container": {
                "image": "registry.example.com/analytics/report:1.4",
                "entrypoint": "/bin/report",
                "command": "--quiet",
                "args": ["--since", "yesterday"],
                "env": {"LEVEL": "full"},
                "workdir": "/work",
                "user": "1000:1000",
                "memory": 268435456u64,
                "cpus": 0.5,
                "pull": "always",
                "network": "bridge",
            }},
            "overlap": "skip",
            "misfire": {"policy": "run_all", "catchup_window": "300s"},
            "paused": true,
            "timeout": "1800s",
            "retry": {"max_attempts": 3,
                      "backoff": {"initial": "10s", "max": "6m", "multiplier": 2.0, "jitter": false}},
        })
    );
    // The secret is reported, with the line of its variable.
    assert_eq!(import.untranslated.len(), 1);
    let secret = &import.untranslated[0];
    assert_eq!(secret.line, 33);
    assert!(
        secret.reason.contains("Secret db key password"),
        "{}",
        secret.reason
    );
    assert!(secret.reason.contains("secret_ref"));
    // A fixed time in a skipped hour: the controller never runs it.
    assert_eq!(import.differences.len(), 1, "{:?}", import.differences);
    assert!(import.differences[0].reason.contains("Europe/London"));
}

#[test]
fn a_kubectl_list_and_several_documents_are_read_in_order() {
    let list = "\
apiVersion: v1
kind: List
items:
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: a}
  spec:
    schedule: \"CRON_TZ=Asia/Tokyo */10 * * * *\"
    concurrencyPolicy: Replace
    jobTemplate:
      spec:
        template:
          spec:
            containers:
            - {name: a, image: busybox, args: [\"echo\", \"hi\"]}
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: b}
  spec:
    schedule: \"@weekly\"
    jobTemplate:
      spec:
        template:
          spec:
            containers:
            - {name: b, image: busybox}
";
    let import = read(list);
    assert!(
        import.is_exact(),
        "{:?} {:?}",
        import.untranslated,
        import.differences
    );
    let a = &import.jobs[0];
    assert_eq!(a.line, 5);
    assert_eq!(
        a.job["schedule"],
        json!({"cron": "*/10 * * * *", "timezone": "Asia/Tokyo"})
    );
    assert_eq!(a.job["overlap"], "cancel_running");
    assert_eq!(a.job["target"]["container"]["command"], "echo");
    assert_eq!(a.job["target"]["container"]["args"], json!(["hi"]));
    assert_eq!(
        a.job["retry"]["max_attempts"], 7,
        "Kubernetes' default backoffLimit"
    );
    let b = &import.jobs[1];
    assert_eq!(b.line, 17);
    assert_eq!(b.job["schedule"], json!({"cron": "@weekly"}));
    assert_eq!(b.job["target"]["container"].get("command"), None);

    let documents = format!("{REPORT}---\n{}", REPORT.replace("sales-report", "other"));
    let import = read(&documents);
    assert_eq!(import.jobs.len(), 2);
    assert_eq!(import.jobs[1].line, 3 + REPORT.lines().count() + 1);
    assert_eq!(import.jobs[1].comments[0], "Nightly sales report");
}

#[test]
fn more_containers_init_containers_volumes_and_other_kinds_are_reported() {
    let text = "\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: many
spec:
  schedule: \"0 * * * *\"
  jobTemplate:
    spec:
      template:
        spec:
          initContainers:
          - name: fetch
            image: busybox
          containers:
          - name: main
            image: busybox
            envFrom:
            - configMapRef: {name: settings}
          - name: sidecar
            image: envoy
          volumes:
          - name: scratch
            emptyDir: {}
";
    let import = read(text);
    assert_eq!(import.jobs.len(), 1);
    let reasons: Vec<(usize, &str)> = import
        .untranslated
        .iter()
        .map(|u| (u.line, u.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    assert_eq!(reasons[0].0, 1);
    assert!(reasons[0].1.contains("a ConfigMap, not a CronJob"));
    assert_eq!(reasons[1].0, 23);
    assert!(reasons[1].1.contains("\"sidecar\""));
    assert_eq!(reasons[2].0, 15);
    assert!(reasons[2].1.contains("init containers fetch"));
    assert_eq!(reasons[3].0, 25);
    assert!(reasons[3].1.contains("volumes scratch"));
    assert_eq!(reasons[4].0, 21);
    assert!(reasons[4].1.contains("envFrom"));
}

#[test]
fn a_bad_schedule_or_zone_is_reported_and_the_rest_translated() {
    let job = |name: &str, schedule: &str, zone: &str| {
        format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: {name}}}\nspec:\n  \
             schedule: \"{schedule}\"\n{zone}  jobTemplate:\n    spec:\n      template:\n        \
             spec:\n          containers:\n          - {{name: x, image: busybox}}\n"
        )
    };
    let text = [
        job("bad-field", "61 * * * *", ""),
        job("bad-zone", "0 1 * * *", "  timeZone: Mars/Olympus\n"),
        job("both-zones", "TZ=UTC 0 1 * * *", "  timeZone: UTC\n"),
        job("every", "@every 90m", ""),
    ]
    .join("---\n");
    let import = read(&text);
    assert_eq!(import.jobs.len(), 1);
    assert_eq!(import.jobs[0].job["schedule"], json!({"every": "1h30m"}));
    let lines: Vec<usize> = import.untranslated.iter().map(|u| u.line).collect();
    assert_eq!(lines, [5, 18, 30]);
    assert!(import.untranslated[1].reason.contains("Mars/Olympus"));
    assert!(import.untranslated[2].reason.contains("both"));
}

#[test]
fn a_deadline_that_holds_two_instants_is_a_difference() {
    let text = REPORT
        .replace("\"30 1 * * *\"", "\"*/5 * * * *\"")
        .replace("timeZone: Europe/London", "timeZone: UTC");
    let import = read(&text);
    assert_eq!(import.differences.len(), 1, "{:?}", import.differences);
    assert_eq!(import.differences[0].line, 11);
    assert!(import.differences[0].reason.contains("latest"));
}

#[test]
fn quantities_read_as_kubernetes_writes_them() {
    for (text, value) in [
        ("128Mi", 134217728.0),
        ("1G", 1e9),
        ("500m", 0.5),
        ("2", 2.0),
        ("1.5", 1.5),
        ("2e3", 2000.0),
    ] {
        assert_eq!(quantity(&json!(text)), Some(value), "{text}");
    }
    assert_eq!(quantity(&json!(3)), Some(3.0));
    assert_eq!(quantity(&json!("lots")), None);
}

#[test]
fn broken_yaml_binary_and_huge_input_are_errors() {
    match import("apiVersion: batch/v1\nkind: CronJob\nspec: [unclosed\n") {
        Err(ImportError::Syntax { line, message }) => {
            assert!(line >= 3, "{line}");
            assert!(message.contains("YAML"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        import("kind: CronJob\n\0"),
        Err(ImportError::NotText { line: 2 })
    );
    let huge = "# filler\n".repeat(50 * 1024 * 1024 / 10);
    assert!(huge.len() > MAX_INPUT_BYTES);
    assert_eq!(import(&huge), Err(ImportError::TooLarge(huge.len())));
}

//! `sked sim` end to end, with no server: a synthetic workload written by one command and
//! replayed by the matrix and by a single run.

use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_sked");

const FIELDS: [&str; 14] = [
    "overload",
    "host",
    "priority",
    "mean_wait",
    "p99_wait",
    "mean_duration",
    "mean_at_server",
    "mean_slowdown",
    "variance_spread",
    "ci95_mean_wait",
    "ci95_mean_duration",
    "ci95_mean_at_server",
    "vs_baseline",
    "requests",
];

fn sked(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run sked");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The keys of a JSON line in the order they were written.
fn keys_in_order(line: &str) -> Vec<String> {
    let object: Value = serde_json::from_str(line).expect("a JSON line");
    let mut keys: Vec<(usize, String)> = object
        .as_object()
        .expect("an object")
        .keys()
        .map(|k| {
            (
                line.find(&format!("\"{k}\":")).expect("key in line"),
                k.clone(),
            )
        })
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

#[test]
fn a_workload_replays_through_the_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, workload, err) = sked(&["sim", "workload", "--seed", "1", "--hours", "0.05"]);
    assert!(ok, "{err}");
    let requests: Vec<Value> = workload
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(requests.len() > 100, "{}", requests.len());
    for r in &requests {
        for field in ["at", "job", "key", "priority", "warm", "cold"] {
            assert!(r.get(field).is_some(), "{field} in {r}");
        }
    }
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(&trace, &workload).unwrap();
    let trace = trace.to_str().unwrap();

    let (ok, out, err) = sked(&["sim", "matrix", "--trace", trace, "--seeds", "2", "--json"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 15 * 2, "{out}");
    let mut cells = std::collections::BTreeSet::new();
    for line in &lines {
        let keys = keys_in_order(line);
        assert_eq!(&keys[..FIELDS.len()], &FIELDS, "{line}");
        let row: Value = serde_json::from_str(line).unwrap();
        let (overload, host) = (
            row["overload"].as_str().unwrap(),
            row["host"].as_str().unwrap(),
        );
        cells.insert((
            overload.to_string(),
            host.to_string(),
            row["priority"].as_i64().unwrap(),
        ));
        for ci in [
            "ci95_mean_wait",
            "ci95_mean_duration",
            "ci95_mean_at_server",
        ] {
            assert_eq!(row[ci].as_array().unwrap().len(), 2, "{line}");
        }
        assert!(row["mean_wait"].as_f64().unwrap() >= 0.0);
        if (overload, host) == ("none", "random") {
            assert_eq!(row["vs_baseline"]["mean_wait"], Value::from(1.0), "{line}");
            assert_eq!(
                row["vs_baseline"]["mean_duration"],
                Value::from(1.0),
                "{line}"
            );
            assert_eq!(
                row["vs_baseline"]["mean_at_server"],
                Value::from(1.0),
                "{line}"
            );
        }
    }
    assert_eq!(cells.len(), 30, "15 cells x 2 priority classes");
    assert!(cells.iter().all(|(_, _, p)| *p == 0 || *p == 1));

    // One cell, the trace on standard input: the same figures as its row in the matrix.
    let mut child = Command::new(BIN)
        .args(["sim", "run", "--trace", "-", "--seeds", "2", "--json"])
        .args(["--overload", "breaker", "--host", "affinity"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(workload.as_bytes())
        .unwrap();
    let run = child.wait_with_output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let run = String::from_utf8(run.stdout).unwrap();
    let from_matrix: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("{\"overload\":\"breaker\",\"host\":\"affinity\","))
        .collect();
    assert_eq!(run.lines().collect::<Vec<_>>(), from_matrix);

    // The table names the workload.
    let (ok, table, err) = sked(&["sim", "matrix", "--trace", trace, "--seeds", "1"]);
    assert!(ok, "{err}");
    assert!(table.starts_with("workload: "), "{table}");
    assert!(table.contains("14 servers x 4 slots"), "{table}");
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"at\": 1, \"job\": \"a\", \"key\": \"p\", \"priority\": 0, \"warm\": 1, \"cold\": 2}\n\
         {\"at\": 1, \"job\": \"a\", \"key\": \"p\", \"priority\": 0, \"warm\": 1}\n",
    )
    .unwrap();
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec!["sim", "matrix", "--trace", empty.to_str().unwrap()],
            "no requests",
        ),
        (
            vec!["sim", "matrix", "--trace", bad.to_str().unwrap()],
            "trace line 2",
        ),
        (vec!["sim", "matrix", "--seeds", "0"], "seeds"),
        (vec!["sim", "matrix", "--seeds", "101"], "seeds"),
        (vec!["sim", "workload", "--hours", "169"], "hours"),
        (vec!["sim", "run", "--trip", "4", "--reset", "4"], "reset"),
    ];
    for (args, expect) in cases {
        let (ok, _, err) = sked(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

#[test]
fn workload_families_set_keys_popularity_and_bursts() {
    let workload = |args: &[&str]| {
        let mut all = vec!["sim", "workload", "--seed", "3", "--hours", "0.05"];
        all.extend_from_slice(args);
        let (ok, out, err) = sked(&all);
        assert!(ok, "{args:?}: {err}");
        out
    };
    // The default workload is the same with its settings spelled out.
    let default = workload(&[]);
    assert_eq!(
        workload(&["--keys", "2000", "--bursts", "0.5", "--burst-size", "5-20"]),
        default
    );
    // A family is the default workload with its keys, popularity and bursts.
    let family = workload(&["--family", "zipf1.2-keys50"]);
    assert_eq!(workload(&["--keys", "50", "--zipf", "1.2"]), family);
    assert_ne!(family, default);
    for line in family.lines() {
        let request: Value = serde_json::from_str(line).unwrap();
        let key = request["key"].as_str().unwrap();
        let n: u32 = key.strip_prefix("project-").unwrap().parse().unwrap();
        assert!((1..=50).contains(&n), "{key}");
    }
    // No bursts: one request an export; all bursts of 2 to 3.
    let single = workload(&["--bursts", "0"]);
    assert!(!single.contains("-export-1\""), "{single}");
    let short = workload(&["--bursts", "1", "--burst-size", "2-3"]);
    assert!(short.contains("-export-1\"") && !short.contains("-export-3\""));

    let refused: [(&[&str], &str); 5] = [
        (&["--family", "skewed"], "one --family"),
        (&["--family", "zipf1-keys50-tall"], "workload family"),
        (
            &["--family", "zipf1-keys50", "--keys", "9"],
            "cannot be used",
        ),
        (&["--burst-size", "9-3"], "burst size"),
        (&["--bursts", "1.5"], "burst share"),
    ];
    for (args, expect) in refused {
        let mut all = vec!["sim", "workload", "--hours", "0.01"];
        all.extend_from_slice(args);
        let (ok, _, err) = sked(&all);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

#[test]
fn the_matrix_reports_each_family() {
    let args = [
        "sim",
        "matrix",
        "--hours",
        "0.02",
        "--seeds",
        "1",
        "--family",
        "zipf1.2-keys50,zipf0.8-keys500",
    ];
    let (ok, table, err) = sked(&args);
    assert!(ok, "{err}");
    let headers: Vec<&str> = table.lines().filter(|l| l.starts_with("family ")).collect();
    assert_eq!(headers.len(), 2, "{table}");
    assert!(headers[0].starts_with("family zipf1.2-keys50: 50 keys, Zipf 1.2"));
    assert!(headers[1].starts_with("family zipf0.8-keys500: 500 keys, Zipf 0.8"));

    let mut json = args.to_vec();
    json.push("--json");
    let (ok, out, err) = sked(&json);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * 15 * 2, "{out}");
    for (i, line) in lines.iter().enumerate() {
        // The usual fields first, the family last.
        let keys = keys_in_order(line);
        assert_eq!(&keys[..FIELDS.len()], &FIELDS, "{line}");
        assert_eq!(keys.last().map(String::as_str), Some("family"), "{line}");
        let row: Value = serde_json::from_str(line).unwrap();
        let expected = if i < 30 {
            "zipf1.2-keys50"
        } else {
            "zipf0.8-keys500"
        };
        assert_eq!(row["family"], Value::from(expected), "{line}");
    }

    // A trace has no family.
    let (ok, _, err) = sked(&["sim", "run", "--trace", "-", "--family", "skewed"]);
    assert!(!ok);
    assert!(err.contains("cannot be used"), "{err}");
}

//! Shell jobs bound by `run_as` and `limits` through the real binary, as root on a host with
//! writable cgroups: the job runs as another user, a fork bomb stops at `pids` and leaves
//! nothing behind, a job over its memory ends `failed` with reason `out_of_memory`, output
//! past `max_output` is cut with a marker, and `open_files` is the job's RLIMIT_NOFILE.
//!
//! Switching users and making cgroups need root: as another user each test says it is skipped
//! and passes, except under CI, where it fails.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Whether the test can run; prints why not, and fails under CI, which must run it as root.
fn as_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run {test} as root: run_as and cgroups need it"
    );
    eprintln!("skipped {test}: run_as and cgroup limits need root");
    false
}

async fn dev() -> Sked {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    sked
}

fn shell(command: &str, extra: Value) -> Value {
    let mut target = json!({"command": command});
    if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
        t.extend(e.clone());
    }
    json!({"shell": target})
}

/// Applies `job`, triggers it and waits for its end: the run and its log.
async fn run_once(sked: &Sked, name: &str, job: Value, bound: Duration) -> (Value, String) {
    let (status, answer) = sked.put_job(name, job).await;
    assert_eq!(status, 201, "{answer}");
    let id = sked.trigger(name).await;
    let run = sked.wait_finished(id, bound).await;
    let log = sked.run_log(id).await;
    (run, log)
}

/// The job's own pids cgroup, as it printed it (`grep pids /proc/self/cgroup` first in its
/// command), as a directory; asserted to be an attempt's.
fn attempt_group(log: &str) -> std::path::PathBuf {
    let line = log
        .lines()
        .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string()))
        .unwrap_or_else(|| panic!("the job printed no pids cgroup:\n{log}"));
    assert!(
        line.starts_with("/sked/attempt-"),
        "not an attempt's group: {line}"
    );
    std::path::PathBuf::from(format!("/sys/fs/cgroup/pids{line}"))
}

/// Living processes (zombies are gone) whose command line contains `marker`.
fn alive_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

#[tokio::test]
async fn run_as_runs_the_job_as_that_user_with_its_group_only() {
    if !as_root("run_as_runs_the_job_as_that_user_with_its_group_only") {
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("user database")
        .expect("a nobody user");
    let sked = dev().await;
    let command = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G) home=$HOME user=$USER/$LOGNAME";
    let job =
        json!({"target": shell(command, json!({"run_as": {"user": "nobody"}})), "timeout": "20s"});
    let (run, log) = run_once(&sked, "as-nobody", job, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}\n{log}");
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let expected = format!(
        "uid={uid} gid={gid} groups={gid} home={} user=nobody/nobody",
        nobody.dir.display()
    );
    assert!(log.contains(&expected), "expected {expected:?} in:\n{log}");

    // A user this host does not have fails the attempt at once, naming it.
    let job =
        json!({"target": shell("echo ran", json!({"run_as": {"user": "no-such-user-here"}}))});
    let (run, log) = run_once(&sked, "as-stranger", job, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "failed", "{run}\n{log}");
    assert!(!log.contains("ran"), "{log}");
    assert!(
        log.contains("[sked-worker: run_as: user \"no-such-user-here\" does not exist"),
        "{log}"
    );
}

#[tokio::test]
async fn a_fork_bomb_stops_at_pids_and_leaves_nothing_behind() {
    if !as_root("a_fork_bomb_stops_at_pids_and_leaves_nothing_behind") {
        return;
    }
    let sked = dev().await;
    // A duration of its own, so only this test's processes are counted.
    let marker = format!("60.{:06}", chrono::Utc::now().timestamp_subsec_micros());
    // Without the limit it would start 200 sleeps and wait for them past the timeout.
    let command = format!(
        "grep pids /proc/self/cgroup; i=0; while [ $i -lt 200 ]; do sleep {marker} & i=$((i+1)); echo started $i; done; wait"
    );
    let job = json!({"target": shell(&command, json!({"limits": {"pids": 32}})), "timeout": "30s"});
    let started = Instant::now();
    let (run, log) = run_once(&sked, "bomb", job, Duration::from_secs(40)).await;
    let took = started.elapsed();
    assert_eq!(
        run["state"], "failed",
        "stopped by the limit, not the timeout: {run}\n{log}"
    );
    assert!(
        took < Duration::from_secs(25),
        "took {took:?}: {run}\n{log}"
    );
    assert!(
        log.starts_with("[sked-worker: limits by cgroup v1: pids 32]"),
        "{log}"
    );
    let group = attempt_group(&log);
    let most = log
        .lines()
        .filter_map(|l| l.strip_prefix("started ")?.trim().parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        (1..32).contains(&most),
        "started {most} sleeps under pids 32:\n{log}"
    );
    // The run is recorded once the supervisor has ended the tree and the worker removed the
    // group; allow the kernel to finish reaping.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (group.exists() || !alive_with(&marker).is_empty()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        alive_with(&marker),
        Vec::<i32>::new(),
        "sleeps survived: {log}"
    );
    assert!(!group.exists(), "{} is left", group.display());
}

#[tokio::test]
async fn a_job_over_its_memory_fails_with_out_of_memory() {
    if !as_root("a_job_over_its_memory_fails_with_out_of_memory") {
        return;
    }
    let sked = dev().await;
    // The shell keeps a command substitution's output in its own memory: 100 MB of it.
    let command = "grep pids /proc/self/cgroup; x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived ${#x}";
    let job =
        json!({"target": shell(command, json!({"limits": {"memory": "64MiB"}})), "timeout": "60s"});
    let (run, log) = run_once(&sked, "hungry", job, Duration::from_secs(70)).await;
    assert_eq!(run["state"], "failed", "{run}\n{log}");
    assert!(
        log.starts_with("[sked-worker: limits by cgroup v1: memory 64MiB]"),
        "{log}"
    );
    assert!(!log.contains("survived"), "{log}");
    let attempt = &run["attempt_history"][0];
    let error = attempt["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("out_of_memory"), "{run}");
    assert!(
        run["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("out_of_memory"),
        "{run}"
    );
    let group = attempt_group(&log);
    assert!(!group.exists(), "{} is left", group.display());

    // The same job under a limit it fits in succeeds: the limit, not the job, failed it.
    let job = json!({"target": shell(command, json!({"limits": {"memory": "512MiB"}})), "timeout": "60s"});
    let (run, log) = run_once(&sked, "fed", job, Duration::from_secs(70)).await;
    assert_eq!(run["state"], "succeeded", "{run}\n{log}");
    assert!(log.contains("survived 100000000"), "{log}");
}

#[tokio::test]
async fn output_past_max_output_is_cut_with_a_marker() {
    if !as_root("output_past_max_output_is_cut_with_a_marker") {
        return;
    }
    let sked = dev().await;
    let command = "head -c 100000 /dev/zero | tr '\\0' x; echo; echo the end";
    let job = json!({"target": shell(command, json!({"limits": {"max_output": "1KiB"}}))});
    let (run, log) = run_once(&sked, "chatty", job, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}\n{log}");
    let kept = log.split("\n[sked-worker:").next().unwrap_or_default();
    assert_eq!(kept, "x".repeat(1024), "{log}");
    assert!(
        log.contains("[sked-worker: output cut at max_output (1KiB); the rest is dropped]"),
        "{log}"
    );
    assert!(!log.contains("the end"), "{log}");
    assert!(log.len() < 1200, "{} bytes kept", log.len());
}

#[tokio::test]
async fn open_files_is_the_jobs_nofile_limit() {
    if !as_root("open_files_is_the_jobs_nofile_limit") {
        return;
    }
    let sked = dev().await;
    let job = json!({"target": shell("ulimit -n", json!({"limits": {"open_files": 64}}))});
    let (run, log) = run_once(&sked, "few-files", job, Duration::from_secs(30)).await;
    assert_eq!(run["state"], "succeeded", "{run}\n{log}");
    assert_eq!(
        log, "[sked-worker: limits by rlimit: open files 64]\n64\n",
        "{run}"
    );
}

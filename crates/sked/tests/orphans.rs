//! A job's processes never outlive their attempt, through the real binary: whether they stay
//! in the job's process group, `setsid` away, or double-fork into a daemon, they end with a
//! cancel, with a timeout, and when the worker running them is SIGKILLed (`sked dev` or a
//! `sked worker`), before the run could be handed to another worker.

mod common;

use common::{shell, Sked};
use serde_json::json;
use std::time::{Duration, Instant};

/// `sleep` durations that name this test process's processes: `<n>.<pid>` seconds, so that
/// the same test running at once elsewhere on the machine (another checkout, another run) is
/// never taken for this one's leftovers.
fn marked<const N: usize>(seconds: [u32; N]) -> [String; N] {
    seconds.map(|n| format!("{n}.{}", std::process::id()))
}

/// The processes whose command line is `sleep <m>` for one of `markers`, by pid and state.
fn alive(markers: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?");
        if state == "Z" || state == "X" {
            continue;
        }
        if markers.iter().any(|m| text.trim() == format!("sleep {m}")) {
            found.push(format!(
                "{} ({}) state {state}",
                text.trim(),
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// A command that leaves three processes behind it, each `sleep <marker>`: one in the job's
/// group, one that `setsid`s away, and one double-forked daemon in a session of its own; then
/// it waits in a fourth.
fn spreading(markers: &[String; 4]) -> String {
    let [a, b, c, d] = markers;
    format!("sleep {a} & setsid sleep {b} & ( setsid sh -c 'exec sleep {c}' & ) ; sleep {d}")
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Triggers `job` and waits until every marker process is running.
async fn start_spread(sked: &Sked, job: &str, markers: &[String; 4]) -> i64 {
    let (status, run) = sked.post(&format!("/jobs/{job}/trigger"), json!({})).await;
    assert_eq!(status, 201, "{run}");
    wait_until(
        "the job's processes did not all start",
        Duration::from_secs(15),
        || alive(markers).len() == 4,
    )
    .await;
    run["id"].as_i64().expect("run id")
}

#[tokio::test]
async fn a_sigkilled_sked_dev_takes_its_jobs_processes_with_it() {
    let markers = marked([7101, 7102, 7103, 7104]);
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({"target": shell(&spreading(&markers)), "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("spread", job).await.0, 201);
    let id = start_spread(&sked, "spread", &markers).await;

    if let Some(dev) = sked.server.as_mut() {
        dev.sigkill();
    }
    // Well inside the heartbeat timeout (2 s in these tests), after which the run would be
    // handed out again.
    let killed = Instant::now();
    wait_until(
        &format!("processes outlived their worker: {:?}", alive(&markers)),
        Duration::from_secs(2),
        || alive(&markers).is_empty(),
    )
    .await;
    println!(
        "sked dev: the job's processes were gone {:?} after its SIGKILL",
        killed.elapsed()
    );

    // After the restart the run gets a second attempt, and only it runs.
    sked.start_dev(&[]).await;
    wait_until(
        "the run was not attempted again",
        Duration::from_secs(20),
        || alive(&markers).len() == 4,
    )
    .await;
    let run = sked.run(id).await;
    let attempts = run["attempt_history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        attempts.first().map(|a| &a["state"]),
        Some(&json!("lost")),
        "{run}"
    );
    let (status, _) = sked.post(&format!("/runs/{id}/cancel"), json!({})).await;
    assert_eq!(status, 200);
    sked.wait_finished(id, Duration::from_secs(15)).await;
}

#[tokio::test]
async fn a_sigkilled_worker_takes_its_jobs_processes_with_it() {
    let markers = marked([7201, 7202, 7203, 7204]);
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let worker = sked.start_worker("doomed", 2);
    let job = json!({"target": shell(&spreading(&markers))});
    assert_eq!(sked.put_job("spread", job).await.0, 201);
    start_spread(&sked, "spread", &markers).await;
    sked.workers[worker].sigkill();
    let killed = Instant::now();
    wait_until(
        &format!("processes outlived their worker: {:?}", alive(&markers)),
        Duration::from_secs(2),
        || alive(&markers).is_empty(),
    )
    .await;
    println!(
        "worker: the job's processes were gone {:?} after its SIGKILL",
        killed.elapsed()
    );
}

/// The worker's supervisor server: its child whose command line names it.
fn supervisor_server_of(worker: i32) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let ppid: i32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let server = String::from_utf8_lossy(&cmdline).contains("__sked-supervisor-server");
            (ppid == worker && server).then_some(pid)
        })
}

#[tokio::test]
async fn a_sigkilled_supervisor_server_ends_its_attempts_and_the_next_gets_a_new_one() {
    let markers = marked([7251, 7252, 7253, 7254]);
    let mut sked = Sked::new();
    sked.start_server(&[]).await;
    let worker = sked.start_worker("serving", 2);
    let job = json!({"target": shell(&spreading(&markers)), "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("spread", job).await.0, 201);
    let id = start_spread(&sked, "spread", &markers).await;
    let worker_pid = sked.workers[worker].pid().as_raw();
    let server = supervisor_server_of(worker_pid).expect("the worker has a supervisor server");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server),
        nix::sys::signal::Signal::SIGKILL,
    );

    // The attempt can no longer learn its supervisor's end: it fails, and its tree is ended.
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "failed", "{run}");
    wait_until(
        &format!("processes outlived their attempt: {:?}", alive(&markers)),
        Duration::from_secs(10),
        || alive(&markers).is_empty(),
    )
    .await;

    // The next attempt starts a new server, and runs as usual.
    let job = json!({"target": shell("echo after; exit 4"), "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("after", job).await.0, 201);
    let id = sked.trigger("after").await;
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert_eq!(run["attempt_history"][0]["exit_code"], 4, "{run}");
    let replaced = supervisor_server_of(worker_pid).expect("a new supervisor server");
    assert_ne!(replaced, server);
}

#[tokio::test]
async fn cancel_and_timeout_end_processes_that_left_the_group() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;

    let cancelled = marked([7301, 7302, 7303, 7304]);
    let job = json!({"target": shell(&spreading(&cancelled))});
    assert_eq!(sked.put_job("cancelled", job).await.0, 201);
    let id = start_spread(&sked, "cancelled", &cancelled).await;
    let (status, answer) = sked.post(&format!("/runs/{id}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let run = sked.wait_finished(id, Duration::from_secs(15)).await;
    assert_eq!(run["state"], "cancelled", "{run}");
    wait_until(
        &format!("processes outlived the cancel: {:?}", alive(&cancelled)),
        Duration::from_secs(5),
        || alive(&cancelled).is_empty(),
    )
    .await;

    let timed_out = marked([7401, 7402, 7403, 7404]);
    let job = json!({"target": shell(&spreading(&timed_out)), "timeout": "2s",
                     "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("slow", job).await.0, 201);
    let id = start_spread(&sked, "slow", &timed_out).await;
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    wait_until(
        &format!("processes outlived the timeout: {:?}", alive(&timed_out)),
        Duration::from_secs(5),
        || alive(&timed_out).is_empty(),
    )
    .await;
}

#[tokio::test]
async fn leftovers_of_a_finished_job_are_ended_and_its_status_is_kept() {
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let markers = marked([7501]);
    // The main process exits 3 while a setsid child lingers with the output pipe closed.
    let command = format!(
        "setsid sleep {} >/dev/null 2>&1 & echo done; exit 3",
        markers[0]
    );
    let job = json!({"target": shell(&command),
                     "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("leaves", job).await.0, 201);
    let (status, run) = sked.post("/jobs/leaves/trigger", json!({})).await;
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().expect("run id");
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "failed", "{run}");
    assert_eq!(run["attempt_history"][0]["exit_code"], 3, "{run}");
    assert!(alive(&markers).is_empty(), "{:?}", alive(&markers));

    // A job killed by a signal is reported as such.
    let job = json!({"target": shell("kill -TERM $$"), "retry": {"max_attempts": 1}});
    assert_eq!(sked.put_job("signalled", job).await.0, 201);
    let (_, run) = sked.post("/jobs/signalled/trigger", json!({})).await;
    let id = run["id"].as_i64().expect("run id");
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    let error = run["attempt_history"][0]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("SIGTERM"), "{run}");
}

#[tokio::test]
async fn a_supervised_job_starts_with_no_signal_blocked_or_ignored_and_no_stray_descriptor() {
    // The supervisor blocks its stop signals to read them; the job must not inherit that, or
    // a cancel's SIGTERM would wait for the grace period's SIGKILL. Nor a signal sked ignores,
    // nor a descriptor beyond its standard three.
    let mut sked = Sked::new();
    sked.start_dev(&[]).await;
    let job = json!({"target": shell(
        "grep -E '^Sig(Blk|Ign)' /proc/self/status; echo fds-begin; ls /proc/$$/fd; echo fds-end"
    )});
    assert_eq!(sked.put_job("mask", job).await.0, 201);
    let id = sked.trigger("mask").await;
    let run = sked.wait_finished(id, Duration::from_secs(20)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    let log = sked.run_log(id).await;
    let line = |prefix: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in {log:?}"))
            .trim()
            .to_string()
    };
    assert_eq!(line("SigBlk:"), "0000000000000000", "{log}");
    // What sked's own processes ignore (SIGPIPE, by the runtime) or glibc's posix_spawn
    // leaves ignored (its signals 32 and 33) must not reach the job; what the worker itself
    // inherited ignored (SIGQUIT under a shell's background job, say) passes on as exec
    // passes it.
    let ignored = u64::from_str_radix(&line("SigIgn:"), 16).expect("a hex mask");
    let sked_ignores = [13u32, 32, 33]
        .iter()
        .fold(0u64, |mask, signal| mask | 1 << (signal - 1));
    assert_eq!(ignored & sked_ignores, 0, "{log}");
    let fds: Vec<&str> = log
        .lines()
        .skip_while(|l| *l != "fds-begin")
        .skip(1)
        .take_while(|l| *l != "fds-end")
        .collect();
    assert_eq!(fds, ["0", "1", "2"], "{log}");
}

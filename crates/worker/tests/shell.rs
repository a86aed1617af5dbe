//! The shell executor on real `sh` commands: exit codes, environment, output, timeouts and
//! stops that end the whole process group.

use chrono::{TimeZone, Utc};
use sked_core::target::ShellTarget;
use sked_core::AttemptOutcome;
use sked_worker::executor::{shell, stop_channel, ExecOptions, ExecResult, RunInfo};
use sked_worker::output::OutputBuffer;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn info() -> RunInfo {
    RunInfo {
        attempt_id: 420,
        run_id: 42,
        attempt: 3,
        scheduled_for: Utc
            .with_ymd_and_hms(2026, 1, 2, 3, 4, 5)
            .single()
            .expect("valid instant"),
        job: "nightly-report".to_string(),
        completion: None,
        event: None,
        shard: None,
        secret_headers: Vec::new(),
        params: Default::default(),
        traceparent: None,
    }
}

fn sh(command: &str) -> ShellTarget {
    ShellTarget {
        command: command.to_string(),
        args: Vec::new(),
        env: BTreeMap::new(),
        cwd: None,
        run_as: None,
        limits: Default::default(),
    }
}

fn options(timeout: Option<Duration>) -> ExecOptions {
    ExecOptions {
        timeout,
        kill_grace: Duration::from_millis(500),
        output_drain: Duration::from_millis(300),
        ..ExecOptions::default()
    }
}

async fn run(target: &ShellTarget, options: &ExecOptions) -> (ExecResult, String) {
    run_as(target, &info(), options).await
}

async fn run_as(
    target: &ShellTarget,
    info: &RunInfo,
    options: &ExecOptions,
) -> (ExecResult, String) {
    let (_stop, signal) = stop_channel();
    let output = OutputBuffer::new(1 << 20);
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        shell::run(target, info, options, signal, &output),
    )
    .await
    .expect("the executor ends in bounded time");
    let text = String::from_utf8_lossy(&output.take(usize::MAX)).into_owned();
    (result, text)
}

/// The process no longer exists (a zombie waiting for init to reap it counts as gone).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pid: i32) -> bool {
    for _ in 0..100 {
        if gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The pids the command printed, one per line.
fn pids(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[tokio::test]
async fn exit_zero_succeeds_and_output_is_captured() {
    let (result, text) = run(&sh("echo out; echo err >&2"), &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.error, None);
    assert!(text.contains("out\n") && text.contains("err\n"), "{text:?}");
}

#[tokio::test]
async fn nonzero_exit_fails_with_its_code() {
    let (result, text) = run(&sh("echo before; exit 3"), &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(result.error.as_deref(), Some("exited with code 3"));
    assert_eq!(text, "before\n");
}

#[tokio::test]
async fn killed_by_a_signal_fails_without_exit_code() {
    let (result, _) = run(&sh("kill -KILL $$"), &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.exit_code, None);
    assert_eq!(result.error.as_deref(), Some("killed by signal SIGKILL"));
}

#[tokio::test]
async fn the_job_sees_its_run_and_its_env() {
    let mut target =
        sh("echo \"$SKED_RUN_ID|$SKED_ATTEMPT|$SKED_SCHEDULED_FOR|$SKED_JOB|$LEVEL\"; pwd");
    target.env.insert("LEVEL".to_string(), "full".into());
    // The job cannot pretend to be another run.
    target.env.insert("SKED_RUN_ID".to_string(), "7".into());
    target.cwd = Some("/".to_string());
    let (result, text) = run(&target, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(
        text, "42|3|2026-01-02T03:04:05Z|nightly-report|full\n/\n",
        "{text:?}"
    );
}

#[tokio::test]
async fn a_triggered_run_sees_its_parameters() {
    let target = sh("echo \"$SKED_PARAM_REGION|$SKED_PARAM_ORDER_ID\"");
    let started = RunInfo {
        params: [("region", "eu"), ("order-id", "42")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..info()
    };
    let (result, text) = run_as(&target, &started, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text, "eu|42\n");
}

#[tokio::test]
async fn a_traced_attempt_hands_its_trace_context_to_the_process() {
    let target = sh("echo \"[$TRACEPARENT]\"");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = RunInfo {
        traceparent: Some(traceparent.to_string()),
        ..info()
    };
    let (result, text) = run_as(&target, &traced, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text, format!("[{traceparent}]\n"));
    // Without tracing the variable is not set at all.
    let (_, text) = run(&sh("echo \"[${TRACEPARENT-unset}]\""), &options(None)).await;
    assert_eq!(text, "[unset]\n");
}

#[tokio::test]
async fn a_run_an_event_started_sees_the_event() {
    let target = sh("echo \"$SKED_EVENT_KEY|$SKED_EVENT_ID|$SKED_EVENT_PAYLOAD\"");
    let started = RunInfo {
        event: Some(sked_core::event::RunEvent {
            key: "sales.ready".into(),
            id: "2026-11-24".into(),
            payload: serde_json::json!({"rows": 3}),
        }),
        ..info()
    };
    let (result, text) = run_as(&target, &started, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text, "sales.ready|2026-11-24|{\"rows\":3}\n");
    // Other runs have none of it.
    let (_, text) = run(&target, &options(None)).await;
    assert_eq!(text, "||\n");
}

#[tokio::test]
async fn a_secret_the_server_did_not_open_fails_the_attempt_by_name() {
    let mut target = sh("echo ran");
    let sealed = sked_core::target::SealedText {
        sealed: "v1:00000000:AAAA".to_string(),
    };
    target.env.insert(
        "DB_PASSWORD".to_string(),
        sked_core::target::TargetValue::Sealed(sealed),
    );
    let (result, text) = run(&target, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    let error = result.error.unwrap_or_default();
    assert!(
        error.contains("DB_PASSWORD") && error.contains("--secret-key-file"),
        "{error}"
    );
    assert!(!text.contains("ran"), "the command did not run: {text:?}");
}

#[tokio::test]
async fn with_args_the_command_runs_without_a_shell() {
    let target = ShellTarget {
        command: "printf".to_string(),
        args: vec![
            "%s|%s\n".to_string(),
            "a b".to_string(),
            "$HOME".to_string(),
        ],
        env: BTreeMap::new(),
        cwd: None,
        run_as: None,
        limits: Default::default(),
    };
    let (result, text) = run(&target, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text, "a b|$HOME\n");
}

#[tokio::test]
async fn a_program_that_cannot_start_fails() {
    let target = ShellTarget {
        command: "/nonexistent/program".to_string(),
        args: vec!["x".to_string()],
        env: BTreeMap::new(),
        cwd: None,
        run_as: None,
        limits: Default::default(),
    };
    let (result, text) = run(&target, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
    assert_eq!(result.exit_code, None);
    assert!(result.error.is_some_and(|e| e.contains("cannot start")));
    assert!(text.contains("cannot start"), "{text:?}");

    let mut target = sh("true");
    target.cwd = Some("/nonexistent/dir".to_string());
    let (result, _) = run(&target, &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Failed);
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let started = Instant::now();
    let (result, text) = run(
        &sh("sleep 60 & echo $!; echo $$; sleep 60"),
        &options(Some(Duration::from_secs(1))),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(result.outcome, AttemptOutcome::TimedOut);
    assert_eq!(result.error.as_deref(), Some("timed out after 1s"));
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let pids = pids(&text);
    assert_eq!(pids.len(), 2, "{text:?}");
    for pid in pids {
        assert!(wait_gone(pid).await, "process {pid} survived the timeout");
    }
    assert!(text.contains("timed out after 1s"), "{text:?}");
}

#[tokio::test]
async fn processes_that_ignore_sigterm_get_sigkill_after_the_grace() {
    let started = Instant::now();
    let (result, text) = run(
        &sh("trap '' TERM; sleep 60 & echo $!; echo $$; sleep 60"),
        &options(Some(Duration::from_millis(300))),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(result.outcome, AttemptOutcome::TimedOut);
    // 300 ms of timeout, then the 500 ms grace before SIGKILL.
    assert!(elapsed >= Duration::from_millis(800), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let pids = pids(&text);
    assert_eq!(pids.len(), 2, "{text:?}");
    for pid in pids {
        assert!(wait_gone(pid).await, "process {pid} survived SIGKILL");
    }
}

#[tokio::test]
async fn a_stop_cancels_and_kills_the_group() {
    let (stop, signal) = stop_channel();
    let output = OutputBuffer::new(1 << 20);
    let target = sh("sleep 60 & echo $!; sleep 60");
    let options = options(None);
    let info = info();
    let running = shell::run(&target, &info, &options, signal, &output);
    let stopper = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.stop();
    };
    let started = Instant::now();
    let (result, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(running, stopper)
    })
    .await
    .expect("bounded");
    assert_eq!(result.outcome, AttemptOutcome::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(3));
    let text = String::from_utf8_lossy(&output.take(usize::MAX)).into_owned();
    for pid in pids(&text) {
        assert!(wait_gone(pid).await, "process {pid} survived the stop");
    }
}

#[tokio::test]
async fn a_background_process_holding_the_pipe_does_not_hang_the_attempt() {
    let started = Instant::now();
    let (result, text) = run(&sh("sleep 60 & echo $!; echo done"), &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    // The output drain (300 ms) then SIGTERM: well under the sleep.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(text.contains("done"), "{text:?}");
    for pid in pids(&text) {
        assert!(wait_gone(pid).await, "leftover process {pid} survived");
    }
}

#[tokio::test]
async fn output_written_shortly_after_the_main_process_exits_is_kept() {
    let (result, text) = run(&sh("(sleep 0.1; echo late) & echo early"), &options(None)).await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text, "early\nlate\n");
}

#[tokio::test]
async fn large_output_is_captured_in_full() {
    let (result, text) = run(
        &sh("i=0; while [ $i -lt 2000 ]; do echo line-$i; i=$((i+1)); done"),
        &options(None),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::Succeeded);
    assert_eq!(text.lines().count(), 2000);
    assert_eq!(text.lines().last(), Some("line-1999"));
}

/// Live (non-zombie) processes whose command line is exactly `cmdline`.
fn alive_with_cmdline(cmdline: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            let pid: Option<i32> = entry.file_name().to_str().and_then(|n| n.parse().ok());
            let text = std::fs::read(entry.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            text.trim() == cmdline && pid.is_some_and(|p| !gone(p))
        })
        .count()
}

#[tokio::test]
async fn a_nested_shell_and_its_background_child_die_on_timeout() {
    let (result, _) = run(
        &sh("sh -c 'sleep 97 & sleep 97'"),
        &options(Some(Duration::from_millis(500))),
    )
    .await;
    assert_eq!(result.outcome, AttemptOutcome::TimedOut);
    let mut left = alive_with_cmdline("sleep 97");
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = alive_with_cmdline("sleep 97");
    }
    assert_eq!(left, 0, "sleep processes survived the timeout");
}

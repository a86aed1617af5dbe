//! The shell executor: runs a `ShellTarget` as a process in its own process group, with the
//! run's `SKED_*` environment, streams its stdout and stderr to the output, and ends the whole
//! group (SIGTERM, then SIGKILL after the grace period) on timeout, on a stop, and when the main
//! process exits leaving others behind. Owns process lifetimes only: it must not speak the
//! worker protocol, and it never returns while a process of the group it knows of still lives
//! (bounded by the grace period).

use super::{expire, human, ExecOptions, ExecResult, RunInfo, StopSignal};
use crate::output::OutputBuffer;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use sked_core::protocol::{ENV_ATTEMPT, ENV_JOB, ENV_RUN_ID, ENV_SCHEDULED_FOR};
use sked_core::target::ShellTarget;
use sked_core::AttemptOutcome;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, timeout_at, Instant};

/// Once the group is gone its pipes close; a process that left the group (setsid) could keep
/// them open, so reading output is bounded by this much after the end.
const READERS_BOUND: Duration = Duration::from_secs(1);
/// How often the group is checked for survivors while it is being terminated.
const POLL: Duration = Duration::from_millis(20);

/// Runs the target and returns how it ended. Every process of its group is gone on return.
pub async fn run(
    target: &ShellTarget,
    info: &RunInfo,
    options: &ExecOptions,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let mut child = match command(target, info).spawn() {
        Ok(child) => child,
        Err(e) => {
            let message = format!("cannot start {:?}: {e}", target.command);
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            return ExecResult::failed(message);
        }
    };
    let Some(pgid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        // Not reaped yet right after spawn, so this does not happen; stay safe anyway.
        let _ = child.start_kill();
        return ExecResult::failed("the process has no id");
    };
    let mut group = Group {
        pgid: Pid::from_raw(pgid),
        gone: false,
    };
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(pump(stdout, output.clone())));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(pump(stderr, output.clone())));
    }

    let ended = tokio::select! {
        status = child.wait() => End::Exited(status),
        () = expire(options.timeout) => End::TimedOut,
        () = stop.requested() => End::Stopped,
    };
    let result = match ended {
        End::Exited(Ok(status)) => {
            // Processes left in the group may hold the pipes: give their output a bounded
            // time to arrive, then end them.
            settle(&mut readers, options.output_drain).await;
            if group.alive() {
                tracing::debug!("process group {pgid} outlived its main process; ending it");
                group.terminate(&mut child, options.kill_grace).await;
            }
            exited(status)
        }
        End::Exited(Err(e)) => {
            group.terminate(&mut child, options.kill_grace).await;
            ExecResult::failed(format!("cannot wait for the process: {e}"))
        }
        End::TimedOut => {
            let limit = human(options.timeout.unwrap_or_default());
            output.write(
                format!(
                    "\n[sked-worker: timed out after {limit}; terminating the process group]\n"
                )
                .as_bytes(),
            );
            group.terminate(&mut child, options.kill_grace).await;
            ExecResult::ended(AttemptOutcome::TimedOut, format!("timed out after {limit}"))
        }
        End::Stopped => {
            output.write(b"\n[sked-worker: stopped; terminating the process group]\n");
            group.terminate(&mut child, options.kill_grace).await;
            ExecResult::ended(AttemptOutcome::Cancelled, "stopped by the worker")
        }
    };
    if !settle(&mut readers, READERS_BOUND).await {
        tracing::debug!("output pipes still open after the process group ended; not waiting");
        for reader in &readers {
            reader.abort();
        }
    }
    result
}

enum End {
    Exited(std::io::Result<ExitStatus>),
    TimedOut,
    Stopped,
}

fn command(target: &ShellTarget, info: &RunInfo) -> Command {
    let mut cmd = if target.args.is_empty() {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(&target.command);
        cmd
    } else {
        let mut cmd = Command::new(&target.command);
        cmd.args(&target.args);
        cmd
    };
    // The job's own variables first: the SKED_* ones describe the run and win.
    cmd.envs(&target.env)
        .env(ENV_RUN_ID, info.run_id.to_string())
        .env(ENV_ATTEMPT, info.attempt.to_string())
        .env(ENV_SCHEDULED_FOR, info.scheduled_for_rfc3339())
        .env(ENV_JOB, &info.job);
    if let Some(cwd) = &target.cwd {
        cmd.current_dir(cwd);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

fn exited(status: ExitStatus) -> ExecResult {
    if status.success() {
        return ExecResult {
            outcome: AttemptOutcome::Succeeded,
            exit_code: Some(0),
            http_status: None,
            error: None,
        };
    }
    match (status.code(), status.signal()) {
        (Some(code), _) => ExecResult {
            exit_code: Some(code),
            ..ExecResult::failed(format!("exited with code {code}"))
        },
        (None, Some(signal)) => {
            let name = Signal::try_from(signal)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| signal.to_string());
            ExecResult::failed(format!("killed by signal {name}"))
        }
        (None, None) => ExecResult::failed(format!("ended with {status}")),
    }
}

/// Copies a pipe into the output until it closes.
async fn pump(mut pipe: impl AsyncRead + Unpin, output: OutputBuffer) {
    let mut buf = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => output.write(&buf[..n]),
        }
    }
}

/// Waits up to `bound` for the readers to reach the end of their pipes; true if they all did.
/// Finished readers are removed, so none is polled again.
async fn settle(readers: &mut Vec<JoinHandle<()>>, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while let Some(reader) = readers.last_mut() {
        if timeout_at(deadline, reader).await.is_err() {
            return false;
        }
        readers.pop();
    }
    true
}

/// The process group of one attempt (its id is the main process's pid). Dropping it kills
/// whatever is left of the group, so an abandoned attempt leaves nothing behind.
struct Group {
    pgid: Pid,
    /// Seen empty: from then on the id may be reused and must not be signalled.
    gone: bool,
}

impl Group {
    /// Some process of the group still exists (a zombie counts until it is reaped).
    fn alive(&mut self) -> bool {
        if !self.gone && matches!(killpg(self.pgid, None), Err(Errno::ESRCH)) {
            self.gone = true;
        }
        !self.gone
    }

    /// SIGTERM to the whole group; SIGKILL once `grace` has passed with any of it left.
    async fn terminate(&mut self, child: &mut Child, grace: Duration) {
        let _ = killpg(self.pgid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            // Reaping the main process removes its zombie from the group.
            let reaped = !matches!(child.try_wait(), Ok(None));
            if reaped && !self.alive() {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            sleep(POLL).await;
        }
        tracing::debug!(
            "process group {} survived SIGTERM; sending SIGKILL",
            self.pgid
        );
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = timeout(Duration::from_secs(1), child.wait()).await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.alive() {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

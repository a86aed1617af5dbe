//! The shell executor: runs a `ShellTarget` with the run's `SKED_*` environment, streams its
//! stdout and stderr to the output, and ends its processes (SIGTERM, then SIGKILL after the
//! grace period) on timeout, on a stop, and when the main process exits leaving others behind.
//!
//! With a supervisor (`ExecOptions::supervisor`, what `sked` always sets) the attempt runs
//! under a [`supervisor`](super::supervisor) process that holds every descendant (also those
//! that `setsid` away) and ends them all, and at once when the worker dies. Without one, the
//! attempt is a process group of its own, ended as a group. Owns process lifetimes only: it
//! must not speak the worker protocol, and it never returns while a process it knows of still
//! lives (bounded by the grace period).
//!
//! `run_as` and the limits that bind processes ([`bind`](super::bind) decides how) are applied
//! by the supervisor to the job's process before it is executed: the attempt's cgroup (made
//! here, removed here once the tree is gone, and read for an out-of-memory kill), rlimits,
//! and the switch to the user. Without a supervisor such a target is refused, not run
//! unbound.

use super::bind::{self, Account};
use super::cgroup::AttemptGroup;
use super::pipes::{abandon, settle, Sink};
use super::supervisor::client::Supervised;
use super::supervisor::{self, Launch};
use super::{expire, human, ExecOptions, ExecResult, RunInfo, StopSignal};
use crate::output::OutputBuffer;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use sked_core::target::ShellTarget;
use sked_core::AttemptOutcome;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::{sleep, timeout, Instant};

/// Once the group is gone its pipes close; a process that left the group (setsid) could keep
/// them open, so reading output is bounded by this much after the end.
const READERS_BOUND: Duration = Duration::from_secs(1);
/// How often the group is checked for survivors while it is being terminated.
const POLL: Duration = Duration::from_millis(20);
/// Beyond the grace period, how long a supervisor may take to sweep its tree.
const SUPERVISOR_MARGIN: Duration = Duration::from_secs(2);

/// Runs the target and returns how it ended. Every process of its group is gone on return.
pub async fn run(
    target: &ShellTarget,
    info: &RunInfo,
    options: &ExecOptions,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let env = match sked_core::target::plain_values(&target.env) {
        Ok(env) => env,
        Err((name, why)) => {
            let message = format!("env {name} {why}");
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            return ExecResult::failed(message);
        }
    };
    let mut binding = match Binding::of(target, info, options) {
        Ok(binding) => binding,
        Err(message) => {
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            return ExecResult::failed(message);
        }
    };
    if let Some(line) = &binding.line {
        output.write(line.as_bytes());
    }
    let started = match start(target, &env, info, options, &binding).await {
        Ok(started) => started,
        Err(e) => {
            let message = format!("cannot start {:?}: {e}", target.command);
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            binding.release().await;
            return ExecResult::failed(message);
        }
    };
    let sink = Sink::new(output, target.limits.max_output.map(|m| m.0));
    let mut readers = Vec::new();
    let (mut child, control) = match started {
        Started::Direct(mut child) => {
            if let Some(stdout) = child.stdout.take() {
                readers.push(sink.pump(stdout));
            }
            if let Some(stderr) = child.stderr.take() {
                readers.push(sink.pump(stderr));
            }
            (Process::Direct(child), None)
        }
        Started::Supervised(mut supervised) => {
            if let Some(stdout) = supervised.stdout.take() {
                readers.push(sink.pump(stdout));
            }
            if let Some(stderr) = supervised.stderr.take() {
                readers.push(sink.pump(stderr));
            }
            let control = supervised.control.take();
            (Process::Supervised(supervised), control)
        }
    };
    let Some(pgid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        // Not reaped yet right after spawn, so this does not happen; stay safe anyway.
        child.start_kill();
        return ExecResult::failed("the process has no id");
    };
    let mut group = Group {
        pgid: Pid::from_raw(pgid),
        gone: false,
        // The supervisor's end of the pipe: dropping it tells the supervisor to end the tree.
        control,
    };

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
            if group.control.is_none() && group.alive() {
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
        abandon(&readers);
    }
    // The tree is gone: whether the kernel killed in it for memory is final now. A timeout or
    // a stop keeps its own outcome.
    let result = match (&binding.cgroup.0, target.limits.memory) {
        (Some(group), Some(memory))
            if result.outcome == AttemptOutcome::Failed && group.out_of_memory(false) =>
        {
            ExecResult::out_of_memory(memory, result.exit_code)
        }
        _ => result,
    };
    binding.release().await;
    result
}

/// How one attempt is bound: what the supervisor is told, and the cgroup made for it.
struct Binding {
    setup: supervisor::Setup,
    account: Option<Account>,
    cgroup: Cgroup,
    /// What the output starts with: which limits applied how.
    line: Option<String>,
}

impl Binding {
    /// Resolves the user and decides and prepares the limits; an error fails the attempt.
    fn of(target: &ShellTarget, info: &RunInfo, options: &ExecOptions) -> Result<Binding, String> {
        let binds = target.run_as.is_some() || target.limits.binds_processes();
        if !binds {
            return Ok(Binding {
                setup: supervisor::Setup::default(),
                account: None,
                cgroup: Cgroup(None),
                line: None,
            });
        }
        if options.supervisor.is_none() {
            return Err(
                "run_as and process limits need the attempt supervisor, which this executor \
                 was not given; the job was not started"
                    .to_string(),
            );
        }
        let account = match &target.run_as {
            None => None,
            Some(run_as) => {
                if !nix::unistd::geteuid().is_root() {
                    return Err(format!(
                        "run_as: cannot run as user {:?}: this worker does not run as root",
                        run_as.user
                    ));
                }
                Some(bind::resolve(run_as)?)
            }
        };
        let user = account.as_ref().map(|a| a.name.as_str());
        let cgroups = options.cgroups.as_ref();
        let mut plan = bind::plan(&target.limits, cgroups.map(|c| c.describe()), user);
        let mut cgroup = Cgroup(None);
        if let (Some(bounds), Some(cgroups)) = (plan.cgroup, cgroups) {
            match cgroups.create(info.attempt_id, bounds) {
                Ok(group) => cgroup = Cgroup(Some(group)),
                // Rlimits still bind what they can; the line says the group is missing.
                Err(e) => {
                    tracing::warn!("cannot make the cgroup of attempt {}: {e}", info.attempt_id);
                    plan = bind::plan(&target.limits, None, user);
                    plan.line = plan.line.map(|line| {
                        format!("[sked-worker: cannot make the attempt's cgroup ({e})]\n{line}")
                    });
                }
            }
        }
        let setup = supervisor::Setup {
            cgroups: cgroup
                .0
                .as_ref()
                .map(|g| g.procs_files())
                .unwrap_or_default(),
            rlimits: plan.rlimits,
            account: account.as_ref().map(|a| (a.uid, a.gid)),
        };
        Ok(Binding {
            setup,
            account,
            cgroup,
            line: plan.line,
        })
    }

    /// Removes the attempt's cgroup, once its processes are gone.
    async fn release(&mut self) {
        if let Some(group) = self.cgroup.0.take() {
            let _ = tokio::task::spawn_blocking(move || group.remove()).await;
        }
    }
}

/// The attempt's cgroup while the attempt holds it. An attempt dropped before its end leaves
/// its supervisor ending the tree; the group is removed once that is done, off the runtime.
struct Cgroup(Option<AttemptGroup>);

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            std::thread::spawn(move || {
                let dirs: Vec<_> = group
                    .procs_files()
                    .iter()
                    .filter_map(|f| f.parent().map(|d| d.to_path_buf()))
                    .collect();
                for _ in 0..20 {
                    group.remove();
                    if dirs.iter().all(|d| !d.exists()) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            });
        }
    }
}

enum End {
    Exited(std::io::Result<ExitStatus>),
    TimedOut,
    Stopped,
}

/// An attempt's main process as started: the job itself, or its supervisor.
enum Started {
    Direct(Child),
    Supervised(Box<Supervised>),
}

/// The main process once its pipes are taken.
enum Process {
    Direct(Child),
    Supervised(Box<Supervised>),
}

impl Process {
    fn id(&self) -> Option<u32> {
        match self {
            Process::Direct(child) => child.id(),
            Process::Supervised(supervised) => Some(supervised.pid),
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Process::Direct(child) => child.wait().await,
            Process::Supervised(supervised) => supervised.wait().await,
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Process::Direct(child) => child.try_wait(),
            Process::Supervised(supervised) => supervised.try_wait(),
        }
    }

    /// Only a job started directly is killed here; a supervisor is told through its pipe.
    fn start_kill(&mut self) {
        if let Process::Direct(child) = self {
            let _ = child.start_kill();
        }
    }
}

/// Starts the attempt: through the worker's supervisor server when it has one, else as a
/// process group of its own.
async fn start(
    target: &ShellTarget,
    env: &[(&str, &str)],
    info: &RunInfo,
    options: &ExecOptions,
    binding: &Binding,
) -> std::io::Result<Started> {
    let (program, args) = if target.args.is_empty() {
        ("/bin/sh", vec!["-c".to_string(), target.command.clone()])
    } else {
        (target.command.as_str(), target.args.clone())
    };
    // The job's own variables first; a run_as user's own HOME, USER and LOGNAME over them;
    // the SKED_* ones describe the run and win.
    let mut overrides: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(account) = &binding.account {
        overrides.push(("HOME".to_string(), account.home.clone()));
        overrides.push(("USER".to_string(), account.name.clone()));
        overrides.push(("LOGNAME".to_string(), account.name.clone()));
    }
    overrides.extend(info.env());
    let Some(server) = &options.supervisor else {
        let mut cmd = Command::new(program);
        cmd.args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .envs(overrides)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(cwd) = &target.cwd {
            cmd.current_dir(cwd);
        }
        return cmd.spawn().map(Started::Direct);
    };
    // The supervisor starts the job with exactly this environment: the worker's, as a
    // process it started would inherit, under the attempt's.
    let mut environment: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    environment.extend(
        overrides
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    let launch = Launch {
        args: supervisor::arguments(
            options.kill_grace,
            options.output_drain,
            &binding.setup,
            program,
            &args,
        )
        .into_iter()
        .map(OsString::from)
        .collect(),
        env: environment.into_iter().collect(),
        cwd: target.cwd.as_ref().map(PathBuf::from),
    };
    let supervised = server.start(&launch).await?;
    Ok(Started::Supervised(Box::new(supervised)))
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

/// The process group of one attempt (its id is the main process's pid: the job, or its
/// supervisor). Dropping it ends whatever is left, so an abandoned attempt leaves nothing
/// behind: the group is killed, or the supervisor's pipe is closed.
struct Group {
    pgid: Pid,
    /// Seen empty: from then on the id may be reused and must not be signalled.
    gone: bool,
    /// With a supervisor, the pipe whose end tells it the worker is gone.
    control: Option<OwnedFd>,
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
    async fn terminate(&mut self, child: &mut Process, grace: Duration) {
        let _ = killpg(self.pgid, Signal::SIGTERM);
        // A supervisor spends the grace on its tree, then needs a moment to sweep it.
        let margin = if self.control.is_some() {
            SUPERVISOR_MARGIN
        } else {
            Duration::ZERO
        };
        let deadline = Instant::now() + grace + margin;
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
        if self.control.take().is_some() {
            // Closing the pipe makes a supervisor SIGKILL its whole tree: give it that chance
            // before it is killed itself.
            let _ = timeout(Duration::from_secs(1), child.wait()).await;
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = timeout(Duration::from_secs(1), child.wait()).await;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // A supervisor ends its tree when its pipe closes, which dropping `control` does.
        if self.control.is_none() && self.alive() {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

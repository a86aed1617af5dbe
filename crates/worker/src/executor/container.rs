//! The container executor: runs a `ContainerTarget` through the container engine's command
//! line (`podman run`, or `docker run`), streams the container's stdout and stderr to the
//! output, and makes its exit code the outcome. A timeout or a stop stops the container
//! (SIGTERM, the grace period, SIGKILL) and removes it.
//!
//! Every container carries the labels `sked.worker`, `sked.worker.pid` and `sked.attempt`,
//! and a worker removes, when it starts, the containers of its name whose worker process is
//! gone ([`Engine::reap_orphans`]): a worker killed mid-run leaves no container behind once
//! it is back. The job's variables reach the container through an env file the engine reads
//! from its standard input: never on a command line, never in `ps`, never in the engine's own
//! environment.
//!
//! Owns the engine's command line only: it must not speak the worker protocol.

use super::cgroup::{AttemptGroup, Bounds};
use super::pipes::{abandon, settle, Sink};
use super::{expire, human, ExecOptions, ExecResult, RunInfo, StopSignal};
use crate::output::OutputBuffer;
use sked_core::container::ContainerTarget;
use sked_core::AttemptOutcome;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// The label naming the worker that started a container: what it reaps at start.
pub const LABEL_WORKER: &str = "sked.worker";
/// The label giving the pid of the worker process that started a container: several workers
/// of one name on a host (the default name is the host's) leave each other's alone.
pub const LABEL_WORKER_PID: &str = "sked.worker.pid";
/// The label naming the attempt a container runs.
pub const LABEL_ATTEMPT: &str = "sked.attempt";
/// How long the engine's own commands (inspect, stop beyond the grace, remove) may take.
const ENGINE_BOUND: Duration = Duration::from_secs(20);
/// Once the container is gone, how long its output may take to arrive.
const READERS_BOUND: Duration = Duration::from_secs(2);
/// The engine's exit code for its own failures (a bad image, a pull that failed).
const ENGINE_FAILED: i32 = 125;

/// Which engine's command line to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Podman,
    Docker,
}

impl EngineKind {
    pub fn parse(name: &str) -> Option<EngineKind> {
        match name {
            "podman" => Some(EngineKind::Podman),
            "docker" => Some(EngineKind::Docker),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Podman => "podman",
            EngineKind::Docker => "docker",
        }
    }
}

/// The container engine this worker runs container targets with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub kind: EngineKind,
    pub program: PathBuf,
    /// The worker's name, written on every container as [`LABEL_WORKER`].
    pub worker: String,
    /// The engine places containers in cgroups by path (its cgroup manager is `cgroupfs`),
    /// so an attempt's limits can be set on a group of sked's own, whose OOM kills sked can
    /// read; otherwise they go to the engine as its flags.
    pub cgroup_paths: bool,
}

impl Engine {
    /// The engine named (`podman` or `docker`), or the first of them on PATH; checked by
    /// asking it about itself. `Ok(None)` when none was named and none answers.
    pub async fn detect(named: Option<&str>, worker: &str) -> Result<Option<Engine>, String> {
        let kinds: Vec<EngineKind> = match named {
            Some(name) => vec![EngineKind::parse(name)
                .ok_or_else(|| format!("--container-runtime {name:?}: podman or docker"))?],
            None => vec![EngineKind::Podman, EngineKind::Docker],
        };
        for kind in kinds {
            let Some(program) = on_path(kind.as_str()) else {
                if named.is_some() {
                    return Err(format!("{} is not on PATH", kind.as_str()));
                }
                continue;
            };
            let format = match kind {
                EngineKind::Podman => "{{.Host.CgroupManager}}",
                EngineKind::Docker => "{{.CgroupDriver}}",
            };
            let answer = bounded(Command::new(&program).args(["info", "--format", format])).await;
            match answer {
                Ok(out) if out.status.success() => {
                    let manager = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    return Ok(Some(Engine {
                        kind,
                        program,
                        worker: worker.to_string(),
                        cgroup_paths: manager == "cgroupfs",
                    }));
                }
                Ok(out) if named.is_some() => {
                    return Err(format!(
                        "{} info failed: {}",
                        kind.as_str(),
                        last_line(&out.stderr)
                    ))
                }
                Err(e) if named.is_some() => return Err(format!("{} info: {e}", kind.as_str())),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Removes the containers a worker of this name left behind when it died (killed
    /// mid-run): those whose worker process no longer runs. Their attempts' runs were handed
    /// to another worker already. How many there were.
    pub async fn reap_orphans(&self) -> Result<usize, String> {
        let filter = format!("label={LABEL_WORKER}={}", self.worker);
        let format = format!("{{{{.ID}}}} {{{{index .Labels \"{LABEL_WORKER_PID}\"}}}}");
        let listed = bounded(
            Command::new(&self.program)
                .args(["ps", "--all", "--filter", &filter, "--format", &format]),
        )
        .await
        .map_err(|e| format!("{} ps: {e}", self.kind.as_str()))?;
        if !listed.status.success() {
            return Err(format!(
                "{} ps failed: {}",
                self.kind.as_str(),
                last_line(&listed.stderr)
            ));
        }
        let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let id = fields.next()?;
                let pid = fields.next().and_then(|p| p.parse::<u32>().ok());
                (!pid.is_some_and(worker_runs)).then(|| id.to_string())
            })
            .collect();
        if !ids.is_empty() {
            let removed = bounded(
                Command::new(&self.program)
                    .args(["rm", "--force"])
                    .args(&ids),
            )
            .await
            .map_err(|e| format!("{} rm: {e}", self.kind.as_str()))?;
            if !removed.status.success() {
                return Err(format!(
                    "{} rm failed: {}",
                    self.kind.as_str(),
                    last_line(&removed.stderr)
                ));
            }
        }
        Ok(ids.len())
    }

    /// The `run` command line for one attempt, up to the image and its arguments. Values of
    /// variables are not on it: only their names, after `--env-file`.
    fn run_args(
        &self,
        target: &ContainerTarget,
        name: &str,
        info: &RunInfo,
        group: Option<&AttemptGroup>,
    ) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--rm",
            "--name",
            name,
            "--label",
            &format!("{LABEL_WORKER}={}", self.worker),
            "--label",
            &format!("{LABEL_WORKER_PID}={}", std::process::id()),
            "--label",
            &format!("{LABEL_ATTEMPT}={}", info.attempt_id),
            "--env-file",
            "/dev/stdin",
            "--network",
            target.network.as_str(),
            "--pull",
            target.pull.as_str(),
            "--security-opt",
            "no-new-privileges",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match group {
            Some(group) => args.push(format!("--cgroup-parent={}", group.relative())),
            None => {
                if let Some(memory) = target.memory {
                    args.push(format!("--memory={}", memory.0));
                    args.push(format!("--memory-swap={}", memory.0));
                }
                if let Some(cpus) = target.cpus {
                    args.push(format!("--cpus={cpus}"));
                }
                if let Some(pids) = target.pids {
                    args.push(format!("--pids-limit={pids}"));
                }
            }
        }
        if let Some(user) = &target.user {
            args.push(format!("--user={user}"));
        }
        if let Some(workdir) = &target.workdir {
            args.push(format!("--workdir={workdir}"));
        }
        if let Some(entrypoint) = &target.entrypoint {
            args.push(format!("--entrypoint={entrypoint}"));
        }
        for mount in &target.mounts {
            let mode = if mount.writable { "rw" } else { "ro" };
            args.push(format!("--volume={}:{}:{mode}", mount.source, mount.target));
        }
        // Nothing after the image is read as the engine's option.
        args.push(target.image.clone());
        args.extend(target.argv().into_iter().map(str::to_string));
        args
    }

    /// `stop` with the grace period (the engine sends SIGTERM, then SIGKILL), then `rm`:
    /// whatever state the container was in, it is gone on return, or the log says why not.
    async fn stop_and_remove(&self, name: &str, grace: Duration, output: &OutputBuffer) {
        let seconds = grace.as_millis().div_ceil(1000).to_string();
        let stop = bounded_for(
            Command::new(&self.program).args(["stop", "--time", &seconds, name]),
            grace + ENGINE_BOUND,
        )
        .await;
        if let Err(e) = stop {
            tracing::warn!("{} stop {name}: {e}", self.kind.as_str());
        }
        self.remove(name, output).await;
    }

    /// `rm --force`: an engine's `run --rm` can leave a container that ended abnormally
    /// (killed for memory, say) to a cleanup of its own that is still going on.
    async fn remove(&self, name: &str, output: &OutputBuffer) {
        match bounded(Command::new(&self.program).args(["rm", "--force", name])).await {
            Ok(out) if out.status.success() || no_such_container(&out.stderr) => {}
            Ok(out) => output.write(
                format!(
                    "[sked-worker: cannot remove container {name}: {}]\n",
                    last_line(&out.stderr)
                )
                .as_bytes(),
            ),
            Err(e) => output
                .write(format!("[sked-worker: cannot remove container {name}: {e}]\n").as_bytes()),
        }
    }
}

/// Runs the container and returns how it ended. The container is gone on return (or the
/// output says why it could not be removed).
pub async fn run(
    target: &ContainerTarget,
    info: &RunInfo,
    options: &ExecOptions,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let Some(engine) = &options.container_engine else {
        return refuse(
            output,
            "this worker has no container engine (sked worker --container-runtime)".into(),
        );
    };
    let env = match env_file(target, info) {
        Ok(env) => env,
        Err(message) => return refuse(output, message),
    };
    let bounds = Bounds {
        memory: target.memory,
        cpus: target.cpus,
        pids: target.pids,
    };
    let limited = bounds != Bounds::default();
    let group = match (&options.cgroups, engine.cgroup_paths && limited) {
        // As for a shell job, a group that cannot be made leaves the limits to the next
        // best binder, here the engine's own flags, and the log says so.
        (Some(cgroups), true) => match cgroups.create(info.attempt_id, bounds) {
            Ok(group) => Some(group),
            Err(e) => {
                output.write(
                    format!(
                        "[sked-worker: cannot make the attempt's cgroup ({e}); the limits go \
                         to the engine]\n"
                    )
                    .as_bytes(),
                );
                None
            }
        },
        _ => None,
    };
    let name = format!("sked-attempt-{}", info.attempt_id);
    let mut command = Command::new(&engine.program);
    command
        .args(engine.run_args(target, &name, info, group.as_ref()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let result = supervise(engine, command, &name, &env, options, &mut stop, output).await;
    // The engine reports a container whose main process was SIGKILLed as exit code 137.
    let result = match (&group, target.memory) {
        (Some(group), Some(memory))
            if result.outcome == AttemptOutcome::Failed
                && group.out_of_memory(result.exit_code == Some(128 + 9)) =>
        {
            ExecResult::out_of_memory(memory, result.exit_code)
        }
        _ => result,
    };
    if let Some(group) = group {
        group.remove();
    }
    result
}

async fn supervise(
    engine: &Engine,
    mut command: Command,
    name: &str,
    env: &str,
    options: &ExecOptions,
    stop: &mut StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return refuse(
                output,
                format!("cannot start {}: {e}", engine.program.display()),
            )
        }
    };
    // The engine reads the variables from its standard input, then sees it closed. A write
    // that fails would start the container without some of them: the attempt ends instead.
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin.write_all(env.as_bytes()).await,
        None => Err(std::io::Error::other("no pipe to the engine")),
    };
    if let Err(e) = written {
        let _ = child.start_kill();
        let _ = child.wait().await;
        engine.stop_and_remove(name, Duration::ZERO, output).await;
        return refuse(
            output,
            format!("cannot hand the container its environment: {e}"),
        );
    }
    // The engine's own complaints arrive on stderr too: keep its last line for the error.
    let sink = Sink::new(output, None);
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(sink.pump(stdout));
    }
    let tail = TailKeeper::default();
    if let Some(stderr) = child.stderr.take() {
        let tail = tail.clone();
        readers.push(sink.pump_seen(stderr, move |bytes| tail.keep(bytes)));
    }
    let ended = tokio::select! {
        status = child.wait() => Some(status),
        () = expire(options.timeout) => None,
        () = stop.requested() => None,
    };
    let timed_out = ended.is_none() && !stop.is_requested();
    let result = match ended {
        Some(Ok(status)) => {
            settle(&mut readers, READERS_BOUND).await;
            match status.code() {
                Some(0) => ExecResult {
                    outcome: AttemptOutcome::Succeeded,
                    exit_code: Some(0),
                    http_status: None,
                    error: None,
                },
                Some(ENGINE_FAILED) => {
                    // The container may have been created before the engine failed.
                    engine.stop_and_remove(name, Duration::ZERO, output).await;
                    ExecResult {
                        exit_code: Some(ENGINE_FAILED),
                        ..ExecResult::failed(format!(
                            "the container engine failed: {}",
                            tail.line()
                        ))
                    }
                }
                Some(code) => {
                    engine.remove(name, output).await;
                    ExecResult {
                        exit_code: Some(code),
                        ..ExecResult::failed(format!("the container exited with code {code}"))
                    }
                }
                None => {
                    engine.stop_and_remove(name, Duration::ZERO, output).await;
                    ExecResult::failed("the container engine was killed by a signal")
                }
            }
        }
        Some(Err(e)) => {
            engine
                .stop_and_remove(name, options.kill_grace, output)
                .await;
            ExecResult::failed(format!("cannot wait for the container engine: {e}"))
        }
        None if timed_out => {
            let limit = human(options.timeout.unwrap_or_default());
            output.write(
                format!("\n[sked-worker: timed out after {limit}; stopping the container]\n")
                    .as_bytes(),
            );
            engine
                .stop_and_remove(name, options.kill_grace, output)
                .await;
            ExecResult::ended(AttemptOutcome::TimedOut, format!("timed out after {limit}"))
        }
        None => {
            output.write(b"\n[sked-worker: stopped; stopping the container]\n");
            engine
                .stop_and_remove(name, options.kill_grace, output)
                .await;
            ExecResult::ended(AttemptOutcome::Cancelled, "stopped by the worker")
        }
    };
    // The engine's client ends with its container; should it linger, it goes now.
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
    if !settle(&mut readers, READERS_BOUND).await {
        abandon(&readers);
    }
    result
}

/// The env file the engine reads: the job's variables, then the `SKED_*` ones, which win.
/// A value with a line break cannot be written in one and is refused by name.
fn env_file(target: &ContainerTarget, info: &RunInfo) -> Result<String, String> {
    let job = sked_core::target::plain_values(&target.env)
        .map_err(|(name, why)| format!("env {name} {why}"))?;
    let run = info.env();
    let mut text = String::new();
    let all = job
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .chain(run);
    for (name, value) in all {
        if value.contains(['\n', '\r']) {
            return Err(format!(
                "env {name} holds a line break, which a container's environment file cannot \
                 carry"
            ));
        }
        text.push_str(&name);
        text.push('=');
        text.push_str(&value);
        text.push('\n');
    }
    Ok(text)
}

fn refuse(output: &OutputBuffer, message: String) -> ExecResult {
    output.write(format!("[sked-worker: {message}]\n").as_bytes());
    ExecResult::failed(message)
}

/// The last line the engine wrote to stderr, as it passes to the output.
#[derive(Clone, Default)]
struct TailKeeper(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl TailKeeper {
    fn keep(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tail.extend_from_slice(bytes);
        let excess = tail.len().saturating_sub(2048);
        tail.drain(..excess);
    }

    fn line(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|p| p.into_inner());
        last_line(&tail)
    }
}

fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim();
    line.chars().take(500).collect()
}

fn no_such_container(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr).to_ascii_lowercase();
    text.contains("no such container") || text.contains("no container with name")
}

/// Runs an engine command to its end within [`ENGINE_BOUND`].
async fn bounded(command: &mut Command) -> std::io::Result<std::process::Output> {
    bounded_for(command, ENGINE_BOUND).await
}

async fn bounded_for(
    command: &mut Command,
    bound: Duration,
) -> std::io::Result<std::process::Output> {
    command.stdin(Stdio::null()).kill_on_drop(true);
    match tokio::time::timeout(bound, command.output()).await {
        Ok(output) => output,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {}", human(bound)),
        )),
    }
}

/// Whether the worker process `pid` still runs (this one included).
fn worker_runs(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// The first `name` in a directory of PATH that is a file.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            attempt_id: 7,
            run_id: 3,
            attempt: 1,
            scheduled_for: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            job: "nightly".into(),
            completion: None,
            event: None,
            shard: None,
            secret_headers: Vec::new(),
            params: Default::default(),
            traceparent: None,
        }
    }

    fn engine() -> Engine {
        Engine {
            kind: EngineKind::Podman,
            program: "podman".into(),
            worker: "w1".into(),
            cgroup_paths: false,
        }
    }

    #[test]
    fn values_stay_off_the_command_line() {
        let target: ContainerTarget = serde_json::from_value(serde_json::json!({
            "image": "localhost/tool", "command": "/bin/sh", "args": ["-c", "env"],
            "env": {"TOKEN": "s3cret"}, "memory": "64MiB", "pids": 16,
            "mounts": [{"source": "/srv", "target": "/srv"}]
        }))
        .unwrap();
        let args = engine().run_args(&target, "sked-attempt-7", &info(), None);
        assert!(!args.iter().any(|a| a.contains("s3cret")), "{args:?}");
        let at = args.iter().position(|a| a == "localhost/tool").unwrap();
        assert_eq!(&args[at + 1..], ["/bin/sh", "-c", "env"]);
        for flag in [
            "--memory=67108864",
            "--pids-limit=16",
            "--volume=/srv:/srv:ro",
            "--network",
            "none",
            "sked.attempt=7",
            "sked.worker=w1",
        ] {
            assert!(args[..at].iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        let env = env_file(&target, &info()).unwrap();
        assert!(env.starts_with("TOKEN=s3cret\n"), "{env}");
        assert!(env.contains("SKED_JOB=nightly\n"), "{env}");
    }

    #[test]
    fn a_value_with_a_line_break_is_refused_by_name() {
        let target: ContainerTarget = serde_json::from_value(serde_json::json!({
            "image": "a", "env": {"KEY": "line1\nline2"}
        }))
        .unwrap();
        let error = env_file(&target, &info()).unwrap_err();
        assert!(error.starts_with("env KEY holds a line break"), "{error}");
    }
}

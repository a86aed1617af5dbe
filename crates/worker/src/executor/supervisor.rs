//! The attempt supervisor: a small process between the worker and a shell attempt's processes
//! that ties their lives to the worker's and ends the whole tree, however it was spread.
//!
//! The worker starts it (its own executable again, see [`run_if_requested`]) with a pipe as its
//! standard input that only the worker writes to. It makes itself a child subreaper, so every
//! process the job starts stays its descendant even when it double-forks or calls `setsid`,
//! then starts the job in a process group of its own and waits. The tree is ended
//! (SIGTERM to every descendant, SIGKILL to what is left after the grace period):
//! - when the worker asks (SIGTERM to the supervisor: a cancel or a timeout);
//! - when the job's main process exits and others are still running past the output drain;
//! - at once with SIGKILL when the worker is gone (the pipe reads end-of-file), so a dead
//!   worker's attempt is dead before its run is handed to another worker.
//!
//! It then exits as the job's main process did: the same exit code, or killed by the same
//! signal. One thread and blocking calls (a signalfd and poll): it starts for every attempt,
//! so it starts cheaply, and has no runtime to leak into the job. It must
//! not speak the worker protocol nor write anything but its own failures to the output.

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The first argument that makes the `sked` executable a supervisor.
pub const SUPERVISOR_ARG: &str = "__sked-attempt-supervisor";

/// How often the tree is looked at while it is being ended.
const POLL: Duration = Duration::from_millis(20);

/// The supervisor's arguments after [`SUPERVISOR_ARG`]:
/// `<grace ms> <drain ms> -- <program> [args…]`.
pub fn arguments(grace: Duration, drain: Duration, program: &str, args: &[String]) -> Vec<String> {
    let mut all = vec![
        SUPERVISOR_ARG.to_string(),
        grace.as_millis().to_string(),
        drain.as_millis().to_string(),
        "--".to_string(),
        program.to_string(),
    ];
    all.extend(args.iter().cloned());
    all
}

/// When this process was started as a supervisor, runs it and returns the exit code to exit
/// with; `None` otherwise. Call it first thing in `main`, before any thread or runtime starts.
pub fn run_if_requested() -> Option<i32> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != SUPERVISOR_ARG {
        return None;
    }
    let rest: Vec<OsString> = args.collect();
    Some(match supervise(&rest) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("[sked-worker: {message}]");
            127
        }
    })
}

enum Event {
    /// The job's main process ended.
    Exited(WaitStatus),
    /// SIGTERM or SIGINT: the worker asks for the attempt to stop.
    Stop,
    /// The pipe from the worker reached its end: the worker is gone.
    WorkerGone,
}

fn supervise(args: &[OsString]) -> Result<i32, String> {
    let text = |i: usize| args.get(i).and_then(|a| a.to_str());
    let millis = |i: usize| {
        text(i)
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| "supervisor: bad arguments".to_string())
    };
    let (grace, drain) = (millis(0)?, millis(1)?);
    if text(2) != Some("--") || args.len() < 4 {
        return Err("supervisor: no program to run".to_string());
    }
    // Orphans of the job become our children, not init's: nothing escapes the tree.
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer argument.
    if unsafe { nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "supervisor: cannot become a subreaper: {}",
            Errno::last()
        ));
    }
    // One thread waits on everything: stop signals and children's ends through a signalfd,
    // the worker's pipe through poll.
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        signals.add(signal);
    }
    signals
        .thread_block()
        .map_err(|e| format!("supervisor: cannot block signals: {e}"))?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("supervisor: cannot read signals: {e}"))?;
    let mut command = Command::new(&args[3]);
    command
        .args(&args[4..])
        .stdin(Stdio::null())
        .process_group(0);
    // The job must not inherit the blocked signals.
    // SAFETY: sigprocmask is async-signal-safe, as a pre_exec closure must be.
    unsafe {
        command.pre_exec(move || signals.thread_unblock().map_err(std::io::Error::from));
    }
    let job = command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", args[3].to_string_lossy()))?;
    let main_pid = Pid::from_raw(job.id() as i32);
    drop(job);

    let mut events = Events {
        main_pid,
        main_status: None,
        signal_fd,
    };
    let status = match events.next(None) {
        Some(Event::Exited(status)) => {
            // Leftovers may finish on their own within the drain; then they are ended.
            let deadline = Instant::now() + drain;
            while !descendants().is_empty() && Instant::now() < deadline {
                events.next(Some(POLL));
            }
            end_tree(grace, &mut events);
            status
        }
        Some(Event::Stop) => {
            end_tree(grace, &mut events);
            events.main_status()
        }
        Some(Event::WorkerGone) | None => {
            end_tree(Duration::ZERO, &mut events);
            events.main_status()
        }
    };
    Ok(exit_as(status))
}

/// What the supervisor waits for, read on its one thread.
struct Events {
    main_pid: Pid,
    /// Once reaped.
    main_status: Option<WaitStatus>,
    signal_fd: SignalFd,
}

impl Events {
    /// The next event, waiting at most `wait` (forever when `None`); children that ended
    /// meanwhile are reaped.
    fn next(&mut self, wait: Option<Duration>) -> Option<Event> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            let left = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let ms = d.saturating_duration_since(Instant::now()).as_millis();
                    PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::ZERO)
                }
            };
            let stdin = std::io::stdin();
            let mut fds = [
                PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.signal_fd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, left) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return Some(Event::WorkerGone),
            }
            let worker_side = fds[0].revents().unwrap_or(PollFlags::empty());
            let signalled = fds[1].revents().is_some_and(|r| !r.is_empty());
            if signalled {
                while let Ok(Some(info)) = self.signal_fd.read_signal() {
                    if info.ssi_signo != Signal::SIGCHLD as u32 {
                        return Some(Event::Stop);
                    }
                }
                if let Some(status) = self.reap() {
                    return Some(Event::Exited(status));
                }
            }
            if !worker_side.is_empty() {
                let mut buf = [0u8; 64];
                match std::io::stdin().read(&mut buf) {
                    Ok(0) => return Some(Event::WorkerGone),
                    Err(e) if e.kind() != std::io::ErrorKind::Interrupted => {
                        return Some(Event::WorkerGone)
                    }
                    _ => {}
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
        }
    }

    /// Reaps every child that has ended (the job, orphans handed to us); the main process's
    /// status the first time it is among them.
    fn reap(&mut self) -> Option<WaitStatus> {
        let mut main = None;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return main,
                Ok(status) if status.pid() == Some(self.main_pid) => {
                    self.main_status = Some(status);
                    main = Some(status);
                }
                Ok(_) => {}
            }
        }
    }

    /// The main process's end, once the tree is gone (a kill sent it one).
    fn main_status(&mut self) -> WaitStatus {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.main_status.is_none() && Instant::now() < deadline {
            self.reap();
            if self.main_status.is_none() {
                std::thread::sleep(POLL);
            }
        }
        self.main_status
            .unwrap_or(WaitStatus::Signaled(self.main_pid, Signal::SIGKILL, false))
    }
}

/// SIGTERM to every descendant, then SIGKILL to whatever is left after `grace` (at once when
/// it is zero), until none is left.
fn end_tree(grace: Duration, events: &mut Events) {
    if !grace.is_zero() {
        signal_all(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while !descendants().is_empty() && Instant::now() < deadline {
            std::thread::sleep(POLL);
            events.reap();
        }
    }
    // A process may fork between a look and a kill: repeat until a look finds nobody.
    for _ in 0..500 {
        if signal_all(Signal::SIGKILL) == 0 {
            return;
        }
        std::thread::sleep(POLL);
        events.reap();
    }
}

/// Sends `signal` to every living descendant; how many there were.
fn signal_all(signal: Signal) -> usize {
    let found = descendants();
    for pid in &found {
        let _ = kill(*pid, signal);
    }
    found.len()
}

/// Whether this process has any child, living or waiting to be reaped. With none, it has no
/// descendant at all (a subreaper inherits every orphan), and /proc need not be read: the
/// common case of a job that leaves nothing behind costs one system call.
fn has_children() -> bool {
    let mut info: nix::libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes into `info`; WNOWAIT leaves any child to the reaping thread.
    let found = unsafe {
        nix::libc::waitid(
            nix::libc::P_ALL,
            0,
            &mut info,
            nix::libc::WEXITED | nix::libc::WNOHANG | nix::libc::WNOWAIT,
        )
    };
    !(found == -1 && Errno::last() == Errno::ECHILD)
}

/// This process's living descendants (zombies waiting to be reaped are not counted), from
/// /proc: a subreaper's descendants stay its descendants.
fn descendants() -> Vec<Pid> {
    if !has_children() {
        return Vec::new();
    }
    let me = std::process::id() as i32;
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid …: comm may hold spaces and parentheses.
            let mut fields = stat
                .rsplit_once(')')
                .map(|(_, r)| r)
                .unwrap_or("")
                .split_whitespace();
            let state = fields.next().unwrap_or("");
            let ppid = fields
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .unwrap_or(0);
            parent_of.push((pid, ppid, state == "Z" || state == "X"));
        }
    }
    let mut tree = vec![me];
    let mut found = Vec::new();
    while let Some(parent) = tree.pop() {
        for &(pid, ppid, dead) in &parent_of {
            if ppid == parent && pid != me {
                tree.push(pid);
                if !dead {
                    found.push(Pid::from_raw(pid));
                }
            }
        }
    }
    found
}

/// The exit code that reports `status`; for a signal, the signal is raised on this process,
/// so its parent sees it killed by the same signal.
fn exit_as(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, signal, _) => {
            // SAFETY: restoring the default action and raising a signal on ourselves.
            unsafe {
                let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl);
            }
            let mut set = SigSet::empty();
            set.add(signal);
            let _ = set.thread_unblock();
            let _ = nix::sys::signal::raise(signal);
            128 + signal as i32
        }
        _ => 1,
    }
}

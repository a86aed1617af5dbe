//! The attempt supervisor: a small process between the worker and a shell attempt's processes
//! that ties their lives to the worker's and ends the whole tree, however it was spread.
//!
//! The worker does not start it itself: one long-lived [`server`] process per worker forks a
//! supervisor for each attempt ([`client`] is the worker's side of it), so an attempt costs a
//! fork of a small single-threaded process, not an exec of the whole `sked` executable. The
//! supervisor's standard input is a pipe that only the worker writes to; its standard output
//! and error are the attempt's output pipes. It makes itself a child subreaper, so every
//! process the job starts stays its descendant even when it double-forks or calls `setsid`,
//! then starts the job in a process group of its own and waits. The tree is ended
//! (SIGTERM to every descendant, SIGKILL to what is left after the grace period):
//! - when the worker asks (SIGTERM to the supervisor: a cancel or a timeout);
//! - when the job's main process exits and others are still running past the output drain;
//! - at once with SIGKILL when the worker is gone (the pipe reads end-of-file), so a dead
//!   worker's attempt is dead before its run is handed to another worker.
//!
//! Before the job is executed, its process (not the supervisor, which stays root so it can end
//! the tree) is set up as the options say: it joins the attempt's cgroups, takes its rlimits,
//! then switches to the run_as user with that user's group as its only one. Options are
//! `key=value` arguments between the two durations and `--`, all optional, in any order:
//! - `cgroup=PATH`: a `cgroup.procs` file the job joins (one per hierarchy; repeatable);
//! - `rlimit-as=BYTES`, `rlimit-nproc=N`, `rlimit-nofile=N`: RLIMIT_AS, RLIMIT_NPROC,
//!   RLIMIT_NOFILE, soft and hard;
//! - `uid=N` and `gid=N`, together: the ids the job runs as (supplementary groups: just `gid`).
//!
//! An unknown key, a bad number or a missing `--` is refused before anything starts. Without
//! options nothing runs between fork and exec, and the job is started with `posix_spawn`
//! rather than a fork of the supervisor ([`spawn`]).
//!
//! It then exits as the job's main process did: the same exit code, or killed by the same
//! signal, which the server reports to the worker. One thread and blocking calls (a signalfd
//! and poll): it has no runtime to leak into the job. It must not speak the worker protocol
//! nor write anything but its own failures to the output.

pub mod client;
pub mod server;
mod spawn;

use super::bind::Rlimit;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often the tree is looked at while it is being ended.
const POLL: Duration = Duration::from_millis(20);

/// How the job's process is set up before it is executed (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setup {
    /// The `cgroup.procs` files the job joins.
    pub cgroups: Vec<PathBuf>,
    pub rlimits: Vec<Rlimit>,
    /// The uid and gid the job runs as.
    pub account: Option<(u32, u32)>,
}

impl Setup {
    fn options(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .cgroups
            .iter()
            .map(|p| format!("cgroup={}", p.display()))
            .collect();
        for rlimit in &self.rlimits {
            all.push(match rlimit {
                Rlimit::AddressSpace(bytes) => format!("rlimit-as={bytes}"),
                Rlimit::Processes(n) => format!("rlimit-nproc={n}"),
                Rlimit::OpenFiles(n) => format!("rlimit-nofile={n}"),
            });
        }
        if let Some((uid, gid)) = self.account {
            all.push(format!("uid={uid}"));
            all.push(format!("gid={gid}"));
        }
        all
    }

    fn parse(options: &[OsString]) -> Result<Setup, String> {
        let mut setup = Setup::default();
        let (mut uid, mut gid) = (None, None);
        for option in options {
            let text = option.to_str().unwrap_or("");
            let Some((key, value)) = text.split_once('=') else {
                return Err(format!("supervisor: bad option {option:?}"));
            };
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("supervisor: bad number in {text:?}"))
            };
            let small = || number().and_then(|n| u32::try_from(n).map_err(|e| e.to_string()));
            match key {
                "cgroup" if value.starts_with('/') => setup.cgroups.push(PathBuf::from(value)),
                "rlimit-as" => setup.rlimits.push(Rlimit::AddressSpace(number()?)),
                "rlimit-nproc" => setup.rlimits.push(Rlimit::Processes(small()?)),
                "rlimit-nofile" => setup.rlimits.push(Rlimit::OpenFiles(small()?)),
                "uid" => uid = Some(small()?),
                "gid" => gid = Some(small()?),
                _ => return Err(format!("supervisor: bad option {text:?}")),
            }
        }
        setup.account = match (uid, gid) {
            (Some(uid), Some(gid)) => Some((uid, gid)),
            (None, None) => None,
            _ => return Err("supervisor: uid and gid go together".to_string()),
        };
        Ok(setup)
    }

    fn is_empty(&self) -> bool {
        *self == Setup::default()
    }
}

/// A supervisor's arguments: `<grace ms> <drain ms> [key=value…] -- <program> [args…]`.
pub fn arguments(
    grace: Duration,
    drain: Duration,
    setup: &Setup,
    program: &str,
    args: &[String],
) -> Vec<String> {
    let mut all = vec![grace.as_millis().to_string(), drain.as_millis().to_string()];
    all.extend(setup.options());
    all.push("--".to_string());
    all.push(program.to_string());
    all.extend(args.iter().cloned());
    all
}

/// When this process was started as the worker's supervisor server, runs it and returns the
/// exit code to exit with; `None` otherwise. Call it first thing in `main`, before any thread
/// or runtime starts: the server forks, and a fork of a multi-threaded process may not run
/// the supervisor's code.
pub fn run_if_requested() -> Option<i32> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != server::SERVER_ARG {
        return None;
    }
    Some(server::serve())
}

/// What one supervisor is to start: its arguments (see [`arguments`]), and the job's whole
/// environment and working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub cwd: Option<PathBuf>,
}

enum Event {
    /// The job's main process ended.
    Exited(WaitStatus),
    /// SIGTERM or SIGINT: the worker asks for the attempt to stop.
    Stop,
    /// The pipe from the worker reached its end: the worker is gone.
    WorkerGone,
}

/// Supervises one attempt in this process (a fresh fork of the server, single-threaded, its
/// standard input, output and error already the attempt's): starts the job, waits, ends the
/// tree, and returns the code to exit with.
fn supervise(launch: &Launch) -> Result<i32, String> {
    let args = &launch.args;
    let text = |i: usize| args.get(i).and_then(|a| a.to_str());
    let millis = |i: usize| {
        text(i)
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| "supervisor: bad arguments".to_string())
    };
    let (grace, drain) = (millis(0)?, millis(1)?);
    let Some(dashes) = args.iter().position(|a| a == "--") else {
        return Err("supervisor: no program to run".to_string());
    };
    if dashes < 2 || dashes + 1 >= args.len() {
        return Err("supervisor: no program to run".to_string());
    }
    let setup = Setup::parse(&args[2..dashes])?;
    let (program, program_args) = (&args[dashes + 1], &args[dashes + 2..]);
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
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("supervisor: cannot read signals: {e}"))?;
    let prepared = if setup.is_empty() {
        None
    } else {
        Some(Prepared::of(&setup)?)
    };
    let main_pid = spawn::start_job(program, program_args, launch, signals, prepared)?;

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

/// A [`Setup`] made ready before the fork: between fork and exec nothing may allocate.
struct Prepared {
    procs: Vec<CString>,
    rlimits: Vec<(nix::libc::__rlimit_resource_t, nix::libc::rlim_t)>,
    account: Option<(nix::libc::uid_t, nix::libc::gid_t)>,
}

impl Prepared {
    fn of(setup: &Setup) -> Result<Prepared, String> {
        use nix::libc::{RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_NPROC};
        let procs = setup
            .cgroups
            .iter()
            .map(|p| {
                CString::new(p.as_os_str().as_bytes())
                    .map_err(|_| format!("supervisor: bad cgroup path {p:?}"))
            })
            .collect::<Result<_, _>>()?;
        let rlimits = setup
            .rlimits
            .iter()
            .map(|r| match *r {
                Rlimit::AddressSpace(bytes) => (RLIMIT_AS, bytes as nix::libc::rlim_t),
                Rlimit::Processes(n) => (RLIMIT_NPROC, nix::libc::rlim_t::from(n)),
                Rlimit::OpenFiles(n) => (RLIMIT_NOFILE, nix::libc::rlim_t::from(n)),
            })
            .collect();
        Ok(Prepared {
            procs,
            rlimits,
            account: setup.account,
        })
    }

    /// In the job's process, between fork and exec: the cgroups first (their files are
    /// root's), then the rlimits (raising a hard one needs root), then the user.
    fn apply(&self) -> std::io::Result<()> {
        use nix::libc;
        for path in &self.procs {
            // SAFETY: open, write and close on a NUL-terminated path and a static buffer.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return fail(
                    b"cannot join the attempt's cgroup",
                    std::io::Error::last_os_error(),
                );
            }
            // SAFETY: as above; `0` is the writing process itself.
            let wrote = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            let error = std::io::Error::last_os_error();
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd) };
            if wrote != 1 {
                return fail(b"cannot join the attempt's cgroup", error);
            }
        }
        for &(resource, value) in &self.rlimits {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit reads the struct it is given.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return fail(b"cannot set an rlimit", std::io::Error::last_os_error());
            }
        }
        if let Some((uid, gid)) = self.account {
            // SAFETY: plain system calls on integers and a one-element array.
            let switched = unsafe {
                libc::setgroups(1, &gid) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0
            };
            if !switched {
                return fail(
                    b"cannot switch to the run_as user",
                    std::io::Error::last_os_error(),
                );
            }
        }
        Ok(())
    }
}

/// Says what failed on the job's standard error (the attempt's output), then fails the exec.
fn fail(what: &[u8], error: std::io::Error) -> std::io::Result<()> {
    // SAFETY: write on the inherited stderr from static buffers.
    unsafe {
        let _ = nix::libc::write(2, b"[sked-worker: ".as_ptr().cast(), 14);
        let _ = nix::libc::write(2, what.as_ptr().cast(), what.len());
        let _ = nix::libc::write(2, b"]\n".as_ptr().cast(), 2);
    }
    Err(error)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(all: &[String]) -> (Setup, Vec<String>) {
        let dashes = all.iter().position(|a| a == "--").expect("--");
        let options: Vec<OsString> = all[2..dashes].iter().map(OsString::from).collect();
        (
            Setup::parse(&options).expect("parses"),
            all[dashes + 1..].to_vec(),
        )
    }

    #[test]
    fn options_round_trip_and_none_adds_nothing() {
        let setup = Setup {
            cgroups: vec![
                PathBuf::from("/sys/fs/cgroup/memory/sked/attempt-7/cgroup.procs"),
                PathBuf::from("/sys/fs/cgroup/pids/sked/attempt-7/cgroup.procs"),
            ],
            rlimits: vec![
                Rlimit::AddressSpace(64 << 20),
                Rlimit::Processes(32),
                Rlimit::OpenFiles(256),
            ],
            account: Some((65534, 65534)),
        };
        let program_args = vec!["-c".to_string(), "echo -- uid=0".to_string()];
        let all = arguments(
            Duration::from_millis(500),
            Duration::from_secs(2),
            &setup,
            "/bin/sh",
            &program_args,
        );
        assert_eq!(&all[..2], ["500", "2000"]);
        let (parsed, program) = parse(&all);
        assert_eq!(parsed, setup);
        assert_eq!(program, ["/bin/sh", "-c", "echo -- uid=0"]);

        let plain = arguments(
            Duration::ZERO,
            Duration::ZERO,
            &Setup::default(),
            "true",
            &[],
        );
        assert_eq!(plain, ["0", "0", "--", "true"]);
        assert!(parse(&plain).0.is_empty());
    }

    #[test]
    fn bad_options_are_refused() {
        for bad in [
            "uid=65534",
            "gid=1",
            "uid=-1",
            "rlimit-nofile=many",
            "rlimit-nproc=99999999999",
            "cgroup=relative/path",
            "swap=1",
            "noequals",
        ] {
            let options: Vec<OsString> = bad.split(' ').map(OsString::from).collect();
            assert!(Setup::parse(&options).is_err(), "{bad}");
        }
        let ok: Vec<OsString> = ["uid=1", "gid=2"].iter().map(OsString::from).collect();
        assert_eq!(Setup::parse(&ok).map(|s| s.account), Ok(Some((1, 2))));
    }
}

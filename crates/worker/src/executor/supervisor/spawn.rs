//! Starting a job's main process from its supervisor, the same way whatever the path taken: in
//! a process group of its own, with no signal blocked and SIGPIPE at its default action,
//! standard input from `/dev/null`, exactly the launch's environment and working directory,
//! and no descriptor of the supervisor's but its output.
//!
//! A job that needs nothing done between fork and exec (no cgroup, rlimit or user: the common
//! case) is started with `posix_spawn`, which shares the supervisor's memory until the exec (a
//! vfork) rather than copying its page tables for a moment and unmapping the copy again: that
//! copy of the `sked` image was a third of a supervised start's CPU. A job with a setup is
//! forked, the setup run in the child. A program without a slash is looked up in the job's
//! own `PATH`, as `execvp` would; one that cannot be resolved that way, or that `posix_spawn`
//! refuses, goes the fork path, so its error reads as it always did.
//!
//! Owns only the start; what the supervisor waits for and ends is [`super`]'s.

use super::{Launch, Prepared};
use nix::libc;
use nix::sys::signal::SigSet;
use nix::unistd::Pid;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Starts `program` with `args` as `launch` says; `blocked` is the supervisor's own signal
/// mask, which the job must not inherit. `prepared` is the setup to run before the exec.
pub(super) fn start_job(
    program: &OsStr,
    args: &[OsString],
    launch: &Launch,
    blocked: SigSet,
    prepared: Option<Prepared>,
) -> Result<Pid, String> {
    if prepared.is_none() {
        if let Some(path) = resolve(program, launch) {
            if let Ok(pid) = spawn(&path, program, args, launch) {
                return Ok(pid);
            }
        }
    }
    fork(program, args, launch, blocked, prepared)
}

/// The file `program` names for the job: itself when it has a slash (relative ones are
/// relative to the job's working directory, where the spawned child is when it executes);
/// otherwise the first executable regular file of that name in the job's `PATH`. `None` when
/// that lookup cannot be done the way `execvp` does it here (no `PATH`, a relative entry).
fn resolve(program: &OsStr, launch: &Launch) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    if program.is_empty() {
        return None;
    }
    let path = launch
        .env
        .iter()
        .find_map(|(key, value)| (key == "PATH").then_some(value))?;
    for dir in std::env::split_paths(path) {
        if !dir.is_absolute() {
            return None;
        }
        let candidate = dir.join(program);
        if is_executable(&candidate) {
            return Some(candidate);
        }
    }
    None
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `posix_spawn` of `path` with `program` as the job's `argv[0]`.
fn spawn(path: &Path, program: &OsStr, args: &[OsString], launch: &Launch) -> Result<Pid, i32> {
    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| libc::EINVAL);
    let path = c(path.as_os_str().as_bytes())?;
    let argv: Vec<CString> = std::iter::once(program)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| c(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = launch
        .env
        .iter()
        .map(|(key, value)| {
            let mut entry = key.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            c(&entry)
        })
        .collect::<Result<_, _>>()?;
    let cwd = launch
        .cwd
        .as_ref()
        .map(|d| c(d.as_os_str().as_bytes()))
        .transpose()?;
    let pointers = |all: &[CString]| -> Vec<*mut libc::c_char> {
        all.iter()
            .map(|s| s.as_ptr().cast_mut())
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect()
    };
    let (argv, envp) = (pointers(&argv), pointers(&envp));
    let mut actions = FileActions::new()?;
    let mut attributes = Attributes::new()?;
    // SAFETY: every pointer handed over is to a live, NUL-terminated string or null-ended
    // array owned above, and the two objects were initialised by their constructors.
    unsafe {
        let null = c"/dev/null";
        check(libc::posix_spawn_file_actions_addopen(
            actions.as_mut_ptr(),
            0,
            null.as_ptr(),
            libc::O_RDONLY,
            0,
        ))?;
        if let Some(cwd) = &cwd {
            check(libc::posix_spawn_file_actions_addchdir_np(
                actions.as_mut_ptr(),
                cwd.as_ptr(),
            ))?;
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check(libc::posix_spawnattr_setsigmask(
            attributes.as_mut_ptr(),
            &empty,
        ))?;
        check(libc::posix_spawnattr_setsigdefault(
            attributes.as_mut_ptr(),
            &defaulted(),
        ))?;
        check(libc::posix_spawnattr_setpgroup(attributes.as_mut_ptr(), 0))?;
        let flags = libc::POSIX_SPAWN_SETSIGMASK
            | libc::POSIX_SPAWN_SETSIGDEF
            | libc::POSIX_SPAWN_SETPGROUP;
        check(libc::posix_spawnattr_setflags(
            attributes.as_mut_ptr(),
            flags as libc::c_short,
        ))?;
        let mut pid: libc::pid_t = 0;
        check(libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            actions.as_mut_ptr(),
            attributes.as_mut_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
        ))?;
        Ok(Pid::from_raw(pid))
    }
}

/// The signals the job starts with at their default action: SIGPIPE, which the runtime
/// ignores, and the C library's own (from the first past SIGSYS up to SIGRTMIN), which its
/// `posix_spawn` would otherwise leave ignored in the job, as a fork does not. `sigaddset`
/// refuses the C library's own, so their bits are set directly.
fn defaulted() -> libc::sigset_t {
    const WORDS: usize =
        std::mem::size_of::<libc::sigset_t>() / std::mem::size_of::<libc::c_ulong>();
    const _: () = assert!(
        WORDS * std::mem::size_of::<libc::c_ulong>() == std::mem::size_of::<libc::sigset_t>()
    );
    let mut words = [0 as libc::c_ulong; WORDS];
    let per_word = libc::c_ulong::BITS as usize;
    for signal in std::iter::once(libc::SIGPIPE).chain(libc::SIGSYS + 1..libc::SIGRTMIN()) {
        let bit = (signal - 1) as usize;
        words[bit / per_word] |= 1 << (bit % per_word);
    }
    // SAFETY: a sigset_t is that many words of bits, signal n at bit n - 1 (asserted above).
    unsafe { std::mem::transmute::<[libc::c_ulong; WORDS], libc::sigset_t>(words) }
}

fn check(code: libc::c_int) -> Result<(), i32> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

/// An owned libc spawn object: initialised when made, destroyed when dropped.
macro_rules! spawn_object {
    ($(#[$doc:meta])* $name:ident($kind:ty), $init:path, $destroy:path) => {
        $(#[$doc])*
        struct $name(Box<$kind>);

        impl $name {
            fn new() -> Result<$name, i32> {
                // SAFETY: zeroed storage, then initialised by its init function before any use.
                let mut object: Box<$kind> = Box::new(unsafe { std::mem::zeroed() });
                check(unsafe { $init(&mut *object) })?;
                Ok($name(object))
            }

            fn as_mut_ptr(&mut self) -> *mut $kind {
                &mut *self.0
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: initialised in `new`, destroyed once.
                unsafe { $destroy(&mut *self.0) };
            }
        }
    };
}

spawn_object!(
    /// The job's file actions: standard input, working directory.
    FileActions(libc::posix_spawn_file_actions_t),
    libc::posix_spawn_file_actions_init,
    libc::posix_spawn_file_actions_destroy
);
spawn_object!(
    /// The job's signal mask, default actions and process group.
    Attributes(libc::posix_spawnattr_t),
    libc::posix_spawnattr_init,
    libc::posix_spawnattr_destroy
);

/// A fork, the setup and the mask's unblocking run in the child before the exec.
fn fork(
    program: &OsStr,
    args: &[OsString],
    launch: &Launch,
    blocked: SigSet,
    prepared: Option<Prepared>,
) -> Result<Pid, String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0);
    if let Some(cwd) = &launch.cwd {
        command.current_dir(cwd);
    }
    // SAFETY: sigprocmask is async-signal-safe, as a pre_exec closure must be.
    unsafe {
        command.pre_exec(move || blocked.thread_unblock().map_err(std::io::Error::from));
    }
    if let Some(prepared) = prepared {
        // SAFETY: `Prepared::apply` makes only async-signal-safe calls and allocates nothing.
        unsafe {
            command.pre_exec(move || prepared.apply());
        }
    }
    let job = command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", program.to_string_lossy()))?;
    Ok(Pid::from_raw(job.id() as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch_with_path(path: &str) -> Launch {
        Launch {
            env: vec![(OsString::from("PATH"), OsString::from(path))],
            ..Launch::default()
        }
    }

    #[test]
    fn programs_resolve_as_execvp_would_or_not_at_all() {
        let launch = launch_with_path("/nonexistent:/usr/bin:/bin");
        let sh = resolve(OsStr::new("sh"), &launch).expect("sh is on the PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        assert_eq!(
            resolve(OsStr::new("./run.sh"), &launch),
            Some(PathBuf::from("./run.sh"))
        );
        assert_eq!(resolve(OsStr::new("no-such-program-here"), &launch), None);
        assert_eq!(resolve(OsStr::new(""), &launch), None);
        // A relative entry is searched from the job's directory: left to the fork path.
        assert_eq!(
            resolve(OsStr::new("sh"), &launch_with_path("bin:/bin")),
            None
        );
        assert_eq!(resolve(OsStr::new("sh"), &Launch::default()), None);
        // A directory of that name is not a program.
        assert_eq!(resolve(OsStr::new("tmp"), &launch_with_path("/")), None);
    }
}

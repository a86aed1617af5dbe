//! The supervisor server: one long-lived, single-threaded process per worker that forks each
//! shell attempt's [supervisor](super), so an attempt costs a fork of a small process rather
//! than an exec of the whole `sked` executable (about 3 ms of CPU each, most of it the loader
//! relocating 80 MB).
//!
//! The worker starts it (its own executable again, with [`SERVER_ARG`]) with one end of a Unix
//! stream socket as its standard input, in a process group of its own. On that socket:
//! - the worker sends a request per attempt: a little-endian `u32` length, then that many
//!   bytes of NUL-terminated fields — a sequence number, the working directory (empty: the
//!   server's), the number of environment entries, the entries as `KEY=value`, then the
//!   supervisor's [arguments](super::arguments) — with three descriptors attached
//!   (`SCM_RIGHTS`): the attempt's control pipe (read end), its stdout and its stderr (write
//!   ends);
//! - the server answers with lines: `s SEQ PID` (started; the supervisor leads process group
//!   PID), `f SEQ MESSAGE` (not started), and later `x PID STATUS` (the supervisor ended, with
//!   the raw wait status), in that order for any one supervisor.
//!
//! It ends when the socket reaches its end (the worker is gone); the supervisors it forked
//! stay, each ending its tree when its own control pipe closes, as it does with the worker.
//! It holds no attempt state beyond its children, and must not speak the worker protocol.

use super::{supervise, Launch};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::unistd::{fork, setpgid, ForkResult, Pid};
use std::ffi::OsString;
use std::io::{IoSliceMut, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// The first argument that makes the `sked` executable the supervisor server.
pub const SERVER_ARG: &str = "__sked-supervisor-server";

/// The longest request the server reads: a job's environment and command are bounded far
/// below this by the job spec's own limits.
pub const MAX_REQUEST: usize = 8 << 20;

/// The descriptors a request carries, in order.
const DESCRIPTORS: usize = 3;

/// Serves requests on standard input until it ends; the exit code.
pub(super) fn serve() -> i32 {
    match serve_socket() {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("[sked-worker: supervisor server: {message}]");
            1
        }
    }
}

fn serve_socket() -> Result<(), String> {
    // SAFETY: fd 0 is open for the whole life of this process (the worker's socket).
    let socket = unsafe { BorrowedFd::borrow_raw(0) };
    let mut children = SigSet::empty();
    children.add(Signal::SIGCHLD);
    children
        .thread_block()
        .map_err(|e| format!("cannot block SIGCHLD: {e}"))?;
    let signal_fd = SignalFd::with_flags(&children, SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("cannot read signals: {e}"))?;
    let answer = |line: String| -> Result<(), String> {
        write_all(socket, line.as_bytes()).map_err(|e| format!("cannot answer: {e}"))
    };
    loop {
        let mut fds = [
            PollFd::new(socket, PollFlags::POLLIN),
            PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("cannot wait: {e}")),
        }
        let request_waiting = fds[0].revents().is_some_and(|r| !r.is_empty());
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            while let Ok(Some(_)) = signal_fd.read_signal() {}
            for (pid, status) in reap() {
                answer(format!("x {pid} {status}\n"))?;
            }
        }
        if request_waiting {
            match read_request(socket)? {
                None => return Ok(()),
                Some(Err((seq, message))) => answer(format!("f {seq} {}\n", one_line(&message)))?,
                Some(Ok((seq, launch, descriptors))) => {
                    let line = match start(&launch, descriptors) {
                        Ok(pid) => format!("s {seq} {pid}\n"),
                        Err(message) => format!("f {seq} {}\n", one_line(&message)),
                    };
                    answer(line)?;
                }
            }
        }
    }
}

/// Every child that has ended, with its raw wait status.
fn reap() -> Vec<(i32, i32)> {
    let mut ended = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into a local.
        let pid = unsafe { nix::libc::waitpid(-1, &mut status, nix::libc::WNOHANG) };
        if pid <= 0 {
            return ended;
        }
        ended.push((pid, status));
    }
}

/// Forks a supervisor for `launch` with the request's descriptors as its standard input,
/// output and error, in a process group of its own; its pid.
fn start(launch: &Launch, descriptors: [OwnedFd; DESCRIPTORS]) -> Result<i32, String> {
    // SAFETY: this process is single-threaded, so the child may run any code.
    match unsafe { fork() } {
        Err(e) => Err(format!("cannot fork a supervisor: {e}")),
        Ok(ForkResult::Child) => {
            let code = become_supervisor(launch, &descriptors);
            let _ = std::io::stderr().flush();
            // SAFETY: ends the forked child without running the server's exit handlers.
            unsafe { nix::libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => {
            // Both sides set the group, so it exists before the worker may signal it.
            let _ = setpgid(child, child);
            drop(descriptors);
            Ok(child.as_raw())
        }
    }
}

/// In the forked child: the descriptors in place, nothing else of the server's left open,
/// then the supervisor.
fn become_supervisor(launch: &Launch, descriptors: &[OwnedFd; DESCRIPTORS]) -> i32 {
    let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
    for (target, fd) in descriptors.iter().enumerate() {
        // SAFETY: dup2 onto 0, 1 and 2 of descriptors this process owns.
        if unsafe { nix::libc::dup2(fd.as_raw_fd(), target as RawFd) } < 0 {
            return 127;
        }
    }
    close_all_above(2);
    match supervise(launch) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("[sked-worker: {message}]");
            127
        }
    }
}

/// Closes every descriptor above `highest`: the server's socket, its signalfd, the request's
/// originals.
fn close_all_above(highest: RawFd) {
    let open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .filter(|&fd| fd > highest)
            .collect(),
        Err(_) => (highest + 1..1024).collect(),
    };
    for fd in open {
        // SAFETY: closing descriptors of this process; a stale one (the directory's own) fails.
        unsafe { nix::libc::close(fd) };
    }
}

type Request = Result<(u64, Launch, [OwnedFd; DESCRIPTORS]), (u64, String)>;

/// The next request; `None` at the socket's end. A malformed request is answered, not fatal,
/// unless the stream can no longer be followed.
fn read_request(socket: BorrowedFd<'_>) -> Result<Option<Request>, String> {
    let mut header = [0u8; 4];
    let (got, descriptors) = receive(socket, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < header.len() && !read_exact(socket, &mut header[got..])? {
        return Ok(None);
    }
    let length = u32::from_le_bytes(header) as usize;
    if length > MAX_REQUEST {
        return Err(format!("a request of {length} bytes, over {MAX_REQUEST}"));
    }
    let mut payload = vec![0u8; length];
    if !read_exact(socket, &mut payload)? {
        return Ok(None);
    }
    let fields: Vec<&[u8]> = payload
        .strip_suffix(&[0])
        .unwrap_or(&payload)
        .split(|&b| b == 0)
        .collect();
    let seq = fields
        .first()
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    let Ok(descriptors) = <[OwnedFd; DESCRIPTORS]>::try_from(descriptors) else {
        return Ok(Some(Err((seq, "a request without its pipes".to_string()))));
    };
    Ok(Some(match parse(&fields) {
        Some(launch) => Ok((seq, launch, descriptors)),
        None => Err((seq, "a malformed request".to_string())),
    }))
}

/// The launch in a request's fields (after the sequence number).
fn parse(fields: &[&[u8]]) -> Option<Launch> {
    let text = |f: &[u8]| OsString::from_vec(f.to_vec());
    let cwd = fields.get(1)?;
    let count: usize = std::str::from_utf8(fields.get(2)?).ok()?.parse().ok()?;
    let env_end = 3usize.checked_add(count)?;
    let env = fields
        .get(3..env_end)?
        .iter()
        .map(|entry| {
            let at = entry.iter().position(|&b| b == b'=')?;
            Some((text(&entry[..at]), text(&entry[at + 1..])))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Launch {
        args: fields[env_end..].iter().map(|f| text(f)).collect(),
        env,
        cwd: (!cwd.is_empty()).then(|| PathBuf::from(text(cwd))),
    })
}

/// Encodes a request for [`read_request`]: the length header and the fields.
pub(super) fn encode(seq: u64, launch: &Launch) -> Vec<u8> {
    let mut payload = Vec::new();
    let mut field = |bytes: &[u8]| {
        payload.extend_from_slice(bytes);
        payload.push(0);
    };
    field(seq.to_string().as_bytes());
    field(
        launch
            .cwd
            .as_ref()
            .map(|c| c.as_os_str().as_bytes())
            .unwrap_or(b""),
    );
    field(launch.env.len().to_string().as_bytes());
    for (key, value) in &launch.env {
        let mut entry = key.as_bytes().to_vec();
        entry.push(b'=');
        entry.extend_from_slice(value.as_bytes());
        field(&entry);
    }
    for arg in &launch.args {
        field(arg.as_bytes());
    }
    let mut message = (payload.len() as u32).to_le_bytes().to_vec();
    message.extend(payload);
    message
}

/// Reads into `buf` with whatever descriptors come with the bytes.
fn receive(socket: BorrowedFd<'_>, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), String> {
    let mut space = nix::cmsg_space!([RawFd; DESCRIPTORS]);
    loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => {
                let mut descriptors = Vec::new();
                for cmsg in message.cmsgs().map_err(|e| e.to_string())? {
                    if let ControlMessageOwned::ScmRights(fds) = cmsg {
                        // SAFETY: the kernel just installed these descriptors for this process.
                        descriptors.extend(
                            fds.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                return Ok((message.bytes, descriptors));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("cannot read a request: {e}")),
        }
    }
}

/// Fills `buf`; false at the socket's end.
fn read_exact(socket: BorrowedFd<'_>, mut buf: &mut [u8]) -> Result<bool, String> {
    while !buf.is_empty() {
        match nix::unistd::read(socket.as_raw_fd(), buf) {
            Ok(0) => return Ok(false),
            Ok(n) => buf = &mut buf[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("cannot read a request: {e}")),
        }
    }
    Ok(true)
}

fn write_all(socket: BorrowedFd<'_>, mut bytes: &[u8]) -> nix::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(socket, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A message on one line of the answer.
fn one_line(message: &str) -> String {
    message.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let launch = Launch {
            args: ["0", "2000", "--", "/bin/sh", "-c", "echo a=b"]
                .iter()
                .map(OsString::from)
                .collect(),
            env: vec![
                (OsString::from("PATH"), OsString::from("/bin:/usr/bin")),
                (OsString::from("EMPTY"), OsString::new()),
                (OsString::from("EQ"), OsString::from("x=y=z")),
            ],
            cwd: Some(PathBuf::from("/tmp")),
        };
        let message = encode(42, &launch);
        let length = u32::from_le_bytes(message[..4].try_into().unwrap()) as usize;
        assert_eq!(length, message.len() - 4);
        let payload = &message[4..];
        let fields: Vec<&[u8]> = payload
            .strip_suffix(&[0])
            .unwrap()
            .split(|&b| b == 0)
            .collect();
        assert_eq!(fields[0], b"42");
        assert_eq!(parse(&fields), Some(launch));

        let bare = Launch {
            args: vec![OsString::from("true")],
            ..Launch::default()
        };
        let message = encode(1, &bare);
        let fields: Vec<&[u8]> = message[4..]
            .strip_suffix(&[0])
            .unwrap()
            .split(|&b| b == 0)
            .collect();
        assert_eq!(parse(&fields), Some(bare));
    }

    #[test]
    fn malformed_requests_are_refused() {
        for fields in [
            vec![&b"1"[..]],
            vec![b"1", b"", b"two"],
            vec![b"1", b"", b"2", b"A=1"],
            vec![b"1", b"", b"1", b"NOEQUALS", b"true"],
        ] {
            assert_eq!(parse(&fields), None, "{fields:?}");
        }
    }
}

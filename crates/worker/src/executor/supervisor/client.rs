//! The worker's side of the [supervisor server](super::server): starts the server (the `sked`
//! executable again) the first time it is needed and again if it ends, sends it one request per
//! shell attempt with the attempt's pipes, and hands the attempt its supervisor's pid and, later,
//! its end.
//!
//! Owns the connection and the bookkeeping of requests in flight only; what a supervisor does
//! is [`super`]'s, and when to end an attempt is the shell executor's.

use super::server::{encode, MAX_REQUEST, SERVER_ARG};
use super::Launch;
use nix::fcntl::OFlag;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

/// How long a started supervisor may take to be reported: the server forks at once, so only a
/// stalled server takes longer.
const START_LIMIT: Duration = Duration::from_secs(10);

/// The worker's supervisor server: cheap to clone, one server process behind all clones.
#[derive(Clone)]
pub struct SupervisorServer(Arc<Inner>);

struct Inner {
    executable: PathBuf,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

impl std::fmt::Debug for SupervisorServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SupervisorServer")
            .field(&self.0.executable)
            .finish()
    }
}

impl PartialEq for SupervisorServer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One attempt's supervisor as started: the worker's ends of its pipes, and its end to come.
pub struct Supervised {
    /// The supervisor's pid, which leads the attempt's process group.
    pub pid: u32,
    /// The control pipe, until taken: closing it tells the supervisor the worker is gone.
    pub control: Option<OwnedFd>,
    /// The attempt's output pipes, until taken.
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    exit: oneshot::Receiver<i32>,
    status: Option<ExitStatus>,
}

impl Supervised {
    /// Waits for the supervisor's end, which is the job's main process's.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let raw = (&mut self.exit).await.map_err(|_| lost())?;
        let status = ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(status)
    }

    /// Its end if it has come.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        match self.exit.try_recv() {
            Ok(raw) => {
                self.status = Some(ExitStatus::from_raw(raw));
                Ok(self.status)
            }
            Err(oneshot::error::TryRecvError::Empty) => Ok(None),
            Err(oneshot::error::TryRecvError::Closed) => Err(lost()),
        }
    }
}

fn lost() -> io::Error {
    io::Error::other("the supervisor server ended before the attempt's supervisor did")
}

impl SupervisorServer {
    /// A server run from `executable` (the `sked` binary), started when first needed.
    pub fn new(executable: impl Into<PathBuf>) -> SupervisorServer {
        SupervisorServer(Arc::new(Inner {
            executable: executable.into(),
            connection: tokio::sync::Mutex::new(None),
        }))
    }

    /// Starts the server now, so that the first attempt does not wait for it and a server
    /// that cannot start is known before any attempt is taken.
    pub async fn prepare(&self) -> io::Result<()> {
        self.connection().await.map(drop)
    }

    /// Starts a supervisor for `launch`.
    pub async fn start(&self, launch: &Launch) -> io::Result<Supervised> {
        let (control_read, control) = pipe2()?;
        let (stdout, stdout_write) = pipe2()?;
        let (stderr, stderr_write) = pipe2()?;
        let connection = self.connection().await?;
        let (seq, started) = connection.expect_start();
        let message = encode(seq, launch);
        // The server cannot skip a request it will not read: refuse it here, not there.
        if message.len() > MAX_REQUEST + 4 {
            connection.forget(seq);
            return Err(io::Error::other(format!(
                "the command and its environment take {} bytes, over the supervisor's {}",
                message.len(),
                MAX_REQUEST
            )));
        }
        let sent = connection
            .send(&message, &[&control_read, &stdout_write, &stderr_write])
            .await;
        drop((control_read, stdout_write, stderr_write));
        if let Err(e) = sent {
            connection.close();
            return Err(e);
        }
        let (pid, exit) = match tokio::time::timeout(START_LIMIT, started).await {
            Ok(Ok(Ok(started))) => started,
            Ok(Ok(Err(message))) => return Err(io::Error::other(message)),
            Ok(Err(_)) => return Err(lost()),
            Err(_) => {
                connection.close();
                return Err(io::Error::other(
                    "the supervisor server did not start the supervisor in time",
                ));
            }
        };
        Ok(Supervised {
            pid,
            control: Some(control),
            stdout: Some(pipe::Receiver::from_owned_fd(stdout)?),
            stderr: Some(pipe::Receiver::from_owned_fd(stderr)?),
            exit,
            status: None,
        })
    }

    /// The open connection, starting a server when there is none.
    async fn connection(&self) -> io::Result<Arc<Connection>> {
        let mut current = self.0.connection.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| c.is_open()) {
            return Ok(connection.clone());
        }
        let connection = Connection::start(&self.0.executable)?;
        *current = Some(connection.clone());
        Ok(connection)
    }
}

/// Both ends of a pipe, close-on-exec: (read, write).
fn pipe2() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)
}

type StartAnswer = Result<(u32, oneshot::Receiver<i32>), String>;

/// One server process and its socket.
struct Connection {
    stream: Arc<UnixStream>,
    /// One request is written at a time.
    writing: tokio::sync::Mutex<()>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    closed: bool,
    next: u64,
    /// Requests sent, by sequence number, waiting for `s` or `f`.
    starting: HashMap<u64, oneshot::Sender<StartAnswer>>,
    /// Supervisors started, by pid, waiting for `x`.
    running: HashMap<u32, oneshot::Sender<i32>>,
}

impl State {
    fn close(&mut self) {
        self.closed = true;
        for (_, waiter) in self.starting.drain() {
            let _ = waiter.send(Err("the supervisor server ended".to_string()));
        }
        // Dropping the senders tells each attempt its end will not be reported.
        self.running.clear();
    }

    /// Takes one line of the server's answers.
    fn answer(&mut self, line: &str) {
        let mut parts = line.splitn(3, ' ');
        let (kind, first, rest) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
        let Some(first) = first.and_then(|f| f.parse::<u64>().ok()) else {
            tracing::warn!("the supervisor server said {line:?}");
            return;
        };
        match kind {
            Some("s") => {
                let (Some(waiter), Ok(pid)) = (self.starting.remove(&first), rest.parse()) else {
                    return;
                };
                let (ended, exit) = oneshot::channel();
                self.running.insert(pid, ended);
                // A request given up meanwhile closed its control pipe: that supervisor ends
                // its tree on its own, and its end is still taken here.
                let _ = waiter.send(Ok((pid, exit)));
            }
            Some("f") => {
                if let Some(waiter) = self.starting.remove(&first) {
                    let _ = waiter.send(Err(rest.to_string()));
                }
            }
            Some("x") => {
                let ended = u32::try_from(first)
                    .ok()
                    .and_then(|pid| self.running.remove(&pid));
                if let (Some(ended), Ok(status)) = (ended, rest.parse()) {
                    let _ = ended.send(status);
                }
            }
            _ => tracing::warn!("the supervisor server said {line:?}"),
        }
    }
}

impl Connection {
    fn start(executable: &Path) -> io::Result<Arc<Connection>> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let mut command = tokio::process::Command::new(executable);
        command
            .arg(SERVER_ARG)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Not in the worker's group: a terminal's Ctrl-C is the worker's to handle.
            .process_group(0)
            .kill_on_drop(true);
        let child = command.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot start the supervisor server {}: {e}",
                    executable.display()
                ),
            )
        })?;
        ours.set_nonblocking(true)?;
        let stream = Arc::new(UnixStream::from_std(ours)?);
        let connection = Arc::new(Connection {
            stream: stream.clone(),
            writing: tokio::sync::Mutex::new(()),
            state: Arc::new(Mutex::new(State::default())),
        });
        tokio::spawn(read_answers(
            stream,
            Arc::downgrade(&connection.state),
            child,
        ));
        Ok(connection)
    }

    fn is_open(&self) -> bool {
        !self.state.lock().map(|s| s.closed).unwrap_or(true)
    }

    fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.close();
        }
        // The server reads the end and exits; the reader then ends too.
        let _ =
            nix::sys::socket::shutdown(self.stream.as_raw_fd(), nix::sys::socket::Shutdown::Write);
    }

    /// A sequence number for a new request, and where its answer will come.
    fn expect_start(&self) -> (u64, oneshot::Receiver<StartAnswer>) {
        let (waiter, answer) = oneshot::channel();
        match self.state.lock() {
            Ok(mut state) if !state.closed => {
                state.next += 1;
                let seq = state.next;
                state.starting.insert(seq, waiter);
                (seq, answer)
            }
            // Closed meanwhile: the answer is that, at once.
            _ => {
                let _ = waiter.send(Err("the supervisor server ended".to_string()));
                (0, answer)
            }
        }
    }

    /// Drops a request that will not be sent.
    fn forget(&self, seq: u64) {
        if let Ok(mut state) = self.state.lock() {
            state.starting.remove(&seq);
        }
    }

    /// Writes one whole request, the descriptors with its first bytes.
    async fn send(&self, message: &[u8], descriptors: &[&OwnedFd]) -> io::Result<()> {
        let _writing = self.writing.lock().await;
        let fds: Vec<i32> = descriptors.iter().map(|fd| fd.as_raw_fd()).collect();
        let raw = self.stream.as_raw_fd();
        let mut written = self
            .stream
            .async_io(Interest::WRITABLE, || {
                sendmsg::<()>(
                    raw,
                    &[IoSlice::new(message)],
                    &[ControlMessage::ScmRights(&fds)],
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(io::Error::from)
            })
            .await?;
        while written < message.len() {
            written += self
                .stream
                .async_io(Interest::WRITABLE, || {
                    nix::sys::socket::send(raw, &message[written..], MsgFlags::MSG_NOSIGNAL)
                        .map_err(io::Error::from)
                })
                .await?;
        }
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// Reads the server's answers until its end, then closes the bookkeeping and reaps it.
async fn read_answers(
    stream: Arc<UnixStream>,
    state: Weak<Mutex<State>>,
    mut server: tokio::process::Child,
) {
    let mut pending = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if stream.readable().await.is_err() {
            break;
        }
        match stream.try_read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                let Some(state) = state.upgrade() else { break };
                let Ok(mut state) = state.lock() else { break };
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    state.answer(String::from_utf8_lossy(&line[..end]).as_ref());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if let Some(state) = state.upgrade() {
        if let Ok(mut state) = state.lock() {
            if !state.closed {
                tracing::warn!(
                    "the supervisor server ended; attempts it started are ended, and the next \
                     attempt starts a new one"
                );
            }
            state.close();
        }
    }
    let _ = server.start_kill();
    let _ = server.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[tokio::test]
    async fn a_launch_over_the_bound_is_refused_before_it_is_sent() {
        // Any executable will do: the request is refused before the server could read it.
        let server = SupervisorServer::new("/bin/true");
        let launch = Launch {
            args: ["0", "0", "--", "true"]
                .iter()
                .map(OsString::from)
                .collect(),
            env: vec![(
                OsString::from("BIG"),
                OsString::from("x".repeat(MAX_REQUEST)),
            )],
            cwd: None,
        };
        let error = server.start(&launch).await.err().map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("over the supervisor's")),
            "{error:?}"
        );
    }
}

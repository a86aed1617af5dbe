//! A fault-injecting TCP proxy for the partition scenarios: it sits between one client (a
//! node, a worker) and one server (PostgreSQL, a node) on loopback and, on the test's word,
//! passes bytes through, cuts every connection and refuses new ones, delays the server's
//! answers, swallows one direction, or freezes every connection open with nothing passing.
//! This kernel has no netem qdisc, so links go wrong here, in user space.
//!
//! A frozen connection is the half-open case as the client sees it: its writes are accepted
//! (the proxy's socket is alive and acknowledges them) and no answer ever comes.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the link does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass both ways.
    Pass,
    /// Every open connection is closed and new ones are closed as soon as accepted.
    Cut,
    /// Bytes from the server reach the client this much later (order kept): a slow database.
    Delay(Duration),
    /// Bytes from the client to the server are swallowed; answers still pass.
    DropToServer,
    /// Bytes from the server to the client are swallowed; requests still pass.
    DropToClient,
    /// Connections stay open, new ones are accepted, and nothing passes either way.
    Freeze,
}

/// Which way bytes go through a pump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    ToServer,
    ToClient,
}

/// A running proxy; dropped, it stops accepting (open connections end with their pumps).
pub struct Proxy {
    port: u16,
    fault: watch::Sender<Fault>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (fault, watching) = watch::channel(Fault::Pass);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *watching.borrow() == Fault::Cut {
                    drop(client);
                    continue;
                }
                let watching = watching.clone();
                tokio::spawn(async move {
                    // A server that cannot be reached is a closed connection, as it would be.
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, watching).await;
                    }
                });
            }
        });
        Proxy {
            port,
            fault,
            accept,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Open connections end too.
        self.fault.send_replace(Fault::Cut);
    }
}

/// Relays one connection until either side closes it or the link is cut.
async fn relay(client: TcpStream, server: TcpStream, fault: watch::Receiver<Fault>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, Way::ToServer, fault.clone()),
        pump(server_read, client_write, Way::ToClient, fault),
    );
}

/// One direction: a reader that stamps each chunk with when it arrived, and a writer that
/// sends it on when the fault allows (after the delay, if any, measured from its arrival, so a
/// delay adds latency without cutting throughput).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    way: Way,
    fault: watch::Receiver<Fault>,
) {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut reading = fault.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if !passable(&mut reading).await {
                return;
            }
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                // A fault set while waiting for bytes applies to the next read.
                _ = reading.changed() => continue,
            };
            if swallowed(*reading.borrow(), way) {
                continue;
            }
            if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let mut writing = fault;
    let writer = async move {
        while let Some((arrived, chunk)) = pending.recv().await {
            loop {
                if !passable(&mut writing).await {
                    return;
                }
                let delay = match *writing.borrow() {
                    Fault::Delay(d) if way == Way::ToClient => d,
                    _ => Duration::ZERO,
                };
                let due = arrived + delay;
                if Instant::now() >= due {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => break,
                    _ = writing.changed() => {}
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // Whichever half ends first ends the direction: dropping both halves closes the sockets.
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
    }
}

/// Waits while the link is frozen; false once it is cut.
async fn passable(fault: &mut watch::Receiver<Fault>) -> bool {
    loop {
        let now = *fault.borrow_and_update();
        match now {
            Fault::Cut => return false,
            Fault::Freeze => {
                if fault.changed().await.is_err() {
                    return false;
                }
            }
            _ => return true,
        }
    }
}

fn swallowed(fault: Fault, way: Way) -> bool {
    matches!(
        (fault, way),
        (Fault::DropToServer, Way::ToServer) | (Fault::DropToClient, Way::ToClient)
    )
}

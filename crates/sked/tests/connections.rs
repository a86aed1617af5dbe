//! Slow and idle clients through the real binary: a client that trickles its headers and a
//! keep-alive connection that sends nothing more are closed after the header timeout, a long
//! poll that outlasts it is not cut, connections beyond the bound are closed at once, and a
//! flood of anonymous slow bodies leaves room for health checks, workers and callers with a
//! token, and ends at the body timeout.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The tests of this file run one at a time: each fills or bounds a server's connections, and
/// the flood takes a thousand descriptors and ports of this process. Side by side, they have
/// been seen to disturb each other (a worker's heartbeat answered 410 during the flood).
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Reads until the server closes the connection; how long that took, or `None` if it was
/// still open after `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

fn connect(sked: &Sked) -> TcpStream {
    TcpStream::connect(("127.0.0.1", sked.port)).expect("connect")
}

#[tokio::test]
async fn slow_and_idle_connections_are_closed_but_long_polls_are_not() {
    let _alone = ALONE.lock().await;
    let mut sked = Sked::new();
    sked.start_dev(&["--header-read-timeout", "1s"]).await;

    // Slowloris: half a request header, then nothing.
    let mut slow = connect(&sked);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .expect("write");
    let took = closed_within(&mut slow, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "a half-sent header kept its connection for 5 s"
    );

    // Idle keep-alive: one whole request, then silence.
    let mut idle = connect(&sked);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("write");
    let took = closed_within(&mut idle, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "an idle keep-alive connection stayed open for 5 s"
    );

    // A worker's long poll of 3 s outlasts the 1 s timeout and still gets its answer. (A
    // client without a pool: a pooled connection idle past the timeout is closed by now.)
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let resp = http
        .post(sked.url("/workers"))
        .json(&json!({"name": "poller", "slots": 1}))
        .send()
        .await
        .expect("register");
    assert_eq!(resp.status().as_u16(), 201);
    let registered: Value = resp.json().await.expect("registered");
    let id = registered["worker_id"].as_str().expect("worker id");
    let started = Instant::now();
    let resp = http
        .post(sked.url(&format!("/workers/{id}/lease")))
        .json(&json!({"max": 1, "wait_ms": 3000}))
        .send()
        .await
        .expect("the long poll is answered, not cut");
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.expect("lease answer");
    assert!(started.elapsed() >= Duration::from_millis(2500), "{body}");
}

#[tokio::test]
async fn connections_beyond_the_bound_are_closed() {
    let _alone = ALONE.lock().await;
    let mut sked = Sked::new();
    // Open (no tokens), every connection is anonymous: the share is the whole bound.
    sked.start_dev(&[
        "--max-connections",
        "8",
        "--max-anonymous-connections",
        "8",
        "--header-read-timeout",
        "30s",
    ])
    .await;
    // The in-process worker holds a connection or two of its own; fill the rest.
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..8 {
        let mut stream = connect(&sked);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("write");
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let mut buf = [0u8; 512];
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => held.push(stream),
            _ => {
                refused = Some(i);
                break;
            }
        }
    }
    let refused_at = refused.expect("a ninth connection was served while eight were open");
    assert!(refused_at >= 5, "only {refused_at} connections were served");
    // Closing one makes room again.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = sked.get("/jobs").await;
    assert_eq!(status, 200);
}

/// Lets this process open `wanted` files at once, as far as its hard limit allows.
fn raise_open_files(wanted: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted.min(hard), hard).expect("setrlimit");
    }
}

/// 1,030 clients without a token each send `POST /login` announcing a body and then one byte
/// every 3 s, more than the 1,024 connections a node keeps. A body over the login's 16 KiB
/// (100,000 bytes) is refused before it is read; one within it (10,000 bytes) is read until
/// the body timeout. Meanwhile `/healthz`, an API call with a token and a worker's heartbeat,
/// each on a new connection, are answered within 1 s; and every slow body is cut at the body
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_bodies_leaves_room_for_health_workers_and_tokens() {
    let _alone = ALONE.lock().await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const FLOOD: usize = 1030;
    const BODY_TIMEOUT: Duration = Duration::from_secs(8);
    // The server inherits the limit: it needs a descriptor per connection too.
    raise_open_files(4096);
    let mut sked = Sked::new();
    // The flood takes seconds to open on a loaded machine: the worker registered before it
    // must not be declared dead meanwhile, which the fast heartbeats of other tests would do.
    sked.start_server(&[
        "--body-read-timeout",
        "8s",
        "--heartbeat-interval",
        "300ms",
        "--heartbeat-timeout",
        "60s",
    ])
    .await;
    let worker_token = common::token(
        &sked,
        "flood-worker",
        json!({"role": "worker", "namespaces": ["*"]}),
    )
    .await;
    let fresh = |token: Option<&str>| {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().expect("header");
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        // No pool: every request opens a connection of its own, as a newcomer would.
        reqwest::Client::builder()
            .default_headers(headers)
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(1))
            .build()
            .expect("client")
    };
    let worker = fresh(Some(&worker_token));
    let registered: Value = worker
        .post(sked.url("/workers"))
        .json(&json!({"name": "flooded", "slots": 1}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("registered");
    let worker_id = registered["worker_id"]
        .as_str()
        .expect("worker id")
        .to_string();

    let head = |length: u32| {
        format!(
            "POST /login HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {length}\r\n\
             \r\nt",
            sked.port
        )
    };
    // Over the login's size: refused before a byte of the body is read.
    for _ in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", sked.port))
            .await
            .expect("connect");
        stream
            .write_all(head(100_000).as_bytes())
            .await
            .expect("send");
        let mut answer = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut answer))
            .await
            .expect("refused at once")
            .expect("read");
        assert!(
            answer[..n].starts_with(b"HTTP/1.1 413"),
            "{:?}",
            String::from_utf8_lossy(&answer[..n])
        );
    }

    let started = Instant::now();
    let head = head(10_000);
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", sked.port)).await else {
            continue;
        };
        if stream.write_all(head.as_bytes()).await.is_ok() {
            flood.push(stream);
        }
    }
    // One byte every 3 s on each, until the server closes it; a task counts what it saw: an
    // answer (a 503 at once), a close (the body timeout), or a reset. The server closes; a
    // reset comes from the kernel, whose accept queue a thousand connections opened at once
    // can overflow, and is counted apart.
    #[derive(Clone, Copy, PartialEq)]
    enum End {
        Busy,
        Closed,
        Reset,
    }
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<(End, Duration)>();
    for mut stream in flood {
        let seen = seen_tx.clone();
        tokio::spawn(async move {
            let mut answer = [0u8; 512];
            loop {
                match tokio::time::timeout(Duration::from_secs(3), stream.read(&mut answer)).await {
                    // An answer, or the connection closed: a 503 sent at once, or the end of
                    // a body that was too slow.
                    Ok(Ok(n)) => {
                        let busy = n > 0 && answer[..n].starts_with(b"HTTP/1.1 503");
                        let end = if busy { End::Busy } else { End::Closed };
                        let _ = seen.send((end, started.elapsed()));
                        return;
                    }
                    Ok(Err(_)) => {
                        let _ = seen.send((End::Reset, started.elapsed()));
                        return;
                    }
                    Err(_) => {
                        if stream.write_all(b"t").await.is_err() {
                            let _ = seen.send((End::Reset, started.elapsed()));
                            return;
                        }
                    }
                }
            }
        });
    }
    drop(seen_tx);
    let flooded = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Health, a caller with a token and a worker's heartbeat, each on a new connection.
    let timed = |what: &'static str, response: reqwest::Result<reqwest::Response>, at: Instant| {
        let status = response.map(|r| r.status().as_u16());
        let took = at.elapsed();
        println!("{what}: {status:?} in {took:?}");
        assert_eq!(status.ok(), Some(200), "{what} during the flood");
        assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    };
    let at = Instant::now();
    timed(
        "/healthz",
        fresh(None)
            .get(format!("{}/healthz", sked.base()))
            .send()
            .await,
        at,
    );
    let at = Instant::now();
    timed(
        "GET /api/v1/jobs with a token",
        fresh(Some(common::ADMIN_TOKEN))
            .get(sked.url("/jobs"))
            .send()
            .await,
        at,
    );
    let at = Instant::now();
    timed(
        "a worker's heartbeat",
        worker
            .post(sked.url(&format!("/workers/{worker_id}/heartbeat")))
            .json(&json!({"running": []}))
            .send()
            .await,
        at,
    );
    let checked = started.elapsed();
    assert!(
        checked < BODY_TIMEOUT,
        "the checks ended after {checked:?}, when the flood was already being cut"
    );

    // Every slow body ends by the body timeout (plus the time it took to open them all).
    let (mut busy, mut resets) = (0, 0);
    let mut cut = Vec::new();
    let deadline = BODY_TIMEOUT + flooded + Duration::from_secs(3);
    while let Ok(Some((end, at))) =
        tokio::time::timeout(deadline.saturating_sub(started.elapsed()), seen_rx.recv()).await
    {
        match end {
            End::Busy => busy += 1,
            End::Closed => cut.push(at),
            End::Reset => resets += 1,
        }
    }
    let ended = busy + cut.len() + resets;
    let first_cut = cut.iter().min().copied().unwrap_or_default();
    println!(
        "{ended} of {FLOOD} slow clients ended: {busy} answered 503 at once, {} cut at the body \
         timeout (first after {first_cut:?}), {resets} reset; opened in {flooded:?}",
        cut.len()
    );
    assert_eq!(ended, FLOOD, "slow bodies still open after {deadline:?}");
    assert!(
        resets * 20 < FLOOD,
        "{resets} of {FLOOD} slow clients were reset rather than answered or closed"
    );
    assert!(
        busy > 0,
        "no client was turned away: the flood did not fill the anonymous share"
    );
    assert!(
        first_cut >= BODY_TIMEOUT - Duration::from_secs(1),
        "slow bodies were cut after {first_cut:?}, before the body timeout"
    );
}

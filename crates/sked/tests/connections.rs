//! Slow and idle clients through the real binary: a client that trickles its headers and a
//! keep-alive connection that sends nothing more are closed after the header timeout, a long
//! poll that outlasts it is not cut, and connections beyond the bound are closed at once.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

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
    let mut sked = Sked::new();
    sked.start_dev(&["--header-read-timeout", "1s"]).await;

    // Slowloris: half a request header, then nothing.
    let mut slow = connect(&sked);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: sked\r\n")
        .expect("write");
    let took = closed_within(&mut slow, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "a half-sent header kept its connection for 5 s"
    );

    // Idle keep-alive: one whole request, then silence.
    let mut idle = connect(&sked);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: sked\r\n\r\n")
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
    let mut sked = Sked::new();
    sked.start_dev(&["--max-connections", "8", "--header-read-timeout", "30s"])
        .await;
    // The in-process worker holds a connection or two of its own; fill the rest.
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..8 {
        let mut stream = connect(&sked);
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: sked\r\n\r\n")
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

//! A network between the server nodes and PostgreSQL, on one machine: a TCP proxy in the
//! benchmark's process that holds every chunk it forwards for a fixed time, each way, in
//! order. A round trip to the database then costs twice that, as on a network with that
//! latency (bandwidth is not limited, and nothing is lost or reordered). This machine's
//! kernel has no `netem`, which would do the same to packets.

use anyhow::{Context, Result};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Starts a proxy to the database at `url` that delays each direction by `one_way`, and
/// returns the URL that reaches the database through it.
pub async fn proxied(url: &str, one_way: Duration) -> Result<String> {
    let mut parsed = reqwest::Url::parse(url).context("--database-url is not a URL")?;
    let host = parsed.host_str().unwrap_or("127.0.0.1").to_string();
    let port = parsed.port().unwrap_or(5432);
    let upstream = format!("{host}:{port}");
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                match TcpStream::connect(&upstream).await {
                    Ok(server) => relay(client, server, one_way).await,
                    Err(e) => eprintln!("latency proxy: cannot reach {upstream}: {e}"),
                }
            });
        }
    });
    parsed
        .set_host(Some("127.0.0.1"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    parsed
        .set_port(Some(local.port()))
        .map_err(|()| anyhow::anyhow!("cannot set the proxy's port"))?;
    let proxied = parsed.to_string();
    eprintln!(
        "PostgreSQL through the latency proxy: a round trip takes {:.2} ms (median of 50)",
        round_trip(&proxied).await?.as_secs_f64() * 1000.0
    );
    Ok(proxied)
}

/// The median time of a trivial query through the proxy: the timer's granularity makes a
/// delay somewhat longer than asked, and this says by how much.
async fn round_trip(url: &str) -> Result<Duration> {
    let client = sked_store::postgres::client(url).await?;
    let mut times = Vec::new();
    for _ in 0..50 {
        let began = Instant::now();
        client.simple_query("SELECT 1").await?;
        times.push(began.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

async fn relay(client: TcpStream, server: TcpStream, one_way: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_in, client_out) = client.into_split();
    let (server_in, server_out) = server.into_split();
    tokio::join!(
        delayed(client_in, server_out, one_way),
        delayed(server_in, client_out, one_way)
    );
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if chunks
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

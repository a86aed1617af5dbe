//! HTTPS, black-box: a `sked server` started with a certificate serves the API and the worker
//! protocol over TLS only; a worker and the CLI given the CA reach it, a client without it is
//! refused at the handshake, and a plain-HTTP request gets no answer.

mod common;

use common::certs::TestCa;
use common::{free_port, shell, sked_command, Proc, ADMIN_TOKEN};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// A throwaway CA (`ca.pem`) and a certificate it signed for 127.0.0.1 (`server.pem`,
/// `server.key`).
fn certificates(dir: &Path) {
    TestCa::new(dir, "ca").issue(
        "server",
        "127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
    );
}

fn client(ca: Option<&Path>) -> reqwest::Client {
    builder(ca)
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {ADMIN_TOKEN}").parse().expect("header"),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .expect("client")
}

/// A client with a timeout, trusting `ca` when given, and sending no token.
fn builder(ca: Option<&Path>) -> reqwest::ClientBuilder {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("ca.pem");
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"));
    }
    builder
}

/// Waits until the server at `base` answers `/readyz` over HTTPS.
async fn wait_ready(https: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !https
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "{base} did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Defines job `name` running `command`, triggers it, and waits until its run succeeds (a
/// worker ran it over TLS); returns the run's id.
async fn run_to_success(https: &reqwest::Client, base: &str, name: &str, command: &str) -> i64 {
    let put = https
        .put(format!("{base}/api/v1/jobs/{name}"))
        .json(&json!({"target": shell(command)}))
        .send()
        .await
        .expect("PUT");
    assert_eq!(put.status().as_u16(), 201);
    let run: Value = https
        .post(format!("{base}/api/v1/jobs/{name}/trigger"))
        .send()
        .await
        .expect("trigger")
        .json()
        .await
        .expect("run");
    let id = run["id"].as_i64().expect("run id");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run: Value = https
            .get(format!("{base}/api/v1/runs/{id}"))
            .send()
            .await
            .expect("GET run")
            .json()
            .await
            .expect("run");
        if run["state"] == "succeeded" {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not run {name} over TLS: {run}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn server_worker_and_cli_speak_tls_on_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let port = free_port();
    let base = format!("https://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let data = dir.path().join("data");
    let (cert, key, ca) = (
        dir.path().join("server.pem"),
        dir.path().join("server.key"),
        dir.path().join("ca.pem"),
    );
    let args = [
        "server",
        "--listen",
        &listen,
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
        "--heartbeat-interval",
        "300ms",
    ];
    let _server = Proc::spawn("server", &args, &dir.path().join("server.log"));
    let https = client(Some(&ca));
    wait_ready(&https, &base).await;

    // A console cookie that no longer opens is ended with the attributes of every session
    // cookie, `Secure` among them, so a browser never sends its replacement in the clear.
    let no_redirects = builder(Some(&ca))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let turned = no_redirects
        .get(format!("{base}/jobs"))
        .header(reqwest::header::COOKIE, "sked_session=AAAA")
        .send()
        .await
        .expect("GET /jobs");
    assert_eq!(turned.status().as_u16(), 303);
    let ended = turned.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .expect("ascii");
    assert!(
        ended.contains("Max-Age=0") && ended.ends_with("; Secure"),
        "{ended}"
    );

    // Without the CA the handshake fails; plain HTTP on the TLS port gets no answer.
    assert!(client(None)
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_err());
    let plain = client(None)
        .get(format!("http://{listen}/readyz"))
        .send()
        .await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));

    let ca_arg = ca.to_str().expect("utf-8");
    let _worker = Proc::spawn(
        "worker",
        &[
            "worker",
            "--server",
            &base,
            "--ca-file",
            ca_arg,
            "--name",
            "tls-worker",
        ],
        &dir.path().join("worker.log"),
    );
    let id = run_to_success(&https, &base, "over-tls", "echo secure").await;

    let out = sked_command()
        .args([
            "run",
            "logs",
            &id.to_string(),
            "--server",
            &base,
            "--ca-file",
            ca_arg,
        ])
        .output()
        .expect("sked run logs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "secure\n");
}

#[tokio::test]
async fn sked_dev_over_tls_runs_its_jobs_with_its_own_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    certificates(dir.path());
    let port = free_port();
    let base = format!("https://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let data = dir.path().join("data");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_string();
    let args = [
        "dev",
        "--listen",
        &listen,
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--tls-cert",
        &path("server.pem"),
        "--tls-key",
        &path("server.key"),
        "--ca-file",
        &path("ca.pem"),
    ];
    let _dev = Proc::spawn("dev", &args, &dir.path().join("dev.log"));
    let https = client(Some(&dir.path().join("ca.pem")));
    wait_ready(&https, &base).await;
    run_to_success(&https, &base, "hello", "echo hi").await;
}

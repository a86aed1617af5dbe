//! Black-box test harness: starts the real `sked` binary in a temporary data directory on a free
//! loopback port, talks to it over HTTP, and kills it (SIGTERM, or SIGKILL when a test says so).
#![allow(dead_code)]

pub mod axe;
pub mod certs;
pub mod failover;
pub mod ledger;
pub mod npm;
pub mod oidc;
pub mod pg;
pub mod proxy;
pub mod python;
pub mod webhooks;

use chrono::{DateTime, Utc};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sked");

/// The admin token of every deployment these tests start: servers read it from
/// [`admin_token_file`], clients and workers get it as `SKED_TOKEN`.
pub const ADMIN_TOKEN: &str = "sked_black-box-test-admin-token-0123456789";

/// The secret key every server of a test process shares, as the nodes of a cluster must.
pub const SECRET_KEY: &str = "c2tlZC1ibGFjay1ib3gtdGVzdHMtc2VjcmV0LWtleSE=";

/// The files every server of the test process reads: the admin token ([`ADMIN_TOKEN`]) and
/// the secret key ([`SECRET_KEY`]), mode 0600, written once.
fn private_files() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, content) in [("admin.token", ADMIN_TOKEN), ("secret.key", SECRET_KEY)] {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write a private file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .expect("chmod a private file");
        }
        dir
    })
    .path()
}

/// `sked` with what every process of a test deployment is given: the admin token and secret
/// key files for servers, the admin token for clients and workers.
pub fn sked_command() -> Command {
    let mut command = Command::new(BIN);
    command
        .env("SKED_ADMIN_TOKEN_FILE", private_files().join("admin.token"))
        .env("SKED_SECRET_KEY_FILE", private_files().join("secret.key"))
        .env("SKED_TOKEN", ADMIN_TOKEN)
        // Tests drive the API far faster than a person; the limit has a test of its own.
        .env("SKED_RATE_LIMIT", "0");
    command
}

/// An HTTP client that sends the admin token, and drops idle connections before the
/// server's header timeout closes them.
pub fn http_client() -> reqwest::Client {
    client_with_token(Some(ADMIN_TOKEN))
}

/// Sends `method url` with `body` as `client`; returns the status and the JSON answer (null
/// when there is none).
pub async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client.request(method.clone(), &url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Creates a token of `grant` through the API with the admin token; returns its secret.
pub async fn token(sked: &Sked, name: &str, grant: Value) -> String {
    let mut body = grant;
    body["name"] = json!(name);
    let (status, created) = sked.post("/tokens", body).await;
    assert_eq!(status, 201, "{created}");
    created["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {created}"))
        .to_string()
}

/// A client that sends a new token of `grant`.
pub async fn client_for(sked: &Sked, name: &str, grant: Value) -> reqwest::Client {
    client_with_token(Some(&token(sked, name, grant).await))
}

/// The first 16 hex digits of `text`'s SHA-256, as `sha256sum` prints them.
pub fn sha256_prefix(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum output");
    String::from_utf8_lossy(&out.stdout)[..16].to_string()
}

/// Logs into the web console with `token`: a client that follows no redirect, and the session
/// cookie (`name=value`) to send with its page requests.
pub async fn console_session(sked: &Sked, token: &str) -> (reqwest::Client, String) {
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let login = browser
        .post(format!("{}/login", sked.base()))
        .form(&[("token", token), ("next", "/jobs")])
        .send()
        .await
        .expect("login");
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    (browser, cookie)
}

/// An HTTP client that sends `token` (none: no `Authorization` header).
pub fn client_with_token(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("a header value");
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .pool_idle_timeout(sked_core::protocol::CLIENT_IDLE_TIMEOUT)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// A report of the outcome of a run that awaits completion, sent as a consumer or an
/// endpoint sends it: with no API token, only the run's own.
pub async fn report_completion(url: &str, body: Value) -> (u16, Value) {
    let resp = client_with_token(None)
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("POST complete");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Short heartbeats so that worker failure is detected within seconds.
pub const FAST_HEARTBEATS: &[&str] =
    &["--heartbeat-interval", "300ms", "--heartbeat-timeout", "2s"];

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// A running `sked` process, killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, args: &[&str], log: &Path) -> Proc {
        Proc::spawn_with_env(name, args, log, &[])
    }

    /// [`Proc::spawn`] with more variables in the process's environment.
    pub fn spawn_with_env(name: &str, args: &[&str], log: &Path, env: &[(String, String)]) -> Proc {
        let out = std::fs::File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = sked_command()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start sked");
        Proc {
            child,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn sigkill(&mut self) {
        let _ = kill(self.pid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.sigkill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.sigkill();
        }
    }
}

/// A sked deployment under test: a data directory, a port, and the processes started on them.
pub struct Sked {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub http: reqwest::Client,
    pub server: Option<Proc>,
    pub workers: Vec<Proc>,
    /// Variables every process of the deployment is given besides `sked_command`'s.
    pub env: Vec<(String, String)>,
}

impl Sked {
    pub fn new() -> Sked {
        Sked {
            dir: tempfile::tempdir().expect("tempdir"),
            port: free_port(),
            http: http_client(),
            server: None,
            workers: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// Starts `sked dev` (server + in-process worker) and waits until it is ready.
    pub async fn start_dev(&mut self, extra: &[&str]) {
        self.start_server_cmd("dev", extra).await;
    }

    /// Starts `sked server` (no worker) and waits until it is ready.
    pub async fn start_server(&mut self, extra: &[&str]) {
        self.start_server_cmd("server", extra).await;
    }

    async fn start_server_cmd(&mut self, cmd: &str, extra: &[&str]) {
        let listen = format!("127.0.0.1:{}", self.port);
        let data = self.data_dir();
        let mut args = vec![
            cmd,
            "--listen",
            &listen,
            "--data-dir",
            data.to_str().expect("utf-8 path"),
        ];
        // A test that speaks the worker protocol itself sets its own heartbeat timings.
        if !extra.iter().any(|a| a.starts_with("--heartbeat")) {
            args.extend_from_slice(FAST_HEARTBEATS);
        }
        args.extend_from_slice(extra);
        let n = self.workers.len();
        let log = self.log(&format!("{cmd}-{n}-{}", Utc::now().timestamp_micros()));
        self.server = Some(Proc::spawn_with_env(cmd, &args, &log, &self.env));
        self.wait_ready().await;
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(resp) = self
                .http
                .get(format!("{}/readyz", self.base()))
                .send()
                .await
            {
                if resp.status().is_success() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "sked did not become ready; see {:?}",
                self.dir.path()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a `sked worker` process against this server.
    pub fn start_worker(&mut self, name: &str, slots: u32) -> usize {
        self.start_worker_with(name, slots, &[])
    }

    /// [`Sked::start_worker`] with more arguments (labels, broker connections).
    pub fn start_worker_with(&mut self, name: &str, slots: u32, extra: &[&str]) -> usize {
        let base = self.base();
        let slots = slots.to_string();
        let mut args = vec![
            "worker", "--server", &base, "--slots", &slots, "--name", name,
        ];
        args.extend_from_slice(extra);
        let log = self.log(&format!("worker-{name}"));
        self.workers
            .push(Proc::spawn_with_env(name, &args, &log, &self.env));
        self.workers.len() - 1
    }

    /// Runs the `sked` command line with `args` against this deployment: whether it
    /// succeeded, its standard output and its standard error.
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = sked_command()
            .args(args)
            .env("SKED_SERVER", self.base())
            .output()
            .expect("run sked");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/api/v1{}", self.base(), path)
    }

    pub async fn put_job(&self, name: &str, job: Value) -> (u16, Value) {
        let resp = self
            .http
            .put(self.url(&format!("/jobs/{name}")))
            .json(&job)
            .send()
            .await
            .expect("PUT job");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).send().await.expect("GET");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// The output of run `id`, as `GET /runs/{id}/log` answers it.
    /// Triggers a run of `job` now (`POST /jobs/{job}/trigger`); its id.
    pub async fn trigger(&self, job: &str) -> i64 {
        let (status, run) = self
            .post(&format!("/jobs/{job}/trigger"), json!(null))
            .await;
        assert_eq!(status, 201, "{run}");
        run["id"].as_i64().expect("a run id")
    }

    pub async fn run_log(&self, id: i64) -> String {
        self.http
            .get(self.url(&format!("/runs/{id}/log")))
            .send()
            .await
            .expect("log")
            .text()
            .await
            .expect("log text")
    }

    /// Every run of a job, oldest instant first.
    pub async fn runs(&self, job: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/jobs/{job}/runs?limit=1000");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (status, page) = self.get(&path).await;
            assert_eq!(status, 200, "{page}");
            all.extend(page["runs"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        all.reverse();
        all
    }

    pub async fn run(&self, id: i64) -> Value {
        let (status, run) = self.get(&format!("/runs/{id}")).await;
        assert_eq!(status, 200, "{run}");
        run
    }

    /// Waits until run `id` is in a terminal state and returns it.
    pub async fn wait_finished(&self, id: i64, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let run = self.run(id).await;
            if is_terminal(&run["state"]) {
                return run;
            }
            assert!(Instant::now() < deadline, "run {id} did not finish: {run}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base()))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// The sum of the samples of `name` in `/metrics`, whatever their labels.
    pub async fn metric(&self, name: &str) -> u64 {
        let text = self.metrics().await;
        metric(&text, name)
    }

    /// Waits until every run of `job` is terminal and there are at least `count`.
    pub async fn wait_runs(&self, job: &str, count: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let runs = self.runs(job).await;
            let done = runs.iter().filter(|r| is_terminal(&r["state"])).count();
            if done >= count && done == runs.len() {
                return runs;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {count} finished runs of {job}; have {}: {}",
                runs.len(),
                Value::Array(runs)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The sum of the samples of `name` in a `/metrics` text, whatever their labels (for an
/// unlabelled metric, its one sample); panics when there is none.
pub fn metric(text: &str, name: &str) -> u64 {
    let values: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse().ok()
        })
        .collect();
    assert!(!values.is_empty(), "no metric {name} in:\n{text}");
    values.iter().sum()
}

pub fn is_terminal(state: &Value) -> bool {
    matches!(
        state.as_str(),
        Some("succeeded" | "failed" | "timed_out" | "cancelled" | "skipped")
    )
}

pub fn instant(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an instant: {v}"))
}

pub fn shell(command: &str) -> Value {
    json!({"shell": {"command": command}})
}

/// A small deterministic generator, so a failing run can be replayed from its printed seed.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `SKED_TEST_SEED`, or from the clock; the seed is printed either way.
    pub fn from_env() -> Rng {
        let seed = std::env::var("SKED_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| Utc::now().timestamp_micros() as u64 | 1);
        println!("seed {seed} (set SKED_TEST_SEED to replay)");
        Rng(seed)
    }

    /// Seeded with `seed` (not 0), for a generator of its own that a test seeds from another.
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

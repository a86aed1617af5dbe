//! The client commands: thin calls to the HTTP API, printed as tables or JSON.

use crate::cli::ClientArgs;
use anyhow::{bail, Context, Result};
use reqwest::{Method, Response};
use serde_json::Value;
use sked_core::auth::Secret;
use std::io::Write;
use std::path::Path;

/// How many times a request refused for the token's request rate is sent.
const RATE_LIMIT_TRIES: u32 = 5;

/// `builder`, also trusting the certificates (PEM) of `ca_file` when one is given.
fn trusting(
    mut builder: reqwest::ClientBuilder,
    ca_file: Option<&Path>,
) -> Result<reqwest::ClientBuilder> {
    if let Some(path) = ca_file {
        let pem = crate::serve::read_certificates(path)?;
        for certificate in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{} holds no PEM certificates", path.display()))?
        {
            builder = builder.add_root_certificate(certificate);
        }
    }
    Ok(builder)
}

/// The most of a health answer's body that `sked health` reads and prints: a sked server's is
/// a line per broker connection at most, and a stranger's page is no business of a check.
const HEALTH_BODY_LIMIT: usize = 4096;

/// `sked health`: asks the server's `/readyz` (or `/healthz`) and succeeds only on 200, printing
/// what the server said either way.
pub async fn health(args: &crate::cli::HealthArgs) -> Result<()> {
    let base = match &args.server {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => local_server(&args.listen),
    };
    let url = format!("{base}{}", if args.live { "/healthz" } else { "/readyz" });
    let http = trusting(reqwest::Client::builder(), args.ca_file.as_deref())?
        .timeout(args.timeout.0)
        .build()
        .context("cannot build the HTTP client")?;
    let mut resp = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot reach the sked server at {base}"))?;
    let status = resp.status();
    let mut body = Vec::new();
    while body.len() < HEALTH_BODY_LIMIT {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            // What the status says is the answer; a body cut short only shortens the message.
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(HEALTH_BODY_LIMIT);
    let said = String::from_utf8_lossy(&body).trim().to_string();
    if status == reqwest::StatusCode::OK {
        println!("{url}: {}", if said.is_empty() { "ok" } else { &said });
        return Ok(());
    }
    if said.is_empty() {
        bail!("{url} answered {status}");
    }
    bail!("{url} answered {status}: {said}")
}

/// The URL of the server that listens on `listen` on this host: an address that means every
/// address (`0.0.0.0`, `[::]`) is reached on the loopback address of its family.
fn local_server(listen: &str) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    match listen.parse::<SocketAddr>() {
        Ok(mut addr) => {
            if addr.ip().is_unspecified() {
                addr.set_ip(match addr.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                });
            }
            format!("http://{addr}")
        }
        // A host name and port, as `--listen localhost:8080` takes it.
        Err(_) => format!("http://{listen}"),
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    pub namespace: String,
    json: bool,
}

impl Client {
    pub fn new(args: &ClientArgs) -> Result<Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &args.token {
            let mut value =
                reqwest::header::HeaderValue::from_str(&Secret::new(token.trim()).bearer())
                    .context("the token holds characters an HTTP header cannot")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = trusting(reqwest::Client::builder(), args.ca_file.as_deref())?
            .default_headers(headers)
            .pool_idle_timeout(sked_core::protocol::CLIENT_IDLE_TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client {
            http,
            base: args.server.trim_end_matches('/').to_string(),
            namespace: args.namespace.clone(),
            json: args.json,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{}", self.base, path)
    }

    /// Sends a request in the client's namespace and fails with the API's own error message.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Response> {
        self.send_in(Some(&self.namespace), method, path, query, body)
            .await
    }

    /// Sends a request in `namespace`, or in none (what every namespace the token sees).
    async fn send_in(
        &self,
        namespace: Option<&str>,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Response> {
        let mut attempts = 0;
        let resp = loop {
            let mut req = self.http.request(method.clone(), self.url(path));
            if let Some(namespace) = namespace {
                req = req.query(&[("namespace", namespace)]);
            }
            let mut req = req.query(query);
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req
                .send()
                .await
                .with_context(|| format!("cannot reach the sked server at {}", self.base))?;
            // Over the token's request rate: wait as told and send it again, a few times.
            attempts += 1;
            let wait = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            match wait {
                Some(seconds)
                    if resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
                        && attempts < RATE_LIMIT_TRIES =>
                {
                    tokio::time::sleep(std::time::Duration::from_secs(seconds.clamp(1, 10))).await;
                }
                _ => break resp,
            }
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let error: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let message = error["error"]["message"].as_str().unwrap_or(&text);
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!("{message} (HTTP {status}; set SKED_TOKEN or --token)");
        }
        match error["error"]["field"].as_str() {
            Some(field) => bail!("{message} (field {field}; HTTP {status})"),
            None => bail!("{message} (HTTP {status})"),
        }
    }

    async fn get_json(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        let resp = self.send(Method::GET, path, query, None).await?;
        resp.json()
            .await
            .context("the server sent a response that is not JSON")
    }

    fn print_json(value: &Value) -> Result<()> {
        println!("{}", serde_json::to_string_pretty(value)?);
        Ok(())
    }

    /// Every item of a paged listing (`items` is the answer's list field), page by page.
    pub async fn get_all(
        &self,
        path: &str,
        query: &[(&str, String)],
        items: &str,
    ) -> Result<Vec<Value>> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut page_query = vec![("limit", "1000".to_string())];
            page_query.extend(query.iter().cloned());
            page_query.extend(cursor.take().map(|c| ("cursor", c)));
            let page = self.get_json(path, &page_query).await?;
            all.extend(page[items].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => return Ok(all),
            }
        }
    }

    pub async fn job_list(&self, search: Option<String>, state: Option<String>) -> Result<()> {
        let mut query = Vec::new();
        query.extend(search.map(|s| ("search", s)));
        query.extend(state.map(|s| ("state", s)));
        let rows = self.get_all("/jobs", &query, "jobs").await?;
        if self.json {
            return Self::print_json(&Value::Array(rows));
        }
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|j| {
                let after = &j["after"];
                let (schedule, next) = match after["upstreams"].as_array() {
                    // No schedule of its own: it runs after each run of its upstreams.
                    Some(upstreams) if j["schedule"].is_null() => {
                        let names: Vec<String> = upstreams.iter().map(text).collect();
                        let next = match after["next_fire_at"].as_str() {
                            Some(at) => format!("{at} (upstream)"),
                            None => "-".to_string(),
                        };
                        (format!("after {}", names.join(", ")), next)
                    }
                    _ => (schedule_summary(&j["schedule"]), text(&j["next_fire_at"])),
                };
                vec![text(&j["name"]), text(&j["state"]), schedule, next]
            })
            .collect();
        print_table(&["NAME", "STATE", "SCHEDULE", "NEXT FIRE"], &table);
        Ok(())
    }

    pub async fn job_get(&self, name: &str) -> Result<()> {
        Self::print_json(&self.get_json(&format!("/jobs/{name}"), &[]).await?)
    }

    /// Each kept version, newest first, with the fields it changed from the one before.
    pub async fn job_history(&self, name: &str) -> Result<()> {
        let list = self
            .get_json(&format!("/jobs/{name}/versions"), &[])
            .await?;
        if self.json {
            return Self::print_json(&list);
        }
        let versions = list["versions"].as_array().cloned().unwrap_or_default();
        let current = list["current"].as_u64();
        let table: Vec<Vec<String>> = versions
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let changed = match versions.get(i + 1) {
                    Some(older) => crate::apply::changed_fields(&older["spec"], &v["spec"]),
                    None if v["version"].as_u64() == Some(1) => "(created)".to_string(),
                    None => "(older versions not kept)".to_string(),
                };
                let mark = if v["version"].as_u64() == current {
                    "*"
                } else {
                    ""
                };
                vec![
                    format!("{}{mark}", text(&v["version"])),
                    text(&v["created_at"]),
                    changed,
                ]
            })
            .collect();
        print_table(&["VERSION", "WRITTEN", "CHANGED"], &table);
        Ok(())
    }

    pub async fn job_rollback(&self, name: &str, to: u32) -> Result<()> {
        let body = serde_json::json!({ "to": to });
        let resp = self
            .send(
                Method::POST,
                &format!("/jobs/{name}/rollback"),
                &[],
                Some(&body),
            )
            .await?;
        let job: Value = resp.json().await.context("the answer is not JSON")?;
        if self.json {
            return Self::print_json(&job);
        }
        println!(
            "job {name} is at version {}: the definition of version {to}",
            text(&job["version"])
        );
        Ok(())
    }

    pub async fn job_action(&self, name: &str, action: &str) -> Result<()> {
        let resp = self
            .send(Method::POST, &format!("/jobs/{name}/{action}"), &[], None)
            .await?;
        let value: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&value);
        }
        match action {
            "trigger" => println!("run {} queued for job {name}", text(&value["id"])),
            "ping" => match value["run_id"].as_i64() {
                Some(run) => println!("run {run} of job {name} answered"),
                None => println!("no run of job {name} waits for a ping: kept for the next"),
            },
            _ => println!("job {name} is {}", text(&value["state"])),
        }
        Ok(())
    }

    /// Triggers a run of job `name` with `params` (none: no body).
    pub async fn job_trigger(
        &self,
        name: &str,
        params: std::collections::BTreeMap<String, String>,
    ) -> Result<()> {
        if params.is_empty() {
            return self.job_action(name, "trigger").await;
        }
        let body = serde_json::json!({ "params": params });
        let resp = self
            .send(
                Method::POST,
                &format!("/jobs/{name}/trigger"),
                &[],
                Some(&body),
            )
            .await?;
        let created = resp.status() == reqwest::StatusCode::CREATED;
        let value: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&value);
        }
        if created {
            println!("run {} queued for job {name}", text(&value["id"]));
        } else {
            println!("run {} of job {name} took the trigger", text(&value["id"]));
        }
        Ok(())
    }

    pub async fn job_ping_url(&self, name: &str) -> Result<()> {
        let value = self
            .get_json(&format!("/jobs/{name}/ping-url"), &[])
            .await?;
        if self.json {
            return Self::print_json(&value);
        }
        println!("{}", text(&value["url"]));
        Ok(())
    }

    pub async fn job_delete(&self, name: &str, force: bool) -> Result<()> {
        let query = [("force", force.to_string())];
        let deleted: Value = self
            .send(Method::DELETE, &format!("/jobs/{name}"), &query, None)
            .await?
            .json()
            .await
            .context("the answer is not JSON")?;
        println!("job {name} deleted");
        for dependant in deleted["paused_dependants"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!("job {} paused: it depended on {name}", text(dependant));
        }
        Ok(())
    }

    pub async fn job_graph(&self, name: &str, up: u32, down: u32, dot: bool) -> Result<()> {
        let value = self
            .get_json(
                &format!("/jobs/{name}/graph"),
                &[("up", up.to_string()), ("down", down.to_string())],
            )
            .await?;
        if self.json {
            return Self::print_json(&value);
        }
        let drawn = if dot {
            crate::graph::dot(&value)
        } else {
            crate::graph::tree(&value)
        };
        print!("{drawn}");
        Ok(())
    }

    pub async fn job_preview(&self, name: &str, count: usize) -> Result<()> {
        let value = self
            .get_json(
                &format!("/jobs/{name}/preview"),
                &[("count", count.to_string())],
            )
            .await?;
        if self.json {
            return Self::print_json(&value);
        }
        match value["outcomes"].as_array() {
            // A schedule that meets a calendar or blackout windows: each instant with what
            // became of it.
            Some(occurrences) => {
                for o in occurrences {
                    let at = text(&o["at"]);
                    match (o["moved_from"].as_str(), o["skipped"].as_str()) {
                        (Some(from), _) => println!("{at}  moved from {from}"),
                        (None, Some(why)) => {
                            println!("{at}  skipped, {}: {why}", text(&o["skip_reason"]))
                        }
                        (None, None) => println!("{at}"),
                    }
                }
            }
            None => {
                for t in value["fire_times"].as_array().into_iter().flatten() {
                    println!("{}", text(t));
                }
            }
        }
        if let Some(note) = value["note"].as_str() {
            println!("({note})");
        }
        Ok(())
    }

    pub async fn job_backfill(
        &self,
        name: &str,
        from: &str,
        to: &str,
        dry_run: bool,
    ) -> Result<Vec<i64>> {
        let body = serde_json::json!({"from": from, "to": to, "dry_run": dry_run});
        let answer: Value = self
            .send(
                Method::POST,
                &format!("/jobs/{name}/backfill"),
                &[],
                Some(&body),
            )
            .await?
            .json()
            .await
            .context("the server sent a response that is not JSON")?;
        let recorded: Vec<i64> = answer["recorded"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_i64)
            .collect();
        if self.json {
            Self::print_json(&answer)?;
            return Ok(recorded);
        }
        let instants = answer["instants"].as_array().map_or(0, Vec::len);
        if dry_run {
            for t in answer["instants"].as_array().into_iter().flatten() {
                println!("{}", text(t));
            }
            println!("{instants} instants would be backfilled");
            return Ok(recorded);
        }
        println!(
            "{name}: {} of {instants} instants recorded as runs, {} had one already",
            recorded.len(),
            text(&answer["existing"])
        );
        Ok(recorded)
    }

    /// Follows `runs` (a backfill's, which run oldest instant first) until each has ended,
    /// saying how many have: redrawn in place on a terminal, a line a minute otherwise. Looks
    /// only at the oldest runs not known to have ended, so a long backfill costs a few requests
    /// a second. An error when any did not succeed.
    pub async fn follow_runs(&self, job: &str, runs: &[i64]) -> Result<()> {
        use std::collections::BTreeMap;
        use std::io::IsTerminal;
        use std::time::Duration;
        /// Runs looked at per round: the oldest unfinished ones and those just after them.
        const AHEAD: usize = 16;
        let terminal = std::io::stderr().is_terminal();
        let mut pending: std::collections::VecDeque<i64> = runs.iter().copied().collect();
        let mut ended: BTreeMap<String, usize> = BTreeMap::new();
        let mut last_line = std::time::Instant::now();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for id in pending.drain(..AHEAD.min(pending.len())) {
                let run = self.get_json(&format!("/runs/{id}"), &[]).await?;
                let state = text(&run["state"]);
                if ["queued", "waiting", "running"].contains(&state.as_str()) {
                    still.push(id);
                } else {
                    *ended.entry(state).or_default() += 1;
                }
            }
            for id in still.into_iter().rev() {
                pending.push_front(id);
            }
            let done: usize = ended.values().sum();
            let outcomes: Vec<String> = ended.iter().map(|(s, n)| format!("{n} {s}")).collect();
            let line = format!(
                "{job}: {done} of {} runs ended ({})",
                runs.len(),
                outcomes.join(", ")
            );
            let mut err = std::io::stderr().lock();
            if terminal {
                let _ = write!(err, "\r\x1b[2K{line}");
            } else if pending.is_empty() || last_line.elapsed() >= Duration::from_secs(60) {
                let _ = writeln!(err, "{line}");
                last_line = std::time::Instant::now();
            }
            drop(err);
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if terminal {
            eprintln!();
        }
        let failed: usize = ended
            .iter()
            .filter(|(state, _)| state.as_str() != "succeeded")
            .map(|(_, n)| n)
            .sum();
        if failed > 0 {
            bail!("{failed} of {} backfilled runs did not succeed", runs.len());
        }
        Ok(())
    }

    pub async fn run_list(&self, filter: RunFilter, limit: u32) -> Result<()> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(filter.job.map(|j| ("job", j)));
        query.extend(filter.state.map(|s| ("state", s)));
        for (flag, on) in [
            ("deadline_missed", filter.deadline_missed),
            ("at_risk", filter.at_risk),
        ] {
            if on {
                query.push((flag, "true".to_string()));
            }
        }
        let page = self.get_json("/runs", &query).await?;
        if self.json {
            return Self::print_json(&page["runs"]);
        }
        let table: Vec<Vec<String>> = page["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let state = match r["skip_reason"].as_str() {
                    Some(reason) => format!("{} ({reason})", text(&r["state"])),
                    None => text(&r["state"]),
                };
                // A shard of a sharded or broadcast instant says which.
                let job = match r["shard"]["count"].as_u64() {
                    Some(count) => {
                        format!(
                            "{} (shard {} of {count})",
                            text(&r["job"]),
                            r["shard"]["index"]
                        )
                    }
                    None => text(&r["job"]),
                };
                vec![
                    text(&r["id"]),
                    job,
                    text(&r["scheduled_for"]),
                    state,
                    text(&r["attempts"]),
                    deadline_text(r),
                ]
            })
            .collect();
        print_table(
            &[
                "ID",
                "JOB",
                "SCHEDULED FOR",
                "STATE",
                "ATTEMPTS",
                "DEADLINE",
            ],
            &table,
        );
        Ok(())
    }

    pub async fn run_get(&self, id: i64) -> Result<()> {
        Self::print_json(&self.get_json(&format!("/runs/{id}"), &[]).await?)
    }

    pub async fn run_cancel(&self, id: i64) -> Result<()> {
        let resp = self
            .send(Method::POST, &format!("/runs/{id}/cancel"), &[], None)
            .await?;
        let value: Value = resp.json().await?;
        match value["cancel"].as_str() {
            Some("requested") => println!("run {id}: its worker was asked to stop it"),
            Some("already_finished") => println!(
                "run {id} had already ended ({})",
                text(&value["run"]["state"])
            ),
            _ => println!("run {id} cancelled"),
        }
        Ok(())
    }

    pub async fn run_retry(&self, id: i64) -> Result<()> {
        let value: Value = self
            .send(Method::POST, &format!("/runs/{id}/retry"), &[], None)
            .await?
            .json()
            .await
            .context("the server sent a response that is not JSON")?;
        if self.json {
            return Self::print_json(&value);
        }
        let reopened = list_text(&value["reopened"]);
        println!("run {id} is {} again", text(&value["run"]["state"]));
        if !reopened.is_empty() {
            println!("runs waiting for it again: {reopened}");
        }
        Ok(())
    }

    pub async fn run_logs(&self, id: i64, attempt: Option<u32>, follow: bool) -> Result<()> {
        let mut query = vec![("follow", follow.to_string())];
        query.extend(attempt.map(|a| ("attempt", a.to_string())));
        let mut resp = self
            .send(Method::GET, &format!("/runs/{id}/log"), &query, None)
            .await?;
        let mut stdout = std::io::stdout();
        while let Some(chunk) = resp.chunk().await.context("the log stream broke off")? {
            stdout.write_all(&chunk)?;
            stdout.flush()?;
        }
        Ok(())
    }

    pub async fn worker_list(&self) -> Result<()> {
        let workers = self.get_all("/workers", &[], "workers").await?;
        if self.json {
            return Self::print_json(&Value::Array(workers));
        }
        let table: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                let labels = w["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", text(v)))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                vec![
                    text(&w["id"]),
                    match (w["state"].as_str(), w["publisher"].as_bool()) {
                        (Some(state), Some(true)) => format!("{state} (publisher)"),
                        (Some(state), _) => state.to_string(),
                        // A server from before worker states.
                        (None, _) => match (w["alive"].as_bool(), w["draining"].as_bool()) {
                            (Some(true), Some(true)) => "draining".into(),
                            (Some(true), _) => "alive".into(),
                            _ => "dead".into(),
                        },
                    },
                    format!("{}/{}", text(&w["running"]), text(&w["slots"])),
                    match &w["load"] {
                        Value::Null => "-".into(),
                        load if load["overloaded"].as_bool() == Some(true) => {
                            format!("{} ({})", text(&load["stall"]), text(&load["overload"]))
                        }
                        load => text(&load["stall"]),
                    },
                    labels,
                    text(&w["last_heartbeat_at"]),
                ]
            })
            .collect();
        print_table(
            &[
                "ID",
                "STATUS",
                "RUNNING",
                "STALL",
                "LABELS",
                "LAST HEARTBEAT",
            ],
            &table,
        );
        Ok(())
    }

    pub async fn worker_drain(&self, id: &str) -> Result<()> {
        let resp = self
            .send(Method::POST, &format!("/workers/{id}/drain"), &[], None)
            .await?;
        let value: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&value);
        }
        println!(
            "worker {id} is draining: it takes no new attempts, and exits once its {} running \
             ones end (or its drain grace passes)",
            text(&value["running"])
        );
        Ok(())
    }

    /// Prints the new token's details, then its secret alone on the last line (for scripts:
    /// `sked token create ... | tail -1`).
    pub async fn token_create(&self, body: &Value) -> Result<()> {
        let resp = self.send(Method::POST, "/tokens", &[], Some(body)).await?;
        let value: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&value);
        }
        println!(
            "token {} created: role {}, namespaces {}{}",
            text(&value["name"]),
            text(&value["role"]),
            list_text(&value["namespaces"]),
            match value["expires_at"].as_str() {
                Some(at) => format!(", expires {at}"),
                None => String::new(),
            }
        );
        println!("its secret is shown this once; keep it:");
        println!("{}", text(&value["token"]));
        Ok(())
    }

    pub async fn token_list(&self) -> Result<()> {
        let value = self.get_json("/tokens", &[]).await?;
        if self.json {
            return Self::print_json(&value["tokens"]);
        }
        let table: Vec<Vec<String>> = value["tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                vec![
                    text(&t["name"]),
                    text(&t["role"]),
                    list_text(&t["namespaces"]),
                    if t["shell"].as_bool() == Some(true) {
                        "yes".into()
                    } else {
                        "no".into()
                    },
                    text(&t["expires_at"]),
                    text(&t["last_used_at"]),
                ]
            })
            .collect();
        print_table(
            &[
                "NAME",
                "ROLE",
                "NAMESPACES",
                "SHELL",
                "EXPIRES",
                "LAST USED",
            ],
            &table,
        );
        Ok(())
    }

    pub async fn token_revoke(&self, name: &str) -> Result<()> {
        self.send(Method::DELETE, &format!("/tokens/{name}"), &[], None)
            .await?;
        println!("token {name} revoked");
        Ok(())
    }

    fn namespace_path(&self) -> String {
        format!("/namespaces/{}", self.namespace)
    }

    fn print_namespace(&self, value: &Value) -> Result<()> {
        if self.json {
            return Self::print_json(value);
        }
        let cap = |v: &Value| match v {
            Value::Null => "none".to_string(),
            other => text(other),
        };
        println!("namespace       {}", text(&value["name"]));
        let shell = if value["allow_shell"].as_bool() == Some(false) {
            "forbidden"
        } else {
            "allowed"
        };
        println!("shell targets   {shell}");
        println!("max jobs        {}", cap(&value["max_jobs"]));
        println!("max queued runs {}", cap(&value["max_queued_runs"]));
        let weight = match &value["weight"] {
            Value::Null => "1".to_string(),
            other => text(other),
        };
        println!("weight          {weight}");
        for window in value["blackouts"].as_array().into_iter().flatten() {
            let when = match (window["from"].as_str(), window["to"].as_str()) {
                (Some(from), Some(to)) => format!("{from} to {to}"),
                _ => format!(
                    "cron {} {} for {}",
                    text(&window["cron"]),
                    window["timezone"].as_str().unwrap_or("UTC"),
                    text(&window["duration"])
                ),
            };
            println!("blackout        {when}: {}", text(&window["reason"]));
        }
        if value["configured"].as_bool() == Some(false) {
            println!("(the defaults: nothing was set)");
        }
        Ok(())
    }

    pub async fn namespace_show(&self) -> Result<()> {
        let value = self.get_json(&self.namespace_path(), &[]).await?;
        self.print_namespace(&value)
    }

    pub async fn namespace_list(&self) -> Result<()> {
        let value = self.get_json("/namespaces", &[]).await?;
        if self.json {
            return Self::print_json(&value["namespaces"]);
        }
        let table: Vec<Vec<String>> = value["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                let cap = |v: &Value| if v.is_null() { "-".into() } else { text(v) };
                vec![
                    text(&n["name"]),
                    if n["allow_shell"].as_bool() == Some(false) {
                        "forbidden".into()
                    } else {
                        "allowed".into()
                    },
                    cap(&n["max_jobs"]),
                    cap(&n["max_queued_runs"]),
                    if n["weight"].is_null() {
                        "1".into()
                    } else {
                        text(&n["weight"])
                    },
                    text(&n["updated_at"]),
                ]
            })
            .collect();
        print_table(
            &[
                "NAME",
                "SHELL",
                "MAX JOBS",
                "MAX QUEUED",
                "WEIGHT",
                "UPDATED",
            ],
            &table,
        );
        Ok(())
    }

    /// The namespace's blackout windows, as its settings hold them.
    pub async fn namespace_blackouts(&self) -> Result<Vec<Value>> {
        let current = self.get_json(&self.namespace_path(), &[]).await?;
        Ok(current["blackouts"].as_array().cloned().unwrap_or_default())
    }

    /// Reads the settings, applies `changes`, and writes them back whole: every setting the
    /// server answered is sent back as it came (default webhook URLs sealed, which the server
    /// opens), so a change to one never drops another.
    pub async fn namespace_set(&self, changes: serde_json::Map<String, Value>) -> Result<()> {
        let current = self.get_json(&self.namespace_path(), &[]).await?;
        let mut settings = match current {
            Value::Object(fields) => fields,
            _ => bail!("the server answered namespace settings that are not an object"),
        };
        // What the view adds to the settings.
        for field in ["name", "configured", "created_at", "updated_at"] {
            settings.remove(field);
        }
        for (field, value) in changes {
            settings.insert(field, value);
        }
        settings.retain(|_, value| !value.is_null());
        let resp = self
            .send(
                Method::PUT,
                &self.namespace_path(),
                &[],
                Some(&Value::Object(settings)),
            )
            .await?;
        let value: Value = resp.json().await?;
        self.print_namespace(&value)
    }

    pub async fn namespace_reset(&self) -> Result<()> {
        self.send(Method::DELETE, &self.namespace_path(), &[], None)
            .await?;
        println!(
            "namespace {}: settings forgotten, the defaults apply",
            self.namespace
        );
        Ok(())
    }

    pub async fn secret_set(&self, name: &str, value: &str) -> Result<()> {
        let body = serde_json::json!({ "value": value });
        let resp = self
            .send(Method::PUT, &format!("/secrets/{name}"), &[], Some(&body))
            .await?;
        let created = resp.status() == reqwest::StatusCode::CREATED;
        let record: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&record);
        }
        let what = if created { "created" } else { "updated" };
        println!("secret {name} in namespace {} {what}", self.namespace);
        Ok(())
    }

    pub async fn secret_list(&self) -> Result<()> {
        let value = self.get_json("/secrets", &[]).await?;
        if self.json {
            return Self::print_json(&value["secrets"]);
        }
        let table: Vec<Vec<String>> = value["secrets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                vec![
                    text(&s["name"]),
                    text(&s["created_at"]),
                    text(&s["updated_at"]),
                ]
            })
            .collect();
        print_table(&["NAME", "CREATED", "UPDATED"], &table);
        Ok(())
    }

    pub async fn secret_delete(&self, name: &str) -> Result<()> {
        self.send(Method::DELETE, &format!("/secrets/{name}"), &[], None)
            .await?;
        println!("secret {name} in namespace {} deleted", self.namespace);
        Ok(())
    }

    pub async fn calendar_put(
        &self,
        name: &str,
        spec: &sked_core::calendar::CalendarSpec,
    ) -> Result<()> {
        let body = serde_json::to_value(spec)?;
        let resp = self
            .send(Method::PUT, &format!("/calendars/{name}"), &[], Some(&body))
            .await?;
        let status = resp.status();
        let record: Value = resp.json().await?;
        if self.json {
            return Self::print_json(&record);
        }
        let what = if status == reqwest::StatusCode::CREATED {
            "created"
        } else {
            "applied"
        };
        let holidays = record["spec"]["holidays"].as_array().map_or(0, Vec::len);
        println!(
            "calendar {name} in namespace {} {what} (version {}, {holidays} holidays)",
            self.namespace,
            text(&record["version"])
        );
        Ok(())
    }

    pub async fn calendar_list(&self) -> Result<()> {
        let value = self.get_json("/calendars", &[]).await?;
        if self.json {
            return Self::print_json(&value["calendars"]);
        }
        let table: Vec<Vec<String>> = value["calendars"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let spec = &c["spec"];
                vec![
                    text(&c["name"]),
                    spec["timezone"].as_str().unwrap_or("UTC").to_string(),
                    spec["holidays"].as_array().map_or(0, Vec::len).to_string(),
                    list_text(&spec["include"]),
                    text(&c["version"]),
                    text(&c["updated_at"]),
                ]
            })
            .collect();
        print_table(
            &["NAME", "ZONE", "HOLIDAYS", "INCLUDES", "VERSION", "UPDATED"],
            &table,
        );
        Ok(())
    }

    pub async fn calendar_show(&self, name: &str) -> Result<()> {
        let value = self.get_json(&format!("/calendars/{name}"), &[]).await?;
        if self.json {
            return Self::print_json(&value);
        }
        let spec = &value["spec"];
        println!("calendar {name} (version {})", text(&value["version"]));
        println!("  zone      {}", spec["timezone"].as_str().unwrap_or("UTC"));
        let weekdays = match spec["weekdays"].as_array() {
            Some(_) => list_text(&spec["weekdays"]),
            None => "mon, tue, wed, thu, fri".to_string(),
        };
        println!("  weekdays  {weekdays}");
        for (field, label) in [("include", "includes"), ("except", "excepts")] {
            if spec[field].as_array().is_some_and(|a| !a.is_empty()) {
                println!("  {label:<9} {}", list_text(&spec[field]));
            }
        }
        println!(
            "  named by  {}",
            match (
                list_text(&value["used_by"]["jobs"]),
                list_text(&value["used_by"]["calendars"])
            ) {
                (jobs, cals) if jobs.is_empty() && cals.is_empty() => "nothing".to_string(),
                (jobs, cals) if cals.is_empty() => format!("jobs {jobs}"),
                (jobs, cals) if jobs.is_empty() => format!("calendars {cals}"),
                (jobs, cals) => format!("jobs {jobs}; calendars {cals}"),
            }
        );
        let table: Vec<Vec<String>> = spec["holidays"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                let when = match (h["date"].as_str(), h["from"].as_str(), h["to"].as_str()) {
                    (Some(d), _, _) if h["yearly"] == Value::Bool(true) => {
                        format!("{d} and yearly")
                    }
                    (Some(d), _, _) => d.to_string(),
                    (None, Some(f), Some(t)) => format!("{f} to {t}"),
                    _ => String::new(),
                };
                vec![when, text(&h["label"])]
            })
            .collect();
        if !table.is_empty() {
            println!();
            print_table(&["HOLIDAY", "LABEL"], &table);
        }
        Ok(())
    }

    pub async fn calendar_delete(&self, name: &str, force: bool) -> Result<()> {
        let query = [("force", force.to_string())];
        let deleted: Value = self
            .send(Method::DELETE, &format!("/calendars/{name}"), &query, None)
            .await?
            .json()
            .await
            .context("the server sent a response that is not JSON")?;
        if self.json {
            return Self::print_json(&deleted);
        }
        println!("calendar {name} in namespace {} deleted", self.namespace);
        let jobs = list_text(&deleted["still_named_by"]["jobs"]);
        if !jobs.is_empty() {
            println!("these jobs name it and fire nothing until it is written again: {jobs}");
        }
        Ok(())
    }

    pub async fn event_send(&self, key: &str, id: &str, payload: Value) -> Result<()> {
        let body = serde_json::json!({"key": key, "id": id, "payload": payload});
        let posted: Value = self
            .send(Method::POST, "/events", &[], Some(&body))
            .await?
            .json()
            .await
            .context("the server sent a response that is not JSON")?;
        if self.json {
            return Self::print_json(&posted);
        }
        let at = text(&posted["occurred_at"]);
        if posted["created"] != Value::Bool(true) {
            println!("event {key} {id} was recorded before, at {at}: nothing more happened");
            return Ok(());
        }
        let started = list_text(&posted["started"]);
        if started.is_empty() {
            println!("event {key} {id} recorded at {at}");
        } else {
            println!("event {key} {id} recorded at {at}; runs started: {started}");
        }
        Ok(())
    }

    pub async fn event_list(&self, key: Option<&str>, limit: u32) -> Result<()> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(key.map(|k| ("key", k.to_string())));
        let page = self.get_json("/events", &query).await?;
        if self.json {
            return Self::print_json(&page["events"]);
        }
        let table: Vec<Vec<String>> = page["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let mut payload = text(&e["payload"]);
                if payload.len() > 60 {
                    let cut = (0..=57)
                        .rev()
                        .find(|i| payload.is_char_boundary(*i))
                        .unwrap_or(0);
                    payload.truncate(cut);
                    payload.push_str("...");
                }
                vec![
                    text(&e["occurred_at"]),
                    text(&e["key"]),
                    text(&e["id"]),
                    payload,
                ]
            })
            .collect();
        print_table(&["OCCURRED", "KEY", "ID", "PAYLOAD"], &table);
        Ok(())
    }

    pub async fn audit(&self, args: &crate::cli::AuditArgs) -> Result<()> {
        let mut query = vec![("limit", args.limit.to_string())];
        query.extend(args.object.clone().map(|o| ("object", o)));
        query.extend(args.actor.clone().map(|a| ("actor", a)));
        query.extend(args.since.clone().map(|s| ("since", s)));
        let namespace = (!args.all).then_some(self.namespace.as_str());
        let page: Value = self
            .send_in(namespace, Method::GET, "/audit", &query, None)
            .await?
            .json()
            .await
            .context("the server sent a response that is not JSON")?;
        if self.json {
            return Self::print_json(&page["entries"]);
        }
        let table: Vec<Vec<String>> = page["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                vec![
                    text(&e["at"]),
                    text(&e["actor"]),
                    text(&e["action"]),
                    text(&e["namespace"]),
                    text(&e["object"]),
                    text(&e["peer"]),
                ]
            })
            .collect();
        print_table(
            &["AT", "ACTOR", "ACTION", "NAMESPACE", "OBJECT", "FROM"],
            &table,
        );
        Ok(())
    }
}

/// A JSON value as table text: strings without quotes, null as "-".
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A JSON list of strings as `a,b`.
fn list_text(v: &Value) -> String {
    v.as_array()
        .map(|items| items.iter().map(text).collect::<Vec<_>>().join(","))
        .unwrap_or_else(|| text(v))
}

fn schedule_summary(s: &Value) -> String {
    // Business days and calendars read best in words: "last business day of the month at
    // 18:00 (calendar uk)".
    let in_words = ["business_day", "every_business_days", "calendar"]
        .iter()
        .any(|key| s.get(key).is_some_and(|v| !v.is_null()));
    if in_words {
        if let Ok(spec) = serde_json::from_value::<sked_core::schedule::ScheduleSpec>(s.clone()) {
            return sked_core::schedule::words::describe(Some(&spec));
        }
    }
    for key in ["cron", "every", "iso8601", "at", "event"] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            let zone = match (key, s.get("timezone").and_then(Value::as_str)) {
                ("cron", Some(tz)) => format!(" {tz}"),
                _ => String::new(),
            };
            return format!("{key} {}{zone}", text(v));
        }
    }
    "manual".to_string()
}

fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::local_server;

    #[test]
    fn the_local_server_is_reached_on_loopback_when_it_listens_everywhere() {
        assert_eq!(local_server("0.0.0.0:8080"), "http://127.0.0.1:8080");
        assert_eq!(local_server("[::]:9000"), "http://[::1]:9000");
        assert_eq!(local_server("127.0.0.1:18080"), "http://127.0.0.1:18080");
        assert_eq!(local_server("10.1.2.3:8080"), "http://10.1.2.3:8080");
        assert_eq!(local_server("localhost:8080"), "http://localhost:8080");
    }
}

/// Which runs `sked run list` asks for.
#[derive(Debug, Default)]
pub struct RunFilter {
    pub job: Option<String>,
    pub state: Option<String>,
    pub deadline_missed: bool,
    pub at_risk: bool,
}

/// A run's deadlines in a word or two for the run table: what it missed and by how much
/// (`missed finish_by +2.0s`), or `at risk`; empty for a run of a job without a deadline.
fn deadline_text(run: &Value) -> String {
    let missed: Vec<String> = run["deadline_missed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let by = m["by_ms"].as_f64().unwrap_or_default() / 1000.0;
            format!("missed {} +{by:.1}s", text(&m["kind"]))
        })
        .collect();
    if !missed.is_empty() {
        missed.join(", ")
    } else if run["at_risk"].is_object() {
        "at risk".to_string()
    } else {
        String::new()
    }
}

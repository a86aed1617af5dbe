//! Shared set-up: server nodes on a fresh store (SQLite in a temporary directory, or PostgreSQL
//! in a schema of its own), bulk job creation, the cluster view, reading the ledger back.

use anyhow::{bail, Context, Result};
use chrono::Utc;
use serde::Deserialize;
use sked_core::cluster::PARTITIONS;
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::stats::{percentiles, Percentiles};
use sked_core::Instant;
use sked_server::ServerConfig;
use sked_store::{Audit, PgStore, PutMode, RunQuery, SqliteStore, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long nodes may take to become ready, and a cluster to balance its partitions.
const START_LIMIT: Duration = Duration::from_secs(180);

/// One in-process server node.
struct Node {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

pub struct Running {
    /// Each node's base URL, in start order.
    pub bases: Vec<String>,
    nodes: Vec<Node>,
    place: Place,
}

/// Where a benchmark's data lives, removed when the benchmark ends.
pub enum Place {
    /// Removed when dropped.
    Dir { _dir: tempfile::TempDir },
    Schema {
        admin: tokio_postgres::Client,
        name: String,
        /// The database URL pointed into the schema, for more connections to it.
        url: String,
    },
}

impl Place {
    pub fn store_name(&self) -> &'static str {
        match self {
            Place::Dir { .. } => "sqlite",
            Place::Schema { .. } => "postgres",
        }
    }

    pub async fn remove(self) {
        if let Place::Schema { admin, name, .. } = self {
            let _ = admin
                .batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
                .await;
        }
    }
}

/// A new schema in the database at `base`, and a URL whose connections use it.
pub async fn fresh_schema(base: &str) -> Result<Place> {
    let admin = sked_store::postgres::client(base)
        .await
        .context("connect to --database-url")?;
    let name = format!("sked_bench_{:016x}", rand::random::<u64>());
    admin
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-csearch_path%3D{name}");
    Ok(Place::Schema { admin, name, url })
}

/// Opens a fresh store: SQLite in a temporary directory, or with `database_url` PostgreSQL in a
/// new schema of that database.
pub async fn fresh_store(database_url: Option<&str>) -> Result<(Arc<dyn Store>, Place)> {
    let Some(base) = database_url else {
        let dir = tempfile::tempdir()?;
        let store = SqliteStore::open(&dir.path().join("sked.db"))?;
        return Ok((Arc::new(store), Place::Dir { _dir: dir }));
    };
    let place = fresh_schema(base).await?;
    let Place::Schema { url, .. } = &place else {
        bail!("a PostgreSQL benchmark without a schema");
    };
    let store = PgStore::connect(url).await?;
    Ok((Arc::new(store), place))
}

/// Opens a fresh store and creates `jobs` through it (before the server starts, so creation
/// does not disturb the measurement).
pub async fn store_with_jobs(
    database_url: Option<&str>,
    jobs: impl Iterator<Item = (String, JobSpec)>,
) -> Result<(Arc<dyn Store>, Place)> {
    use futures_util::{StreamExt, TryStreamExt};
    let (store, place) = fresh_store(database_url).await?;
    // Several writes at once: on PostgreSQL each is a round trip and a commit of its own, and
    // a schedule whose store row is old when the node starts owes the instants it missed.
    futures_util::stream::iter(jobs)
        .map(|(name, spec)| {
            let store = store.clone();
            async move {
                let now = Utc::now();
                let job = spec.validate(Some(&name), now).context("benchmark job")?;
                store
                    .put_job("default", &job, PutMode::Upsert, now, Audit::none())
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    Ok((store, place))
}

/// Starts `nodes` server nodes on the store: the first on `store`, each other one on a
/// connection of its own to the same schema, as separate hosts would. Returns once every node
/// is ready and, with several, once the partitions are balanced between them.
pub async fn start(store: Arc<dyn Store>, place: Place, nodes: usize) -> Result<Running> {
    start_with(store, place, nodes, Vec::new()).await
}

/// [`start`], with broker connections for broker targets.
pub async fn start_with(
    store: Arc<dyn Store>,
    place: Place,
    nodes: usize,
    brokers: Vec<sked_core::publish::BrokerConnection>,
) -> Result<Running> {
    let config = ServerConfig {
        brokers,
        retention: None,
        ..ServerConfig::default()
    };
    start_configured(store, place, nodes, config).await
}

/// [`start`], each node configured as `template` but for its address, name, secret key and
/// request limit (its run retention is kept: none unless the template sets one).
pub async fn start_configured(
    store: Arc<dyn Store>,
    place: Place,
    nodes: usize,
    template: ServerConfig,
) -> Result<Running> {
    let mut stores = vec![store];
    if nodes > 1 {
        let Place::Schema { url, .. } = &place else {
            bail!("--nodes above 1 needs --database-url");
        };
        for _ in 1..nodes {
            stores.push(Arc::new(PgStore::connect(url).await?));
        }
    }
    let mut running = Running {
        bases: Vec::new(),
        nodes: Vec::new(),
        place,
    };
    for (i, store) in stores.into_iter().enumerate() {
        let config = ServerConfig {
            listen: "127.0.0.1:0".to_string(),
            node_name: format!("bench{i}"),
            secret_key: Some(sked_server::secrets::SecretKey::from_base64(SECRET_KEY)?),
            // The benchmarks measure the scheduler, not the per-token request limit.
            rate_limit: sked_server::rate::RateLimit {
                per_second: 0,
                burst: 0,
            },
            ..template.clone()
        };
        sked_server::auth::ensure_admin_token(store.as_ref(), ADMIN_TOKEN, chrono::Utc::now())
            .await?;
        let listener = sked_server::bind(&config).await?;
        running
            .bases
            .push(format!("http://{}", listener.local_addr()?));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = sked_server::serve(config, store, listener, shutdown).await {
                eprintln!("server: {e}");
            }
        });
        running.nodes.push(Node {
            stop: Some(stop),
            task,
        });
    }
    let http = http_client();
    let deadline = std::time::Instant::now() + START_LIMIT;
    for (base, node) in running.bases.iter().zip(&running.nodes) {
        loop {
            if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            if node.task.is_finished() {
                bail!("the server node at {base} stopped before it was ready");
            }
            if std::time::Instant::now() > deadline {
                bail!("the server node at {base} was not ready within {START_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if nodes > 1 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        wait_balanced(&http, &running.bases[0], nodes, None, left).await?;
    }
    Ok(running)
}

impl Running {
    pub fn store_name(&self) -> &'static str {
        self.place.store_name()
    }

    /// A connection to the PostgreSQL database under test, outside the store's pool.
    pub fn admin(&self) -> Option<&tokio_postgres::Client> {
        match &self.place {
            Place::Schema { admin, .. } => Some(admin),
            Place::Dir { .. } => None,
        }
    }

    /// The PostgreSQL schema under test.
    pub fn schema(&self) -> Option<&str> {
        match &self.place {
            Place::Schema { name, .. } => Some(name),
            Place::Dir { .. } => None,
        }
    }

    /// The first node's base URL.
    pub fn base(&self) -> &str {
        &self.bases[0]
    }

    /// Stops every node; the data stays until [`Place::remove`] via [`Running::finish`].
    pub async fn stop(&mut self) {
        for node in &mut self.nodes {
            if let Some(stop) = node.stop.take() {
                let _ = stop.send(());
            }
        }
        for node in &mut self.nodes {
            (&mut node.task).await.ok();
        }
    }

    /// Removes the benchmark's data.
    pub async fn finish(self) {
        self.place.remove().await;
    }

    /// Reads back the runs due in `[from, to)` once the nodes have stopped, then removes the
    /// benchmark's data.
    pub async fn finish_with_runs(
        self,
        store: &dyn Store,
        from: Instant,
        to: Instant,
    ) -> Result<Vec<RunRecord>> {
        let runs = all_runs(store).await;
        self.finish().await;
        Ok(runs?
            .into_iter()
            .filter(|r| in_window(r.scheduled_for, from, to))
            .collect())
    }

    /// The sum over the nodes of a counter of `/metrics`; `None` when no node reports it.
    pub async fn metric_sum(&self, name: &str) -> Result<Option<f64>> {
        let mut sum = None;
        for base in &self.bases {
            let text = reqwest::get(format!("{base}/metrics"))
                .await?
                .text()
                .await?;
            if let Some(v) = metric(&text, name) {
                sum = Some(sum.unwrap_or(0.0) + v);
            }
        }
        Ok(sum)
    }
}

/// The HTTP client of the benchmarks' own requests, dropping idle connections before the
/// server closes them (`CLIENT_IDLE_TIMEOUT`).
pub fn http_client() -> reqwest::Client {
    client_builder()
        .pool_idle_timeout(sked_core::protocol::CLIENT_IDLE_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// The admin token of every deployment the benchmarks start: in-process servers get it in
/// their store, `sked` processes through [`admin_token_file`] and `SKED_TOKEN`.
pub const ADMIN_TOKEN: &str = "sked_benchmark-admin-token-0123456789abcdef";

/// The key that seals secrets, shared by every node a benchmark starts.
pub const SECRET_KEY: &str = "c2tlZC1iZW5jaG1hcmstc2VjcmV0LWtleS0wMTIzNDU=";

/// A file of this benchmark run holding `content` (mode 0600), written once.
pub fn private_file(name: &str, content: &str) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("sked-bench-{}-{name}", std::process::id()));
    if !path.exists() {
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(path)
}

/// A client builder whose requests carry the admin token.
pub fn client_builder() -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(value) = format!("Bearer {ADMIN_TOKEN}").parse() {
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder().default_headers(headers)
}

/// The sum of the samples of `name` in a `/metrics` text, whatever their labels; `None` when
/// it has none.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .reduce(|a, b| a + b)
}

/// `GET /api/v1/cluster`, the fields the benchmarks read.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterView {
    /// The node that answered.
    pub node: String,
    pub unowned: u32,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodeView {
    pub id: String,
    pub partitions: u32,
    pub alive: bool,
}

impl ClusterView {
    /// Partitions the live nodes hold, in the view's order.
    pub fn shares(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.partitions)
            .collect()
    }

    pub fn held_by(&self, id: &str) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.id == id)
            .map(|n| n.partitions)
            .sum()
    }

    /// `n` live nodes (exactly `ids`, when given), no partition unowned, and each live node
    /// holding its fair share, 256/n give or take one.
    pub fn balanced(&self, n: usize, ids: Option<&[String]>) -> bool {
        let alive: Vec<&NodeView> = self.nodes.iter().filter(|v| v.alive).collect();
        let fair = PARTITIONS / n.max(1) as u32;
        alive.len() == n
            && self.unowned == 0
            && alive.iter().map(|v| v.partitions).sum::<u32>() == PARTITIONS
            && alive.iter().all(|v| v.partitions.abs_diff(fair) <= 1)
            && ids.is_none_or(|ids| alive.iter().all(|v| ids.contains(&v.id)))
    }
}

pub async fn cluster(http: &reqwest::Client, base: &str) -> Result<ClusterView> {
    let resp = http
        .get(format!("{base}/api/v1/cluster"))
        .send()
        .await
        .with_context(|| format!("GET {base}/api/v1/cluster"))?;
    if !resp.status().is_success() {
        bail!(
            "GET {base}/api/v1/cluster: {}: {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
    }
    resp.json()
        .await
        .with_context(|| format!("GET {base}/api/v1/cluster"))
}

/// Polls the node at `base` until [`ClusterView::balanced`]; fails with the last view after
/// `within`.
pub async fn wait_balanced(
    http: &reqwest::Client,
    base: &str,
    n: usize,
    ids: Option<&[String]>,
    within: Duration,
) -> Result<ClusterView> {
    let deadline = std::time::Instant::now() + within;
    loop {
        // A busy node may miss one poll; the deadline bounds the wait.
        let last = cluster(http, base).await;
        if let Ok(view) = &last {
            if view.balanced(n, ids) {
                return Ok(view.clone());
            }
        }
        if std::time::Instant::now() > deadline {
            bail!("the partitions were not balanced over {n} nodes within {within:?}: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every run in the default namespace.
pub async fn all_runs(store: &dyn Store) -> Result<Vec<RunRecord>> {
    let mut runs = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(&RunQuery {
                namespace: "default".into(),
                limit: 1000,
                cursor,
                ..Default::default()
            })
            .await?;
        runs.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(runs),
        }
    }
}

pub fn ms(d: chrono::Duration) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// The percentiles of the values `value` gives `runs` (runs it gives none are left out).
pub fn percentiles_of<'a>(
    runs: impl IntoIterator<Item = &'a RunRecord>,
    value: impl Fn(&RunRecord) -> Option<f64>,
) -> Percentiles {
    let mut values: Vec<f64> = runs.into_iter().filter_map(value).collect();
    percentiles(&mut values)
}

/// A latency's summary as every benchmark prints it.
pub fn tail_json(p: &Percentiles) -> serde_json::Value {
    serde_json::json!({"p50": p.p50, "p90": p.p90, "p99": p.p99, "max": p.max})
}

/// For each second of the window from `from`, `summary` of the values `value` gives the runs
/// due in it (null for a second with none), so a tail can be placed in time.
pub fn by_second(
    runs: &[RunRecord],
    from: Instant,
    seconds: u64,
    value: impl Fn(&RunRecord) -> Option<f64>,
    summary: impl Fn(&mut Vec<f64>) -> f64,
) -> Vec<Option<f64>> {
    let mut buckets = vec![Vec::new(); seconds as usize];
    for run in runs {
        let second = (run.scheduled_for - from).num_seconds();
        let bucket = usize::try_from(second)
            .ok()
            .and_then(|s| buckets.get_mut(s));
        if let (Some(bucket), Some(value)) = (bucket, value(run)) {
            bucket.push(value);
        }
    }
    buckets
        .iter_mut()
        .map(|b| (!b.is_empty()).then(|| summary(b)))
        .collect()
}

pub fn in_window(t: Instant, from: Instant, to: Instant) -> bool {
    t >= from && t < to
}

/// The period of `--every` in microseconds, checked along with `--schedules`.
pub fn period_us(every: &str, schedules: usize) -> Result<i64> {
    let period_us = every
        .parse::<sked_core::duration::HumanDuration>()
        .map_err(|e| anyhow::anyhow!("--every {every}: {e}"))?
        .as_chrono()
        .num_microseconds()
        .context("--every is too long")?;
    if period_us <= 0 || schedules == 0 {
        bail!("--every and --schedules must be above zero");
    }
    Ok(period_us)
}

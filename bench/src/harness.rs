//! Shared set-up: a server on a fresh store (SQLite in a temporary directory, or PostgreSQL in a
//! schema of its own), bulk job creation, reading the ledger back.

use anyhow::{Context, Result};
use chrono::Utc;
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::Instant;
use sked_server::ServerConfig;
use sked_store::{PgStore, PutMode, RunQuery, SqliteStore, Store};
use std::sync::Arc;
use tokio::sync::oneshot;

pub struct Running {
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    place: Place,
}

/// Where a benchmark's data lives, removed when the benchmark ends.
pub enum Place {
    /// Removed when dropped.
    Dir { _dir: tempfile::TempDir },
    Schema {
        admin: tokio_postgres::Client,
        name: String,
    },
}

impl Place {
    pub fn store_name(&self) -> &'static str {
        match self {
            Place::Dir { .. } => "sqlite",
            Place::Schema { .. } => "postgres",
        }
    }

    async fn remove(self) {
        if let Place::Schema { admin, name } = self {
            let _ = admin
                .batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
                .await;
        }
    }
}

/// Opens a fresh store: SQLite in a temporary directory, or with `database_url` PostgreSQL in a
/// new schema of that database.
async fn fresh_store(database_url: Option<&str>) -> Result<(Arc<dyn Store>, Place)> {
    let Some(base) = database_url else {
        let dir = tempfile::tempdir()?;
        let store = SqliteStore::open(&dir.path().join("sked.db"))?;
        return Ok((Arc::new(store), Place::Dir { _dir: dir }));
    };
    let (admin, connection) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .context("connect to --database-url")?;
    tokio::spawn(connection);
    let name = format!("sked_bench_{:016x}", rand::random::<u64>());
    admin
        .batch_execute(&format!("CREATE SCHEMA {name}"))
        .await?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let store = PgStore::connect(&format!("{base}{sep}options=-csearch_path%3D{name}")).await?;
    Ok((Arc::new(store), Place::Schema { admin, name }))
}

/// Opens a fresh store and creates `jobs` through it (before the server starts, so creation
/// does not disturb the measurement).
pub async fn store_with_jobs(
    database_url: Option<&str>,
    jobs: impl Iterator<Item = (String, JobSpec)>,
) -> Result<(Arc<dyn Store>, Place)> {
    let (store, place) = fresh_store(database_url).await?;
    let now = Utc::now();
    for (name, spec) in jobs {
        let job = spec.validate(Some(&name), now).context("benchmark job")?;
        store.put_job("default", &job, PutMode::Upsert, now).await?;
    }
    Ok((store, place))
}

pub async fn start(store: Arc<dyn Store>, place: Place) -> Result<Running> {
    let config = ServerConfig {
        listen: "127.0.0.1:0".to_string(),
        retention: None,
        ..ServerConfig::default()
    };
    let listener = sked_server::bind(&config).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(e) = sked_server::serve(config, store, listener, shutdown).await {
            eprintln!("server: {e}");
        }
    });
    let http = reqwest::Client::new();
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(Running {
        base,
        stop: Some(stop),
        task,
        place,
    })
}

impl Running {
    pub fn store_name(&self) -> &'static str {
        self.place.store_name()
    }

    /// Stops the server; the data stays until [`Place::remove`] via [`Running::finish`].
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.ok();
    }

    /// Removes the benchmark's data.
    pub async fn finish(self) {
        self.place.remove().await;
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

pub fn in_window(t: Instant, from: Instant, to: Instant) -> bool {
    t >= from && t < to
}

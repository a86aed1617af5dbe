//! Shared set-up: a server on a fresh SQLite store, bulk job creation, reading the ledger back.

use anyhow::{Context, Result};
use chrono::Utc;
use sked_core::job::JobSpec;
use sked_core::records::RunRecord;
use sked_core::Instant;
use sked_server::ServerConfig;
use sked_store::{PutMode, RunQuery, SqliteStore, Store};
use std::sync::Arc;
use tokio::sync::oneshot;

pub struct Running {
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// Opens a store in a temporary directory and creates `jobs` through it (before the server
/// starts, so creation does not disturb the measurement).
pub async fn store_with_jobs(
    jobs: impl Iterator<Item = (String, JobSpec)>,
) -> Result<(Arc<dyn Store>, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("sked.db"))?);
    let now = Utc::now();
    for (name, spec) in jobs {
        let job = spec.validate(Some(&name), now).context("benchmark job")?;
        store.put_job("default", &job, PutMode::Upsert, now).await?;
    }
    Ok((store, dir))
}

pub async fn start(store: Arc<dyn Store>, dir: tempfile::TempDir) -> Result<Running> {
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
        _dir: dir,
    })
}

impl Running {
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
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

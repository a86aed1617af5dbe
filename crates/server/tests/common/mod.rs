//! A real server for the server's own tests: started in this process on a fresh SQLite store
//! in a temporary directory, on a free loopback port, talked to over HTTP.
#![allow(dead_code)]

use sked_server::ServerConfig;
use sked_store::{SqliteStore, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The admin token of every server these tests start; their client sends it.
pub const ADMIN_TOKEN: &str = "sked_server-test-admin-token-0123456789";

/// Longest any one request may take.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// Status, headers and body of an answer.
pub type Raw = (u16, reqwest::header::HeaderMap, Vec<u8>);

pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts a server with `config` (its address and retention are the test's) and waits
    /// until it is ready.
    pub async fn start(config: ServerConfig) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("sked.db")).unwrap());
        let config = ServerConfig {
            listen: "127.0.0.1:0".to_string(),
            retention: None,
            rate_limit: sked_server::rate::RateLimit {
                per_second: 0,
                burst: 0,
            },
            secret_key: config.secret_key.clone().or_else(|| {
                sked_server::secrets::SecretKey::from_base64(
                    &sked_server::secrets::SecretKey::generate(),
                )
                .ok()
            }),
            ..config
        };
        sked_server::auth::ensure_admin_token(store.as_ref(), ADMIN_TOKEN, chrono::Utc::now())
            .await
            .unwrap();
        let listener = sked_server::bind(&config).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = sked_server::serve(config, store, listener, shutdown).await {
                eprintln!("server: {e}");
            }
        });
        // A fresh connection for every request: a refused upload leaves its connection unusable.
        let mut admin = reqwest::header::HeaderMap::new();
        admin.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
        );
        let http = reqwest::Client::builder()
            .default_headers(admin)
            .timeout(REQUEST_LIMIT)
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        loop {
            if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Server {
            base,
            http,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// Sends `method path` with an optional `(content type, body)`.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Raw, reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await?.to_vec();
        Ok((status, headers, bytes))
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<(&str, Vec<u8>)>) -> Raw {
        match self.try_send(method, path, body).await {
            Ok(answer) => answer,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

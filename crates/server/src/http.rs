//! The HTTP listener: accepts connections up to a bound, speaks TLS on them when given a
//! certificate, serves each with hyper under a timeout for reading a request's headers, and
//! ends them gracefully at shutdown. It owns connections only; what a request does is the
//! router's (`api`).
//!
//! hyper starts the header timeout when a connection opens and again each time it falls idle
//! after a response, so the one timeout closes both a client that trickles its headers
//! (slowloris) and a keep-alive connection that sends nothing more. A request in progress (a
//! worker's long poll, a followed log) is not idle and is never cut by it.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower_service::Service;

/// Bounds on the connections one node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers, counted from the connection
    /// opening or from the previous response.
    pub header_read_timeout: Duration,
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// At shutdown, how long open requests may take to finish.
    pub shutdown_grace: Duration,
}

/// A certificate chain and its key, for HTTPS.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the certificate {path}: {why}")]
    Certificate { path: String, why: String },
    #[error("cannot read the private key {path}: {why}")]
    Key { path: String, why: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(String),
}

impl Tls {
    /// From PEM files: the certificate chain (leaf first) and its private key.
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Tls, TlsError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let certificate_error = |why: String| TlsError::Certificate {
            path: cert.display().to_string(),
            why,
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| certificate_error(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| certificate_error(e.to_string()))?;
        if chain.is_empty() {
            return Err(certificate_error("it holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
            path: key.display().to_string(),
            why: e.to_string(),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: sked_core::protocol::DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Serves `app` on `listener` until `stop` says so, then lets open requests finish (up to the
/// grace period).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<Tls>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut refused = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            _ = crate::stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!("http: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "http: {} connections open, the most allowed; closed {refused} more so far",
                    limits.max_connections
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            // A connection's errors (a reset, a header timeout, a failed handshake) concern
            // that client only.
            match tls {
                None => serve_connection(stream, peer, app, limits, watcher).await,
                Some(tls) => {
                    // The handshake is bounded like the headers that would follow it.
                    let handshake = tls.acceptor.accept(stream);
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(limits.header_read_timeout, handshake).await
                    {
                        serve_connection(stream, peer, app, limits, watcher).await;
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "http: requests still open after {:?}; closing them",
            limits.shutdown_grace
        );
    }
    Ok(())
}

/// Serves one connection's requests with hyper until it closes or shutdown ends it.
async fn serve_connection<S>(
    stream: S,
    peer: std::net::SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    watcher: hyper_util::server::graceful::Watcher,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // Each request carries its peer's address, for the audit trail.
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let mut app = app.clone();
        async move { app.call(request).await }
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let _ = watcher.watch(connection).await;
}

//! The HTTP listener: accepts connections up to a bound, speaks TLS on them when given a
//! certificate, serves each with hyper under timeouts for reading a request's headers and its
//! body, keeps capacity for callers with a token while anonymous clients hold connections,
//! and ends connections gracefully at shutdown. It owns connections only; what a request does
//! is the router's (`api`).
//!
//! hyper starts the header timeout when a connection opens and again each time it falls idle
//! after a response, so the one timeout closes both a client that trickles its headers
//! (slowloris) and a keep-alive connection that sends nothing more. A request's body must then
//! arrive within the body timeout ([`TimedBody`]), or reading it fails and the connection
//! closes. A request in progress whose body was read (a worker's long poll, a followed log) is
//! never cut by either.
//!
//! Capacity: of the `max_connections` a node keeps open, at most `max_anonymous_connections`
//! belong to clients that have not yet shown a valid token (a connection [`Standing::vouch`]es
//! for itself once a request on it is authenticated, and stops counting as anonymous). A
//! connection accepted while the anonymous share is full is *on probation*: it has a short
//! header timeout, a request of it that carries a body but no credentials is answered 503
//! without being read, and after a response that did not authenticate it, it is closed. So
//! anonymous clients holding every connection they may still leave room for workers, callers
//! with a token and health checks.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

/// Bounds on the connections one node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers, counted from the connection
    /// opening or from the previous response.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body, counted from the end of its
    /// headers.
    pub body_read_timeout: Duration,
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Of those, connections on which no valid token was shown yet; past it, new connections
    /// are on probation (see the module's documentation).
    pub max_anonymous_connections: usize,
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
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_connections: 1024,
            max_anonymous_connections: anonymous_share(1024),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// How long a request's body may take by default: an output chunk of 8 MiB needs 280 KiB/s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The header timeout of a connection on probation: a client that is not anonymous sends its
/// request at once.
const PROBATION_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The default share of `max_connections` anonymous clients may hold: three quarters, so a
/// quarter is kept for callers with a token.
pub fn anonymous_share(max_connections: usize) -> usize {
    (max_connections - max_connections / 4).max(1)
}

/// What a connection has shown of itself, shared with the requests made on it.
#[derive(Debug)]
pub struct Standing {
    /// Its place among the anonymous connections, until it shows a valid token.
    anonymous: Mutex<Option<OwnedSemaphorePermit>>,
    /// A request on it was authenticated with a token.
    vouched: AtomicBool,
    /// Accepted while the anonymous share was full.
    probation: bool,
}

impl Standing {
    fn new(anonymous: Option<OwnedSemaphorePermit>) -> Standing {
        Standing {
            probation: anonymous.is_none(),
            anonymous: Mutex::new(anonymous),
            vouched: AtomicBool::new(false),
        }
    }

    /// A request on this connection was authenticated with a valid token: it no longer
    /// counts as anonymous, and its place among them goes to another client.
    pub fn vouch(&self) {
        if !self.vouched.swap(true, Ordering::Relaxed) {
            self.anonymous
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
    }

    fn vouched(&self) -> bool {
        self.vouched.load(Ordering::Relaxed)
    }
}

/// Marks the connection a request came on as authenticated (see [`Standing::vouch`]); a
/// request made in-process (the console's calls to the API) has no connection.
pub fn vouch(extensions: &axum::http::Extensions) {
    if let Some(standing) = extensions.get::<Arc<Standing>>() {
        standing.vouch();
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
    let anonymous = Arc::new(Semaphore::new(limits.max_anonymous_connections.max(1)));
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
        let standing = Arc::new(Standing::new(anonymous.clone().try_acquire_owned().ok()));
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            // A connection's errors (a reset, a header timeout, a failed handshake) concern
            // that client only.
            match tls {
                None => serve_connection(stream, peer, app, limits, standing, watcher).await,
                Some(tls) => {
                    // The handshake is bounded like the headers that would follow it.
                    let handshake = tls.acceptor.accept(stream);
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(limits.header_read_timeout, handshake).await
                    {
                        serve_connection(stream, peer, app, limits, standing, watcher).await;
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
    standing: Arc<Standing>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    let header_timeout = if standing.probation {
        limits.header_read_timeout.min(PROBATION_HEADER_TIMEOUT)
    } else {
        limits.header_read_timeout
    };
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    // Each request carries its peer's address, for the audit trail, and the connection's
    // standing, which authentication raises.
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        // On probation, a body is read only once a request of the connection showed a token.
        let gate = standing.probation.then(|| standing.clone());
        let mut request = request.map(|body| TimedBody::new(body, limits.body_read_timeout, gate));
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(standing.clone());
        let mut app = app.clone();
        let standing = standing.clone();
        async move {
            if standing.probation && !standing.vouched() && unvouched_upload(&request) {
                return Ok(busy());
            }
            let mut response = app.call(request).await?;
            if standing.probation && !standing.vouched() {
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let _ = watcher.watch(connection).await;
}

/// A request with a body and no credentials (no token, no session cookie): on probation it is
/// answered at once. (One with credentials that prove false is not read either: its body is
/// gated, see [`TimedBody`].)
fn unvouched_upload<B>(request: &Request<B>) -> bool {
    use axum::http::header;
    let headers = request.headers();
    let has_body = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    let credentials =
        headers.contains_key(header::AUTHORIZATION) || headers.contains_key(header::COOKIE);
    has_body && !credentials
}

/// The answer to a request left unread on probation.
fn busy() -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut response = crate::api::ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        "the server holds as many connections of clients without a token as it takes; \
         send a token, or try again",
    )
    .retry_after(Duration::from_secs(1))
    .into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// A request's body that must arrive by a deadline: past it, reading fails (the handler
/// answers that the body could not be read, and hyper closes the connection). On a connection
/// on probation (`gate`), reading fails at once until the connection is vouched for.
pub struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    gate: Option<Arc<Standing>>,
}

impl TimedBody {
    fn new(inner: Incoming, limit: Duration, gate: Option<Arc<Standing>>) -> TimedBody {
        TimedBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
            gate,
        }
    }
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyRefused {
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error(
        "the server holds as many connections of clients without a token as it takes; a body \
         is read on this connection only after a request with a valid token"
    )]
    NoToken,
}

impl hyper::body::Body for TimedBody {
    type Data = hyper::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let gated = self.gate.as_ref().is_some_and(|s| !s.vouched());
        if gated && !self.inner.is_end_stream() {
            return Poll::Ready(Some(Err(BodyRefused::NoToken.into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyRefused::TimedOut(self.limit).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

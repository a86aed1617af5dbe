//! The worker's side of the protocol's transport: POSTs to the current server and fails over to
//! the next URL of the list when a server cannot be reached (or answers 502/503/504), and goes
//! back to the first server of the list (its home) once that is ready again, so that workers
//! given rotated lists spread over the nodes again after a node returns. Owns the server list,
//! which one is current, timeouts and error bodies; knows nothing of attempts or of what the
//! messages mean.

use crate::{error_chain, WorkerConfig, WorkerError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why a protocol request did not get a usable answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    /// No server answered (connection refused, timeout, reset, or "unavailable").
    Unreachable(String),
    /// A server answered with a status other than 2xx.
    Status {
        server: String,
        status: u16,
        code: String,
        message: String,
    },
    /// A server answered 2xx with a body that is not the expected message.
    Decode(String),
}

impl CallError {
    /// Worth retrying later: nobody answered, or the server failed rather than refused.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable(_) => true,
            CallError::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            CallError::Decode(_) => false,
        }
    }

    /// The server does not know this worker (never registered, or declared dead).
    pub(crate) fn is_unknown_worker(&self) -> bool {
        matches!(self, CallError::Status { status: 410, .. })
            || matches!(self, CallError::Status { status: 404, code, .. } if code == "unknown_worker")
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Unreachable(why) => write!(f, "no server answered: {why}"),
            CallError::Status {
                server,
                status,
                code,
                message,
            } => write!(f, "{server} answered HTTP {status} {code}: {message}"),
            CallError::Decode(why) => write!(f, "unreadable answer: {why}"),
        }
    }
}

pub(crate) struct ProtocolClient {
    http: reqwest::Client,
    servers: Vec<String>,
    current: AtomicUsize,
}

impl ProtocolClient {
    pub(crate) fn new(config: &WorkerConfig) -> Result<Self, WorkerError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &config.token {
            let mut value =
                reqwest::header::HeaderValue::from_str(&token.bearer()).map_err(|_| {
                    WorkerError::Config("the token holds characters a header cannot".into())
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder();
        if !config.trusted_certificates.is_empty() {
            let certificates = reqwest::Certificate::from_pem_bundle(&config.trusted_certificates)
                .map_err(|e| WorkerError::Config(format!("the trusted certificates: {e}")))?;
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder
            .default_headers(headers)
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(sked_core::protocol::CLIENT_IDLE_TIMEOUT)
            .user_agent(concat!("sked-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(WorkerError::HttpClient)?;
        Ok(ProtocolClient {
            http,
            servers: config.servers.clone(),
            current: AtomicUsize::new(0),
        })
    }

    /// When requests go to another server than the first of the list, asks the first whether
    /// it is ready (`GET /readyz`) and, if it is, makes it current again.
    pub(crate) async fn return_home_if_ready(&self, timeout: Duration) {
        let current = self.current.load(Ordering::Relaxed);
        let Some(home) = self.servers.first() else {
            return;
        };
        if current == 0 {
            return;
        }
        let ready = self
            .http
            .get(format!("{home}/readyz"))
            .timeout(timeout)
            .send()
            .await
            .is_ok_and(|answer| answer.status().is_success());
        // A failover that happened meanwhile wins: compare against what was read.
        if ready
            && self
                .current
                .compare_exchange(current, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::info!("the server at {home} is ready again: going back to it");
        }
    }

    /// The server requests go to first.
    pub(crate) fn current(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed) % self.servers.len().max(1);
        self.servers.get(i).map(String::as_str).unwrap_or_default()
    }

    /// POSTs a JSON message and decodes the JSON answer.
    pub(crate) async fn post_json<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        message: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let body = serde_json::to_vec(message).map_err(|e| CallError::Decode(e.to_string()))?;
        let answer = self.post(path, "application/json", body, timeout).await?;
        serde_json::from_slice(&answer).map_err(|e| CallError::Decode(e.to_string()))
    }

    /// POSTs raw bytes; the answer's body is ignored.
    pub(crate) async fn post_bytes(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), CallError> {
        self.post(path, "application/octet-stream", body, timeout)
            .await
            .map(|_| ())
    }

    /// Tries each server once, starting with the current one; the first that answers becomes
    /// current.
    async fn post(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let n = self.servers.len();
        let start = self.current.load(Ordering::Relaxed) % n.max(1);
        let mut failures = Vec::new();
        for i in 0..n {
            let index = (start + i) % n;
            let server = &self.servers[index];
            let sent = self
                .http
                .post(format!("{server}{path}"))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body.clone())
                .timeout(timeout)
                .send()
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(e) => {
                    failures.push(format!("{server}: {}", error_chain(&e)));
                    continue;
                }
            };
            let status = response.status().as_u16();
            if matches!(status, 502..=504) {
                failures.push(format!("{server}: HTTP {status}"));
                continue;
            }
            let answer = match response.bytes().await {
                Ok(bytes) => bytes.to_vec(),
                Err(e) => {
                    failures.push(format!("{server}: {}", error_chain(&e)));
                    continue;
                }
            };
            if index != start
                && self
                    .current
                    .compare_exchange(start, index, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!("failing over to the server at {server}");
            }
            if (200..300).contains(&status) {
                return Ok(answer);
            }
            let (code, message) = error_body(&answer);
            return Err(CallError::Status {
                server: server.clone(),
                status,
                code,
                message,
            });
        }
        Err(CallError::Unreachable(failures.join("; ")))
    }
}

/// `{"error": {"code", "message"}}`, or whatever text the body has.
fn error_body(body: &[u8]) -> (String, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let field = |name: &str| {
        error
            .and_then(|e| e.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    match (field("code"), field("message")) {
        (Some(code), message) => (code, message.unwrap_or_default()),
        (None, _) => {
            let text = String::from_utf8_lossy(body);
            (String::new(), text.chars().take(300).collect())
        }
    }
}

/// Percent-encodes a path segment (worker ids come from the server).
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_read() {
        let body = br#"{"error": {"code": "unknown_worker", "message": "register again"}}"#;
        assert_eq!(
            error_body(body),
            ("unknown_worker".to_string(), "register again".to_string())
        );
        assert_eq!(error_body(b"oops"), (String::new(), "oops".to_string()));
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("dev-00ff_a.b"), "dev-00ff_a.b");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn errors_are_classified() {
        let status = |status: u16, code: &str| CallError::Status {
            server: "s".to_string(),
            status,
            code: code.to_string(),
            message: String::new(),
        };
        assert!(status(410, "unknown_worker").is_unknown_worker());
        assert!(status(404, "unknown_worker").is_unknown_worker());
        assert!(!status(404, "not_found").is_unknown_worker());
        assert!(status(500, "").is_transient());
        assert!(!status(400, "invalid_request").is_transient());
        assert!(CallError::Unreachable(String::new()).is_transient());
    }
}

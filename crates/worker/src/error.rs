//! `WorkerError`: why `run` gave up. Owns only the error type; transient failures (a server
//! that does not answer, a rejected report) are logged and retried by the agent, never
//! returned.

/// What stops the worker for good. Unreachable servers are not an error: the worker keeps
/// trying until it is shut down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A setting of [`crate::WorkerConfig`] cannot work (no servers, zero slots, ...).
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built (for example, no TLS backend).
    #[error("cannot set up the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// The server answered the registration with a client error: retrying cannot help.
    #[error("the server at {server} refused to register this worker (HTTP {status}): {message}")]
    Registration {
        server: String,
        status: u16,
        message: String,
    },
}

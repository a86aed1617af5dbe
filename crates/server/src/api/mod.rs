//! The HTTP API under `/api/v1`: jobs, runs, workers (including the worker protocol), the
//! cluster's nodes, plus health, readiness, metrics and the OpenAPI document.
//!
//! Handlers parse and validate, call the store, and tell the firing loop or the dispatcher what
//! changed. They hold no state of their own.

mod cluster;
mod error;
mod extract;
mod jobs;
mod openapi;
mod runs;
mod strict;
mod workers;

pub use error::ApiError;

use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Largest job definition or protocol message accepted.
pub const MAX_BODY: usize = 1024 * 1024;
/// Largest output chunk a worker may send at once.
pub const MAX_OUTPUT_CHUNK: usize = 8 * 1024 * 1024;

pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/jobs", get(jobs::list).post(jobs::create))
        .route(
            "/jobs/{name}",
            get(jobs::get).put(jobs::put).delete(jobs::delete),
        )
        .route("/jobs/{name}/trigger", post(jobs::trigger))
        .route("/jobs/{name}/pause", post(jobs::pause))
        .route("/jobs/{name}/resume", post(jobs::resume))
        .route("/jobs/{name}/preview", get(jobs::preview))
        .route("/jobs/{name}/runs", get(jobs::runs))
        .route("/jobs/{name}/stats", get(jobs::stats))
        .route("/schedules/preview", post(jobs::preview_schedule))
        .route("/runs", get(runs::list))
        .route("/runs/{id}", get(runs::get))
        .route("/runs/{id}/log", get(runs::log))
        .route("/runs/{id}/cancel", post(runs::cancel))
        .route("/workers", get(workers::list).post(workers::register))
        .route("/workers/{id}/heartbeat", post(workers::heartbeat))
        .route("/workers/{id}/lease", post(workers::lease))
        .route("/workers/{id}/complete", post(workers::complete))
        .route(
            "/attempts/{id}/log",
            post(workers::append_output).layer(DefaultBodyLimit::max(MAX_OUTPUT_CHUNK)),
        )
        .route("/cluster", get(cluster::view))
        .route("/openapi.json", get(openapi::document))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_such_endpoint);
    Router::new()
        .nest("/api/v1", api)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_such_endpoint)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// A path no route serves, inside `/api/v1` or not.
async fn no_such_endpoint() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

/// A path that is served, with a method it is not served with. (The router adds `Allow`.)
async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("this endpoint does not answer {method}"),
    )
}

/// Ready once the first schedules are loaded, and while the store commits.
async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    if !*state.ready.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, "loading schedules".into());
    }
    match state.health.failure() {
        None => (StatusCode::OK, "ready".into()),
        Some(failure) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store cannot commit: {failure}"),
        ),
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// The `namespace` query parameter, `default` when absent.
#[derive(Debug, Deserialize)]
pub struct Namespace {
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

fn default_namespace() -> String {
    "default".to_string()
}

impl Namespace {
    pub fn checked(self) -> Result<String, ApiError> {
        sked_core::job::validate_name("namespace", &self.namespace)
            .map_err(|e| ApiError::invalid("namespace", e.message))?;
        Ok(self.namespace)
    }
}

/// A request body, or the error for one that is too large (over [`MAX_BODY`]) or unreadable.
/// The body limit of the route `path` is for: output chunks may be larger than definitions.
fn body_limit(path: &str) -> usize {
    if path.starts_with("/api/v1/attempts/") {
        MAX_OUTPUT_CHUNK
    } else {
        MAX_BODY
    }
}

/// Uploads up to this size that declare a length over the limit are read and dropped before
/// the refusal, within [`DRAIN_TIME`].
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Refuses a request whose declared `Content-Length` is over its route's limit. The upload is
/// read (and dropped) first, within bounds: a server that answers and closes while the client
/// is still sending makes the client see a broken pipe instead of the 413 and its JSON.
/// Bodies without a declared length meet the route's `DefaultBodyLimit` instead.
async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let limit = body_limit(request.uri().path());
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let Some(length) = declared.filter(|l| *l > limit as u64) else {
        return next.run(request).await;
    };
    if length <= DRAIN_LIMIT {
        use futures_util::StreamExt;
        let mut upload = request.into_body().into_data_stream();
        let drain = async { while let Some(Ok(_)) = upload.next().await {} };
        let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    }
    too_large(limit).into_response()
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_body",
        format!("the request body is larger than the limit of {limit} bytes"),
    )
    .with_field("body")
}

pub fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body_within(body, MAX_BODY)
}

/// A request body on a route whose `DefaultBodyLimit` is `limit`, or the error for one that is
/// too large or unreadable. The limit is only quoted to the client: the route enforces it.
pub fn body_within(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(limit),
        status => ApiError::new(status, "invalid_body", rejection.body_text()).with_field("body"),
    })
}

/// Parses a JSON body; the error names the field that failed (`schedule.every`). Structs are
/// read only from objects (see [`strict`]).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()).with_field("body")
    })?;
    serde_path_to_error::deserialize(strict::Strict(&value)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        let mut field = if path == "." { String::new() } else { path };
        // Depending on the version, the path of an unknown field ends at its parent or at the
        // field itself; name the field itself either way.
        if let Some(name) = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .filter(|name| field != *name && !field.ends_with(&format!(".{name}")))
        {
            field = if field.is_empty() {
                name.to_string()
            } else {
                format!("{field}.{name}")
            };
        }
        let field = if field.is_empty() {
            "body".to_string()
        } else {
            field
        };
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message).with_field(field)
    })
}

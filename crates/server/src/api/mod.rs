//! The HTTP API under `/api/v1`: jobs, runs, workers (including the worker protocol), tokens,
//! the audit trail, the cluster's nodes, plus health, readiness, metrics and the OpenAPI
//! document.
//!
//! [`route_table`] is the one place routes are registered, each with the permission it needs;
//! its guard finds the caller before the handler runs. Handlers parse and validate, check the
//! caller's namespaces, call the store, record changes in the audit trail, and tell the firing
//! loop or the dispatcher what changed. They hold no state of their own.

mod apply;
mod audit;
mod backfill;
mod calendars;
mod cluster;
pub(crate) mod error;
mod events;
mod extract;
mod grid;
mod jobs;
mod limits;
mod namespaces;
mod notifications;
mod openapi;
mod pings;
mod runs;
mod secrets;
mod strict;
pub(crate) mod tokens;
mod versions;
mod workers;

pub use error::ApiError;
pub use jobs::JOB_VIEW_FIELDS;

use crate::auth::Authenticator;
use crate::rate::RequestRate;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use sked_core::auth::Permission;
use std::net::SocketAddr;
use std::sync::Arc;

/// Largest job definition or protocol message accepted.
pub const MAX_BODY: usize = 1024 * 1024;
/// Largest output chunk a worker may send at once.
pub const MAX_OUTPUT_CHUNK: usize = 8 * 1024 * 1024;
/// Largest report a consumer may send without an API token (its message is at most 4 KiB).
pub const MAX_REPORT: usize = 16 * 1024;
/// The largest trigger body (`{"params": {...}}`).
pub const MAX_TRIGGER_BODY: usize = 32 * 1024;

/// One route of the API and who may call it. Every route is registered from [`route_table`],
/// so none can be served without a permission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    /// The full path as the router matches it, e.g. `/api/v1/jobs/{name}`.
    pub path: &'static str,
    pub permission: Permission,
}

/// The API: every route with its permission and its handler.
fn route_table() -> Vec<(Route, MethodRouter<AppState>)> {
    use Permission::{Admin, Authenticated, Events, Open, Read, Worker, Write};
    let route = |method: Method, path: &'static str, permission, handler| {
        (
            Route {
                method,
                path,
                permission,
            },
            handler,
        )
    };
    vec![
        route(Method::GET, "/api/v1/jobs", Read, get(jobs::list)),
        route(Method::POST, "/api/v1/jobs", Write, post(jobs::create)),
        route(Method::POST, "/api/v1/apply", Write, post(apply::apply)),
        route(Method::GET, "/api/v1/jobs/{name}", Read, get(jobs::get)),
        route(Method::PUT, "/api/v1/jobs/{name}", Write, put(jobs::put)),
        route(
            Method::DELETE,
            "/api/v1/jobs/{name}",
            Write,
            delete(jobs::delete),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/trigger",
            Write,
            post(jobs::trigger).layer(DefaultBodyLimit::max(MAX_TRIGGER_BODY)),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/backfill",
            Write,
            post(backfill::backfill),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/pause",
            Write,
            post(jobs::pause),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/resume",
            Write,
            post(jobs::resume),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/preview",
            Read,
            get(jobs::preview),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/runs",
            Read,
            get(jobs::runs),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/versions",
            Read,
            get(versions::list),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/rollback",
            Write,
            post(versions::rollback),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/stats",
            Read,
            get(jobs::stats),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/graph",
            Read,
            get(jobs::graph),
        ),
        route(
            Method::GET,
            "/api/v1/graph",
            Read,
            get(jobs::namespace_graph),
        ),
        route(
            Method::POST,
            "/api/v1/schedules/preview",
            Read,
            post(jobs::preview_schedule),
        ),
        route(
            Method::POST,
            "/api/v1/jobs/{name}/ping",
            Events,
            post(pings::ping),
        ),
        route(
            Method::GET,
            "/api/v1/jobs/{name}/ping-url",
            Write,
            get(pings::ping_url),
        ),
        route(
            Method::POST,
            "/ping/{token}",
            Open,
            post(pings::ping_by_token),
        ),
        route(Method::POST, "/api/v1/events", Events, post(events::post)),
        route(Method::GET, "/api/v1/events", Read, get(events::list)),
        route(Method::GET, "/api/v1/runs", Read, get(runs::list)),
        route(Method::GET, "/api/v1/runs/grid", Read, get(grid::get)),
        route(Method::GET, "/api/v1/runs/{id}", Read, get(runs::get)),
        route(Method::GET, "/api/v1/runs/{id}/log", Read, get(runs::log)),
        route(
            Method::POST,
            "/api/v1/runs/{id}/cancel",
            Write,
            post(runs::cancel),
        ),
        route(
            Method::POST,
            "/api/v1/runs/{id}/retry",
            Write,
            post(runs::retry),
        ),
        // The body carries the run's completion token instead of an API token.
        route(
            Method::POST,
            "/api/v1/runs/{id}/complete",
            Open,
            post(runs::complete).layer(DefaultBodyLimit::max(MAX_REPORT)),
        ),
        route(Method::GET, "/api/v1/workers", Read, get(workers::list)),
        route(
            Method::POST,
            "/api/v1/workers",
            Worker,
            post(workers::register),
        ),
        route(
            Method::POST,
            "/api/v1/workers/{id}/heartbeat",
            Worker,
            post(workers::heartbeat),
        ),
        route(
            Method::POST,
            "/api/v1/workers/{id}/lease",
            Worker,
            post(workers::lease),
        ),
        route(
            Method::POST,
            "/api/v1/workers/{id}/complete",
            Worker,
            post(workers::complete),
        ),
        route(
            Method::POST,
            "/api/v1/workers/{id}/deregister",
            Worker,
            post(workers::deregister),
        ),
        route(
            Method::POST,
            "/api/v1/workers/{id}/drain",
            Admin,
            post(workers::drain),
        ),
        route(
            Method::POST,
            "/api/v1/attempts/{id}/log",
            Worker,
            post(workers::append_output).layer(DefaultBodyLimit::max(MAX_OUTPUT_CHUNK)),
        ),
        route(Method::GET, "/api/v1/tokens", Admin, get(tokens::list)),
        route(Method::POST, "/api/v1/tokens", Admin, post(tokens::create)),
        route(
            Method::DELETE,
            "/api/v1/tokens/{name}",
            Admin,
            delete(tokens::revoke),
        ),
        route(
            Method::GET,
            "/api/v1/namespaces",
            Read,
            get(namespaces::list),
        ),
        route(
            Method::GET,
            "/api/v1/namespaces/{name}",
            Read,
            get(namespaces::get),
        ),
        route(
            Method::PUT,
            "/api/v1/namespaces/{name}",
            Admin,
            put(namespaces::put),
        ),
        route(
            Method::DELETE,
            "/api/v1/namespaces/{name}",
            Admin,
            delete(namespaces::delete),
        ),
        route(Method::GET, "/api/v1/calendars", Read, get(calendars::list)),
        route(
            Method::GET,
            "/api/v1/calendars/{name}",
            Read,
            get(calendars::get),
        ),
        route(
            Method::PUT,
            "/api/v1/calendars/{name}",
            Write,
            put(calendars::put),
        ),
        route(
            Method::DELETE,
            "/api/v1/calendars/{name}",
            Write,
            delete(calendars::delete),
        ),
        route(Method::GET, "/api/v1/limits", Read, get(limits::list)),
        route(Method::GET, "/api/v1/limits/{name}", Read, get(limits::get)),
        route(
            Method::PUT,
            "/api/v1/limits/{name}",
            Write,
            put(limits::put),
        ),
        route(
            Method::DELETE,
            "/api/v1/limits/{name}",
            Write,
            delete(limits::delete),
        ),
        route(Method::GET, "/api/v1/secrets", Read, get(secrets::list)),
        route(
            Method::PUT,
            "/api/v1/secrets/{name}",
            Write,
            put(secrets::put),
        ),
        route(
            Method::DELETE,
            "/api/v1/secrets/{name}",
            Write,
            delete(secrets::delete),
        ),
        route(Method::GET, "/api/v1/audit", Read, get(audit::list)),
        route(
            Method::GET,
            "/api/v1/notifications",
            Read,
            get(notifications::list),
        ),
        route(Method::GET, "/api/v1/cluster", Read, get(cluster::view)),
        route(
            Method::GET,
            "/api/v1/openapi.json",
            Authenticated,
            get(openapi::document),
        ),
        route(Method::GET, "/healthz", Open, get(|| async { "ok" })),
        route(Method::GET, "/readyz", Open, get(readyz)),
        route(Method::GET, "/metrics", Open, get(metrics)),
    ]
}

/// Every route the API serves, with its permission: for tests and the documentation.
pub fn routes() -> Vec<Route> {
    route_table().into_iter().map(|(route, _)| route).collect()
}

pub fn router(state: AppState) -> Router {
    let mut router = Router::new();
    let own = Arc::new(crate::browsers::OwnAddress::from_public_url(
        state.config.public_url.as_deref(),
    ));
    for (route, handler) in route_table() {
        let guard = Guard {
            auth: state.auth.clone(),
            permission: route.permission,
            own: own.clone(),
            body: crate::browsers::BodyKind::of(route.path),
            rate: state
                .rate
                .clone()
                .filter(|_| route.permission != Permission::Worker),
        };
        router = router.route(
            route.path,
            handler.route_layer(axum::middleware::from_fn_with_state(guard, authorize)),
        );
    }
    router
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_such_endpoint)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .with_state(state)
}

/// What a route's guard checks.
#[derive(Clone)]
struct Guard {
    auth: Arc<Authenticator>,
    permission: Permission,
    /// The server's own origin, which alone may send it changes from a browser.
    own: Arc<crate::browsers::OwnAddress>,
    /// What body the route reads.
    body: crate::browsers::BodyKind,
    /// Counts the caller's requests on this route; `None` for routes not counted.
    rate: Option<Arc<RequestRate>>,
}

/// Refuses a change sent by a page of another origin, finds the caller, checks the route's
/// permission and the body's type, and hands the caller to the handler. Runs before the
/// handler reads the body, so a refused upload is never read.
async fn authorize(
    State(guard): State<Guard>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use crate::browsers::{foreign_origin, wrong_body};
    if let Some(refusal) = foreign_origin(request.method(), request.headers(), &guard.own) {
        return refusal.into_response();
    }
    if guard.permission == Permission::Open {
        if let Some(refusal) = wrong_body(request.method(), request.headers(), guard.body) {
            return refusal.into_response();
        }
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let authorization = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let caller = match guard
        .auth
        .caller(authorization, peer, chrono::Utc::now())
        .await
    {
        Ok(caller) => caller,
        Err(refusal) if refusal.status == StatusCode::TOO_MANY_REQUESTS => {
            return refusal.into_response();
        }
        Err(refusal) => {
            guard.auth.failed(
                peer,
                request.method(),
                request.uri().path(),
                &refusal.message,
            );
            let mut response = refusal.into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            return response;
        }
    };
    if caller.token_id.is_some() {
        crate::http::vouch(request.extensions());
    }
    if let Err(denied) = caller.permits(guard.permission) {
        return ApiError::from(denied).into_response();
    }
    if let Some(refusal) = wrong_body(request.method(), request.headers(), guard.body) {
        return refusal.into_response();
    }
    if let Some(Err(wait)) = guard.rate.as_ref().map(|rate| rate.check(caller.token_id)) {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "this token sent more requests than the server allows per second; wait {} ms",
                wait.as_millis().max(1)
            ),
        )
        .retry_after(wait)
        .into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
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

/// Ready once the first schedules are loaded, and while the store commits. Each broker
/// connection's state follows, one per line: a broker outage degrades the node without
/// making it unready, since no other node would reach that broker better and everything
/// else it does goes on (`sked_broker_up` is the signal to alert on).
async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let (status, mut body) = if !*state.ready.borrow() {
        (StatusCode::SERVICE_UNAVAILABLE, "loading schedules".into())
    } else {
        match state.health.failure() {
            None => (StatusCode::OK, "ready".to_string()),
            Some(failure) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store cannot commit: {failure}"),
            ),
        }
    };
    for line in state.brokers.lines() {
        body.push('\n');
        body.push_str(&line);
    }
    (status, body)
}

/// `/metrics` is open for the aggregate series. The series a job asked for by name
/// (`job_metrics`) are served only to a caller whose token reads, for the namespaces it sees
/// (in open mode, everyone); a token that is sent must be valid.
async fn metrics(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let authorization = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let open = state.auth.mode() == crate::auth::AuthMode::Open;
    let caller = if authorization.is_some() || open {
        match state
            .auth
            .caller(authorization, peer, chrono::Utc::now())
            .await
        {
            Ok(caller) => Some(caller),
            Err(refusal) => return refusal.into_response(),
        }
    } else {
        None
    };
    let reader = caller.filter(|c| c.permits(Permission::Read).is_ok());
    let sees = |namespace: &str| reader.as_ref().is_some_and(|c| c.sees(namespace));
    let job_series: Option<&dyn Fn(&str) -> bool> = reader.as_ref().map(|_| &sees as _);
    let waiting = state
        .dispatcher
        .top_waiting_keys(crate::metrics::FLOW_KEYS_SHOWN);
    state.metrics.flow_keys_waiting(
        waiting
            .iter()
            .map(|(namespace, key, runs)| (namespace.as_str(), key.as_str(), *runs)),
    );
    (
        [("content-type", crate::metrics::CONTENT_TYPE)],
        state
            .metrics
            .render(&state.brokers.render_metrics(), job_series),
    )
        .into_response()
}

/// The `namespace` query parameter, `default` when absent.
#[derive(Debug, Deserialize)]
pub struct Namespace {
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

/// The query of a `DELETE` whose object others may name (a job's dependants, a calendar's
/// jobs): refused while they do, unless `force`.
#[derive(Debug, Deserialize)]
pub struct DeleteParams {
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub force: bool,
}

pub(crate) fn default_namespace() -> String {
    "default".to_string()
}

impl Namespace {
    /// The namespace, if it is a valid name and `caller` sees it.
    pub fn checked(self, caller: &sked_core::auth::Grant) -> Result<String, ApiError> {
        sked_core::job::validate_name("namespace", &self.namespace)
            .map_err(|e| ApiError::invalid("namespace", e.message))?;
        caller.enter(&self.namespace)?;
        Ok(self.namespace)
    }
}

/// A request body, or the error for one that is too large (over [`MAX_BODY`]) or unreadable.
/// The body limit of the route `path` is for: output chunks may be larger than definitions.
fn body_limit(path: &str) -> usize {
    if path.starts_with("/api/v1/attempts/") {
        MAX_OUTPUT_CHUNK
    } else if path.starts_with("/api/v1/runs/") && path.ends_with("/complete") {
        MAX_REPORT
    } else if path.starts_with("/api/v1/jobs/") && path.ends_with("/trigger") {
        MAX_TRIGGER_BODY
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

/// The trace a request carries (its W3C `traceparent` header), as a run that joins it keeps
/// it: only while this server exports traces. A header that is absent, repeated or not a
/// valid `traceparent` is ignored, as W3C Trace Context asks (the run then starts a trace of
/// its own).
pub fn joined_trace(state: &AppState, headers: &axum::http::HeaderMap) -> Option<String> {
    state.run_traces?;
    let mut values = headers
        .get_all(sked_core::protocol::HEADER_TRACEPARENT)
        .iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let parent = sked_core::trace::TraceParent::parse(value.to_str().ok()?).ok()?;
    Some(sked_core::trace::Joined::given(parent).to_string())
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

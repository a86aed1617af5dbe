//! API errors: every failure is JSON `{"error": {"code", "message", "field"}}` with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sked_core::namespace::NamespaceRefusal;
use sked_core::throttle::Throttle;
use sked_core::SpecError;
use sked_store::StoreError;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Sent as `Retry-After` (whole seconds), for 429 and 503 answers.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, after: std::time::Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} does not exist"),
        )
    }

    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message).with_field(field)
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_job", e.message).with_field(e.field)
    }
}

impl From<crate::secrets::SecretError> for ApiError {
    fn from(e: crate::secrets::SecretError) -> Self {
        use crate::secrets::SecretError;
        let field = match &e {
            SecretError::OtherKey { field, .. }
            | SecretError::NotSealed { field }
            | SecretError::Unbound { field }
            | SecretError::TooLong { field }
            | SecretError::NoKey { field }
            | SecretError::MissingRef { field, .. } => field.clone(),
            SecretError::BadKey(_) => "secret".to_string(),
        };
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_job", e.to_string()).with_field(field)
    }
}

/// A namespace's settings refuse the change: shell targets are a permission (403), caps and
/// jobs in the way are the namespace's state (409).
impl From<NamespaceRefusal> for ApiError {
    fn from(refusal: NamespaceRefusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            NamespaceRefusal::ShellForbidden { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "shell_forbidden", message)
                    .with_field("target.shell")
            }
            NamespaceRefusal::TooManyJobs { .. }
            | NamespaceRefusal::TooManySecrets { .. }
            | NamespaceRefusal::TooManyCalendars { .. }
            | NamespaceRefusal::TooManyNamespaces { .. } => {
                ApiError::new(StatusCode::CONFLICT, "limit_reached", message)
            }
            NamespaceRefusal::ShellJobsExist { .. } => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message).with_field("allow_shell")
            }
        }
    }
}

impl From<crate::schedule_rules::ResolveError> for ApiError {
    fn from(e: crate::schedule_rules::ResolveError) -> Self {
        match e {
            crate::schedule_rules::ResolveError::Spec(spec) => spec.into(),
            crate::schedule_rules::ResolveError::Store(store) => store.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(what) => ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} already exists; use PUT to replace it"),
            ),
            StoreError::Refused(refusal) => refusal.into(),
            StoreError::Invalid(e) => e.into(),
            StoreError::DependedOn { job, dependants } => ApiError::new(
                StatusCode::CONFLICT,
                "depended_on",
                format!(
                    "job {job:?} is depended on by {}; delete it with force=true (sked job \
                     delete --force) to delete it and pause them",
                    dependants.join(", ")
                ),
            ),
            // 503, so that a worker tries the next node of its list, where the database may
            // still be reachable, and a client knows to try again.
            StoreError::Unavailable(why) => {
                log_store_error(&StoreError::Unavailable(why.clone()));
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("the database is unavailable: {why}"),
                )
                .retry_after(std::time::Duration::from_secs(1))
            }
            StoreError::InvalidCursor(cursor) => ApiError::invalid(
                "cursor",
                format!("{cursor:?} is not a cursor this listing handed out"),
            ),
            other => {
                log_store_error(&other);
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    other.to_string(),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {"code": self.code, "message": self.message, "field": self.field}
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(after) = self.retry_after {
            let seconds = after.as_secs().max(1).to_string();
            if let Ok(value) = axum::http::HeaderValue::from_str(&seconds) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        response
    }
}

/// Logs a store error behind a 500, at most one line per second with the count held back:
/// a store that fails every request (a full disk, a damaged file) must not flood the log.
fn log_store_error(error: &StoreError) {
    static THROTTLE: Mutex<Throttle> = Mutex::new(Throttle::new(Duration::from_secs(1)));
    log_throttled(&THROTTLE, format_args!("store: {error}"));
}

/// Logs `message` as an error when `throttle` lets it through, saying how many were held back
/// since the last one: for failures that may repeat on every request.
pub(crate) fn log_throttled(throttle: &Mutex<Throttle>, message: std::fmt::Arguments<'_>) {
    let admitted = throttle
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .admit(std::time::Instant::now());
    match admitted {
        Some(0) => tracing::error!("{message}"),
        Some(held_back) => tracing::error!("{message} ({held_back} more since the last report)"),
        None => {}
    }
}

//! API errors: every failure is JSON `{"error": {"code", "message", "field"}}` with a status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sked_core::SpecError;
use sked_store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
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

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(what) => ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} already exists; use PUT to replace it"),
            ),
            StoreError::InvalidCursor(cursor) => ApiError::invalid(
                "cursor",
                format!("{cursor:?} is not a cursor this listing handed out"),
            ),
            other => {
                tracing::error!("store: {other}");
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
        (self.status, axum::Json(body)).into_response()
    }
}

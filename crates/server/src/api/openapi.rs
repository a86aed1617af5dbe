//! The OpenAPI document describing this API, served at `/api/v1/openapi.json`.

use axum::response::IntoResponse;

const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([("content-type", "application/json")], DOCUMENT)
}

//! The OpenAPI document describing this API, served at `/api/v1/openapi.json`.
//!
//! The document is static JSON, served as it is: nothing parses it at run time. The tests in
//! `crates/server/tests/openapi.rs` keep it valid and true to the router and the handlers.

use axum::response::IntoResponse;

const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([("content-type", "application/json")], DOCUMENT)
}

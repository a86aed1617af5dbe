//! The console's pages, one module each, and what they read from the API. A page handler asks
//! the API for what it shows, as the visitor, and renders it; a form handler checks the CSRF
//! token, sends the change to the API and shows the API's answer.

pub mod admin;
pub mod job;
pub mod job_form;
pub mod jobs;
pub mod login;
pub mod overview;
pub mod run;
pub mod workers;

use super::api::Failure;
use super::layout;
use super::{Console, Turned, Visitor};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;
use sked_core::records::RunRecord;
use sked_core::schedule::ScheduleSpec;
use sked_core::Instant;

/// A job as the pages read it from `GET /api/v1/jobs` and `GET /api/v1/jobs/{name}`.
#[derive(Debug, Clone, Deserialize)]
pub struct JobRow {
    pub name: String,
    pub namespace: String,
    #[serde(default)]
    pub description: Option<String>,
    pub state: String,
    #[serde(default)]
    pub schedule: Option<ScheduleSpec>,
    pub target: serde_json::Value,
    pub next_fire_at: Option<Instant>,
    pub fired_count: u64,
    pub version: u32,
    #[serde(default)]
    pub last_run: Option<RunRecord>,
}

impl JobRow {
    /// The console's address of this job.
    pub fn href(&self) -> String {
        job_href(&self.namespace, &self.name)
    }

    /// The kind of target: `shell`, `http`, `amqp`, ….
    pub fn target_kind(&self) -> &str {
        self.target
            .as_object()
            .and_then(|o| o.keys().next())
            .map_or("?", String::as_str)
    }
}

pub fn job_href(namespace: &str, name: &str) -> String {
    format!(
        "/jobs/{}/{}",
        super::api::segment(namespace),
        super::api::segment(name)
    )
}

/// The namespaces the visitor sees, from `GET /api/v1/namespaces`, `default` first.
pub async fn namespaces(console: &Console, visitor: &Visitor) -> Vec<String> {
    #[derive(Deserialize)]
    struct Listing {
        namespaces: Vec<Named>,
    }
    #[derive(Deserialize)]
    struct Named {
        name: String,
    }
    let mut names: Vec<String> = console
        .api
        .get::<Listing>(visitor.who(), "/api/v1/namespaces")
        .await
        .map(|l| l.namespaces.into_iter().map(|n| n.name).collect())
        .unwrap_or_default();
    if !names.iter().any(|n| n == "default") && visitor.caller.sees("default") {
        names.insert(0, "default".into());
    }
    names.sort_by_key(|n| (n != "default", n.clone()));
    names
}

/// The page for an API refusal: to the login page when the token no longer works, otherwise
/// the API's message with its status.
pub fn refused(console: &Console, visitor: &Visitor, title: &str, failure: Failure) -> Response {
    if failure.status == StatusCode::UNAUTHORIZED {
        return Turned::ToLogin {
            next: visitor.path.clone(),
            clear: Some(console.sessions.clear_cookie()),
        }
        .into_response();
    }
    let body = html! { (layout::refusal(&failure.message)) };
    let mut response = layout::page(console, visitor, title, body);
    *response.status_mut() = failure.status;
    response
}

/// The `csrf` field every console form carries.
#[derive(Debug, Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    pub csrf: String,
}

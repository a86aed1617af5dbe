//! The console's pages, one module each, and what they read from the API. A page handler asks
//! the API for what it shows, as the visitor, and renders it; a form handler checks the CSRF
//! token, sends the change to the API and shows the API's answer.

pub mod admin;
pub mod graph;
pub mod grid;
pub mod job;
pub mod job_form;
pub mod jobs;
pub mod login;
pub mod overview;
pub mod preferences;
pub mod run;
pub mod search;
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
    /// For a job without a schedule that runs after its upstreams.
    #[serde(default)]
    pub after: Option<RunsAfter>,
}

/// The `after` of a job view: the upstreams a job without a schedule runs after, and their
/// next instant.
#[derive(Debug, Clone, Deserialize)]
pub struct RunsAfter {
    pub upstreams: Vec<String>,
    pub next_fire_at: Option<Instant>,
}

impl JobRow {
    /// The console's address of this job.
    pub fn href(&self) -> String {
        job_href(&self.namespace, &self.name)
    }

    /// Its schedule in words ("after extract" for a job that runs after its upstreams).
    pub fn schedule_words(&self) -> String {
        let upstreams = self
            .after
            .as_ref()
            .map_or(&[][..], |a| a.upstreams.as_slice());
        sked_core::schedule::words::describe_job(self.schedule.as_ref(), upstreams)
    }

    /// When it runs next: its own next instant, or its upstreams' next one.
    pub fn next_instant(&self) -> Option<Instant> {
        self.next_fire_at
            .or(self.after.as_ref().and_then(|a| a.next_fire_at))
    }

    /// The zone its schedule reads in, when it names one.
    pub fn zone(&self) -> Option<&str> {
        self.schedule.as_ref()?.timezone.as_deref()
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

/// The job filters the job list and the runs grid share (the API's job list parameters of the
/// same names): namespace, search, job state and schedule kind.
pub fn job_filters(
    known: &[String],
    namespace: &str,
    search: &str,
    state: &str,
    kind: &str,
) -> maud::Markup {
    html! {
        label { "Namespace "
            select name="namespace" {
                @for ns in known {
                    option value=(ns) selected[ns == namespace] { (ns) }
                }
            }
        }
        label { "Search "
            input type="search" name="search" value=(search) maxlength="128"
                placeholder="name or description";
        }
        label { "State "
            select name="state" {
                @for (value, label) in [("", "any"), ("active", "active"), ("paused", "paused"), ("completed", "completed")] {
                    option value=(value) selected[state == value] { (label) }
                }
            }
        }
        label { "Schedule "
            select name="kind" {
                @for (value, label) in [("", "any"), ("cron", "cron"), ("every", "every"), ("iso8601", "ISO 8601"), ("at", "once"), ("event", "on event"), ("manual", "none")] {
                    option value=(value) selected[kind == value] { (label) }
                }
            }
        }
    }
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

/// The namespace a page shows: the one asked for, else `default` when the visitor sees it,
/// else the first it sees (a viewer of one namespace lands on it); with the namespaces the
/// visitor sees, for the picker.
pub async fn chosen(console: &Console, visitor: &Visitor, asked: &str) -> (String, Vec<String>) {
    let known = namespaces(console, visitor).await;
    let namespace = if !asked.is_empty() {
        asked.to_string()
    } else if visitor.caller.sees("default") {
        "default".to_string()
    } else {
        known
            .first()
            .cloned()
            .unwrap_or_else(|| "default".to_string())
    };
    (namespace, known)
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

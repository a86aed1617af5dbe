//! The jobs of a namespace: search, filter, sort, a page at a time (`GET /api/v1/jobs`, which
//! pages by cursor, so page 1,000 costs what page 1 does).

use super::{chosen, refused, JobRow};
use crate::console::api::query;
use crate::console::layout;
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use sked_core::auth::Permission;

/// Jobs per page.
const PAGE: u32 = 50;

#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    search: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    last: String,
    #[serde(default)]
    sort: String,
    #[serde(default)]
    order: String,
    #[serde(default)]
    cursor: String,
}

#[derive(Deserialize)]
struct JobPage {
    jobs: Vec<JobRow>,
    next_cursor: Option<String>,
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(f): Query<Filters>,
) -> Response {
    let (namespace, known) = chosen(&console, &visitor, &f.namespace).await;
    let namespace = namespace.as_str();
    let filters = [
        ("namespace", namespace),
        ("search", f.search.as_str()),
        ("state", &f.state),
        ("kind", &f.kind),
        ("last", &f.last),
        ("sort", &f.sort),
        ("order", &f.order),
    ];
    let with = |more: &[(&'static str, &str)]| {
        let mut pairs = filters.to_vec();
        pairs.extend_from_slice(more);
        query(&pairs)
    };
    let limit = PAGE.to_string();
    let path = format!(
        "/api/v1/jobs?{}",
        with(&[
            ("cursor", &f.cursor),
            ("limit", &limit),
            ("include", "last_run")
        ])
    );
    let listing: JobPage = match console.api.get(visitor.who(), &path).await {
        Ok(listing) => listing,
        Err(failure) => return refused(&console, &visitor, "Jobs", failure),
    };
    let first = format!("/jobs?{}", with(&[]));
    let next = listing
        .next_cursor
        .as_deref()
        .map(|cursor| format!("/jobs?{}", with(&[("cursor", cursor)])));
    let body = html! {
        form.filters method="get" action="/jobs" role="search" {
            (super::job_filters(&known, namespace, &f.search, &f.state, &f.kind))
            label { "Last run "
                select name="last" {
                    @for (value, label) in [("", "any"), ("succeeded", "succeeded"), ("failed", "failed"), ("timed_out", "timed out"), ("running", "running"), ("queued", "queued"), ("waiting", "waiting"), ("cancelled", "cancelled"), ("skipped", "skipped")] {
                        option value=(value) selected[f.last == value] { (label) }
                    }
                }
            }
            label { "Sort "
                select name="sort" {
                    @for (value, label) in [("name", "name"), ("created_at", "created"), ("updated_at", "updated")] {
                        option value=(value) selected[f.sort == value] { (label) }
                    }
                }
            }
            label { "Order "
                select name="order" {
                    @for (value, label) in [("asc", "ascending"), ("desc", "descending")] {
                        option value=(value) selected[f.order == value] { (label) }
                    }
                }
            }
            button type="submit" { "Show" }
            a.button href={ "/graph?" (query(&[("namespace", namespace)])) } { "Graph" }
            @if visitor.may(Permission::Write) {
                a.button href={ "/jobs/new?" (query(&[("namespace", namespace)])) } { "New job" }
            }
        }
        @if listing.jobs.is_empty() {
            p.empty { "No jobs match." }
        } @else {
            div.table-wrap tabindex="0" {
                table.jobs {
                    thead { tr {
                        th scope="col" { "Job" }
                        th scope="col" { "State" }
                        th scope="col" { "Schedule" }
                        th scope="col" { "Target" }
                        th scope="col" { "Last run" }
                        th scope="col" { "Next run" }
                        th scope="col" { "Fired" }
                    } }
                    tbody {
                        @for job in &listing.jobs {
                            tr {
                                td { a href=(job.href()) { (job.name) }
                                    @if let Some(d) = &job.description { div.sub { (d) } } }
                                td { (layout::state(&job.state)) }
                                td { (job.schedule_words()) }
                                td { (job.target_kind()) }
                                td {
                                    @if let Some(run) = &job.last_run {
                                        a href={ "/runs/" (run.id) } { (layout::state(run.state.as_str())) }
                                        " " (visitor.clock.when(run.finished_at.or(run.started_at).or(Some(run.scheduled_for))))
                                    } @else { span.none { "never" } }
                                }
                                td {
                                    (visitor.clock.when(job.next_instant()))
                                    @if job.next_fire_at.is_none() && job.next_instant().is_some() {
                                        div.sub { "upstream's next" }
                                    }
                                }
                                td.num { (job.fired_count) }
                            }
                        }
                    }
                }
            }
        }
        nav.pager aria-label="Pages" {
            @if !f.cursor.is_empty() {
                a href=(first) { "First page" }
            }
            @if let Some(next) = next { a rel="next" href=(next) { "Next page" } }
        }
    };
    layout::page(&console, &visitor, "Jobs", body)
}

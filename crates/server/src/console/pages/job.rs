//! One job: its definition, its next instants, its runs with a chart of their duration and
//! lateness, its recent errors, and the actions the visitor's token may take on it.

use super::{refused, CsrfOnly, JobRow};
use crate::console::api::{query, segment, As, Failure};
use crate::console::chart::{self, Chart, Mark, Point, Series, Unit};
use crate::console::clock::Clock;
use crate::console::layout::{self, confirmed_button, millis, post_button, span};
use crate::console::{Console, Visitor};
use axum::extract::{Path, Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;
use sked_core::auth::Permission;
use sked_core::records::{JobStats, RunRecord};
use sked_core::Instant;

/// Runs shown per page of the job's history.
const RUNS: u32 = 50;

#[derive(Debug, Default, Deserialize)]
pub struct History {
    #[serde(default)]
    cursor: String,
}

#[derive(Deserialize)]
struct RunPage {
    runs: Vec<RunRecord>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Preview {
    fire_times: Vec<Instant>,
    /// For a schedule that meets a calendar or blackout windows: each instant, with what
    /// became of it.
    #[serde(default)]
    outcomes: Vec<Outcome>,
}

#[derive(Deserialize)]
struct Outcome {
    at: Instant,
    moved_from: Option<Instant>,
    skipped: Option<String>,
}

/// What `GET /jobs/{name}/graph` says of the jobs around this one.
#[derive(Deserialize)]
struct Graph {
    nodes: Vec<super::graph::Node>,
    #[serde(default)]
    edges: Vec<super::graph::Edge>,
    #[serde(default)]
    truncated: bool,
}

/// `/api/v1/jobs/{name}{rest}` with the namespace in the query.
fn api_path(namespace: &str, name: &str, rest: &str, more: &[(&str, &str)]) -> String {
    let mut pairs = vec![("namespace", namespace)];
    pairs.extend_from_slice(more);
    format!("/api/v1/jobs/{}{rest}?{}", segment(name), query(&pairs))
}

/// The job's definition as the API returns it, and the same as the pages read it.
pub(super) async fn definition(
    console: &Console,
    who: As<'_>,
    namespace: &str,
    name: &str,
) -> Result<(serde_json::Value, JobRow), Failure> {
    let value: serde_json::Value = console
        .api
        .get(who, &api_path(namespace, name, "", &[]))
        .await?;
    let row: JobRow = serde_json::from_value(value.clone()).map_err(|e| Failure {
        status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal".into(),
        message: format!("the API answered with a job the console cannot read: {e}"),
        field: None,
    })?;
    Ok((value, row))
}

/// A definition without what the API adds to it (state, counters, last run, …).
pub(super) fn spec_only(mut value: serde_json::Value) -> serde_json::Value {
    if let Some(object) = value.as_object_mut() {
        for field in crate::api::JOB_VIEW_FIELDS {
            object.remove(*field);
        }
    }
    value
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Path((namespace, name)): Path<(String, String)>,
    Query(history): Query<History>,
) -> Response {
    let who = visitor.who();
    let (value, job) = match definition(&console, who, &namespace, &name).await {
        Ok(found) => found,
        Err(failure) => return refused(&console, &visitor, &name, failure),
    };
    let limit = RUNS.to_string();
    let runs_path = api_path(
        &namespace,
        &name,
        "/runs",
        &[("limit", &limit), ("cursor", &history.cursor)],
    );
    let stats_path = api_path(&namespace, &name, "/stats", &[]);
    let preview_path = api_path(&namespace, &name, "/preview", &[("count", "10")]);
    let graph_path = api_path(&namespace, &name, "/graph", &[("up", "3"), ("down", "3")]);
    let (runs, stats, preview, graph) = tokio::join!(
        console.api.get::<RunPage>(who, &runs_path),
        console.api.get::<JobStats>(who, &stats_path),
        console.api.get::<Preview>(who, &preview_path),
        console.api.get::<Graph>(who, &graph_path),
    );
    // Only a job that waits for others or that others wait for has a graph to draw.
    let graph = graph.ok().filter(|g| g.nodes.iter().any(|n| n.depth != 0));
    let runs = match runs {
        Ok(runs) => runs,
        Err(failure) => return refused(&console, &visitor, &name, failure),
    };
    let href = job.href();
    let definition = serde_json::to_string_pretty(&spec_only(value)).unwrap_or_default();
    let errors: Vec<&RunRecord> = runs
        .runs
        .iter()
        .filter(|r| r.error.is_some())
        .take(5)
        .collect();
    let body = html! {
        p.lead {
            (layout::state(&job.state)) " "
            (job.schedule_words()) " · " (job.target_kind()) " target · namespace "
            a href={ "/jobs?" (query(&[("namespace", &job.namespace)])) } { (job.namespace) }
            " · version " (job.version)
            " · " a href={ "/graph?" (query(&[("namespace", &job.namespace)])) } { "Graph" }
        }
        @if let Some(d) = &job.description { p { (d) } }
        @if visitor.may(Permission::Write) {
            div.actions {
                (post_button(&visitor, &format!("{href}/trigger"), "Trigger now", "primary"))
                @if job.state == "paused" {
                    (post_button(&visitor, &format!("{href}/resume"), "Resume", ""))
                } @else if job.state == "active" {
                    (post_button(&visitor, &format!("{href}/pause"), "Pause", ""))
                }
                a.button href={ (href) "/edit" } { "Edit" }
                a.button href={ "/jobs/new?" (query(&[("namespace", &job.namespace), ("clone", &job.name)])) } { "Clone" }
                (confirmed_button(&visitor, &format!("{href}/delete"), "Delete",
                    &format!("Delete job {}? Its runs stay in the history.", job.name)))
            }
        }
        div.columns {
            section aria-labelledby="stats" {
                h2 #stats { "Outcomes" }
                @match &stats {
                    Ok(stats) => {
                        dl.figures {
                            div { dt { "runs" } dd { (stats.runs) } }
                            div { dt { "succeeded" } dd.good { (stats.succeeded) } }
                            div { dt { "failed" } dd.bad { (stats.failed) } }
                            div { dt { "retries" } dd { (stats.retries) } }
                            div { dt { "lateness p50" } dd { (millis(stats.lateness_ms.p50)) } }
                            div { dt { "lateness p99" } dd { (millis(stats.lateness_ms.p99)) } }
                        }
                    }
                    Err(failure) => { (layout::refusal(&failure.message)) }
                }
            }
            section aria-labelledby="next" {
                h2 #next { "Next instants" }
                @match &preview {
                    Ok(p) if !p.outcomes.is_empty() => {
                        ol.instants { @for o in &p.outcomes { li {
                            (visitor.clock.exact(Some(o.at), job.zone()))
                            @if let Some(from) = o.moved_from { " · moved from " (visitor.clock.exact(Some(from), job.zone())) }
                            @if let Some(why) = &o.skipped { " · " span.none { "skipped: " (why) } }
                        } } }
                    }
                    Ok(p) if !p.fire_times.is_empty() => {
                        ol.instants { @for t in &p.fire_times { li { (visitor.clock.exact(Some(*t), job.zone())) } } }
                    }
                    Ok(_) if job.after.is_some() => {
                        p {
                            "Runs after each run of " (job.after.as_ref().map(|a| a.upstreams.join(", ")).unwrap_or_default()) "; "
                            @match job.next_instant() {
                                Some(t) => { "the upstream's next instant: " (visitor.clock.exact(Some(t), job.zone())) }
                                None => { "no upstream owes an instant" }
                            }
                        }
                    }
                    Ok(_) => { p.none { "none: " (if job.state == "paused" { "the job is paused" } else { "the schedule owes no more" }) } }
                    Err(failure) => { (layout::refusal(&failure.message)) }
                }
            }
        }
        @if let Some(graph) = &graph {
            section aria-labelledby="graph" {
                h2 #graph { "Dependencies" }
                p.hint {
                    "What it waits for (left) and what waits for it (right), three levels each way; "
                    "each box is coloured by its newest run. "
                    a href={ "/graph?" (query(&[("namespace", &job.namespace)])) } { "The whole namespace's graph" }
                }
                (super::graph::draw(&job.namespace, &graph.nodes, &graph.edges, Some(&job.name), &visitor.clock))
                @if graph.truncated { p.hint { "More jobs lie further away than shown." } }
            }
        }
        section aria-labelledby="chart" {
            h2 #chart { "Duration and lateness" }
            (chart(&runs.runs, visitor.clock.tz_of(job.zone())))
        }
        @if !errors.is_empty() {
            section aria-labelledby="errors" {
                h2 #errors { "Recent errors" }
                ul.errors {
                    @for run in errors {
                        li { a href={ "/runs/" (run.id) } { "run " (run.id) } " " (visitor.clock.when_of(run.finished_at, job.zone())) ": "
                            code { (run.error.as_deref().unwrap_or_default()) } }
                    }
                }
            }
        }
        section aria-labelledby="runs" {
            h2 #runs { "Runs" }
            (run_table(&runs.runs, &visitor.clock, job.zone()))
            nav.pager aria-label="Pages of runs" {
                @if !history.cursor.is_empty() { a href=(href) { "Newest runs" } }
                @if let Some(cursor) = &runs.next_cursor {
                    a rel="next" href={ (href) "?" (query(&[("cursor", cursor)])) } { "Older runs" }
                }
            }
        }
        section aria-labelledby="definition" {
            h2 #definition { "Definition" }
            pre.definition tabindex="0" { code { (definition) } }
        }
    };
    layout::page(&console, &visitor, &job.name, body)
}

/// Runs as a table: instant (in the visitor's zone, or the job's `zone`), how it came, state,
/// attempts, lateness and duration.
pub(super) fn run_table(runs: &[RunRecord], clock: &Clock, zone: Option<&str>) -> Markup {
    html! {
        @if runs.is_empty() {
            p.empty { "No runs yet." }
        } @else {
            div.table-wrap tabindex="0" {
                table.runs {
                    thead { tr {
                        th scope="col" { "Run" } th scope="col" { "Instant" } th scope="col" { "Trigger" }
                        th scope="col" { "State" } th scope="col" { "Attempts" }
                        th scope="col" { "Started late" } th scope="col" { "Duration" }
                    } }
                    tbody {
                        @for run in runs {
                            tr {
                                td { a href={ "/runs/" (run.id) } { (run.id) }
                                    @if let Some(shard) = run.shard { " (shard " (shard.index + 1) " of " (shard.count) ")" } }
                                td { (clock.exact(Some(run.scheduled_for), zone)) }
                                td { (run.trigger.as_str()) }
                                td { (layout::state(run.state.as_str())) }
                                td.num { (run.attempts) }
                                td.num { @if run.started_at.is_some() { (span(Some(run.scheduled_for), run.started_at)) } @else { "—" } }
                                td.num { (span(run.started_at, run.finished_at)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Duration and start lateness of runs by their instant, on one time axis and one value axis
/// (`console::chart`), each point titled with its figures.
/// `zone`: the zone its time axis reads in.
fn chart(runs: &[RunRecord], zone: chrono_tz::Tz) -> Markup {
    let mut duration = Vec::new();
    let mut lateness = Vec::new();
    for run in runs.iter().rev() {
        let (Some(started), Some(finished)) = (run.started_at, run.finished_at) else {
            continue;
        };
        let state = run.state.as_str();
        duration.push(Point {
            at: run.scheduled_for,
            value: (finished - started).num_milliseconds().max(0) as f64,
            class: state.to_string(),
            note: format!("run {}, {}", run.id, state.replace('_', " ")),
        });
        lateness.push(Point {
            at: run.scheduled_for,
            value: (started - run.scheduled_for).num_milliseconds().max(0) as f64,
            class: "lateness".to_string(),
            note: format!("run {}", run.id),
        });
    }
    let drawn = Chart {
        label: format!(
            "Duration and start lateness of the last {} finished runs, by instant",
            duration.len()
        ),
        value_axis: "duration · start lateness".into(),
        time_axis: "instant".into(),
        unit: Unit::Millis,
        zone,
        series: vec![
            Series {
                name: "duration".into(),
                class: "duration".into(),
                mark: Mark::Line,
                points: duration,
            },
            Series {
                name: "start lateness".into(),
                class: "lateness".into(),
                mark: Mark::Line,
                points: lateness,
            },
        ],
    };
    chart::render(&drawn).unwrap_or_else(|| html! { p.empty { "No finished runs to draw yet." } })
}

/// Trigger, pause, resume or delete, then back to the job (or its list, once deleted).
pub async fn action(
    State(console): State<Console>,
    visitor: Visitor,
    Path((namespace, name, action)): Path<(String, String, String)>,
    Form(form): Form<CsrfOnly>,
) -> Response {
    if let Err(turned) = console.check_csrf(&visitor, &form.csrf) {
        return turned.into_response();
    }
    let (method, rest) = match action.as_str() {
        "trigger" => (Method::POST, "/trigger"),
        "pause" => (Method::POST, "/pause"),
        "resume" => (Method::POST, "/resume"),
        "delete" => (Method::DELETE, ""),
        _ => {
            let failure = Failure {
                status: axum::http::StatusCode::NOT_FOUND,
                code: "not_found".into(),
                message: format!("a job has no action {action:?}"),
                field: None,
            };
            return refused(&console, &visitor, &name, failure);
        }
    };
    let path = api_path(&namespace, &name, rest, &[]);
    let done = console
        .api
        .call::<serde_json::Value>(visitor.who(), method, &path, None)
        .await;
    match done {
        Err(failure) => refused(&console, &visitor, &name, failure),
        Ok(answer) => {
            let to = match action.as_str() {
                "delete" => format!("/jobs?{}", query(&[("namespace", &namespace)])),
                "trigger" => match answer.get("id").and_then(|id| id.as_i64()) {
                    Some(id) => format!("/runs/{id}"),
                    None => super::job_href(&namespace, &name),
                },
                _ => super::job_href(&namespace, &name),
            };
            visitor.finish(&console, Redirect::to(&to).into_response())
        }
    }
}

//! One job: its definition, its next instants, its runs with a chart of their duration and
//! lateness, its recent errors, and the actions the visitor's token may take on it.

use super::{refused, CsrfOnly, JobRow};
use crate::console::api::{query, segment, As, Failure};
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
    nodes: Vec<GraphNode>,
    #[serde(default)]
    truncated: bool,
}

#[derive(Deserialize)]
struct GraphNode {
    name: String,
    depth: i32,
    state: Option<String>,
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
    let mut around: Vec<&GraphNode> = graph
        .as_ref()
        .map(|g| g.nodes.iter().filter(|n| n.depth != 0).collect())
        .unwrap_or_default();
    around.sort_by_key(|n| (n.depth, n.name.as_str()));
    let truncated = graph.as_ref().is_ok_and(|g| g.truncated);
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
        @if !around.is_empty() {
            section aria-labelledby="graph" {
                h2 #graph { "Dependencies" }
                ul.graph {
                    @for n in &around {
                        li {
                            @if n.depth < 0 { "waits for " } @else { "awaited by " }
                            a href=(super::job_href(&job.namespace, &n.name)) { (n.name) }
                            @match &n.state { Some(state) => { " " (layout::state(state)) }, None => { " (deleted)" } }
                            @if n.depth.abs() > 1 { span.sub { " · " (n.depth.abs()) " levels away" } }
                        }
                    }
                }
                @if truncated { p.hint { "More jobs lie further away than shown." } }
            }
        }
        section aria-labelledby="chart" {
            h2 #chart { "Duration and lateness" }
            (chart(&runs.runs))
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

/// Width and height of the chart's drawing, in its own units (it scales to the page).
const CHART_W: f64 = 600.0;
const CHART_H: f64 = 160.0;

/// Duration (bars, coloured by outcome) and start lateness (a line) of runs, oldest on the
/// left, each scaled to its own largest value. Drawn here as SVG: no script, no library.
fn chart(runs: &[RunRecord]) -> Markup {
    let points: Vec<(f64, f64, &str)> = runs
        .iter()
        .rev()
        .filter_map(|run| {
            let started = run.started_at?;
            let duration = run
                .finished_at
                .map(|f| (f - started).num_milliseconds().max(0) as f64)?;
            let late = (started - run.scheduled_for).num_milliseconds().max(0) as f64;
            Some((duration, late, run.state.as_str()))
        })
        .collect();
    if points.is_empty() {
        return html! { p.empty { "No finished runs to draw yet." } };
    }
    let most = |f: fn(&(f64, f64, &str)) -> f64| points.iter().map(f).fold(1.0, f64::max);
    let (longest, latest) = (most(|p| p.0), most(|p| p.1));
    // At least 20 slots, so that a handful of runs are bars, not blocks.
    let step = CHART_W / points.len().max(20) as f64;
    let line: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let x = step * (i as f64 + 0.5);
            let y = CHART_H - p.1 / latest * (CHART_H - 4.0) - 2.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (CHART_W) " " (CHART_H) } role="img"
                aria-label={ "Duration of the last " (points.len()) " finished runs, longest " (millis(longest)) "; start lateness, largest " (millis(latest)) } {
                @for (i, p) in points.iter().enumerate() {
                    @let h = (p.0 / longest * (CHART_H - 4.0)).max(1.0);
                    rect class={ "bar " (p.2) } x=(format!("{:.1}", step * i as f64 + step * 0.1))
                        y=(format!("{:.1}", CHART_H - h)) width=(format!("{:.1}", step * 0.8)) height=(format!("{h:.1}")) {
                        title { (p.2) ", " (millis(p.0)) ", started " (millis(p.1)) " late" }
                    }
                }
                polyline.lateness points=(line.join(" ")) {}
            }
            figcaption {
                span.key.duration { "duration" } " (bars, up to " (millis(longest)) ") · "
                span.key.lateness { "start lateness" } " (line, up to " (millis(latest)) ")"
            }
        }
    }
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

//! One run: its attempts (worker, exit code, timings), its trace as a timeline of spans (from
//! the ledger, so it needs no tracing backend; linked to the backend's view when the server
//! exports traces with `--trace-link`), and the output of its latest attempt, followed live
//! while the run is not over (`console.js` reads `/runs/{id}/output`, which is the API's log
//! passed through as the visitor).

use super::{job_href, refused, CsrfOnly};
use crate::console::api::query;
use crate::console::layout::{self, millis, span};
use crate::console::{Console, Visitor};
use crate::traces::TraceView;
use axum::extract::{Path, Query, State};
use axum::http::Method;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;
use serde::Deserialize;
use sked_core::auth::Permission;
use sked_core::records::{AttemptRecord, RunRecord};

#[derive(Deserialize)]
struct RunView {
    #[serde(flatten)]
    run: RunRecord,
    lateness_ms: f64,
    attempt_history: Vec<AttemptRecord>,
    #[serde(default)]
    waiting_for_workers: Option<String>,
    trace: TraceView,
}

/// Width of the timeline's drawing, in its own units (the SVG scales to its cell).
const TIMELINE_WIDTH: f64 = 1000.0;

/// The run's spans, one row each: its name, a bar placed on the run's span of time, and how
/// long it took; the trace id, linked when the server knows where the backend shows it.
fn timeline(trace: &TraceView) -> maud::Markup {
    let from = trace.spans.iter().map(|s| s.start).min();
    let to = trace.spans.iter().map(|s| s.end).max();
    let (Some(from), Some(to)) = (from, to) else {
        return html! {};
    };
    let whole = (to - from).num_microseconds().unwrap_or(0).max(1) as f64;
    let at = |t: sked_core::Instant| {
        (t - from).num_microseconds().unwrap_or(0) as f64 / whole * TIMELINE_WIDTH
    };
    html! {
        h2 #trace-title { "Trace" }
        @if let Some(id) = &trace.trace_id {
            p { "trace id "
                @if let Some(link) = &trace.link { a href=(link) { code { (id) } } }
                @else { code { (id) } } }
        }
        div.table-wrap tabindex="0" {
            table.timeline aria-labelledby="trace-title" {
                thead { tr { th scope="col" { "Span" } th scope="col" { "When" } th scope="col" { "Took" } } }
                tbody {
                    @for s in &trace.spans {
                        @let (x, end) = (at(s.start), at(s.end));
                        tr {
                            td.depth[s.depth > 0] { (s.name) }
                            td.bar-cell {
                                svg viewBox=(format!("0 0 {TIMELINE_WIDTH} 10")) preserveAspectRatio="none"
                                    role="img" aria-label=(format!("{} from {} to {}", s.name, s.start, s.end)) {
                                    rect.span.failed[s.error.is_some()] x=(format!("{x:.1}")) y="1"
                                        width=(format!("{:.1}", (end - x).max(2.0))) height="8" {}
                                }
                            }
                            td.num { (span(Some(s.start), Some(s.end))) }
                        }
                    }
                }
            }
        }
    }
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Path(id): Path<i64>,
) -> Response {
    let title = format!("Run {id}");
    let view: RunView = match console
        .api
        .get(visitor.who(), &format!("/api/v1/runs/{id}"))
        .await
    {
        Ok(view) => view,
        Err(failure) => return refused(&console, &visitor, &title, failure),
    };
    let run = &view.run;
    let over = run.state.is_terminal();
    let output = console
        .api
        .raw(
            visitor.who(),
            Method::GET,
            &format!("/api/v1/runs/{id}/log"),
            None,
        )
        .await;
    let output = if output.status().is_success() {
        axum::body::to_bytes(output.into_body(), 16 * 1024 * 1024)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    let body = html! {
        p.lead {
            (layout::state(run.state.as_str())) " · job "
            a href=(job_href(&run.namespace, &run.job)) { (run.job) }
            @if let Some(shard) = run.shard { " · shard " (shard.index + 1) " of " (shard.count) }
            " · " (run.trigger.as_str())
        }
        @if visitor.may(Permission::Write) && !over {
            div.actions {
                (layout::confirmed_button(&visitor, &format!("/runs/{id}/cancel"), "Cancel run",
                    &format!("Cancel run {id}?")))
            }
        }
        dl.figures {
            div { dt { "instant" } dd { (visitor.clock.exact(Some(run.scheduled_for), None)) } }
            @if let Some(nominal) = run.nominal_for {
                div { dt { "moved from" } dd { (visitor.clock.exact(Some(nominal), None)) } }
            }
            div { dt { "started" } dd { (visitor.clock.when(run.started_at)) } }
            div { dt { "finished" } dd { (visitor.clock.when(run.finished_at)) } }
            div { dt { "fired late" } dd { (millis(view.lateness_ms)) } }
            div { dt { "duration" } dd { (span(run.started_at, run.finished_at)) } }
            div { dt { "attempts" } dd { (run.attempts) } }
            @if let Some(deadline) = run.deadline {
                @if let Some(at) = deadline.start_by { div { dt { "start by" } dd { (visitor.clock.when(Some(at))) } } }
                @if let Some(at) = deadline.finish_by { div { dt { "finish by" } dd { (visitor.clock.when(Some(at))) } } }
                @if let Some(max) = deadline.max_duration { div { dt { "max duration" } dd { (max.to_string()) } } }
            }
        }
        @for miss in &run.deadline_missed {
            p.error { "missed its " (miss.kind.as_str()) " by " (millis(miss.by_ms as f64)) }
        }
        @if let Some(risk) = run.at_risk {
            p.notice { "called at risk of missing its finish_by at " (visitor.clock.when(Some(risk.at)))
                @if let Some(end) = risk.estimated_finish { ", expected to end at " (visitor.clock.when(Some(end))) } }
        }
        @if let Some(reason) = run.skip_reason { p.notice { "skipped: " (reason.as_str()) } }
        @if let Some(error) = &run.error { p.error { (error) } }
        @if let Some(waiting) = &view.waiting_for_workers { p.notice { (waiting) } }
        @if let Some(reason) = &run.waiting_reason { p.notice { "waiting: " (reason.as_str())
            @if !run.waiting_for.is_empty() { " for " (run.waiting_for.join(", ")) } } }
        h2 { "Attempts" }
        @if view.attempt_history.is_empty() {
            p.empty { "No attempt yet." }
        } @else {
            div.table-wrap tabindex="0" {
                table.attempts {
                    thead { tr {
                        th scope="col" { "#" } th scope="col" { "Worker" } th scope="col" { "State" }
                        th scope="col" { "Started" } th scope="col" { "Duration" }
                        th scope="col" { "Exit code" } th scope="col" { "HTTP" } th scope="col" { "Output" } th scope="col" { "Error" }
                    } }
                    tbody {
                        @for a in &view.attempt_history {
                            tr {
                                td.num { (a.number) }
                                td { code { (a.worker_id) } }
                                td { (layout::state(a.state.as_str())) }
                                td { (visitor.clock.when(Some(a.started_at))) }
                                td.num { (span(Some(a.started_at), a.finished_at)) }
                                td.num { (a.exit_code.map(|c| c.to_string()).unwrap_or_default()) }
                                td.num { (a.http_status.map(|c| c.to_string()).unwrap_or_default()) }
                                td.num { (a.output_bytes) " B" @if a.output_truncated { " (cut)" } }
                                td { (a.error.as_deref().unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
        (timeline(&view.trace))
        h2 #output-title { "Output" @if !over { " " span.badge.busy #live { "live" } } }
        pre.output #output tabindex="0" aria-labelledby="output-title" aria-live="polite"
            data-follow=[(!over).then(|| format!("/runs/{id}/output?{}", query(&[("follow", "true")])))]
            data-offset=(output.len()) { (output) }
    };
    layout::page(&console, &visitor, &format!("Run {id}"), body)
}

#[derive(Debug, Default, Deserialize)]
pub struct Follow {
    #[serde(default)]
    follow: bool,
}

/// The latest attempt's output as text; with `follow=true` it streams until the run ends (the
/// API's `GET /runs/{id}/log`, with its bound on follows at once).
pub async fn output(
    State(console): State<Console>,
    visitor: Visitor,
    Path(id): Path<i64>,
    Query(f): Query<Follow>,
) -> Response {
    let path = format!(
        "/api/v1/runs/{id}/log?{}",
        query(&[("follow", if f.follow { "true" } else { "" })])
    );
    let response = console
        .api
        .raw(visitor.who(), Method::GET, &path, None)
        .await;
    visitor.finish(&console, response)
}

pub async fn cancel(
    State(console): State<Console>,
    visitor: Visitor,
    Path(id): Path<i64>,
    Form(form): Form<CsrfOnly>,
) -> Response {
    if let Err(turned) = console.check_csrf(&visitor, &form.csrf) {
        return turned.into_response();
    }
    let path = format!("/api/v1/runs/{id}/cancel");
    match console
        .api
        .call::<serde_json::Value>(visitor.who(), Method::POST, &path, None)
        .await
    {
        Ok(_) => visitor.finish(
            &console,
            Redirect::to(&format!("/runs/{id}")).into_response(),
        ),
        Err(failure) => refused(&console, &visitor, &format!("Run {id}"), failure),
    }
}

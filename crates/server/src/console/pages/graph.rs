//! The dependency graph: the page of a namespace's pipelines (`/graph`, from
//! `GET /api/v1/graph`) and the drawing of a graph as SVG that a job's page shares (its own
//! graph, from `GET /api/v1/jobs/{name}/graph`). Where each job goes is `console::dag`'s; this
//! module only turns the API's nodes into boxes, links and colours. It must not read the store
//! or call the API for anything but the graph.

use super::{chosen, refused};
use crate::console::api::query;
use crate::console::clock::Clock;
use crate::console::dag::{self, NODE_H, NODE_W};
use crate::console::layout;
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;
use sked_core::Instant;
use std::collections::BTreeMap;

/// Jobs the namespace's graph shows at most.
const JOBS: u32 = 300;

#[derive(Debug, Default, Deserialize)]
pub struct Params {
    #[serde(default)]
    namespace: String,
}

/// A job's newest run, as a graph's node has it.
#[derive(Debug, Deserialize)]
pub struct LastRun {
    pub id: i64,
    pub state: String,
    #[serde(default)]
    pub finished_at: Option<Instant>,
}

/// A job of a graph, as the API returns it.
#[derive(Debug, Deserialize)]
pub struct Node {
    pub name: String,
    /// Levels from the job a job's graph is drawn around (0 on the namespace's graph).
    #[serde(default)]
    pub depth: i32,
    /// `None` for a job deleted with `force` that others still name.
    pub state: Option<String>,
    #[serde(default)]
    pub last_run: Option<LastRun>,
    #[serde(default)]
    pub next_fire_at: Option<Instant>,
}

#[derive(Debug, Deserialize)]
pub struct Edge {
    pub upstream: String,
    pub job: String,
}

#[derive(Debug, Deserialize)]
struct NamespaceGraph {
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    #[serde(default)]
    truncated: bool,
}

/// The tone of a run's state, as its badge has it (`layout::state`).
fn tone(state: Option<&str>) -> &'static str {
    match state {
        Some("succeeded") => "good",
        Some("failed" | "timed_out") => "bad",
        Some("running" | "queued" | "waiting") => "busy",
        _ => "quiet",
    }
}

/// A name cut to fit its box.
fn fitted(name: &str, most: usize) -> String {
    if name.chars().count() <= most {
        name.to_string()
    } else {
        let mut cut: String = name.chars().take(most.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// What a node says of its job under its name: its newest run's state, then that it is
/// paused or when it runs next.
fn status(node: &Node) -> String {
    let run = match (&node.state, &node.last_run) {
        (None, _) => return "deleted".into(),
        (_, Some(run)) => run.state.replace('_', " "),
        (_, None) => "no runs".into(),
    };
    match (node.state.as_deref(), node.next_fire_at) {
        (Some("paused"), _) => format!("{run} · paused"),
        (_, Some(next)) => format!("{run} · next {}", next.format("%m-%d %H:%M")),
        _ => run,
    }
}

/// The whole of what a node tells, for its title and the list.
fn told(node: &Node) -> String {
    let mut text = node.name.clone();
    match &node.state {
        None => text.push_str(", deleted"),
        Some(state) => {
            text.push_str(&format!(", {state}"));
            match &node.last_run {
                Some(run) => {
                    text.push_str(&format!(
                        ", newest run {} {}",
                        run.id,
                        run.state.replace('_', " ")
                    ));
                    if let Some(end) = run.finished_at {
                        text.push_str(&format!(" at {} UTC", end.format("%Y-%m-%d %H:%M:%S")));
                    }
                }
                None => text.push_str(", no runs yet"),
            }
            if let Some(next) = node.next_fire_at {
                text.push_str(&format!(", next {} UTC", next.format("%Y-%m-%d %H:%M:%S")));
            }
        }
    }
    text
}

fn f(v: f64) -> String {
    format!("{v:.1}")
}

/// An edge's route as an SVG path: a curve between layers, straight across a placeholder.
fn path(points: &[dag::Point]) -> String {
    let mut d = String::new();
    for (i, p) in points.iter().enumerate() {
        if i == 0 {
            d.push_str(&format!("M{} {}", f(p.x), f(p.y)));
        } else if i % 2 == 1 {
            let from = points[i - 1];
            let bend = (p.x - from.x) / 2.0;
            d.push_str(&format!(
                " C{} {} {} {} {} {}",
                f(from.x + bend),
                f(from.y),
                f(p.x - bend),
                f(p.y),
                f(p.x),
                f(p.y)
            ));
        } else {
            d.push_str(&format!(" L{} {}", f(p.x), f(p.y)));
        }
    }
    d
}

/// The graph of `nodes` and `edges` of `namespace` as SVG, upstreams on the left, with the
/// same as a list for those who do not see it. `current` is the job a job's page is about.
pub fn draw(
    namespace: &str,
    nodes: &[Node],
    edges: &[Edge],
    current: Option<&str>,
    clock: &Clock,
) -> Markup {
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let index: BTreeMap<&str, usize> = sorted
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let pairs: Vec<(usize, usize)> = edges
        .iter()
        .filter_map(|e| {
            Some((
                *index.get(e.upstream.as_str())?,
                *index.get(e.job.as_str())?,
            ))
        })
        .collect();
    let laid = dag::layout(sorted.len(), &pairs);
    let shown = laid.boxes.iter().flatten().count();
    let href = |name: &str| super::job_href(namespace, name);
    let waits_for = |name: &str| -> Vec<&str> {
        edges
            .iter()
            .filter(|e| e.job == name)
            .map(|e| e.upstream.as_str())
            .collect()
    };
    html! {
        div.graph-wrap {
            svg.dag xmlns="http://www.w3.org/2000/svg" width=(f(laid.width)) height=(f(laid.height))
                viewBox={ "0 0 " (f(laid.width)) " " (f(laid.height)) } role="group"
                aria-label={ "Dependency graph of " (shown) " jobs; upstreams on the left" } {
                defs {
                    marker #dag-arrow viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto" {
                        path d="M0 0 L8 4 L0 8 z" {}
                    }
                }
                g.edges {
                    @for (_, route) in &laid.routes {
                        path d=(path(route)) marker-end="url(#dag-arrow)" {}
                    }
                }
                @for (i, node) in sorted.iter().enumerate() {
                    @if let Some(at) = laid.boxes[i] {
                        @let run_state = node.last_run.as_ref().map(|r| r.state.as_str());
                        @let class = format!("node {}{}{}", tone(run_state),
                            if Some(node.name.as_str()) == current { " current" } else { "" },
                            if node.state.is_none() { " deleted" } else { "" });
                        a href=(href(&node.name)) class=(class) data-job=(node.name) data-run-state=[run_state] {
                            title { (told(node)) }
                            rect x=(f(at.x)) y=(f(at.y)) width=(f(NODE_W)) height=(f(NODE_H)) rx="6" {}
                            text.name x=(f(at.x + 10.0)) y=(f(at.y + 18.0)) { (fitted(&node.name, 26)) }
                            text.status x=(f(at.x + 10.0)) y=(f(at.y + 35.0)) { (status(node)) }
                        }
                    }
                }
            }
        }
        @if shown < sorted.len() {
            p.hint { "Only " (shown) " of " (sorted.len()) " jobs are drawn." }
        }
        details.graph-list {
            summary { "The graph as a list" }
            ul.graph {
                @for node in &sorted {
                    li {
                        a href=(href(&node.name)) { (node.name) }
                        @match &node.state {
                            Some(_) => {
                                " "
                                @match &node.last_run {
                                    Some(run) => { a href={ "/runs/" (run.id) } { (layout::state(&run.state)) } }
                                    None => { span.none { "no runs" } }
                                }
                                @if node.state.as_deref() == Some("paused") { " · paused" }
                                @if let Some(next) = node.next_fire_at { " · next " (clock.when(Some(next))) }
                            }
                            None => { " (deleted)" }
                        }
                        @let ups = waits_for(&node.name);
                        @if !ups.is_empty() { span.sub { " · waits for " (ups.join(", ")) } }
                    }
                }
            }
        }
    }
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(p): Query<Params>,
) -> Response {
    let (namespace, known) = chosen(&console, &visitor, &p.namespace).await;
    let limit = JOBS.to_string();
    let path = format!(
        "/api/v1/graph?{}",
        query(&[("namespace", &namespace), ("limit", &limit)])
    );
    let graph: NamespaceGraph = match console.api.get(visitor.who(), &path).await {
        Ok(graph) => graph,
        Err(failure) => return refused(&console, &visitor, "Dependency graph", failure),
    };
    let body = html! {
        form.filters method="get" action="/graph" {
            label { "Namespace "
                select name="namespace" {
                    @for ns in &known {
                        option value=(ns) selected[*ns == namespace] { (ns) }
                    }
                }
            }
            button type="submit" { "Show" }
            a.button href={ "/jobs?" (query(&[("namespace", &namespace)])) } { "Jobs" }
        }
        @if graph.nodes.is_empty() {
            p.empty { "No job of this namespace waits for another." }
        } @else {
            p.lead {
                (graph.nodes.len()) " jobs that wait for others or that others wait for, "
                (graph.edges.len()) " dependencies. Each box is coloured by its newest run."
            }
            @if graph.truncated {
                p.hint role="status" { "The namespace has more: only the first " (JOBS) " jobs (by the upstreams' names) are shown." }
            }
            (draw(&namespace, &graph.nodes, &graph.edges, None, &visitor.clock))
        }
    };
    layout::page(&console, &visitor, "Dependency graph", body)
}

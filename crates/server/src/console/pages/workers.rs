//! The workers that may run the visitor's namespaces: labels, slots, load, heartbeat, state
//! (a clean stop is `stopped`, not lost); the nodes' broker publishers apart from them. A page
//! at a time (the API bounds each page in count and bytes), each worker's labels cut to the
//! first few, so a large fleet or a worker with many labels never makes the page fail.

use super::refused;
use crate::console::api::query;
use crate::console::layout;
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use sked_core::records::WorkerRecord;

/// Workers per page.
const PAGE: u32 = 100;
/// Labels shown per worker; the rest are counted.
const LABELS_SHOWN: usize = 12;

#[derive(Deserialize)]
pub struct Filters {
    #[serde(default)]
    cursor: String,
}

#[derive(Deserialize)]
struct WorkerList {
    workers: Vec<Worker>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Worker {
    #[serde(flatten)]
    worker: WorkerRecord,
    #[serde(default)]
    load: Option<Load>,
}

#[derive(Deserialize)]
struct Load {
    stall: u32,
    overloaded: bool,
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(f): Query<Filters>,
) -> Response {
    let limit = PAGE.to_string();
    let path = format!(
        "/api/v1/workers?{}",
        query(&[("limit", &limit), ("cursor", &f.cursor)])
    );
    let list: WorkerList = match console.api.get(visitor.who(), &path).await {
        Ok(list) => list,
        Err(failure) => return refused(&console, &visitor, "Workers", failure),
    };
    // A node's broker publisher is no worker process: its slots are messages in flight, so it
    // is shown apart and counted in no worker pool.
    let (publishers, workers): (Vec<&Worker>, Vec<&Worker>) =
        list.workers.iter().partition(|w| w.worker.publisher);
    let next = list
        .next_cursor
        .as_deref()
        .map(|cursor| format!("/workers?{}", query(&[("cursor", cursor)])));
    let body = html! {
        @if workers.is_empty() && f.cursor.is_empty() {
            p.empty { "No worker has registered. Start one with " code { "sked worker" } "." }
        } @else {
            div.table-wrap tabindex="0" { table.workers {
                thead { tr {
                    th scope="col" { "Worker" } th scope="col" { "Labels" } th scope="col" { "Namespaces" }
                    th scope="col" { "Slots busy" } th scope="col" { "Stall" } th scope="col" { "Last heartbeat" }
                    th scope="col" { "State" }
                } }
                tbody { @for w in &workers { tr {
                    td { (w.worker.name) div.sub { code { (w.worker.id) } } }
                    td {
                        @for (k, v) in w.worker.labels.iter().take(LABELS_SHOWN) { span.label { (k) "=" (v) } " " }
                        @if w.worker.labels.len() > LABELS_SHOWN {
                            span.sub { "and " (w.worker.labels.len() - LABELS_SHOWN) " more" }
                        }
                    }
                    td { (w.worker.namespaces.join(", ")) }
                    td.num { (w.worker.running) " / " (w.worker.slots) }
                    td.num { @match &w.load { Some(l) => { (l.stall) @if l.overloaded { " (held back)" } }, None => { "—" } } }
                    td { (visitor.clock.when(Some(w.worker.last_heartbeat_at))) }
                    td { (layout::state(w.worker.state.as_str())) }
                } } }
            } }
        }
        @if !publishers.is_empty() {
            section aria-labelledby="publishers" {
                h2 #publishers { "Broker publishers" }
                p.hint { "Each server node with broker connections publishes broker targets itself; these are not workers, and their runs are not counted in the workers' slots." }
                div.table-wrap tabindex="0" { table.publishers {
                    thead { tr {
                        th scope="col" { "Publisher" } th scope="col" { "Publishing" }
                        th scope="col" { "Last heartbeat" } th scope="col" { "State" }
                    } }
                    tbody { @for w in &publishers { tr {
                        td { (w.worker.name) div.sub { code { (w.worker.id) } } }
                        td.num { (w.worker.running) }
                        td { (visitor.clock.when(Some(w.worker.last_heartbeat_at))) }
                        td { (layout::state(w.worker.state.as_str())) }
                    } } }
                } }
            }
        }
        nav.pager aria-label="Pages" {
            @if !f.cursor.is_empty() {
                a href="/workers" { "First page" }
            }
            @if let Some(next) = next { a rel="next" href=(next) { "Next page" } }
        }
    };
    layout::page(&console, &visitor, "Workers", body)
}

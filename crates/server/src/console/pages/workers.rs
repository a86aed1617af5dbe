//! The workers that may run the visitor's namespaces: labels, slots, load, heartbeat.

use super::refused;
use crate::console::layout::{self, when};
use crate::console::{Console, Visitor};
use axum::extract::State;
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use sked_core::records::WorkerRecord;

#[derive(Deserialize)]
struct WorkerList {
    workers: Vec<Worker>,
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

pub async fn page(State(console): State<Console>, visitor: Visitor) -> Response {
    let list: WorkerList = match console
        .api
        .get(visitor.who(), "/api/v1/workers?limit=1000")
        .await
    {
        Ok(list) => list,
        Err(failure) => return refused(&console, &visitor, "Workers", failure),
    };
    let body = html! {
        @if list.workers.is_empty() {
            p.empty { "No worker has registered. Start one with " code { "sked worker" } "." }
        } @else {
            div.table-wrap { table.workers {
                thead { tr {
                    th scope="col" { "Worker" } th scope="col" { "Labels" } th scope="col" { "Namespaces" }
                    th scope="col" { "Slots busy" } th scope="col" { "Stall" } th scope="col" { "Last heartbeat" }
                    th scope="col" { "State" }
                } }
                tbody { @for w in &list.workers { tr {
                    td { (w.worker.name) div.sub { code { (w.worker.id) } } }
                    td { @for (k, v) in &w.worker.labels { span.label { (k) "=" (v) } " " } }
                    td { (w.worker.namespaces.join(", ")) }
                    td.num { (w.worker.running) " / " (w.worker.slots) }
                    td.num { @match &w.load { Some(l) => { (l.stall) @if l.overloaded { " (held back)" } }, None => { "—" } } }
                    td { (when(Some(w.worker.last_heartbeat_at))) }
                    td { (layout::state(if !w.worker.alive { "lost" } else if w.worker.draining { "draining" } else { "active" })) }
                } } }
            } }
        }
    };
    layout::page(&console, &visitor, "Workers", body)
}

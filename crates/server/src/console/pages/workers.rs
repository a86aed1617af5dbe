//! The workers that may run the visitor's namespaces: labels, slots, load, heartbeat, state
//! (a clean stop is `stopped`, not lost); the nodes' broker publishers apart from them.

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
    // A node's broker publisher is no worker process: its slots are messages in flight, so it
    // is shown apart and counted in no worker pool.
    let (publishers, workers): (Vec<&Worker>, Vec<&Worker>) =
        list.workers.iter().partition(|w| w.worker.publisher);
    let body = html! {
        @if workers.is_empty() {
            p.empty { "No worker has registered. Start one with " code { "sked worker" } "." }
        } @else {
            div.table-wrap { table.workers {
                thead { tr {
                    th scope="col" { "Worker" } th scope="col" { "Labels" } th scope="col" { "Namespaces" }
                    th scope="col" { "Slots busy" } th scope="col" { "Stall" } th scope="col" { "Last heartbeat" }
                    th scope="col" { "State" }
                } }
                tbody { @for w in &workers { tr {
                    td { (w.worker.name) div.sub { code { (w.worker.id) } } }
                    td { @for (k, v) in &w.worker.labels { span.label { (k) "=" (v) } " " } }
                    td { (w.worker.namespaces.join(", ")) }
                    td.num { (w.worker.running) " / " (w.worker.slots) }
                    td.num { @match &w.load { Some(l) => { (l.stall) @if l.overloaded { " (held back)" } }, None => { "—" } } }
                    td { (when(Some(w.worker.last_heartbeat_at))) }
                    td { (layout::state(w.worker.state.as_str())) }
                } } }
            } }
        }
        @if !publishers.is_empty() {
            section aria-labelledby="publishers" {
                h2 #publishers { "Broker publishers" }
                p.hint { "Each server node with broker connections publishes broker targets itself; these are not workers, and their runs are not counted in the workers' slots." }
                div.table-wrap { table.publishers {
                    thead { tr {
                        th scope="col" { "Publisher" } th scope="col" { "Publishing" }
                        th scope="col" { "Last heartbeat" } th scope="col" { "State" }
                    } }
                    tbody { @for w in &publishers { tr {
                        td { (w.worker.name) div.sub { code { (w.worker.id) } } }
                        td.num { (w.worker.running) }
                        td { (when(Some(w.worker.last_heartbeat_at))) }
                        td { (layout::state(w.worker.state.as_str())) }
                    } } }
                } }
            }
        }
    };
    layout::page(&console, &visitor, "Workers", body)
}

//! One search box for everything the visitor may read (`/search?q=`, the header's box, `/`
//! on the keyboard): jobs by name or description in each namespace they see, a run by its
//! id, workers by name, id or label, and audit entries about an object of that name. Each kind is
//! one bounded API call (the namespaces asked are bounded too), so a search costs the same
//! however much the store holds, and finds only what the visitor's token may read.

use super::{job_href, namespaces};
use crate::console::api::query;
use crate::console::layout::{self, refusal};
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use sked_core::records::{AuditRecord, RunRecord, WorkerRecord};

/// Longest search taken.
const MAX_QUERY: usize = 200;
/// Namespaces searched for jobs, and jobs shown of each.
const NAMESPACES_SEARCHED: usize = 20;
const JOBS_SHOWN: &str = "20";
/// Workers read to match against, and shown.
const WORKERS_READ: &str = "1000";
const WORKERS_SHOWN: usize = 20;

#[derive(Debug, Default, Deserialize)]
pub struct Asked {
    #[serde(default)]
    q: String,
}

#[derive(Deserialize)]
struct JobPage {
    jobs: Vec<super::JobRow>,
}

#[derive(Deserialize)]
struct WorkerList {
    workers: Vec<WorkerRecord>,
}

#[derive(Deserialize)]
struct AuditPage {
    entries: Vec<AuditRecord>,
}

/// A search as it is run: trimmed, or why it is not run.
fn searched(q: &str) -> Result<&str, String> {
    let q = q.trim();
    if q.chars().count() > MAX_QUERY {
        return Err(format!("a search is at most {MAX_QUERY} characters"));
    }
    Ok(q)
}

/// Whether worker `w` matches `q`: its id, or one of its labels (`key=value`, or either part).
fn worker_matches(w: &WorkerRecord, q: &str) -> bool {
    let q = q.to_lowercase();
    w.id.to_lowercase().contains(&q)
        || w.name.to_lowercase().contains(&q)
        || w.labels.iter().any(|(key, value)| {
            key.to_lowercase().contains(&q)
                || value.to_lowercase().contains(&q)
                || format!("{key}={value}").to_lowercase() == q
        })
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(asked): Query<Asked>,
) -> Response {
    let q = match searched(&asked.q) {
        Ok(q) => q,
        Err(message) => {
            let body = html! { (refusal(&message)) };
            let mut response = layout::page(&console, &visitor, "Search", body);
            *response.status_mut() = axum::http::StatusCode::BAD_REQUEST;
            return response;
        }
    };
    if q.is_empty() {
        let body = html! { p.empty { "Type a job's name, a run's id, a worker or a label in the search box above." } };
        return layout::page(&console, &visitor, "Search", body);
    }
    let who = visitor.who();
    let known = namespaces(&console, &visitor).await;
    let searched_namespaces = &known[..known.len().min(NAMESPACES_SEARCHED)];
    let job_searches = searched_namespaces.iter().map(|namespace| {
        let path = format!(
            "/api/v1/jobs?{}",
            query(&[
                ("namespace", namespace),
                ("search", q),
                ("limit", JOBS_SHOWN)
            ])
        );
        let console = &console;
        async move { console.api.get::<JobPage>(who, &path).await }
    });
    let run = async {
        match q.parse::<i64>() {
            Ok(id) if id > 0 => console
                .api
                .get::<RunRecord>(who, &format!("/api/v1/runs/{id}"))
                .await
                .ok(),
            _ => None,
        }
    };
    let workers_path = format!("/api/v1/workers?{}", query(&[("limit", WORKERS_READ)]));
    let audit_path = format!(
        "/api/v1/audit?{}",
        query(&[("object", q), ("limit", JOBS_SHOWN)])
    );
    let (jobs, run, workers, audit) = tokio::join!(
        futures_util::future::join_all(job_searches),
        run,
        console.api.get::<WorkerList>(who, &workers_path),
        console.api.get::<AuditPage>(who, &audit_path),
    );
    let jobs: Vec<super::JobRow> = jobs
        .into_iter()
        .filter_map(Result::ok)
        .flat_map(|page| page.jobs)
        .collect();
    let workers: Vec<WorkerRecord> = workers
        .map(|list| list.workers)
        .unwrap_or_default()
        .into_iter()
        .filter(|w| worker_matches(w, q))
        .take(WORKERS_SHOWN)
        .collect();
    let audit = audit.map(|page| page.entries).unwrap_or_default();
    let found = jobs.len() + usize::from(run.is_some()) + workers.len() + audit.len();
    let body = html! {
        p.lead { (found) " found for " q { (q) } }
        @if let Some(run) = &run {
            section aria-labelledby="found-run" {
                h2 #found-run { "Run" }
                p { a href={ "/runs/" (run.id) } { "Run " (run.id) } " of "
                    a href=(job_href(&run.namespace, &run.job)) { (run.namespace) "/" (run.job) } " "
                    (layout::state(run.state.as_str())) " " (visitor.clock.when(Some(run.scheduled_for))) }
            }
        }
        section aria-labelledby="found-jobs" {
            h2 #found-jobs { "Jobs" }
            @if jobs.is_empty() { p.empty { "No job's name or description holds it." } }
            @else {
                ul { @for job in &jobs {
                    li { a href=(job.href()) { (job.namespace) "/" (job.name) } " "
                         span.hint { (job.schedule_words()) } }
                } }
            }
            @if known.len() > NAMESPACES_SEARCHED {
                p.hint { "Searched the first " (NAMESPACES_SEARCHED) " of " (known.len()) " namespaces." }
            }
        }
        section aria-labelledby="found-workers" {
            h2 #found-workers { "Workers" }
            @if workers.is_empty() { p.empty { "No worker's id or label holds it." } }
            @else {
                ul { @for w in &workers {
                    li { (w.name) " " code { (w.id) } " " (layout::state(if w.alive { "alive" } else { "lost" })) }
                } }
            }
        }
        section aria-labelledby="found-audit" {
            h2 #found-audit { "Audit entries about it" }
            @if audit.is_empty() { p.empty { "No audit entry names an object of that name." } }
            @else {
                ul { @for e in &audit {
                    li { (visitor.clock.when(Some(e.entry.at))) " " (e.entry.actor) " "
                         code { (e.entry.action) } " "
                         a href={ "/audit?" (query(&[("object", q)])) } { "in the audit trail" } }
                } }
            }
        }
    };
    layout::page(&console, &visitor, "Search", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_is_trimmed_and_bounded() {
        assert_eq!(searched("  nightly "), Ok("nightly"));
        assert!(searched(&"x".repeat(MAX_QUERY + 1)).is_err());
        assert_eq!(
            searched(&"é".repeat(MAX_QUERY)).map(str::len),
            Ok(2 * MAX_QUERY)
        );
    }

    #[test]
    fn a_worker_matches_by_id_or_label() {
        let w: WorkerRecord = serde_json::from_value(serde_json::json!({
            "id": "w-1", "name": "gpu-box-7", "labels": {"zone": "eu-west", "gpu": "a100"},
            "slots": 4, "running": 0, "alive": true, "draining": false,
            "registered_at": "2026-11-30T00:00:00Z", "last_heartbeat_at": "2026-11-30T00:00:00Z",
            "namespaces": ["*"]
        }))
        .unwrap();
        assert!(worker_matches(&w, "GPU-box"));
        assert!(worker_matches(&w, "eu-west"));
        assert!(worker_matches(&w, "gpu=a100"));
        assert!(!worker_matches(&w, "us-east"));
    }
}

//! `POST /api/v1/apply`: a file of job definitions (`sked job apply -f`) written whole or not
//! at all. Each job is checked as `PUT /jobs/{name}` checks it (`jobs::prepared`), then the
//! store writes them all in one transaction, upstreams first; the first refusal names its job
//! and nothing is written. A dry run makes every check, the store's included, and writes
//! nothing.

use super::extract::Query;
use super::jobs::{definition, prepared, unchanged_without_grant};
use super::{body, parse_json, ApiError, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::job::{JobSpec, ValidJob};
use sked_store::PutOutcome;

/// The most jobs one `POST /apply` writes.
pub const MAX_APPLY_JOBS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The definitions, each with its name.
    jobs: Vec<serde_json::Value>,
    /// Check everything and answer what would change; write nothing.
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize)]
pub struct Applied {
    pub dry_run: bool,
    /// Each job of the request, in the order written (upstreams first).
    pub jobs: Vec<AppliedJob>,
}

#[derive(Debug, Serialize)]
pub struct AppliedJob {
    pub name: String,
    /// `created`, `updated` or `unchanged`.
    pub change: PutOutcome,
}

/// `POST /apply`: many definitions (a file of `sked job apply`), all written in one
/// transaction or none. Every job is checked as a PUT checks it, then the store writes them in
/// the order their dependencies need; the first refusal names its job (`jobs[i]...` in
/// `field`) and nothing is written. With `dry_run`, the same checks, the store's included,
/// answer what would change.
pub async fn apply(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Applied>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let request: ApplyRequest = parse_json(&body(raw)?)?;
    if request.jobs.len() > MAX_APPLY_JOBS {
        return Err(ApiError::invalid(
            "jobs",
            format!("at most {MAX_APPLY_JOBS} jobs at a time"),
        ));
    }
    let now = Utc::now();
    let in_job = |i: usize, name: &str, e: ApiError| {
        let field = match &e.field {
            Some(f) if f != "body" => format!("jobs[{i}].{f}"),
            _ => format!("jobs[{i}]"),
        };
        let message = format!("job {name:?}: {}", e.message);
        ApiError { message, ..e }.with_field(field)
    };
    let mut specs = Vec::with_capacity(request.jobs.len());
    let mut upstreams = Vec::with_capacity(request.jobs.len());
    for (i, value) in request.jobs.into_iter().enumerate() {
        let spec: JobSpec = serde_json::from_value(value).map_err(|e| {
            in_job(
                i,
                "?",
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()),
            )
        })?;
        let name = spec.name.clone().unwrap_or_default();
        if !name.is_empty() && specs.iter().any(|(n, _): &(String, JobSpec)| *n == name) {
            return Err(in_job(
                i,
                &name,
                ApiError::invalid("name", "the name appears twice"),
            ));
        }
        upstreams.push((
            name.clone(),
            sked_core::dependency::upstreams(&spec.depends_on),
        ));
        specs.push((name, spec));
    }
    let order = sked_core::dependency::write_order(&upstreams).map_err(|cycle| {
        ApiError::invalid(
            "jobs",
            format!(
                "these jobs depend on each other in a cycle: {}",
                cycle.join(", ")
            ),
        )
    })?;
    let mut slots: Vec<Option<(String, JobSpec)>> = specs.into_iter().map(Some).collect();
    let mut jobs = Vec::with_capacity(order.len());
    let mut befores = Vec::with_capacity(order.len());
    let mut exempt = Vec::new();
    for i in order {
        let Some((name, spec)) = slots[i].take() else {
            continue;
        };
        let before = state.store.get_job(&namespace, &name).await?;
        let mut job = prepared(
            &state,
            &caller,
            &namespace,
            None,
            spec,
            before.as_ref(),
            now,
        )
        .map_err(|e| in_job(i, &name, e))?;
        crate::schedule_rules::attach(&*state.store, &namespace, &mut job.schedule)
            .await
            .map_err(|e| in_job(i, &name, e.into()))?;
        if unchanged_without_grant(&caller, &job) {
            exempt.push(name);
            continue;
        }
        jobs.push((i, job));
        befores.push(before);
    }
    let valid: Vec<ValidJob> = jobs.iter().map(|(_, job)| job.clone()).collect();
    // Each changed job's entry commits with the batch.
    let definitions: Vec<Option<serde_json::Value>> = befores
        .iter()
        .map(|before| before.as_ref().map(|b| definition(&b.spec)))
        .collect();
    let ns = namespace.clone();
    let audit = audit::by(
        &caller,
        move |outcomes: &Vec<(PutOutcome, sked_core::records::JobRecord)>| {
            outcomes
                .iter()
                .zip(definitions.clone())
                .filter(|((outcome, _), _)| *outcome != PutOutcome::Unchanged)
                .map(|((_, record), before)| Change {
                    action: "job.put",
                    namespace: Some(ns.clone()),
                    object: Some(record.name.clone()),
                    before,
                    after: Some(definition(&record.spec)),
                })
                .collect::<Vec<_>>()
        },
    );
    let outcomes = state
        .store
        .put_jobs(&namespace, &valid, now, request.dry_run, audit)
        .await
        .map_err(|refusal| match refusal.index {
            Some(at) => {
                let (i, job) = &jobs[at];
                in_job(*i, &job.name, refusal.error.into())
            }
            None => refusal.error.into(),
        })?;
    let mut applied: Vec<AppliedJob> = exempt
        .into_iter()
        .map(|name| AppliedJob {
            name,
            change: PutOutcome::Unchanged,
        })
        .collect();
    for (outcome, record) in outcomes {
        if !request.dry_run && outcome != PutOutcome::Unchanged {
            state.firing.reload(record.id);
        }
        applied.push(AppliedJob {
            name: record.name,
            change: outcome,
        });
    }
    Ok(Json(Applied {
        dry_run: request.dry_run,
        jobs: applied,
    }))
}

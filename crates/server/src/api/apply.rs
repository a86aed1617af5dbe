//! `POST /api/v1/apply`: a file of calendars and job definitions (`sked job apply -f`) written
//! whole or not at all. Each calendar is checked as `PUT /calendars/{name}` checks it, resolved
//! with those it names from the file first and then from the store; each job as
//! `PUT /jobs/{name}` checks it (`jobs::prepared`), its calendar found the same way. Then the
//! store writes them all in one transaction, calendars first and jobs upstreams first; the
//! first refusal names its item (`calendars[i]...`, `jobs[i]...`) and nothing is written. A
//! dry run makes every check, the store's included, and writes nothing.

use super::extract::Query;
use super::jobs::{definition, prepared, unchanged_without_grant};
use super::{body, parse_json, ApiError, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::schedule_rules::{attach_pending, resolve_pending, Pending};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::calendar::CalendarSpec;
use sked_core::job::{validate_name, JobSpec, ValidJob};
use sked_store::{Batch, BatchItem, NamedCalendar, PutOutcome};

/// The most jobs one `POST /apply` writes.
pub const MAX_APPLY_JOBS: usize = 1000;
/// The most calendars one `POST /apply` writes.
pub const MAX_APPLY_CALENDARS: usize = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The calendars, each with its name beside its definition's fields.
    #[serde(default)]
    calendars: Vec<serde_json::Value>,
    /// The definitions, each with its name.
    #[serde(default)]
    jobs: Vec<serde_json::Value>,
    /// Check everything and answer what would change; write nothing.
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize)]
pub struct Applied {
    pub dry_run: bool,
    /// Each calendar of the request, in its order.
    pub calendars: Vec<AppliedItem>,
    /// Each job of the request, in the order written (upstreams first).
    pub jobs: Vec<AppliedItem>,
}

/// What became of one calendar or job.
#[derive(Debug, Serialize)]
pub struct AppliedItem {
    pub name: String,
    /// `created`, `updated` or `unchanged`.
    pub change: PutOutcome,
}

/// A refusal `e` of the request's `list[i]` (named `name`), its field and message placed.
fn placed(list: &str, i: usize, name: &str, e: ApiError) -> ApiError {
    let field = match &e.field {
        Some(f) if f != "body" => format!("{list}[{i}].{f}"),
        _ => format!("{list}[{i}]"),
    };
    let what = list.trim_end_matches('s');
    let message = format!("{what} {name:?}: {}", e.message);
    ApiError { message, ..e }.with_field(field)
}

/// The request's calendars, each checked alone and then resolved with those it names (from
/// the request first, then from the namespace): the first refusal names its place.
async fn checked_calendars(
    state: &AppState,
    namespace: &str,
    values: Vec<serde_json::Value>,
) -> Result<(Vec<NamedCalendar>, Pending), ApiError> {
    if values.len() > MAX_APPLY_CALENDARS {
        return Err(ApiError::invalid(
            "calendars",
            format!("at most {MAX_APPLY_CALENDARS} calendars at a time"),
        ));
    }
    let mut calendars: Vec<NamedCalendar> = Vec::with_capacity(values.len());
    for (i, value) in values.into_iter().enumerate() {
        let serde_json::Value::Object(mut fields) = value else {
            return Err(placed(
                "calendars",
                i,
                "?",
                ApiError::invalid("body", "must be an object with a name"),
            ));
        };
        let name = match fields.remove("name") {
            Some(serde_json::Value::String(name)) => name,
            _ => {
                return Err(placed(
                    "calendars",
                    i,
                    "?",
                    ApiError::invalid("name", "must be the calendar's name, a string"),
                ))
            }
        };
        validate_name("name", &name)
            .map_err(|e| placed("calendars", i, &name, ApiError::invalid("name", e.message)))?;
        if calendars.iter().any(|c| c.name == name) {
            return Err(placed(
                "calendars",
                i,
                &name,
                ApiError::invalid("name", "the name appears twice"),
            ));
        }
        let spec: CalendarSpec = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| {
                placed(
                    "calendars",
                    i,
                    &name,
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()),
                )
            })?;
        calendars.push(NamedCalendar { name, spec });
    }
    let pending: Pending = calendars
        .iter()
        .map(|c| (c.name.clone(), c.spec.clone()))
        .collect();
    for (i, calendar) in calendars.iter().enumerate() {
        resolve_pending(&*state.store, namespace, &calendar.name, &pending)
            .await
            .map_err(|e| placed("calendars", i, &calendar.name, e.into()))?;
    }
    Ok((calendars, pending))
}

/// `POST /apply`: many calendars and definitions (a file of `sked job apply`), all written in
/// one transaction or none. Every calendar and job is checked as a PUT checks it, then the
/// store writes the calendars and then the jobs in the order their dependencies need; the
/// first refusal names its item (`calendars[i]...` or `jobs[i]...` in `field`) and nothing is
/// written. With `dry_run`, the same checks, the store's included, answer what would change.
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
    let (calendars, pending) = checked_calendars(&state, &namespace, request.calendars).await?;
    let now = Utc::now();
    let in_job = |i: usize, name: &str, e: ApiError| placed("jobs", i, name, e);
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
        super::limits::check_used(&state, &namespace, &job.spec)
            .await
            .map_err(|e| in_job(i, &name, e))?;
        attach_pending(&*state.store, &namespace, &mut job.schedule, &pending)
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
    // Each changed calendar's and job's entry commits with the batch.
    let mut calendars_before = Vec::with_capacity(calendars.len());
    for calendar in &calendars {
        let before = state.store.get_calendar(&namespace, &calendar.name).await?;
        calendars_before.push(before.and_then(|b| serde_json::to_value(&b.spec).ok()));
    }
    let definitions: Vec<Option<serde_json::Value>> = befores
        .iter()
        .map(|before| before.as_ref().map(|b| definition(&b.spec)))
        .collect();
    let ns = namespace.clone();
    let audit = audit::by(&caller, move |written: &sked_store::Applied| {
        let calendars = written
            .calendars
            .iter()
            .zip(calendars_before.clone())
            .filter(|((outcome, _), _)| *outcome != PutOutcome::Unchanged)
            .map(|((_, record), before)| Change {
                action: "calendar.put",
                namespace: Some(ns.clone()),
                object: Some(record.name.clone()),
                before,
                after: serde_json::to_value(&record.spec).ok(),
            });
        let jobs = written
            .jobs
            .iter()
            .zip(definitions.clone())
            .filter(|((outcome, _), _)| *outcome != PutOutcome::Unchanged)
            .map(|((_, record), before)| Change {
                action: "job.put",
                namespace: Some(ns.clone()),
                object: Some(record.name.clone()),
                before,
                after: Some(definition(&record.spec)),
            });
        calendars.chain(jobs).collect::<Vec<_>>()
    });
    let batch = Batch {
        calendars,
        jobs: valid,
    };
    let written = state
        .store
        .apply(&namespace, &batch, now, request.dry_run, audit)
        .await
        .map_err(|refusal| match refusal.at {
            Some(BatchItem::Calendar(i)) => {
                let name = batch.calendars.get(i).map_or("?", |c| c.name.as_str());
                placed("calendars", i, name, refusal.error.into())
            }
            Some(BatchItem::Job(at)) => match jobs.get(at) {
                Some((i, job)) => in_job(*i, &job.name, refusal.error.into()),
                None => refusal.error.into(),
            },
            None => refusal.error.into(),
        })?;
    // The rules first: a job reloaded below reads the calendars written with it.
    if !request.dry_run && written.calendars_changed() {
        state.firing.rules_changed();
    }
    let calendars = written
        .calendars
        .into_iter()
        .map(|(change, record)| AppliedItem {
            name: record.name,
            change,
        })
        .collect();
    let mut applied: Vec<AppliedItem> = exempt
        .into_iter()
        .map(|name| AppliedItem {
            name,
            change: PutOutcome::Unchanged,
        })
        .collect();
    for (outcome, record) in written.jobs {
        if !request.dry_run && outcome != PutOutcome::Unchanged {
            state.firing.reload(record.id);
        }
        applied.push(AppliedItem {
            name: record.name,
            change: outcome,
        });
    }
    Ok(Json(Applied {
        dry_run: request.dry_run,
        calendars,
        jobs: applied,
    }))
}

//! `/api/v1/calendars`: a namespace's calendars of business days (`sked_core::calendar`), which
//! schedules name in `schedule.calendar`. A calendar is checked whole, with every calendar it
//! includes or excepts, before it is written; a calendar something names is deleted only with
//! `force`. Each change is audited in its own transaction and reaches the firing loop at once,
//! and other nodes' loops through the store's change events (`crate::changes`).

use super::extract::{Path, Query};
use super::{body, parse_json, ApiError, DeleteParams, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::schedule_rules::resolve_new;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use sked_core::calendar::{CalendarRecord, CalendarSpec, CalendarUsers};
use sked_core::job::validate_name;
use sked_store::{CalendarDeletion, PutOutcome};

#[derive(Debug, Serialize)]
pub struct CalendarList {
    pub calendars: Vec<CalendarRecord>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
) -> Result<Json<CalendarList>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let calendars = state.store.list_calendars(&namespace).await?;
    Ok(Json(CalendarList { calendars }))
}

/// A calendar with what names it.
#[derive(Debug, Serialize)]
pub struct CalendarView {
    #[serde(flatten)]
    pub record: CalendarRecord,
    pub used_by: CalendarUsers,
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<CalendarView>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let record = state
        .store
        .get_calendar(&namespace, &name)
        .await?
        .ok_or_else(|| not_found(&name, &namespace))?;
    let used_by = state.store.calendar_users(&namespace, &name).await?;
    Ok(Json(CalendarView { record, used_by }))
}

fn not_found(name: &str, namespace: &str) -> ApiError {
    ApiError::not_found(format!("calendar {name:?} in namespace {namespace:?}"))
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CalendarRecord>), ApiError> {
    let namespace = ns.checked(&caller)?;
    validate_name("name", &name).map_err(|e| ApiError::invalid("name", e.message))?;
    let spec: CalendarSpec = parse_json(&body(raw)?)?;
    resolve_new(&*state.store, &namespace, &name, &spec).await?;
    let before = state.store.get_calendar(&namespace, &name).await?;
    let ns = namespace.clone();
    let audit = audit::by(
        &caller,
        move |(outcome, record): &(PutOutcome, CalendarRecord)| {
            (*outcome != PutOutcome::Unchanged).then(|| Change {
                action: "calendar.put",
                namespace: Some(ns.clone()),
                object: Some(record.name.clone()),
                before: before
                    .as_ref()
                    .and_then(|b| serde_json::to_value(&b.spec).ok()),
                after: serde_json::to_value(&record.spec).ok(),
            })
        },
    );
    let (outcome, record) = state
        .store
        .put_calendar(&namespace, &name, &spec, Utc::now(), audit)
        .await?;
    if outcome != PutOutcome::Unchanged {
        state.firing.rules_changed();
    }
    let status = if outcome == PutOutcome::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(record)))
}

/// A deleted calendar, with what still names it (deleted with `force`).
#[derive(Debug, Serialize)]
pub struct DeletedCalendar {
    #[serde(flatten)]
    pub record: CalendarRecord,
    pub still_named_by: CalendarUsers,
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<Json<DeletedCalendar>, ApiError> {
    let namespace = Namespace {
        namespace: params.namespace,
    }
    .checked(&caller)?;
    let ns = namespace.clone();
    let audit = audit::by(&caller, move |deletion: &CalendarDeletion| match deletion {
        CalendarDeletion::Deleted(record, _) => Some(Change {
            action: "calendar.delete",
            namespace: Some(ns.clone()),
            object: Some(record.name.clone()),
            before: serde_json::to_value(&record.spec).ok(),
            after: None,
        }),
        _ => None,
    });
    match state
        .store
        .delete_calendar(&namespace, &name, params.force, audit)
        .await?
    {
        CalendarDeletion::Missing => Err(not_found(&name, &namespace)),
        CalendarDeletion::InUse(users) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "in_use",
            format!(
                "calendar {name:?} is named by {}; delete it with force=true (sked calendar \
                 delete --force) and the schedules naming it fire nothing until it is written \
                 again",
                users_in_words(&users)
            ),
        )),
        CalendarDeletion::Deleted(record, still_named_by) => {
            state.firing.rules_changed();
            Ok(Json(DeletedCalendar {
                record,
                still_named_by,
            }))
        }
    }
}

/// "jobs a, b and calendars c".
fn users_in_words(users: &CalendarUsers) -> String {
    let mut parts = Vec::new();
    if !users.jobs.is_empty() {
        parts.push(format!("jobs {}", users.jobs.join(", ")));
    }
    if !users.calendars.is_empty() {
        parts.push(format!("calendars {}", users.calendars.join(", ")));
    }
    parts.join(" and ")
}

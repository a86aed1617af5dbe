//! `/api/v1/events`: telling sked what happened (`sked_core::event`). A post records the
//! event once per `(namespace, key, id)` and, in the same store transaction, starts the runs
//! of the jobs whose schedule names the key and releases the runs waiting for it; a post of
//! the same event again answers with the first and changes nothing. Posting needs the
//! `events` permission (roles admin, editor and emitter), reading needs `read`. The audit
//! trail records each new event's key and id, never its payload.

use super::extract::Query;
use super::jobs::check_limit;
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
use sked_core::event::EventSpec;
use sked_core::records::EventRecord;
use sked_core::Instant;
use sked_store::{EventQuery, FlowedRun, PostedEvent};

/// A recorded event, and what posting it did.
#[derive(Debug, Serialize)]
pub struct PostedView {
    #[serde(flatten)]
    pub event: EventRecord,
    /// False when the event had been posted before: nothing happened this time.
    pub created: bool,
    /// The runs it started (jobs whose schedule names its key).
    pub started: Vec<i64>,
    /// Jobs whose schedule names its key that it started no run of, because of their
    /// `dedup` (the run it was deduplicated to) or `debounce` (the pending run it was
    /// absorbed into).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flowed: Vec<FlowedRun>,
}

pub async fn post(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
    headers: axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<PostedView>), ApiError> {
    let namespace = ns.checked(&caller)?;
    let mut spec: EventSpec = parse_json(&body(raw)?)?;
    spec.validate()?;
    spec.trace_parent = super::joined_trace(&state, &headers);
    let (ns, key, id) = (namespace.clone(), spec.key.clone(), spec.id.clone());
    let audit = audit::by(&caller, move |posted: &PostedEvent| {
        posted.created.then(|| Change {
            action: "event.post",
            namespace: Some(ns.clone()),
            object: Some(key.clone()),
            before: None,
            after: Some(serde_json::json!({"id": id, "started": posted.started})),
        })
    });
    let posted = state
        .store
        .post_event(&namespace, &spec, Utc::now(), audit)
        .await?;
    if !posted.created {
        // The same id with another payload is a mistake the sender should hear about, not a
        // second event and not a silent drop.
        if posted.event.payload != spec.payload {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "event_conflict",
                format!(
                    "event {:?} with id {:?} was recorded at {} with another payload",
                    spec.key,
                    spec.id,
                    posted.event.occurred_at.to_rfc3339()
                ),
            ));
        }
        return Ok((
            StatusCode::OK,
            Json(PostedView {
                event: posted.event,
                created: false,
                started: Vec::new(),
                flowed: Vec::new(),
            }),
        ));
    }
    if !posted.queued.is_empty() {
        state
            .dispatcher
            .enqueue(state.store.queued_runs(Some(&posted.queued)).await?);
    }
    Ok((
        StatusCode::CREATED,
        Json(PostedView {
            event: posted.event,
            created: true,
            started: posted.started,
            flowed: posted.flowed,
        }),
    ))
}

#[derive(Debug, Deserialize)]
pub struct EventParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    key: Option<String>,
    /// Events recorded before this instant: the previous page's `next_before`.
    before: Option<Instant>,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct EventPage {
    pub events: Vec<EventRecord>,
    /// Where the next page starts (`before`), when this one is full.
    pub next_before: Option<Instant>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<EventParams>,
) -> Result<Json<EventPage>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let key = p.key.filter(|k| !k.is_empty());
    if let Some(key) = &key {
        sked_core::event::validate_key("key", key)?;
    }
    let limit = check_limit(p.limit)?;
    let query = EventQuery {
        namespace,
        key,
        before: p.before,
        limit,
    };
    let events = state.store.list_events(&query).await?;
    let next_before = (events.len() == limit as usize)
        .then(|| events.last().map(|e| e.occurred_at))
        .flatten();
    Ok(Json(EventPage {
        events,
        next_before,
    }))
}

//! `/api/v1/limits`: the flow-control limits named in a namespace (`sked_core::flow`), which
//! jobs `use` in `concurrency` and `rate_limit`, and what every key is doing now: the attempts
//! holding it (from the store, cluster-wide) and the runs it holds back (this node's
//! dispatcher: in a cluster, each node shows the runs it queued). A limit a job uses is
//! deleted only once no job uses it. Each change is audited in its own transaction; the
//! next start of a run that uses the limit reads its new value.

use super::extract::{Path, Query};
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
use sked_core::flow::LimitSpec;
use sked_core::job::{validate_name, JobSpec};
use sked_core::Instant;
use sked_store::{KeyHolder, LimitDeletion, LimitRecord};
use std::collections::BTreeMap;

/// A named limit as the API shows it.
#[derive(Debug, Serialize)]
pub struct LimitView {
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    pub spec: LimitSpec,
    pub updated_at: Instant,
}

impl From<LimitRecord> for LimitView {
    fn from(r: LimitRecord) -> Self {
        LimitView {
            namespace: r.namespace,
            name: r.name,
            spec: r.spec,
            updated_at: r.updated_at,
        }
    }
}

/// One key that has holders or runs waiting.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub namespace: String,
    pub key: String,
    /// The attempts holding it now (concurrency keys).
    pub holders: Vec<KeyHolder>,
    /// Runs it holds back on this node.
    pub waiting: usize,
    /// Why, as the store said last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When those runs ask again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Instant>,
    /// The first of them, oldest first (at most [`RUNS_SHOWN`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting_runs: Vec<i64>,
}

/// Limits one namespace may hold.
pub const MAX_LIMITS: usize = 1000;

/// Waiting runs a key shows by id.
pub const RUNS_SHOWN: usize = 20;

#[derive(Debug, Serialize)]
pub struct LimitList {
    pub limits: Vec<LimitView>,
    pub keys: Vec<KeyView>,
}

/// `namespace` optional: without it, every namespace the caller sees.
#[derive(Debug, Deserialize)]
pub struct ListParams {
    namespace: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<Json<LimitList>, ApiError> {
    let scope: Option<Vec<String>> = match params.namespace {
        Some(namespace) => Some(vec![Namespace { namespace }.checked(&caller)?]),
        None => (!caller.all_namespaces()).then(|| caller.namespaces.clone()),
    };
    let sees = |namespace: &str| {
        scope
            .as_ref()
            .is_none_or(|s| s.iter().any(|n| n == namespace))
    };
    let limits = state.store.list_limits(scope.as_deref()).await?;
    let holders = state.store.key_holders(scope.as_deref()).await?;
    let mut keys: BTreeMap<(String, String), KeyView> = BTreeMap::new();
    let view = |namespace: &str, key: &str| KeyView {
        namespace: namespace.to_string(),
        key: key.to_string(),
        holders: Vec::new(),
        waiting: 0,
        reason: None,
        retry_at: None,
        waiting_runs: Vec::new(),
    };
    for holder in holders {
        keys.entry((holder.namespace.clone(), holder.key.clone()))
            .or_insert_with(|| view(&holder.namespace, &holder.key))
            .holders
            .push(holder);
    }
    for wait in state.dispatcher.key_waits() {
        if !sees(&wait.namespace) {
            continue;
        }
        let entry = keys
            .entry((wait.namespace.clone(), wait.key.clone()))
            .or_insert_with(|| view(&wait.namespace, &wait.key));
        entry.waiting = wait.runs.len();
        entry.reason = Some(wait.reason);
        entry.retry_at = Some(wait.until);
        entry.waiting_runs = wait.runs.into_iter().take(RUNS_SHOWN).collect();
    }
    Ok(Json(LimitList {
        limits: limits.into_iter().map(LimitView::from).collect(),
        keys: keys.into_values().collect(),
    }))
}

fn not_found(name: &str, namespace: &str) -> ApiError {
    ApiError::not_found(format!("limit {name:?} in namespace {namespace:?}"))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<LimitView>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let record = state
        .store
        .get_limit(&namespace, &name)
        .await?
        .ok_or_else(|| not_found(&name, &namespace))?;
    Ok(Json(record.into()))
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<LimitView>), ApiError> {
    let namespace = ns.checked(&caller)?;
    validate_name("name", &name).map_err(|e| ApiError::invalid("name", e.message))?;
    let spec: LimitSpec = parse_json(&body(raw)?)?;
    spec.validate()
        .map_err(|e| ApiError::invalid(&e.field, e.message))?;
    let before = state.store.get_limit(&namespace, &name).await?;
    if before.is_none() {
        let held = state
            .store
            .list_limits(Some(std::slice::from_ref(&namespace)))
            .await?
            .len();
        if held >= MAX_LIMITS {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "limit_reached",
                format!("namespace {namespace:?} holds {MAX_LIMITS} limits, its most"),
            ));
        }
    }
    let (ns, object, after) = (
        namespace.clone(),
        name.clone(),
        serde_json::to_value(&spec).ok(),
    );
    let before = before.and_then(|b| serde_json::to_value(&b.spec).ok());
    let audit = audit::by(&caller, move |_: &bool| {
        (before.as_ref() != after.as_ref()).then(|| Change {
            action: "limit.put",
            namespace: Some(ns.clone()),
            object: Some(object.clone()),
            before: before.clone(),
            after: after.clone(),
        })
    });
    let created = state
        .store
        .put_limit(&namespace, &name, &spec, Utc::now(), audit)
        .await?;
    let record = state
        .store
        .get_limit(&namespace, &name)
        .await?
        .ok_or_else(|| not_found(&name, &namespace))?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(record.into())))
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<StatusCode, ApiError> {
    let namespace = ns.checked(&caller)?;
    let (ns, object) = (namespace.clone(), name.clone());
    let audit = audit::by(&caller, move |deletion: &LimitDeletion| {
        matches!(deletion, LimitDeletion::Deleted).then(|| Change {
            action: "limit.delete",
            namespace: Some(ns.clone()),
            object: Some(object.clone()),
            before: None,
            after: None,
        })
    });
    match state.store.delete_limit(&namespace, &name, audit).await? {
        LimitDeletion::Deleted => Ok(StatusCode::NO_CONTENT),
        LimitDeletion::NotFound => Err(not_found(&name, &namespace)),
        LimitDeletion::InUse(jobs) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "in_use",
            format!(
                "limit {name:?} is used by jobs {}: change them first",
                jobs.join(", ")
            ),
        )),
    }
}

/// Refuses a job that `use`s a limit its namespace does not define, naming the field.
pub async fn check_used(state: &AppState, namespace: &str, spec: &JobSpec) -> Result<(), ApiError> {
    let fields = spec
        .concurrency
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((format!("concurrency[{i}].use"), c.uses.as_deref()?, true)))
        .chain(spec.rate_limit.iter().enumerate().filter_map(|(i, r)| {
            Some((format!("rate_limit[{i}].use"), r.uses.as_deref()?, false))
        }));
    for (field, name, concurrency) in fields {
        let limit = state.store.get_limit(namespace, name).await?;
        let defined = limit.is_some_and(|l| {
            if concurrency {
                l.spec.concurrency.is_some()
            } else {
                l.spec.rate.is_some()
            }
        });
        if !defined {
            let what = if concurrency { "concurrency" } else { "rate" };
            return Err(ApiError::invalid(
                &field,
                format!(
                    "namespace {namespace:?} has no limit {name:?} with a {what} (PUT \
                     /api/v1/limits/{name})"
                ),
            ));
        }
    }
    Ok(())
}

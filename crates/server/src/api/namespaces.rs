//! `/api/v1/namespaces`: what an administrator allows in each namespace (shell targets, a cap on
//! its jobs and on its queued runs). Any token reads the namespaces it sees (with settings,
//! holding jobs, or named by the token); only an admin changes them (the route table says so).
//! A namespace without settings has the defaults.

use super::extract::Path;
use super::{body, parse_json, ApiError};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::secrets::{is_sealed, open_value, seal_notify, seal_value, Binding};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use sked_core::job::validate_name;
use sked_core::namespace::{NamespaceRecord, NamespaceSpec};
use sked_core::notify::Webhook;
use sked_core::Instant;

/// A namespace's settings; `configured` is false (and the times absent) for one that has only
/// the defaults.
#[derive(Debug, Serialize)]
pub struct NamespaceView {
    pub name: String,
    #[serde(flatten)]
    pub spec: NamespaceSpec,
    pub configured: bool,
    pub created_at: Option<Instant>,
    pub updated_at: Option<Instant>,
}

impl From<NamespaceRecord> for NamespaceView {
    fn from(record: NamespaceRecord) -> Self {
        NamespaceView {
            name: record.name,
            spec: record.spec,
            configured: true,
            created_at: Some(record.created_at),
            updated_at: Some(record.updated_at),
        }
    }
}

impl NamespaceView {
    /// A namespace without settings: the defaults.
    fn unconfigured(name: String) -> Self {
        NamespaceView {
            name,
            spec: NamespaceSpec::default(),
            configured: false,
            created_at: None,
            updated_at: None,
        }
    }
}

/// The most namespaces holding jobs that a listing reads beside the configured ones.
const MAX_LISTED: u32 = 10_000;

#[derive(Debug, Serialize)]
pub struct NamespaceList {
    pub namespaces: Vec<NamespaceView>,
}

/// The namespace named in the path, if it is a valid name the caller sees.
fn entered(caller: &Caller, name: &str) -> Result<(), ApiError> {
    validate_name("name", name).map_err(|e| ApiError::invalid("name", e.message))?;
    caller.enter(name)?;
    Ok(())
}

/// The namespaces the caller sees, by name: those with settings, those that hold jobs, and
/// those its token names (a viewer of one namespace finds it even while it is empty).
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<NamespaceList>, ApiError> {
    let mut found: std::collections::BTreeMap<String, NamespaceView> = state
        .store
        .list_namespaces()
        .await?
        .into_iter()
        .map(|n| (n.name.clone(), NamespaceView::from(n)))
        .collect();
    let holding_jobs = state.store.job_namespaces(MAX_LISTED).await?;
    let named = caller
        .grant
        .namespaces
        .iter()
        .filter(|n| *n != sked_core::auth::ALL_NAMESPACES)
        .cloned();
    for name in holding_jobs.into_iter().chain(named) {
        if !found.contains_key(&name) {
            found.insert(name.clone(), NamespaceView::unconfigured(name));
        }
    }
    let namespaces = found
        .into_values()
        .filter(|n| caller.sees(&n.name))
        .collect();
    Ok(Json(NamespaceList { namespaces }))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<NamespaceView>, ApiError> {
    entered(&caller, &name)?;
    let view = match state.store.get_namespace(&name).await? {
        Some(record) => record.into(),
        None => NamespaceView::unconfigured(name),
    };
    Ok(Json(view))
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<NamespaceView>), ApiError> {
    entered(&caller, &name)?;
    let mut spec: NamespaceSpec = parse_json(&body(raw)?)?;
    let key = state.config.secret_key.as_ref();
    let binding = Binding::Namespace(&name);
    // A default webhook URL is a secret (it often carries a token): sent back as it was read,
    // sealed, it is opened here to be judged like a new one, and sealed again below.
    for (i, hook) in webhooks(&mut spec) {
        if is_sealed(&hook.url) {
            hook.url = open_value(key, &[binding], &url_field(i), &hook.url)?;
        }
    }
    spec.validate()
        .map_err(|e| ApiError::invalid(&e.field, e.message))?;
    for rule in spec.notify.iter().filter_map(|r| r.webhook.as_ref()) {
        super::jobs::refused_url(
            &state.config.http_target_policy,
            "notify.webhook.url",
            &rule.url,
        )?;
    }
    seal_notify(key, binding, &mut spec.notify)?;
    for (i, hook) in webhooks(&mut spec) {
        hook.url = seal_value(key, binding, &url_field(i), &hook.url)?;
    }
    let ns = name.clone();
    type Put = (Option<NamespaceRecord>, NamespaceRecord);
    let audit = audit::by(&caller, move |(before, after): &Put| {
        Some(Change {
            action: "namespace.put",
            namespace: Some(ns.clone()),
            object: Some(ns.clone()),
            before: before.as_ref().map(|b| snapshot(&b.spec)),
            after: Some(snapshot(&after.spec)),
        })
    });
    let (before, after) = state
        .store
        .put_namespace(&name, &spec, Utc::now(), audit)
        .await?;
    crate::namespaces::refresh_now(&state).await;
    state.firing.rules_changed();
    let status = if before.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(after.into())))
}

/// Forgets a namespace's settings: its jobs stay, under the defaults.
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<NamespaceView>, ApiError> {
    entered(&caller, &name)?;
    let ns = name.clone();
    let audit = audit::by(&caller, move |deleted: &Option<NamespaceRecord>| {
        deleted.as_ref().map(|deleted| Change {
            action: "namespace.delete",
            namespace: Some(ns.clone()),
            object: Some(ns.clone()),
            before: Some(snapshot(&deleted.spec)),
            after: None,
        })
    });
    let deleted = state
        .store
        .delete_namespace(&name, audit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("settings of namespace {name:?}")))?;
    crate::namespaces::refresh_now(&state).await;
    state.firing.rules_changed();
    Ok(Json(deleted.into()))
}

/// The default rules' webhooks, with their rule's place.
fn webhooks(spec: &mut NamespaceSpec) -> impl Iterator<Item = (usize, &mut Webhook)> {
    spec.notify
        .iter_mut()
        .enumerate()
        .filter_map(|(i, rule)| rule.webhook.as_mut().map(|hook| (i, hook)))
}

fn url_field(rule: usize) -> String {
    format!("notify[{rule}].webhook.url")
}

fn snapshot(spec: &NamespaceSpec) -> serde_json::Value {
    serde_json::to_value(spec).unwrap_or(serde_json::Value::Null)
}

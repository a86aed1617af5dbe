//! `/api/v1/secrets`: a namespace's secrets, which env and header values name with
//! `{"secret_ref": "..."}`. A value is sealed with the server's key before it is stored and
//! leaves the server only inside an attempt of that namespace handed to a worker: no answer,
//! log line or audit entry carries it. Listing shows names and times.

use super::extract::{Path, Query};
use super::{body, parse_json, ApiError, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::secrets::{seal_value, Binding};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::job::validate_name;
use sked_core::namespace::SecretRecord;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretValue {
    value: String,
}

/// The value never prints.
impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(..)")
    }
}

#[derive(Debug, Serialize)]
pub struct SecretList {
    pub secrets: Vec<SecretRecord>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
) -> Result<Json<SecretList>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let secrets = state.store.list_secrets(&namespace).await?;
    Ok(Json(SecretList { secrets }))
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<SecretRecord>), ApiError> {
    let namespace = ns.checked(&caller)?;
    validate_name("name", &name).map_err(|e| ApiError::invalid("name", e.message))?;
    let req: SecretValue = parse_json(&body(raw)?)?;
    let sealed = seal_value(
        state.config.secret_key.as_ref(),
        Binding::Namespace(&namespace),
        &format!("secret {name}"),
        &req.value,
    )
    .map_err(|e| ApiError::invalid("value", e.to_string()))?;
    let ns = namespace.clone();
    let audit = audit::by(&caller, move |(_, record): &(bool, SecretRecord)| {
        Some(Change {
            action: "secret.put",
            namespace: Some(ns.clone()),
            object: Some(record.name.clone()),
            before: None,
            after: serde_json::to_value(record).ok(),
        })
    });
    let (created, record) = state
        .store
        .put_secret(&namespace, &name, &sealed, Utc::now(), audit)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(record)))
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<SecretRecord>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let ns = namespace.clone();
    let audit = audit::by(&caller, move |deleted: &Option<SecretRecord>| {
        deleted.as_ref().map(|record| Change {
            action: "secret.delete",
            namespace: Some(ns.clone()),
            object: Some(record.name.clone()),
            before: serde_json::to_value(record).ok(),
            after: None,
        })
    });
    let record = state
        .store
        .delete_secret(&namespace, &name, audit)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!("secret {name:?} in namespace {namespace:?}"))
        })?;
    Ok(Json(record))
}

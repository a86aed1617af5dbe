//! Job versions: the definitions a job has had (`GET /jobs/{name}/versions`), and putting an
//! earlier one back (`POST /jobs/{name}/rollback`). A rollback is written through the same path
//! as a PUT, so it is validated, permission-checked and audited again, and becomes a new
//! version: history is only ever added to.

use super::extract::{Path, Query};
use super::jobs::{find, store_job};
use super::{body, parse_json, ApiError, Namespace};
use crate::auth::Caller;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use sked_core::records::JobVersion;
use sked_store::PutMode;

/// A job's kept definitions, newest first.
#[derive(Debug, Serialize)]
pub struct VersionList {
    pub job: String,
    pub namespace: String,
    /// The version in force now.
    pub current: u32,
    pub versions: Vec<JobVersion>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<VersionList>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let versions = kept(&state, &namespace, &name).await?;
    Ok(Json(VersionList {
        current: versions.first().map_or(0, |v| v.version),
        job: name,
        namespace,
        versions,
    }))
}

/// `POST /jobs/{name}/rollback`: which version to put back.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    pub to: u32,
}

pub async fn rollback(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let namespace = ns.checked(&caller)?;
    let request: Rollback = parse_json(&body(raw)?)?;
    let versions = kept(&state, &namespace, &name).await?;
    let Some(wanted) = versions.iter().find(|v| v.version == request.to) else {
        let (newest, oldest) = (
            versions.first().map_or(0, |v| v.version),
            versions.last().map_or(0, |v| v.version),
        );
        return Err(ApiError::invalid(
            "to",
            format!(
                "job {name:?} keeps versions {oldest} to {newest}, not {}",
                request.to
            ),
        ));
    };
    let definition = serde_json::to_vec(&wanted.spec).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot encode version {}: {e}", request.to),
        )
    })?;
    store_job(
        &state,
        &caller,
        &namespace,
        Some(&name),
        &definition,
        PutMode::Upsert,
        "job.rollback",
    )
    .await
}

/// The job's kept versions; 404 when there is no such job.
async fn kept(state: &AppState, namespace: &str, name: &str) -> Result<Vec<JobVersion>, ApiError> {
    match state.store.job_versions(namespace, name).await? {
        Some(versions) => Ok(versions),
        // Answered as a read of the job would be.
        None => find(state, namespace, name).await.map(|_| Vec::new()),
    }
}

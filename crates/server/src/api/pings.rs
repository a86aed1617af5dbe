//! Pings of heartbeat jobs (`sked_core::heartbeat`): `POST /api/v1/jobs/{name}/ping` with a
//! token that may post events, or `POST /ping/{token}` with the job's ping token in the path
//! instead, for a script or a cron line that sends no header; `GET /api/v1/jobs/{name}/ping-url`
//! tells an editor that address. Pings are not audited: like a worker's heartbeats, they come
//! every period and change no definition.

use super::extract::{Path, Query};
use super::jobs::find;
use super::{ApiError, Namespace};
use crate::auth::Caller;
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use sked_core::records::JobRecord;
use sked_core::TargetSpec;
use sked_store::PingOutcome;
use std::time::Instant;

/// What a ping did.
#[derive(Debug, Serialize)]
pub struct PingAnswer {
    pub namespace: String,
    pub job: String,
    /// `answered`: it ended the oldest run waiting for a ping, `succeeded`; `kept`: no run
    /// waited, and the next one credits it if it is due within the grace.
    pub outcome: &'static str,
    /// The run it answered.
    pub run_id: Option<i64>,
}

/// A heartbeat job's address for pings without a token.
#[derive(Debug, Serialize)]
pub struct PingUrl {
    /// `/ping/{token}`, on any node of the cluster.
    pub path: String,
    /// The path on this node's public URL (`--public-url`, else the address it listens on).
    pub url: String,
}

pub async fn ping(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<PingAnswer>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let job = find(&state, &namespace, &name).await?;
    answer(&state, &job).await.map(Json)
}

pub async fn ping_url(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<PingUrl>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let job = find(&state, &namespace, &name).await?;
    if !matches!(job.spec.target, TargetSpec::Heartbeat(_)) {
        return Err(not_a_heartbeat(&job));
    }
    let path = format!("/ping/{}", state.completion.ping_token(job.id));
    Ok(Json(PingUrl {
        url: format!("{}{path}", state.public_url()),
        path,
    }))
}

pub async fn ping_by_token(
    State(state): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    Path(token): Path<String>,
) -> Result<Json<PingAnswer>, ApiError> {
    let peer = peer.map(|axum::Extension(info)| info.0.ip());
    // A genuine address is known without reading anything, and is heard even from a peer
    // past its refusals: only refusals are counted, and only they are held back.
    let Some(job_id) = state.completion.ping_job(&token) else {
        if let Some(Err(wait)) = peer.map(|p| state.completion_refusals.check(p, Instant::now())) {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many refused pings from this address; wait and use the job's ping address",
            )
            .retry_after(wait));
        }
        if let Some(peer) = peer {
            state.completion_refusals.refused(peer, Instant::now());
        }
        return Err(ApiError::not_found("ping address".to_string()));
    };
    if let Some(Err(wait)) = state.pings.as_ref().map(|r| r.check(Some(job_id))) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "this job is pinged too often; one ping per period is enough",
        )
        .retry_after(wait));
    }
    let job = state
        .store
        .get_job_by_id(job_id)
        .await?
        .ok_or_else(|| ApiError::not_found("ping address".to_string()))?;
    answer(&state, &job).await.map(Json)
}

async fn answer(state: &AppState, job: &JobRecord) -> Result<PingAnswer, ApiError> {
    let outcome = state
        .store
        .ping(job.id, Utc::now())
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {:?}", job.name)))?;
    let (outcome, run_id) = match outcome {
        PingOutcome::NotHeartbeat => return Err(not_a_heartbeat(job)),
        PingOutcome::Kept => ("kept", None),
        PingOutcome::Answered { run_id, released } => {
            if !released.is_empty() {
                let runs = state.store.queued_runs(Some(&released)).await?;
                state.dispatcher.enqueue(runs);
            }
            ("answered", Some(run_id))
        }
    };
    Ok(PingAnswer {
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        outcome,
        run_id,
    })
}

fn not_a_heartbeat(job: &JobRecord) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_a_heartbeat",
        format!(
            "job {:?} is not a heartbeat job: only a job with target `heartbeat` takes pings",
            job.name
        ),
    )
}

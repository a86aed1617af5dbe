//! `/api/v1/runs`: the ledger — list, read with attempts, captured output, cancel, and a
//! consumer's completion report.

use super::extract::{Path, Query};
use super::jobs::{check_limit, parse_run_state, RunPage};
use super::{ApiError, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::follows::Refusal;
use crate::metrics::Metrics;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::run::RunState;
use sked_store::{CancelOutcome, RetryOutcome, RunQuery};
use std::time::{Duration, Instant};

#[derive(Debug, Deserialize)]
pub struct ListParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    job: Option<String>,
    state: Option<String>,
    /// `true`: only the runs that missed a deadline.
    #[serde(default)]
    deadline_missed: bool,
    /// `true`: only the runs called at risk of missing their `finish_by`.
    #[serde(default)]
    at_risk: bool,
    limit: Option<u32>,
    cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<ListParams>,
) -> Result<Json<RunPage>, ApiError> {
    let query = RunQuery {
        namespace: Namespace {
            namespace: p.namespace,
        }
        .checked(&caller)?,
        job: p.job.filter(|j| !j.is_empty()),
        state: parse_run_state(p.state.as_deref())?,
        deadline_missed: p.deadline_missed,
        at_risk: p.at_risk,
        limit: check_limit(p.limit)?,
        cursor: p.cursor,
    };
    let page = state.store.list_runs(&query).await?;
    Ok(Json(RunPage {
        runs: page.items,
        next_cursor: page.next_cursor,
    }))
}

/// A run with its attempts, oldest attempt first.
#[derive(Debug, Serialize)]
pub struct RunView {
    #[serde(flatten)]
    pub run: RunRecord,
    pub lateness_ms: f64,
    pub attempt_history: Vec<AttemptRecord>,
    /// A queued run that this node's dispatcher cannot hand to any worker asking for work:
    /// why (`waiting for workers: 3 eligible, all over the breaker threshold`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for_workers: Option<String>,
    /// Its trace: the id while traces are exported, and its spans from the ledger.
    pub trace: crate::traces::TraceView,
}

/// The run with its attempts; a run of a namespace `caller` does not see does not exist.
async fn find(
    state: &AppState,
    caller: &Caller,
    id: i64,
) -> Result<(RunRecord, Vec<AttemptRecord>), ApiError> {
    let what = format!("run {id}");
    let (run, attempts) = state
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(&what))?;
    caller.reach(&run.namespace, &what)?;
    Ok((run, attempts))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Json<RunView>, ApiError> {
    let (run, attempts) = find(&state, &caller, id).await?;
    let waiting_for_workers = (run.state == RunState::Queued)
        .then(|| state.dispatcher.waiting_for_workers(run.id))
        .flatten();
    let trace = crate::traces::view(&state, &run, &attempts, Utc::now());
    Ok(Json(RunView {
        lateness_ms: run.lateness_ms(),
        run,
        attempt_history: attempts,
        waiting_for_workers,
        trace,
    }))
}

/// A consumer reports the outcome of a run that awaits completion. No API token: the body
/// carries the run's completion token, which only the message of its attempt held
/// (`crate::completion`). Answers with the run as it is afterwards.
///
/// A peer whose reports were refused (no such run, a wrong token) more than
/// [`REFUSALS_PER_SECOND`](crate::rate::REFUSALS_PER_SECOND) times in a second is answered 429
/// before the store is read for its next reports, until the second is over; a token the server
/// made is told apart without reading anything and is always heard.
pub async fn complete(
    State(state): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    Path(id): Path<i64>,
    raw: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<RunRecord>, ApiError> {
    let peer = peer.map(|axum::Extension(info)| info.0.ip());
    let report: crate::completion::CompletionReport =
        super::parse_json(&super::body_within(raw, super::MAX_REPORT)?)?;
    let genuine = state.completion.made(&report.token).is_some();
    let tripped = peer
        .filter(|_| !genuine)
        .and_then(|p| state.completion_refusals.check(p, Instant::now()).err());
    if let Some(wait) = tripped {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many refused completion reports from this address; wait and send the right token",
        )
        .retry_after(wait));
    }
    let recorded = match state.store.get_run(id).await? {
        Some((run, attempts)) => crate::completion::record(&state, &run, &attempts, report).await,
        None => Err(ApiError::not_found(format!("run {id}"))),
    };
    if let Err(refusal) = recorded {
        let made_up = matches!(
            refusal.status,
            StatusCode::NOT_FOUND | StatusCode::FORBIDDEN
        );
        if let (true, Some(peer)) = (made_up, peer) {
            state.completion_refusals.refused(peer, Instant::now());
        }
        return Err(refusal);
    }
    let (run, _) = state
        .store
        .get_run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
    Ok(Json(run))
}

#[derive(Debug, Serialize)]
pub struct CancelView {
    /// `cancelled`, `requested` (the worker is told to stop) or `already_finished`.
    pub cancel: &'static str,
    pub run: RunRecord,
}

pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Json<CancelView>, ApiError> {
    // The namespace is checked before anything changes.
    find(&state, &caller, id).await?;
    let audit = audit::by(&caller, move |outcome: &Option<CancelOutcome>| {
        let (cancel, run) = match outcome.as_ref()? {
            CancelOutcome::Cancelled { run, .. } => ("cancelled", run),
            CancelOutcome::Requested(run) => ("requested", run),
            CancelOutcome::AlreadyFinished(run) => ("already_finished", run),
        };
        Some(Change {
            action: "run.cancel",
            namespace: Some(run.namespace.clone()),
            object: Some(id.to_string()),
            before: None,
            after: Some(serde_json::json!({"cancel": cancel, "job": run.job})),
        })
    });
    let outcome = state
        .store
        .cancel_run(id, Utc::now(), audit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
    let (cancel, run) = match outcome {
        CancelOutcome::Cancelled { run, released } => {
            state
                .metrics
                .run_ended(&run.namespace, RunState::Cancelled, None);
            // Other nodes learn it from the store's announcement.
            state.dispatcher.remove(&[run.id]);
            if !released.is_empty() {
                state
                    .dispatcher
                    .enqueue(state.store.queued_runs(Some(&released)).await?);
            }
            ("cancelled", run)
        }
        CancelOutcome::Requested(run) => ("requested", run),
        CancelOutcome::AlreadyFinished(run) => ("already_finished", run),
    };
    Ok(Json(CancelView { cancel, run }))
}

#[derive(Debug, Serialize)]
pub struct RetryView {
    pub run: RunRecord,
    /// Runs of its dependants, skipped because it had failed, now waiting for it again.
    pub reopened: Vec<i64>,
}

/// Reopens a run that ended otherwise than succeeded (`Store::retry_run`); 409 with the reason
/// when it may not be.
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
) -> Result<Json<RetryView>, ApiError> {
    // The namespace is checked before anything changes.
    let (before, _) = find(&state, &caller, id).await?;
    let ended = serde_json::json!({
        "job": before.job,
        "skip_reason": before.skip_reason,
        "error": before.error,
    });
    let audit = audit::by(&caller, move |outcome: &Option<RetryOutcome>| {
        let Some(RetryOutcome::Retried {
            run, was, reopened, ..
        }) = outcome
        else {
            return None;
        };
        let mut before = ended.clone();
        before["state"] = serde_json::json!(was);
        Some(Change {
            action: "run.retry",
            namespace: Some(run.namespace.clone()),
            object: Some(id.to_string()),
            before: Some(before),
            after: Some(serde_json::json!({"state": run.state, "reopened": reopened})),
        })
    });
    let outcome = state
        .store
        .retry_run(id, Utc::now(), audit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {id}")))?;
    let (run, queued, reopened) = match outcome {
        RetryOutcome::Retried {
            run,
            queued,
            reopened,
            ..
        } => (run, queued, reopened),
        RetryOutcome::Refused { run, reason } => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_retryable",
                format!("run {} of job {} is not retried: {reason}", run.id, run.job),
            ))
        }
    };
    if !queued.is_empty() {
        state
            .dispatcher
            .enqueue(state.store.queued_runs(Some(&queued)).await?);
    }
    Ok(Json(RetryView { run, reopened }))
}

#[derive(Debug, Deserialize)]
pub struct LogParams {
    /// Attempt number (1 is the first); the latest when absent.
    attempt: Option<u32>,
    #[serde(default)]
    follow: bool,
}

const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// What a refused follow is told to wait.
const FOLLOW_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The output of one attempt as text; with `follow=true` the response streams until the run
/// has ended and all its output is sent, or the token it was opened with is revoked or
/// expires (within [`FOLLOW_POLL`] and the token cache's half second).
pub async fn log(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    Query(p): Query<LogParams>,
    request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (run, attempts) = find(&state, &caller, id).await?;
    let pick = |attempts: &[AttemptRecord]| match p.attempt {
        Some(n) => attempts.iter().find(|a| a.number == n).map(|a| a.id),
        None => attempts.last().map(|a| a.id),
    };
    let headers = [("content-type", "text/plain; charset=utf-8")];
    if !p.follow {
        let bytes = match pick(&attempts) {
            Some(attempt_id) => state.store.read_output(attempt_id, 0).await?,
            None if p.attempt.is_some() => {
                return Err(ApiError::not_found(format!(
                    "attempt {:?} of run {id}",
                    p.attempt
                )))
            }
            None => Vec::new(),
        };
        return Ok((headers, bytes).into_response());
    }
    // Each follow polls the store until its run ends: bounded in number, shared between
    // tokens and namespaces, and ended as soon as its client goes.
    let admin = caller.role == sked_core::auth::Role::Admin;
    let slot = match state.follows.take(caller.token_id, &run.namespace, admin) {
        Ok(slot) => slot,
        Err(refusal) => {
            let why = match refusal {
                Refusal::Full => format!(
                    "{} logs are being followed, the most this server allows",
                    state.follows.total()
                ),
                Refusal::Token(part) => format!(
                    "this token follows {part} logs, its share of the {} this server allows",
                    state.follows.total()
                ),
                Refusal::Namespace(part) => format!(
                    "namespace {:?} has {part} logs followed, its share of the {} this server \
                     allows",
                    run.namespace,
                    state.follows.total()
                ),
            };
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_follows",
                format!("{why}; read the log without follow=true, or try again later"),
            )
            .retry_after(FOLLOW_RETRY_AFTER));
        }
    };
    // Asked again as the follow goes on: a revoked or expired token's follow ends.
    let authorization = request_headers
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes().to_vec());
    let auth = state.auth.clone();
    let peer = caller.peer;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let store = state.store.clone();
    let mut attempt_id = pick(&attempts);
    let mut finished = run.state.is_terminal();
    let metrics = state.metrics.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let _counted = Metrics::hold(&metrics.log_follows);
        let mut offset = 0u64;
        let mut checked = Instant::now();
        loop {
            if checked.elapsed() >= FOLLOW_POLL {
                checked = Instant::now();
                if auth
                    .caller(authorization.as_deref(), peer, Utc::now())
                    .await
                    .is_err()
                {
                    // The token was revoked or expired (or the store cannot say): the stream
                    // ends here, as if the run had.
                    return;
                }
            }
            if let Some(aid) = attempt_id {
                match store.read_output(aid, offset).await {
                    Ok(bytes) if !bytes.is_empty() => {
                        offset += bytes.len() as u64;
                        if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("log follow of run {id}: {e}");
                        return;
                    }
                }
            }
            if finished {
                return;
            }
            tokio::select! {
                // The response body was dropped: the client went away.
                () = tx.closed() => return,
                () = tokio::time::sleep(FOLLOW_POLL) => {}
            }
            match store.get_run(id).await {
                Ok(Some((run, attempts))) => {
                    finished = run.state.is_terminal();
                    let latest = match p.attempt {
                        Some(n) => attempts.iter().find(|a| a.number == n).map(|a| a.id),
                        None => attempts.last().map(|a| a.id),
                    };
                    if latest != attempt_id {
                        // A new attempt started: follow it from its beginning.
                        attempt_id = latest;
                        offset = 0;
                    }
                }
                Ok(None) | Err(_) => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok((headers, Body::from_stream(stream)).into_response())
}

//! `/api/v1/workers` and `/api/v1/attempts`: the worker protocol (register, heartbeat, lease,
//! output, complete) and the list of workers. Message types are in `sked_core::protocol`.

use super::extract::{Path, Query};
use super::jobs::check_limit;
use super::{body, body_within, parse_json, ApiError, MAX_OUTPUT_CHUNK};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::dispatch::{KnownWorker, LoadReport};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use rand::Rng;
use serde::{Deserialize, Serialize};
use sked_core::dispatch::{WorkerLoad, MAX_AFFINITY_KEY_BYTES, MAX_WARM_KEYS};
use sked_core::protocol::{
    check_worker_labels, CompleteRequest, CompleteResponse, HeartbeatRequest, HeartbeatResponse,
    LeaseRequest, LeaseResponse, RegisterRequest, RegisterResponse, MAX_WORKER_BROKERS,
};
use sked_core::records::WorkerRecord;
use sked_store::{AppendOutcome, AttemptReport, Drained, NewWorker};
use std::time::Duration;

#[derive(Debug, Serialize)]
pub struct WorkerList {
    pub workers: Vec<WorkerView>,
    pub next_cursor: Option<String>,
}

/// A registered worker, with its load as this node's dispatcher knows it.
#[derive(Debug, Serialize)]
pub struct WorkerView {
    #[serde(flatten)]
    pub worker: WorkerRecord,
    /// Absent when it has not spoken to this node since the node started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadView>,
}

/// What dispatch reads of a worker (docs/DISPATCH.md).
#[derive(Debug, Serialize)]
pub struct LoadView {
    /// Its stall gauge, as last reported.
    pub stall: u32,
    /// Attempts this node handed it since its last heartbeat.
    pub assigned_since_heartbeat: u32,
    /// The affinity keys it reported warm.
    pub warm_keys: usize,
    /// Its pool's overload policy, and whether it holds the worker back now.
    pub overload: sked_core::dispatch::Overload,
    pub overloaded: bool,
}

#[derive(Debug, Deserialize)]
pub struct WorkerListParams {
    limit: Option<u32>,
    cursor: Option<String>,
}

/// The most bytes of workers one page of the list holds (at least one worker, whatever its
/// size): past it the page ends early, with a cursor to the rest.
pub const MAX_LIST_BYTES: usize = 1024 * 1024;

/// Registered workers in id order, a page at a time: those that may run jobs of a namespace
/// the caller sees (a page may hold fewer than `limit` for a token of few namespaces), and at
/// most [`MAX_LIST_BYTES`] of them.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<WorkerListParams>,
) -> Result<Json<WorkerList>, ApiError> {
    let limit = check_limit(p.limit)?;
    let page = state.store.list_workers(limit, p.cursor.as_deref()).await?;
    let mut workers = Vec::new();
    let mut bytes = 0usize;
    let mut next_cursor = page.next_cursor;
    for worker in page.items {
        if !caller.sees_any(&worker.namespaces) {
            continue;
        }
        let view = WorkerView {
            load: state.dispatcher.known_worker(&worker.id).map(|k| LoadView {
                stall: k.stall,
                assigned_since_heartbeat: k.assigned,
                warm_keys: k.warm_keys.len(),
                overload: k.overload.policy,
                overloaded: k.overload.overloaded(),
            }),
            worker,
        };
        let size = serde_json::to_vec(&view).map_or(0, |v| v.len());
        if !workers.is_empty() && bytes + size > MAX_LIST_BYTES {
            // The page is full: the next one starts after the last worker in this one.
            next_cursor = workers
                .last()
                .map(|last: &WorkerView| sked_store::cursor::after_worker(&last.worker).encode());
            break;
        }
        bytes += size;
        workers.push(view);
    }
    Ok(Json(WorkerList {
        workers,
        next_cursor,
    }))
}

fn unknown_worker(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "unknown_worker",
        format!("worker {id} is not registered or was declared dead; register again"),
    )
}

pub const MAX_SLOTS: u32 = 10_000;
/// The most attempts a heartbeat may report running: no worker runs more than its slots.
const MAX_RUNNING_REPORTED: usize = MAX_SLOTS as usize;

pub async fn register(
    State(state): State<AppState>,
    caller: Caller,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    // An admin (and an open development server) is trusted with its own pace.
    let limited = caller.role != sked_core::auth::Role::Admin;
    if let Some(Err(wait)) = state
        .registrations
        .as_ref()
        .filter(|_| limited)
        .map(|rate| rate.check(caller.token_id))
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_registrations",
            format!(
                "this token registered more workers than the server allows per second; \
                 register again in {} ms",
                wait.as_millis().max(1)
            ),
        )
        .retry_after(wait));
    }
    let req: RegisterRequest = parse_json(&body(raw)?)?;
    check_worker_labels(&req.labels).map_err(|why| ApiError::invalid("labels", why))?;
    caller.may_claim(&req.labels)?;
    if req.slots == 0 || req.slots > MAX_SLOTS {
        return Err(ApiError::invalid(
            "slots",
            format!("must be between 1 and {MAX_SLOTS}"),
        ));
    }
    if req.name.is_empty() || req.name.len() > 256 {
        return Err(ApiError::invalid("name", "must be 1 to 256 bytes"));
    }
    let id = format!(
        "{}-{:016x}",
        sanitize(&req.name),
        rand::thread_rng().gen::<u64>()
    );
    let namespaces = caller.worker_namespaces();
    let worker = NewWorker {
        id: id.clone(),
        name: req.name,
        labels: req.labels.clone(),
        slots: req.slots,
        namespaces: namespaces.clone(),
        token_id: caller.token_id,
        publisher: false,
    };
    state.store.register_worker(&worker, Utc::now()).await?;
    state.dispatcher.remember_worker(
        &id,
        KnownWorker {
            labels: req.labels,
            slots: req.slots,
            namespaces,
            token_id: caller.token_id,
            ..KnownWorker::new(state.config.overload)
        },
    );
    tracing::info!(
        "worker {id} registered with {} slots by token {}",
        req.slots,
        caller.name
    );
    Ok((
        StatusCode::CREATED,
        Json(RegisterResponse {
            worker_id: id,
            heartbeat_interval_ms: state.config.heartbeat_interval.as_millis() as u64,
            heartbeat_timeout_ms: state.config.heartbeat_timeout.as_millis() as u64,
            http_target_policy: state.config.http_target_policy.clone(),
        }),
    ))
}

/// Worker ids carry the worker's name for readable logs, limited to safe characters.
fn sanitize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(48)
        .collect()
}

pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let req: HeartbeatRequest = parse_json(&body(raw)?)?;
    // A report out of bounds is refused as such (400) whoever sends it, before the worker is
    // looked up; only a well-formed one learns whether the worker is still known.
    if req.warm_keys.len() > MAX_WARM_KEYS {
        return Err(ApiError::invalid(
            "warm_keys",
            format!(
                "lists {} keys; at most {MAX_WARM_KEYS}",
                req.warm_keys.len()
            ),
        ));
    }
    if let Some(key) = req
        .warm_keys
        .iter()
        .find(|k| k.len() > MAX_AFFINITY_KEY_BYTES)
    {
        return Err(ApiError::invalid(
            "warm_keys",
            format!(
                "a key of {} bytes; at most {MAX_AFFINITY_KEY_BYTES}",
                key.len()
            ),
        ));
    }
    let overload = match req.overload {
        None => state.config.overload,
        Some(setting) => setting
            .control()
            .map_err(|e| ApiError::invalid("overload.reset", e))?,
    };
    if req.running.len() > MAX_RUNNING_REPORTED {
        return Err(ApiError::invalid(
            "running",
            format!(
                "lists {} attempts; a worker runs at most {MAX_RUNNING_REPORTED}",
                req.running.len()
            ),
        ));
    }
    owned_worker(&state, &caller, &id).await?;
    let now = Utc::now();
    let forgotten_before = crate::attempts::forgotten_before(&state, now);
    let beat = state.store.heartbeat(
        &id,
        &req.running,
        now,
        crate::attempts::lease_renewal(&state),
        forgotten_before,
    );
    let outcome = state.metrics.store_call("heartbeat", beat).await?;
    if !outcome.forgotten.is_empty() {
        tracing::warn!(
            "worker {id} does not know attempts {:?} (their lease answer was lost); \
             their runs go to the reaper",
            outcome.forgotten
        );
    }
    if !outcome.known {
        state.dispatcher.forget_worker(&id);
        return Err(unknown_worker(&id));
    }
    let report = LoadReport {
        attempts: req.running,
        started_before: forgotten_before,
        stall: req.stall,
        warm_keys: req.warm_keys,
    };
    state.dispatcher.report_load(&id, report, overload);
    // Another node may have taken the drain: every node learns it here. A worker draining
    // on its own says so itself; no other node has its poll, so this node's memory suffices.
    if outcome.draining || req.draining {
        state.dispatcher.drain_worker(&id);
    }
    Ok(Json(HeartbeatResponse {
        stop: outcome.stop,
        drain: outcome.draining,
    }))
}

/// Asks a worker to drain: no node hands it new attempts (this one at once, the others at its
/// next heartbeat, which also tells the worker), and the worker exits once its running
/// attempts end or its drain grace passes.
pub async fn drain(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<WorkerRecord>, ApiError> {
    let drained = state
        .store
        .drain_worker(
            &id,
            // Audited once: by the request that drained it.
            audit::by(&caller, |drained: &Option<Drained>| {
                drained.as_ref().filter(|d| d.newly).map(|drained| Change {
                    action: "worker.drain",
                    namespace: None,
                    object: Some(drained.worker.id.clone()),
                    before: None,
                    after: serde_json::to_value(&drained.worker).ok(),
                })
            }),
        )
        .await?
        .ok_or_else(|| ApiError::not_found(format!("live worker {id:?}")))?;
    state.dispatcher.drain_worker(&id);
    Ok(Json(drained.worker))
}

/// A worker's clean stop, at the end of its shutdown: it is listed `stopped`, not lost, and
/// any attempt it still holds is taken back now rather than after the heartbeat timeout.
/// Answers the worker as it is now; afterwards its id is unknown (410), as for a worker
/// declared dead.
pub async fn deregister(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<WorkerRecord>, ApiError> {
    // The body says nothing yet, but one that is not an object is refused (400) before the
    // worker is looked up, as for every worker call.
    let raw = body(raw)?;
    if !raw.is_empty() && !parse_json::<serde_json::Value>(&raw)?.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the body, when there is one, must be a JSON object",
        ));
    }
    owned_worker(&state, &caller, &id).await?;
    state.dispatcher.drain_worker(&id);
    let stopped = state.store.deregister_worker(&id, Utc::now()).await?;
    state.dispatcher.forget_worker(&id);
    let stopped = stopped.ok_or_else(|| unknown_worker(&id))?;
    tracing::info!("worker {id} stopped");
    Ok(Json(stopped))
}

/// The worker's registration, from memory or, after a server restart, from the store.
async fn known_worker(state: &AppState, id: &str) -> Result<KnownWorker, ApiError> {
    if let Some(worker) = state.dispatcher.known_worker(id) {
        return Ok(worker);
    }
    let record = state
        .store
        .get_worker(id)
        .await?
        .filter(|w| w.alive)
        .ok_or_else(|| unknown_worker(id))?;
    let worker = KnownWorker {
        labels: record.labels,
        slots: record.slots,
        namespaces: record.namespaces,
        token_id: record.token_id,
        draining: record.draining,
        ..KnownWorker::new(state.config.overload)
    };
    state.dispatcher.remember_worker(id, worker.clone());
    Ok(worker)
}

/// The worker `id`, if `caller` is the token it registered with: no other token, an admin's
/// included, speaks for it.
async fn owned_worker(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<KnownWorker, ApiError> {
    let worker = known_worker(state, id).await?;
    if worker.token_id != caller.token_id {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("worker {id} was registered with another token"),
        ));
    }
    Ok(worker)
}

pub async fn lease(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<LeaseResponse>, ApiError> {
    let req: LeaseRequest = parse_json(&body(raw)?)?;
    if req.brokers.len() > MAX_WORKER_BROKERS {
        return Err(ApiError::invalid(
            "brokers",
            format!("at most {MAX_WORKER_BROKERS} broker connections"),
        ));
    }
    for name in &req.brokers {
        sked_core::job::validate_name("brokers", name)
            .map_err(|e| ApiError::invalid("brokers", e.message))?;
    }
    if req.capabilities.len() > sked_core::limits::Capability::ALL.len() {
        return Err(ApiError::invalid(
            "capabilities",
            format!(
                "at most {} capabilities, each once",
                sked_core::limits::Capability::ALL.len()
            ),
        ));
    }
    let worker = owned_worker(&state, &caller, &id).await?;
    if worker.draining {
        return Ok(Json(LeaseResponse {
            attempts: Vec::new(),
            drain: true,
        }));
    }
    let free = req.max.min(worker.slots);
    if free == 0 {
        return Ok(Json(LeaseResponse {
            attempts: Vec::new(),
            drain: false,
        }));
    }
    // The poll takes at most what the worker asked for; how busy the worker is, the
    // dispatcher keeps counting while the poll is open.
    let load = WorkerLoad {
        running: worker.slots - free,
        cap: free,
        brokers: req.brokers,
        capabilities: req.capabilities,
        ..worker.load(&id)
    };
    let wait = Duration::from_millis(req.wait_ms).min(state.config.max_lease_wait);
    let handout = state.dispatcher.poll(load, wait).await;
    if handout.runs().is_empty() {
        // A drain may have ended the poll.
        let drain = state
            .dispatcher
            .known_worker(&id)
            .is_some_and(|w| w.draining);
        return Ok(Json(LeaseResponse {
            attempts: Vec::new(),
            drain,
        }));
    }
    let attempts = crate::attempts::start(&state, &id, handout).await?;
    Ok(Json(LeaseResponse {
        attempts,
        drain: false,
    }))
}

/// Completions are fenced by each attempt's token; the worker must also still be known, as for
/// a lease. A worker declared dead gets 410 here too, and learns to register again. Its
/// completions are not needed: the reaper took away the leases of its running attempts in the
/// same transaction that declared it dead (an attempt it still started afterwards is taken away
/// at the next sweep), and their runs are queued again without spending a retry.
pub async fn complete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<CompleteResponse>, ApiError> {
    let req: CompleteRequest = parse_json(&body(raw)?)?;
    owned_worker(&state, &caller, &id).await?;
    let reports: Vec<AttemptReport> = req
        .completions
        .iter()
        .map(|c| AttemptReport {
            attempt_id: c.attempt_id,
            token: c.token,
            worker_id: id.clone(),
            outcome: c.outcome,
            exit_code: c.exit_code,
            http_status: c.http_status,
            error: c.error.as_ref().map(|e| e.chars().take(4096).collect()),
        })
        .collect();
    let results = crate::attempts::complete(&state, &reports).await?;
    // Accepted or refused as final, the worker holds these attempts no more.
    let ended: Vec<i64> = results.iter().map(|r| r.attempt_id).collect();
    state.dispatcher.completed(&id, &ended);
    Ok(Json(CompleteResponse { results }))
}

#[derive(Debug, Deserialize)]
pub struct OutputParams {
    /// The attempt's fencing token.
    token: i64,
    /// The worker that holds the attempt.
    worker: String,
}

#[derive(Debug, Serialize)]
pub struct AppendView {
    pub kept: u64,
    pub truncated: bool,
}

/// Output of a running attempt, from the worker that holds it under its own token.
pub async fn append_output(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<i64>,
    Query(p): Query<OutputParams>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<AppendView>, ApiError> {
    owned_worker(&state, &caller, &p.worker).await?;
    let bytes = body_within(raw, MAX_OUTPUT_CHUNK)?;
    match state
        .store
        .append_output(id, p.token, &p.worker, &bytes, state.config.output_cap)
        .await?
    {
        AppendOutcome::Accepted { kept, truncated } => Ok(Json(AppendView { kept, truncated })),
        AppendOutcome::Rejected => Err(ApiError::new(
            StatusCode::CONFLICT,
            "fenced",
            format!("attempt {id} does not hold a lease with that token"),
        )),
    }
}

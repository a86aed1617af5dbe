//! `POST /api/v1/jobs/{name}/backfill`: records the instants a job's schedule names in a past
//! range, as if it had been set before it (`Schedule::instants_between`), each once: an
//! instant already in the ledger stays as it is. The runs meet the job's dependencies like
//! scheduled ones, and its dependants follow them; they wait their turn rather than being
//! dropped by overlap (`OverlapPolicy::for_trigger`), and meet the queue's caps as a
//! schedule's instants do (`crate::admission`): past the job's or the namespace's cap an instant
//! is recorded skipped with reason `backlog`. `dry_run` lists the instants only.

use super::extract::{Path, Query};
use super::jobs::find;
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
use sked_core::policy::admission::Admission;
use sked_core::run::{RunState, SkipReason, Trigger};
use sked_core::Instant;
use sked_store::{Fire, FireOutcome};

/// The most runs one backfill records: a larger range is backfilled in parts. For a job that
/// is not sharded, that many instants; a sharded job's instant is its shards, and a
/// broadcast's is counted at the most workers it could go to.
pub const MAX_RUNS: usize = 10_000;
/// Runs per store transaction.
const BATCH: usize = 500;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    from: Instant,
    to: Instant,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize)]
pub struct Backfill {
    /// The schedule's instants in the range, in order.
    pub instants: Vec<Instant>,
    pub dry_run: bool,
    /// The runs this backfill recorded (instants not in the ledger before).
    pub recorded: Vec<i64>,
    /// Instants that had a run already, left as they were.
    pub existing: usize,
    /// Recorded instants skipped (reason `backlog`): the job or its namespace had as many runs
    /// queued as its cap allows.
    pub skipped_backlog: usize,
}

pub async fn backfill(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Backfill>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let req: BackfillRequest = parse_json(&body(raw)?)?;
    let job = find(&state, &namespace, &name).await?;
    let now = Utc::now();
    if req.to < req.from {
        return Err(ApiError::invalid("to", "must not be before from"));
    }
    if req.to > now {
        return Err(ApiError::invalid(
            "to",
            "must not be in the future: the schedule records those instants itself",
        ));
    }
    let schedule = crate::schedule_rules::schedule_of(&*state.store, &job).await?;
    if schedule.is_manual() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_timer",
            format!("job {name:?} has no timer schedule: there are no instants to backfill"),
        ));
    }
    if job.spec.paused {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "paused",
            format!("job {name:?} is paused: resume it to backfill it"),
        ));
    }
    let per_instant = if job.spec.broadcast {
        usize::from(sked_core::shard::MAX_SHARDS)
    } else {
        usize::from(sked_core::shard::count(&job.spec))
    };
    let max_instants = (MAX_RUNS / per_instant).max(1);
    let mut instants: Vec<Instant> = schedule
        .instants_between(req.from, req.to, max_instants + 1)
        .into_iter()
        .map(sked_core::ledger_instant)
        .collect();
    instants.dedup();
    if instants.len() > max_instants {
        let each = if per_instant > 1 {
            format!(" ({per_instant} runs each)")
        } else {
            String::new()
        };
        return Err(ApiError::invalid(
            "from",
            format!(
                "the range holds more than {max_instants} instants of the schedule{each}: \
                 backfill it in parts"
            ),
        ));
    }
    let mut answer = Backfill {
        instants,
        dry_run: req.dry_run,
        recorded: Vec::new(),
        existing: 0,
        skipped_backlog: 0,
    };
    if req.dry_run {
        return Ok(Json(answer));
    }
    // From the first decision until the last run is queued, no other backfill decides.
    let _turn = state.backlog.turn().await;
    for chunk in answer.instants.chunks((BATCH / per_instant).max(1)) {
        // The queue counts the earlier chunks' runs; this one's count as they are admitted.
        let mut admission = Admission::default();
        let now = Utc::now();
        let fires: Vec<Fire> = chunk
            .iter()
            .map(|&instant| {
                // A calendar or a blackout window removes the instant, or a calendar moves
                // its run to a business day.
                let occurrence = schedule.outcome(instant);
                let skip = match &occurrence.removed {
                    Some(removed) => Some(removed.by),
                    None => {
                        admission.admit(job.id, &namespace, state.backlog.of(job.id, &namespace))
                    }
                };
                Fire {
                    job_id: job.id,
                    scheduled_for: sked_core::ledger_instant(occurrence.due),
                    trigger: Trigger::Backfill,
                    skip,
                    ready_at: now,
                    advance: None,
                    nominal_for: occurrence.nominal_for,
                    why: occurrence.removed.map(|r| r.why),
                }
            })
            .collect();
        // Each part is audited in its own transaction: an entry for every part recorded.
        let (ns, job_name) = (namespace.clone(), name.clone());
        let (from, to) = (req.from, req.to);
        let part = (chunk.first().copied(), chunk.last().copied());
        let audit = audit::by(&caller, move |outcome: &FireOutcome| {
            let recorded: usize = outcome
                .runs
                .iter()
                .filter(|run| run.inserted)
                .map(|run| run.all_runs().count())
                .sum();
            let existing = outcome.runs.iter().filter(|run| !run.inserted).count();
            Some(Change {
                action: "job.backfill",
                namespace: Some(ns.clone()),
                object: Some(job_name.clone()),
                before: None,
                after: Some(serde_json::json!({
                    "from": from,
                    "to": to,
                    "part": {"from": part.0, "to": part.1},
                    "recorded": recorded,
                    "existing": existing,
                })),
            })
        });
        let outcome = state.store.record_fires(&fires, now, audit).await?;
        let mut queued = outcome.released;
        for (run, fire) in outcome.runs.iter().zip(&fires) {
            if run.inserted {
                answer.recorded.extend(run.all_runs());
                if fire.skip == Some(SkipReason::Backlog) {
                    answer.skipped_backlog += 1;
                    state.metrics.fires_skipped_backlog.inc();
                }
                if run.state == RunState::Queued {
                    queued.extend(run.all_runs());
                }
            } else {
                answer.existing += 1;
            }
        }
        if !queued.is_empty() {
            state
                .dispatcher
                .enqueue(state.store.queued_runs(Some(&queued)).await?);
        }
    }
    Ok(Json(answer))
}

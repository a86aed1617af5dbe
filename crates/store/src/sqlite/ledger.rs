//! The ledger's moves: instants recorded as runs, attempts started and completed, runs cancelled,
//! lost attempts taken back. Each public function runs inside the caller's transaction, so every
//! decision (made by `sked-core`) commits together with its effects.

use super::dependencies::{self, settle};
use super::events;
use super::rows::{self, micros, RUN_COLUMNS};
use crate::shared::{CompletingJob, Ended, NewRun, ReportedAttempt};
use crate::{
    AttemptReport, AttemptStart, CancelOutcome, CompletionEffect, Fire, FireOutcome, FiredRun,
    NotStarted, QueuedRun, ReapOutcome, Result, RetryOutcome, RunUnderWindows, StartOutcome,
    StartedAttempt,
};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::job::JobSpec;
use sked_core::policy::overlap::{decide, ActiveRuns, OverlapDecision};
use sked_core::policy::{OverlapPolicy, RetryPolicy};
use sked_core::run::{AfterAttempt, RunState, SkipReason, Trigger, WaitReason};
use sked_core::Instant;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// Statements over one job's unfinished runs. Each repeats an index's condition word for word
/// (`state IN ('waiting', 'queued', 'running')`, or `state = 'waiting'`): SQLite uses a partial
/// index only when the query provably implies its condition, and without one these statements
/// walk every run the job ever had. `tests::job_scoped_statements_use_partial_indexes` holds
/// them to it.
/// Runs waiting for their dependencies are not active yet: overlap counts only those held back
/// by overlap. Overlap is between instants: the shards of the instant being admitted (`?2`)
/// are not in its way.
pub(super) const COUNT_ACTIVE: &str = "SELECT coalesce(sum(state IN ('queued', 'running')), 0), \
            coalesce(sum(state = 'waiting' AND waiting_reason = 'overlap'), 0) \
     FROM runs WHERE job_id = ?1 AND state IN ('waiting', 'queued', 'running') \
     AND scheduled_for IS NOT ?2";
/// `?3` is the reason recorded on the cancelled runs; `?4` whether runs waiting for their
/// dependencies go too (a deleted job) or stay (an overlap `cancel_running`, which is about
/// runs that could start); `?5` an instant whose shards stay (the one a `cancel_running`
/// admits), or NULL.
pub(super) const CANCEL_UNSTARTED: &str = "UPDATE runs SET state = 'cancelled', finished_at = ?2, \
     error = ?3 WHERE job_id = ?1 AND state IN ('waiting', 'queued', 'running') \
     AND state IN ('queued', 'waiting') AND (?4 OR waiting_reason IS NOT 'dependencies') \
     AND scheduled_for IS NOT ?5 \
     RETURNING namespace, job, scheduled_for, id";
/// A run asked to stop here drops the reason a blackout window may have asked it with (its
/// error at the end is the worker's again), unless that window asked first.
pub(super) const REQUEST_CANCEL_RUNNING: &str = "UPDATE runs SET cancel_requested = 1, \
     error = CASE WHEN cancel_requested THEN error END \
     WHERE job_id = ?1 AND state IN ('waiting', 'queued', 'running') AND state = 'running' \
     AND scheduled_for IS NOT ?2 RETURNING id";
/// Queues the job's oldest instant held back by overlap (every shard of it), once none of its
/// runs is queued or running.
pub(super) const RELEASE_WAITING: &str = "UPDATE runs SET state = 'queued', waiting_reason = NULL \
     WHERE id IN ( \
        SELECT id FROM runs INDEXED BY runs_waiting WHERE job_id = ?1 AND state = 'waiting' \
        AND waiting_reason = 'overlap' AND scheduled_for = ( \
            SELECT scheduled_for FROM runs WHERE job_id = ?1 AND state = 'waiting' \
            AND waiting_reason = 'overlap' ORDER BY scheduled_for, id LIMIT 1)) \
     AND NOT EXISTS (SELECT 1 FROM runs WHERE job_id = ?1 \
        AND state IN ('waiting', 'queued', 'running') AND state IN ('queued', 'running')) \
     RETURNING id";
#[cfg(test)]
const JOB_SCOPED: &[&str] = &[
    COUNT_ACTIVE,
    CANCEL_UNSTARTED,
    REQUEST_CANCEL_RUNNING,
    RELEASE_WAITING,
];

/// Cancels the job's queued and waiting runs (those waiting for dependencies only with
/// `with_dependency_waits`) and asks its running ones to stop, except the shards of `sparing`;
/// returns the running ones, and adds the cancelled ones to `ended`.
pub(super) fn cancel_active(
    tx: &Transaction<'_>,
    job_id: i64,
    reason: &str,
    with_dependency_waits: bool,
    sparing: Option<Instant>,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> Result<Vec<i64>> {
    let sparing = sparing.map(micros);
    {
        let mut stmt = tx.prepare_cached(CANCEL_UNSTARTED)?;
        let cancelled = stmt.query_map(
            params![job_id, micros(now), reason, with_dependency_waits, sparing],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            },
        )?;
        for run in cancelled {
            let (namespace, job, instant, run_id) = run?;
            ended.push(Ended {
                namespace,
                job,
                scheduled_for: rows::instant(instant)?,
                run_id,
                state: RunState::Cancelled,
            });
        }
    }
    let mut stmt = tx.prepare_cached(REQUEST_CANCEL_RUNNING)?;
    let ids = stmt.query_map(params![job_id, sparing], |r| r.get::<_, i64>(0))?;
    Ok(ids.collect::<rusqlite::Result<_>>()?)
}

/// What the fire path needs of a job.
struct FiringJob {
    namespace: String,
    name: String,
    overlap: OverlapPolicy,
    priority: i32,
    version: u32,
    /// Its definition, read only for a job with dependencies (the verdict needs them) or a
    /// broadcast (its routing says which workers it goes to).
    spec: Option<JobSpec>,
    /// A heartbeat job's grace (micros): its runs wait for pings.
    ping_grace: Option<i64>,
    /// The runs each instant is split into (1: not sharded).
    shards: u16,
    broadcast: bool,
}

impl FiringJob {
    fn depends_on(&self) -> Option<&JobSpec> {
        self.spec
            .as_ref()
            .filter(|spec| !spec.depends_on.is_empty())
    }
}

/// Where the instant's shards go, one entry per shard (`sked_core::shard::placements`).
fn placements(tx: &Transaction<'_>, job: &FiringJob) -> Result<Vec<Option<String>>> {
    match job.spec.as_ref().filter(|_| job.broadcast) {
        Some(spec) => placements_of(tx, spec, &job.namespace),
        None => Ok(vec![None; usize::from(job.shards)]),
    }
}

/// Where an instant of a job with `spec` goes (`sked_core::shard::placements`): for a
/// broadcast, one shard per live worker that may take it.
pub(super) fn placements_of(
    tx: &Transaction<'_>,
    spec: &JobSpec,
    namespace: &str,
) -> Result<Vec<Option<String>>> {
    if !spec.broadcast {
        return Ok(sked_core::shard::placements(spec, namespace, &[]));
    }
    let mut stmt = tx.prepare_cached(crate::shared::LIVE_WORKERS)?;
    let mut rows = stmt.query([])?;
    let mut live = Vec::new();
    while let Some(row) = rows.next()? {
        live.push(crate::shared::live_worker(
            row.get(0)?,
            &row.get::<_, String>(1)?,
            &row.get::<_, String>(2)?,
        )?);
    }
    Ok(sked_core::shard::placements(spec, namespace, &live))
}

pub fn record_fires(tx: &Transaction<'_>, fires: &[Fire], now: Instant) -> Result<FireOutcome> {
    let mut outcome = FireOutcome::default();
    let mut ended: Vec<Ended> = Vec::new();
    let mut jobs: HashMap<i64, Option<FiringJob>> = HashMap::new();
    for fire in fires {
        let job = match jobs.entry(fire.job_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(firing_job(tx, fire.job_id)?),
        };
        let Some(job) = job else {
            // Deleted since the instant was computed: nothing is owed any more.
            outcome.runs.push(FiredRun::gone());
            continue;
        };
        // Most fires (overlap `allow`, a skip, a manual run) are decided without reading the
        // job's runs: they are written at once, and a conflict says the instant was recorded
        // already. Any other is looked up first, since deciding it may cancel other runs.
        let decided_alone = fire.skip.is_some()
            || fire.trigger == Trigger::Manual
            || (job.overlap == OverlapPolicy::Allow && job.depends_on().is_none());
        let existing = if decided_alone {
            None
        } else {
            recorded_run(tx, fire)?
        };
        let mut other_shards = Vec::new();
        let (run_id, state, inserted) = match existing {
            Some((id, state)) => (id, state, false),
            None => {
                let new = decide_fire(tx, fire, job, now, &mut outcome, &mut ended)?;
                let state = new.state();
                // Every shard of the instant shares its one decision; a conflict on the first
                // says the instant was recorded already.
                let places = placements(tx, job)?;
                let count = places.len();
                let mut written = Vec::with_capacity(count);
                for (shard, pinned) in places.into_iter().enumerate() {
                    let place = Place {
                        shard,
                        count,
                        pinned,
                    };
                    match insert_run(tx, fire, job, place, &new, now)? {
                        Some(id) => written.push(id),
                        None if shard == 0 => break,
                        None => {}
                    }
                }
                match written.split_first() {
                    Some((&id, others)) => {
                        other_shards = others.to_vec();
                        if state.is_terminal() {
                            for &run_id in &written {
                                ended.push(Ended {
                                    namespace: job.namespace.clone(),
                                    job: job.name.clone(),
                                    scheduled_for: fire.scheduled_for,
                                    run_id,
                                    state,
                                });
                            }
                        }
                        (id, state, true)
                    }
                    None => {
                        let (id, state) = recorded_run(tx, fire)?.ok_or_else(|| {
                            crate::StoreError::Corrupt(format!(
                                "run of job {} at {} conflicts but cannot be found",
                                fire.job_id, fire.scheduled_for
                            ))
                        })?;
                        (id, state, false)
                    }
                }
            }
        };
        let advanced = match &fire.advance {
            None => false,
            Some(advance) => {
                // Applied only while the job's firing state is the one the loop started from.
                let changed = tx
                    .prepare_cached(
                        "UPDATE jobs SET fired_count = ?4, next_fire_at = ?5, \
                         state = CASE WHEN ?5 IS NULL THEN 'completed' ELSE state END \
                         WHERE id = ?1 AND schedule_epoch = ?2 AND fired_count = ?3",
                    )?
                    .execute(params![
                        fire.job_id,
                        micros(advance.epoch),
                        advance.fired_before as i64,
                        advance.fired_before as i64 + 1,
                        advance.next_fire_at.map(micros),
                    ])?;
                changed == 1
            }
        };
        outcome.runs.push(FiredRun {
            run_id,
            state,
            inserted,
            advanced,
            other_shards,
            placed: job.shards > 1 || job.broadcast,
        });
    }
    let settled = settle(tx, ended, Vec::new(), now)?;
    outcome.released = settled.queued;
    outcome.cancel_requested.extend(settled.cancel_requested);
    Ok(outcome)
}

/// The run already recorded for the fire's job and instant (its shard 0, when sharded).
fn recorded_run(tx: &Transaction<'_>, fire: &Fire) -> Result<Option<(i64, RunState)>> {
    let found: Option<(i64, String)> = tx
        .prepare_cached(
            "SELECT id, state FROM runs WHERE job_id = ?1 AND scheduled_for = ?2 AND shard = 0",
        )?
        .query_row(params![fire.job_id, micros(fire.scheduled_for)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    found
        .map(|(id, state)| Ok((id, rows::run_state(&state)?)))
        .transpose()
}

/// One shard of an instant: its place, how many there are, and the worker it is pinned to.
struct Place {
    shard: usize,
    count: usize,
    pinned: Option<String>,
}

/// Writes the fire's run, or one shard of it; `None` when it was recorded already.
fn insert_run(
    tx: &Transaction<'_>,
    fire: &Fire,
    job: &FiringJob,
    place: Place,
    new: &NewRun,
    now: Instant,
) -> Result<Option<i64>> {
    let state = new.state();
    let finished = state.is_terminal().then(|| micros(now));
    let waiting_reason = new.waiting_reason();
    let written = tx
        .prepare_cached(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
             skip_reason, priority, ready_at, created_at, finished_at, error, waiting_reason, \
             waiting_for, waiting_until, job_version, shard, shard_count, pinned_worker, \
             nominal_for) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                     ?17, ?18, ?19, ?20) \
             ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING",
        )?
        .execute(params![
            fire.job_id,
            job.namespace,
            job.name,
            micros(fire.scheduled_for),
            fire.trigger.as_str(),
            state.as_str(),
            new.skip.map(SkipReason::as_str),
            job.priority,
            micros(fire.ready_at),
            micros(now),
            finished,
            new.error,
            waiting_reason.map(WaitReason::as_str),
            new.waiting_for(),
            new.waiting_until(),
            job.version,
            place.shard,
            place.count,
            place.pinned,
            fire.nominal_for.map(micros),
        ])?;
    Ok((written == 1).then(|| tx.last_insert_rowid()))
}

fn firing_job(tx: &Transaction<'_>, job_id: i64) -> Result<Option<FiringJob>> {
    type Row = (
        String,
        String,
        String,
        i32,
        bool,
        u32,
        Option<i64>,
        u16,
        bool,
    );
    let row: Option<Row> = tx
        .prepare_cached(
            "SELECT namespace, name, overlap, priority, has_dependencies, version, ping_grace, \
             shards, broadcast FROM jobs WHERE id = ?1",
        )?
        .query_row(params![job_id], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
            ))
        })
        .optional()?;
    let Some((
        namespace,
        name,
        overlap,
        priority,
        has_dependencies,
        version,
        ping_grace,
        shards,
        broadcast,
    )) = row
    else {
        return Ok(None);
    };
    let overlap = OverlapPolicy::parse(&overlap)
        .ok_or_else(|| crate::StoreError::Corrupt(format!("unknown overlap policy {overlap:?}")))?;
    let spec = if has_dependencies || broadcast {
        let text: String = tx
            .prepare_cached("SELECT spec FROM jobs WHERE id = ?1")?
            .query_row(params![job_id], |r| r.get(0))?;
        Some(rows::spec(&text)?)
    } else {
        None
    };
    Ok(Some(FiringJob {
        namespace,
        name,
        overlap,
        priority,
        version,
        spec,
        ping_grace,
        shards: shards.max(1),
        broadcast,
    }))
}

/// The new run's state: skipped as the fire says; else, for a scheduled instant, waiting
/// while its dependencies are unmet (skipped when they never can be), then by the job's
/// overlap policy, whose `cancel_running` also ends the job's active runs here.
fn decide_fire(
    tx: &Transaction<'_>,
    fire: &Fire,
    job: &FiringJob,
    now: Instant,
    outcome: &mut FireOutcome,
    ended: &mut Vec<Ended>,
) -> Result<NewRun> {
    if let Some(reason) = fire.skip {
        return Ok(NewRun::skipped_fire(reason, fire));
    }
    // A heartbeat's runs wait for pings, each on its own: no overlap, nothing to run. One
    // that a ping came just before already has it.
    if let Some(grace) = job.ping_grace {
        if super::heartbeats::take_kept_ping(tx, fire.job_id, fire.scheduled_for, grace)? {
            return Ok(NewRun {
                state: Some(RunState::Succeeded),
                ..NewRun::default()
            });
        }
        return Ok(NewRun::awaiting_ping(fire.scheduled_for, grace));
    }
    // Manual runs are asked for explicitly: neither dependencies nor overlap hold them back.
    if fire.trigger == Trigger::Manual {
        return Ok(NewRun::default());
    }
    if let Some(spec) = job.depends_on() {
        let verdict = dependencies::judge(tx, &job.namespace, spec, fire.scheduled_for)?;
        if let Some(new) = NewRun::by_dependencies(verdict, spec, now)? {
            return Ok(new);
        }
    }
    let overlap = job.overlap.for_trigger(fire.trigger);
    if overlap == OverlapPolicy::Allow {
        return Ok(NewRun::default());
    }
    let admitted = admit_by_overlap(tx, fire.job_id, fire.scheduled_for, overlap, now, ended)?;
    outcome.cancel_requested.extend(admitted.cancel_requested);
    Ok(NewRun {
        state: Some(admitted.state),
        skip: admitted.skip,
        ..NewRun::default()
    })
}

/// How the overlap policy admits a new run of a job.
pub(super) struct Admitted {
    pub state: RunState,
    pub skip: Option<SkipReason>,
    /// Running runs a `cancel_running` asked to stop.
    pub cancel_requested: Vec<i64>,
}

/// The state a run of the job starts in by its overlap policy (not `allow`): queued, waiting
/// behind an active run, or skipped; `cancel_running` ends the job's other runs that could
/// start (added to `ended`) and asks its running ones to stop.
pub(super) fn admit_by_overlap(
    tx: &Transaction<'_>,
    job_id: i64,
    instant: Instant,
    overlap: OverlapPolicy,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> Result<Admitted> {
    let (active, waiting): (u32, u32) = tx
        .prepare_cached(COUNT_ACTIVE)?
        .query_row(params![job_id, micros(instant)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let mut admitted = Admitted {
        state: RunState::Queued,
        skip: None,
        cancel_requested: Vec::new(),
    };
    match decide(overlap, ActiveRuns { active, waiting }) {
        OverlapDecision::Queue => {}
        OverlapDecision::Wait => admitted.state = RunState::Waiting,
        OverlapDecision::Skip => {
            admitted.state = RunState::Skipped;
            admitted.skip = Some(SkipReason::Overlap);
        }
        OverlapDecision::CancelActiveThenQueue => {
            let reason = "cancelled by a newer run (overlap cancel_running)";
            admitted.cancel_requested =
                cancel_active(tx, job_id, reason, false, Some(instant), now, ended)?;
        }
    }
    Ok(admitted)
}

/// Ends a run that never started as skipped, for `reason`, saying why.
pub(super) fn skip_run(
    tx: &Transaction<'_>,
    run_id: i64,
    reason: SkipReason,
    why: &str,
    now: Instant,
) -> Result<()> {
    tx.prepare_cached(
        "UPDATE runs SET state = 'skipped', skip_reason = ?2, error = ?3, finished_at = ?4 \
         WHERE id = ?1",
    )?
    .execute(params![run_id, reason.as_str(), why, micros(now)])?;
    Ok(())
}

/// Every queued run with its job's definition; `state = 'queued'` is the `runs_queued` index's
/// condition, so a start does not read the whole ledger.
pub(super) const QUEUED: &str = "SELECT r.id, r.job_id, r.namespace, r.job, r.scheduled_for, \
     r.priority, r.ready_at, j.spec, r.event_key, r.event_id, e.payload, r.shard, \
     r.shard_count, r.pinned_worker, r.params, r.trace_parent \
     FROM runs r JOIN jobs j ON j.id = r.job_id LEFT JOIN events e ON e.namespace = r.namespace \
     AND e.key = r.event_key AND e.event_id = r.event_id WHERE r.state = 'queued'";

pub fn queued_runs(tx: &Transaction<'_>, ids: Option<&[i64]>) -> Result<Vec<QueuedRun>> {
    let sql = format!("{QUEUED} AND r.id = ?1");
    let mut runs = Vec::new();
    let mut specs: HashMap<i64, sked_core::job::JobSpec> = HashMap::new();
    let mut push = |row: &rusqlite::Row<'_>| -> Result<()> {
        let job_id: i64 = row.get(1)?;
        let spec = match specs.entry(job_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(rows::spec(&row.get::<_, String>(7)?)?),
        };
        runs.push(
            QueuedRun {
                run_id: row.get(0)?,
                job_id,
                namespace: row.get(2)?,
                job: row.get(3)?,
                scheduled_for: rows::instant(row.get(4)?)?,
                priority: row.get(5)?,
                ready_at: rows::instant(row.get(6)?)?,
                target: spec.target.clone(),
                timeout: spec.timeout.map(|t| t.0),
                routing: spec.routing.clone(),
                event: crate::shared::run_event(row.get(8)?, row.get(9)?, row.get(10)?)?,
                graph_ranked: spec.priority.is_auto(),
                shard: sked_core::shard::Shard::of_run(
                    row.get::<_, i64>(11)?,
                    row.get::<_, i64>(12)?,
                ),
                pinned_worker: row.get(13)?,
                gates: Default::default(),
                params: crate::shared::json_column("trigger parameters", row.get(14)?)?,
                trace_parent: row.get(15)?,
            }
            .gated_by(spec),
        );
        Ok(())
    };
    match ids {
        None => {
            let mut stmt = tx.prepare_cached(QUEUED)?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                push(row)?;
            }
        }
        Some(ids) => {
            let mut stmt = tx.prepare_cached(&sql)?;
            for id in ids {
                let mut rows = stmt.query(params![id])?;
                if let Some(row) = rows.next()? {
                    push(row)?;
                }
            }
        }
    }
    Ok(runs)
}

const QUEUED_BEFORE: &str = "SELECT id FROM runs WHERE state = 'queued' AND id > ?1 \
     AND ready_at < ?2 ORDER BY id LIMIT ?3";

/// Through `runs_queued`, so a page costs its own size, not the ledger's.
pub fn queued_before(
    tx: &Transaction<'_>,
    ready_before: Instant,
    after_id: i64,
    limit: u32,
) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(QUEUED_BEFORE)?;
    let ids = stmt
        .query_map(params![after_id, micros(ready_before), limit], |row| {
            row.get(0)
        })?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    Ok(ids)
}

pub fn start_attempts(
    tx: &Transaction<'_>,
    starts: &[AttemptStart],
    now: Instant,
) -> Result<Vec<StartOutcome>> {
    let mut gate = super::flow::BatchGate::load(tx, starts)?;
    let now = gate.as_ref().map_or(now, |g| g.start_instant(now));
    let mut started = Vec::with_capacity(starts.len());
    for start in starts {
        // A run with keys is checked first and counted once it has started, so a run that is
        // no longer startable (not queued, or debounced and not ready) spends nothing: the
        // same decisions as checking it is queued first, without a read of every run.
        let admitted = match (gate.as_ref(), &start.flow) {
            (Some(gate), Some(claim)) => {
                match gate.book.check(&claim.namespace, &claim.gates, now) {
                    Ok(admitted) => Some(admitted),
                    Err(hold) => {
                        let queued: Option<i64> = tx
                            .prepare_cached(
                                "SELECT 1 FROM runs WHERE id = ?1 AND state = 'queued' \
                                 AND (absorbed IS NULL OR ready_at <= ?2)",
                            )?
                            .query_row(params![start.run_id, micros(now)], |r| r.get(0))
                            .optional()?;
                        started.push(Err(match queued {
                            Some(_) => NotStarted::Held(hold),
                            None => NotStarted::NotQueued,
                        }));
                        continue;
                    }
                }
            }
            _ => None,
        };
        // Only a queued run starts; the update says so by returning its new attempt count.
        let number: Option<(u32, i64)> = tx
            .prepare_cached(
                "UPDATE runs SET state = 'running', attempts = attempts + 1, \
                 started_at = coalesce(started_at, ?2) WHERE id = ?1 AND state = 'queued' \
                 AND (absorbed IS NULL OR ready_at <= ?2) RETURNING attempts, scheduled_for",
            )?
            .query_row(params![start.run_id, micros(now)], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((number, scheduled_for)) = number else {
            started.push(Err(NotStarted::NotQueued));
            continue;
        };
        tx.prepare_cached(
            "INSERT INTO attempts (run_id, number, worker_id, token, state, started_at, \
             lease_expires_at) VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6)",
        )?
        .execute(params![
            start.run_id,
            number,
            start.worker_id,
            start.token,
            micros(now),
            micros(start.lease_expires_at),
        ])?;
        let attempt_id = tx.last_insert_rowid();
        if let (Some(gate), Some(claim), Some(admitted)) = (gate.as_mut(), &start.flow, admitted) {
            gate.book.count(&claim.namespace, &claim.gates, admitted);
            gate.hold(claim, attempt_id, start.run_id, scheduled_for);
        }
        started.push(Ok(StartedAttempt { attempt_id, number }));
    }
    if let Some(gate) = gate {
        gate.save(tx, now)?;
    }
    Ok(started)
}

pub fn complete_attempts(
    tx: &Transaction<'_>,
    reports: &[AttemptReport],
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> Result<Vec<CompletionEffect>> {
    let mut effects = Vec::with_capacity(reports.len());
    let mut ended = Vec::new();
    let mut events = Vec::new();
    // Read once per job of the batch, and only for a job one of whose attempts failed.
    let mut retries: HashMap<i64, RetryPolicy> = HashMap::new();
    for report in reports {
        let (found, job) = reported_attempt(tx, report.attempt_id)?.unzip();
        let attempt = match crate::shared::admit_report(found, report) {
            Ok(attempt) => attempt,
            Err(refused) => {
                effects.push(refused);
                continue;
            }
        };
        let error = crate::shared::report_error(report);
        tx.prepare_cached(
            "UPDATE attempts SET state = ?2, finished_at = ?3, exit_code = ?4, http_status = ?5, \
             error = ?6 WHERE id = ?1",
        )?
        .execute(params![
            report.attempt_id,
            sked_core::AttemptState::from(report.outcome).as_str(),
            micros(now),
            report.exit_code,
            report.http_status,
            error,
        ])?;
        let retry = || -> Result<RetryPolicy> {
            Ok(match retries.entry(attempt.job_id) {
                Entry::Occupied(known) => *known.get(),
                Entry::Vacant(slot) => *slot.insert(retry_of(tx, attempt.job_id)?),
            })
        };
        let (failures, decision) = crate::shared::after_report(&attempt, report, now, retry)?;
        let (run_state, requeued) = match decision {
            AfterAttempt::Retry { ready_at } => {
                tx.prepare_cached(
                    "UPDATE runs SET state = 'queued', ready_at = ?2, failures = ?3, error = ?4 \
                     WHERE id = ?1",
                )?
                .execute(params![
                    attempt.run_id,
                    micros(ready_at),
                    failures,
                    error
                ])?;
                (RunState::Queued, vec![attempt.run_id])
            }
            AfterAttempt::Finish(state) => {
                let run = finish_run(tx, attempt.run_id, state, failures, error.as_deref(), now)?;
                let emits = job.as_ref().and_then(|job| job.emits.as_deref());
                if let (RunState::Succeeded, Some(key)) = (state, emits) {
                    let emitted = crate::shared::emission(&run, attempt.run_id, key);
                    let (event, created) =
                        events::record(tx, &run.namespace, &emitted, Some(attempt.run_id), now)?;
                    if created {
                        events.push(event);
                    }
                }
                ended.push(run);
                let released = if job.as_ref().is_some_and(CompletingJob::holds_back) {
                    release_waiting(tx, attempt.job_id)?
                } else {
                    Vec::new()
                };
                (state, released)
            }
        };
        effects.push(CompletionEffect::Accepted {
            run_id: attempt.run_id,
            run_state,
            requeued,
            namespace: attempt.namespace,
            started_at: attempt.started_at,
            job_label: job.and_then(|job| job.job_label),
        });
    }
    // The batch's runs that ended, and the events they emitted, move their dependants together.
    let released = dependencies::settle_admitting(tx, ended, events, backlog, now)?.queued;
    crate::shared::list_released(&mut effects, released);
    Ok(effects)
}

/// The attempt a report is about, with its run and what the completion needs of its job, in
/// one statement.
fn reported_attempt(
    tx: &Transaction<'_>,
    attempt_id: i64,
) -> Result<Option<(ReportedAttempt, CompletingJob)>> {
    type Row = (
        ReportedAttempt,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let found: Option<Row> = tx
        .prepare_cached(
            "SELECT a.run_id, r.job_id, a.token, a.state, r.state, r.failures, \
             r.cancel_requested, a.worker_id, r.namespace, a.started_at, j.overlap, j.emits, \
             CASE WHEN j.job_metrics THEN j.name END \
             FROM attempts a JOIN runs r ON r.id = a.run_id LEFT JOIN jobs j ON j.id = r.job_id \
             WHERE a.id = ?1",
        )?
        .query_row(params![attempt_id], |r| {
            let attempt = ReportedAttempt {
                run_id: r.get(0)?,
                job_id: r.get(1)?,
                token: r.get(2)?,
                attempt_state: r.get(3)?,
                run_state: r.get(4)?,
                failures: r.get(5)?,
                cancel_requested: r.get(6)?,
                worker_id: r.get(7)?,
                namespace: r.get(8)?,
                started_at: Instant::UNIX_EPOCH,
            };
            Ok((attempt, r.get(9)?, r.get(10)?, r.get(11)?, r.get(12)?))
        })
        .optional()?;
    found
        .map(|(attempt, started_at, overlap, emits, job_label)| {
            let attempt = ReportedAttempt {
                started_at: rows::instant(started_at)?,
                ..attempt
            };
            let job = CompletingJob::new(overlap.as_deref(), emits, job_label)?;
            Ok((attempt, job))
        })
        .transpose()
}

/// The job's retry policy, for deciding after a failed attempt; the default once the job is
/// deleted.
fn retry_of(tx: &Transaction<'_>, job_id: i64) -> Result<RetryPolicy> {
    let text: Option<String> = tx
        .prepare_cached("SELECT retry FROM jobs WHERE id = ?1")?
        .query_row(params![job_id], |r| r.get(0))
        .optional()?;
    text.map_or_else(
        || Ok(RetryPolicy::default()),
        |text| crate::shared::retry_policy(&text),
    )
}

/// Ends a run in `state`; the run as its dependants learn of it.
pub(super) fn finish_run(
    tx: &Transaction<'_>,
    run_id: i64,
    state: RunState,
    failures: u32,
    error: Option<&str>,
    now: Instant,
) -> Result<Ended> {
    let (namespace, job, instant): (String, String, i64) = tx
        .prepare_cached(
            "UPDATE runs SET state = ?2, finished_at = ?3, failures = ?4, \
             error = CASE WHEN ?2 = 'cancelled' AND cancel_requested AND error IS NOT NULL \
                 THEN error ELSE ?5 END \
             WHERE id = ?1 RETURNING namespace, job, scheduled_for",
        )?
        .query_row(
            params![run_id, state.as_str(), micros(now), failures, error],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
    Ok(Ended {
        namespace,
        job,
        scheduled_for: rows::instant(instant)?,
        run_id,
        state,
    })
}

/// Queues the oldest instant of the job held back by overlap, once none of its runs is active.
fn release_waiting(tx: &Transaction<'_>, job_id: i64) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(RELEASE_WAITING)?;
    let released = stmt.query_map(params![job_id], |r| r.get(0))?;
    Ok(released.collect::<rusqlite::Result<_>>()?)
}

fn get_run(tx: &Transaction<'_>, run_id: i64) -> Result<Option<sked_core::records::RunRecord>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![run_id])?;
    rows.next()?.map(rows::run).transpose()
}

pub fn cancel_run(
    tx: &Transaction<'_>,
    run_id: i64,
    now: Instant,
) -> Result<Option<CancelOutcome>> {
    let Some(run) = get_run(tx, run_id)? else {
        return Ok(None);
    };
    let outcome = match run.state {
        s if s.is_terminal() => CancelOutcome::AlreadyFinished(run),
        RunState::Running => {
            tx.prepare_cached(
                "UPDATE runs SET cancel_requested = 1, \
                 error = CASE WHEN cancel_requested THEN error END WHERE id = ?1",
            )?
            .execute(params![run_id])?;
            CancelOutcome::Requested(refetch(tx, run_id)?)
        }
        RunState::Queued | RunState::Waiting => {
            let ended = finish_run(
                tx,
                run_id,
                RunState::Cancelled,
                run.failures,
                Some("cancelled by a user"),
                now,
            )?;
            let mut released = release_waiting(tx, run.job_id)?;
            released.extend(settle(tx, vec![ended], Vec::new(), now)?.queued);
            CancelOutcome::Cancelled {
                run: refetch(tx, run_id)?,
                released,
            }
        }
        // Every state is terminal or one of the three above.
        _ => CancelOutcome::AlreadyFinished(run),
    };
    Ok(Some(outcome))
}

/// Running runs a blackout window with `cancel_running` may stop
/// (`Store::runs_under_windows`), found through the active runs' partial index. Named: with
/// `r.id > ?1 ORDER BY r.id`, SQLite's planner walked the whole ledger in id order instead,
/// 0.3–0.6 s at two million runs on every pass of the blackout duty, holding a reader.
const UNDER_WINDOWS: &str = "SELECT r.id, r.namespace, r.job, r.trigger, r.started_at, j.spec \
     FROM runs r INDEXED BY runs_active JOIN jobs j ON j.id = r.job_id \
     WHERE r.state IN ('waiting', 'queued', 'running') AND r.state = 'running' \
     AND r.cancel_requested = 0 AND r.trigger IN ('schedule', 'backfill') \
     AND r.started_at IS NOT NULL AND r.id > ?1 \
     AND (r.namespace IN (SELECT value FROM json_each(?2)) \
          OR EXISTS (SELECT 1 FROM json_each(j.spec, '$.blackouts') \
                     WHERE json_extract(value, '$.cancel_running') = 1)) \
     ORDER BY r.id LIMIT ?3";

pub fn runs_under_windows(
    tx: &Transaction<'_>,
    namespaces: &[String],
    after: i64,
    limit: u32,
) -> Result<Vec<RunUnderWindows>> {
    let namespaces = crate::shared::to_json("namespaces", namespaces)?;
    let mut stmt = tx.prepare_cached(UNDER_WINDOWS)?;
    let mut rows = stmt.query(params![after, namespaces, limit])?;
    let mut found = Vec::new();
    while let Some(row) = rows.next()? {
        found.push(RunUnderWindows {
            run_id: row.get(0)?,
            namespace: row.get(1)?,
            job: row.get(2)?,
            trigger: rows::trigger(&row.get::<_, String>(3)?)?,
            started_at: rows::instant(row.get(4)?)?,
            blackouts: rows::spec(&row.get::<_, String>(5)?)?.blackouts,
        });
    }
    Ok(found)
}

/// Asks the runs of `stops` still running, and not asked yet, to stop, each with its reason
/// kept as its error (`Store::stop_runs`).
pub fn stop_runs(tx: &Transaction<'_>, stops: &[(i64, String)]) -> Result<Vec<i64>> {
    let mut stmt = tx.prepare_cached(
        "UPDATE runs SET cancel_requested = 1, error = ?2 \
         WHERE id = ?1 AND state = 'running' AND cancel_requested = 0 RETURNING id",
    )?;
    let mut asked = Vec::new();
    for (id, reason) in stops {
        if let Some(id) = stmt
            .query_row(params![id, reason], |r| r.get::<_, i64>(0))
            .optional()?
        {
            asked.push(id);
        }
    }
    asked.sort_unstable();
    Ok(asked)
}

pub fn retry_run(tx: &Transaction<'_>, run_id: i64, now: Instant) -> Result<Option<RetryOutcome>> {
    let Some(run) = get_run(tx, run_id)? else {
        return Ok(None);
    };
    let refused = |run, reason: &str| {
        Ok(Some(RetryOutcome::Refused {
            run,
            reason: reason.to_string(),
        }))
    };
    if let Err(reason) = run.state.may_reopen() {
        return refused(run, reason);
    }
    let spec: Option<String> = tx
        .prepare_cached("SELECT spec FROM jobs WHERE id = ?1")?
        .query_row(params![run.job_id], |r| r.get(0))
        .optional()?;
    let Some(spec) = spec else {
        return refused(run, "its job was deleted");
    };
    let spec = rows::spec(&spec)?;
    let verdict = if spec.depends_on.is_empty() {
        None
    } else {
        Some(dependencies::judge(
            tx,
            &run.namespace,
            &spec,
            run.scheduled_for,
        )?)
    };
    let new = match crate::shared::reopening(&spec, verdict, now)? {
        Ok(new) => new,
        Err(reason) => return refused(run, &reason),
    };
    let (waiting_for, waiting_until) = new.dependencies.clone().unzip();
    tx.prepare_cached(&crate::shared::reopen_run_sql('?'))?
        .execute(params![
            run_id,
            new.state().as_str(),
            micros(now),
            new.waiting_reason().map(WaitReason::as_str),
            waiting_for,
            waiting_until,
        ])?;
    let mut settled = crate::shared::Settled::default();
    let reopened = dependencies::reopen(tx, &run, now, &mut settled)?;
    let mut queued = settled.queued;
    if new.state() == RunState::Queued {
        queued.insert(0, run_id);
    }
    Ok(Some(RetryOutcome::Retried {
        was: run.state,
        run: refetch(tx, run_id)?,
        queued,
        reopened,
    }))
}

fn refetch(tx: &Transaction<'_>, run_id: i64) -> Result<sked_core::records::RunRecord> {
    get_run(tx, run_id)?
        .ok_or_else(|| crate::StoreError::Database(format!("run {run_id} vanished")))
}

pub fn reap(tx: &Transaction<'_>, silent_since: Instant, now: Instant) -> Result<ReapOutcome> {
    let mut outcome = ReapOutcome::default();
    let mut ended = Vec::new();
    {
        let mut stmt = tx.prepare_cached(
            "UPDATE workers SET alive = 0 WHERE alive = 1 AND last_heartbeat_at < ?1 RETURNING id",
        )?;
        let ids = stmt.query_map(params![micros(silent_since)], |r| r.get::<_, String>(0))?;
        for id in ids {
            outcome.dead_workers.push(id?);
        }
    }
    // Attempts whose lease ran out, and every attempt of a worker that is not alive.
    let lost: Vec<(i64, i64, i64, bool)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT a.id, a.run_id, r.job_id, r.cancel_requested \
             FROM attempts a JOIN runs r ON r.id = a.run_id \
             WHERE a.state = 'running' AND (a.lease_expires_at < ?1 OR NOT EXISTS ( \
                 SELECT 1 FROM workers w WHERE w.id = a.worker_id AND w.alive = 1))",
        )?;
        let rows = stmt.query_map(params![micros(now)], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (attempt_id, run_id, job_id, cancel_requested) in lost {
        tx.prepare_cached(
            "UPDATE attempts SET state = 'lost', finished_at = ?2, \
             error = 'the worker stopped heartbeating; its lease was taken away' WHERE id = ?1",
        )?
        .execute(params![attempt_id, micros(now)])?;
        if cancel_requested {
            let failures: u32 = tx
                .prepare_cached("SELECT failures FROM runs WHERE id = ?1")?
                .query_row(params![run_id], |r| r.get(0))?;
            ended.push(finish_run(
                tx,
                run_id,
                RunState::Cancelled,
                failures,
                Some("cancelled; its worker was lost"),
                now,
            )?);
            outcome.cancelled.push(run_id);
            outcome.requeued.extend(release_waiting(tx, job_id)?);
        } else {
            // A lost attempt is sked's failure, not the job's: the retry budget is untouched.
            tx.prepare_cached("UPDATE runs SET state = 'queued', ready_at = ?2 WHERE id = ?1")?
                .execute(params![run_id, micros(now)])?;
            outcome.requeued.push(run_id);
        }
    }
    // A broadcast's shard pinned to a worker that is gone can run nowhere else.
    let stranded: Vec<(i64, i64, u32, String)> = {
        let mut stmt = tx.prepare_cached(STRANDED)?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (run_id, job_id, failures, worker) in stranded {
        let error = sked_core::shard::worker_lost(&worker);
        ended.push(finish_run(
            tx,
            run_id,
            RunState::Failed,
            failures,
            Some(&error),
            now,
        )?);
        outcome.failed.push(run_id);
        outcome.requeued.extend(release_waiting(tx, job_id)?);
    }
    let held_back: Vec<i64> = {
        let mut stmt = tx.prepare_cached(HELD_BACK)?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for job_id in held_back {
        outcome.requeued.extend(release_waiting(tx, job_id)?);
    }
    outcome
        .requeued
        .extend(settle(tx, ended, Vec::new(), now)?.queued);
    Ok(outcome)
}

/// Jobs with runs held back by overlap while none of theirs is queued or running (through
/// `runs_overlap_waiting`). A completion releases them only for a job whose policy holds runs
/// back: the reaper's pass releases those left when a job's policy became `allow`.
const HELD_BACK: &str = "SELECT DISTINCT job_id FROM runs w INDEXED BY runs_overlap_waiting \
     WHERE state = 'waiting' AND waiting_reason = 'overlap' \
     AND NOT EXISTS (SELECT 1 FROM runs WHERE job_id = w.job_id \
        AND state IN ('waiting', 'queued', 'running') AND state IN ('queued', 'running'))";

/// Queued shards of a broadcast whose worker is no longer alive (through `runs_pinned`).
const STRANDED: &str = "SELECT id, job_id, failures, pinned_worker FROM runs \
     WHERE state = 'queued' AND pinned_worker IS NOT NULL \
     AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = runs.pinned_worker AND w.alive = 1)";

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of every job-scoped statement must go through a partial index, never through
    /// an index that covers the job's whole history (the ledger key, the by-name index), nor
    /// a scan.
    /// The reaper looks for stranded broadcast shards every pass: through the small index of
    /// pinned queued runs, never the queue or the ledger.
    #[test]
    fn stranded_shards_are_found_through_their_index() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        let plan = super::super::query_plan(&conn, STRANDED).join("; ");
        assert!(plan.contains("INDEX runs_pinned"), "{plan}");
    }

    /// The duties that walk the active runs in pages by id (the blackout stops every second,
    /// the queue's reconciliation every 15 s) go through a partial index of the active runs: a
    /// walk of the ledger's key in id order reads every ended run before the first active one.
    #[test]
    fn paged_walks_of_active_runs_never_walk_the_ledger() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        for sql in [UNDER_WINDOWS, QUEUED_BEFORE] {
            let plan = super::super::query_plan(&conn, sql);
            let runs = plan
                .iter()
                .find(|step| step.contains(" r ") || step.contains(" runs "))
                .unwrap_or_else(|| panic!("no step reads the runs: {plan:?}"));
            assert!(
                runs.contains("INDEX runs_active") || runs.contains("INDEX runs_queued"),
                "{sql}\n=> {}",
                plan.join("; ")
            );
        }
    }

    #[test]
    fn job_scoped_statements_use_partial_indexes() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        for sql in JOB_SCOPED.iter().chain([&QUEUED, &HELD_BACK]) {
            let plan = super::super::query_plan(&conn, sql);
            for step in plan
                .iter()
                .filter(|step| step.contains(" r ") || step.contains("runs"))
            {
                let index = step.split_whitespace().skip_while(|w| *w != "INDEX").nth(1);
                let partial = matches!(
                    index,
                    Some("runs_active" | "runs_waiting" | "runs_queued" | "runs_overlap_waiting")
                ) || step.contains("PRIMARY KEY");
                assert!(partial, "{sql}\n=> {}", plan.join("; "));
            }
        }
    }
}

//! The ledger's moves: instants recorded as runs, attempts started and completed, runs cancelled,
//! lost attempts taken back. Each public function runs inside the caller's transaction, so every
//! decision (made by `sked-core`) commits together with its effects.
//!
//! Each decision is taken over locked rows, locked in the order of `mod.rs` (jobs, then runs,
//! then attempts, each by id): the job's row where its overlap policy reads how many of its
//! runs are active (the overlap decision, and the release of runs held back), the run's row for
//! its state (a start locks it in the statement that moves it while queued), the attempt's row
//! for its lease. A job whose policy is `allow` holds nothing back, so its completions take no
//! lock of it; runs left held back by a policy changed meanwhile are released by the reaper's
//! pass (`HELD_BACK`).

use super::dependencies::{self, dependants_of, settle};
use super::events;
use super::jobs::lock as lock_jobs;
use super::rows::{self, micros, RUN_COLUMNS};
use super::{PgResult, Tx};
use crate::shared::{CompletingJob, Ended, NewRun, ReportedAttempt};
use crate::{
    AttemptReport, AttemptStart, CancelOutcome, CompletionEffect, Fire, FireOutcome, FiredRun,
    NotStarted, QueuedRun, ReapOutcome, RetryOutcome, RunUnderWindows, StartOutcome,
    StartedAttempt, StoreError,
};
use sked_core::job::JobSpec;
use sked_core::policy::overlap::{decide, ActiveRuns, OverlapDecision};
use sked_core::policy::{OverlapPolicy, RetryPolicy};
use sked_core::records::RunRecord;
use sked_core::run::{AfterAttempt, RunState, SkipReason, Trigger, WaitReason};
use sked_core::Instant;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use tokio_postgres::types::ToSql;

/// What the fire path needs of a job.
struct FiringJob {
    namespace: String,
    name: String,
    overlap: OverlapPolicy,
    priority: i32,
    version: i32,
    /// Its definition, read only for a job with dependencies (the verdict needs them) or a
    /// broadcast (its routing says which workers it goes to).
    spec: Option<JobSpec>,
    /// A heartbeat job's grace (micros): its runs wait for pings.
    ping_grace: Option<i64>,
    /// The runs each instant is split into (1: not sharded).
    shards: i32,
    broadcast: bool,
    /// Its firing state as locked: the schedule's epoch and the instants fired in it.
    epoch: i64,
    fired_count: i64,
}

impl FiringJob {
    fn depends_on(&self) -> Option<&JobSpec> {
        self.spec
            .as_ref()
            .filter(|spec| !spec.depends_on.is_empty())
    }
}

/// Where the instant's shards go, one entry per shard (`sked_core::shard::placements`).
async fn placements(tx: &Tx<'_>, job: &FiringJob) -> PgResult<Vec<Option<String>>> {
    match job.spec.as_ref().filter(|_| job.broadcast) {
        Some(spec) => placements_of(tx, spec, &job.namespace).await,
        None => Ok(vec![None; usize::try_from(job.shards).unwrap_or(1)]),
    }
}

/// Where an instant of a job with `spec` goes (`sked_core::shard::placements`): for a
/// broadcast, one shard per live worker that may take it.
pub(super) async fn placements_of(
    tx: &Tx<'_>,
    spec: &JobSpec,
    namespace: &str,
) -> PgResult<Vec<Option<String>>> {
    if !spec.broadcast {
        return Ok(sked_core::shard::placements(spec, namespace, &[]));
    }
    let stmt = tx.prepare_cached(crate::shared::LIVE_WORKERS).await?;
    let mut live = Vec::new();
    for row in tx.query(&stmt, &[]).await? {
        live.push(crate::shared::live_worker(
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
        )?);
    }
    Ok(sked_core::shard::placements(spec, namespace, &live))
}

fn sorted(ids: impl IntoIterator<Item = i64>) -> Vec<i64> {
    let mut ids: Vec<i64> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

pub async fn record_fires(tx: &Tx<'_>, fires: &[Fire], now: Instant) -> PgResult<FireOutcome> {
    // Every job of the batch is locked up front, in id order: the overlap decision counts the
    // job's active runs, and nothing else changes that count while the lock is held. So is
    // every job that depends on them, whose waiting runs a skipped instant may move.
    let ids = sorted(fires.iter().map(|f| f.job_id));
    let below = dependants_of(tx, &ids).await?;
    if !below.is_empty() {
        lock_jobs(tx, &sorted(ids.iter().copied().chain(below))).await?;
    }
    let jobs = firing_jobs(tx, &ids).await?;
    // Most fires are decided without reading their job's runs: those are written together,
    // several instants of one job too (a catch-up). A job goes one way whole, so its instants
    // advance its firing state in order; one with any fire that must read its runs, or an
    // instant twice in the batch, goes job by job.
    let mut instants = HashSet::new();
    let mut in_bulk_jobs: HashMap<i64, bool> = HashMap::new();
    for fire in fires {
        let alone = instants.insert((fire.job_id, fire.scheduled_for))
            && jobs
                .get(&fire.job_id)
                .is_some_and(|job| decided_alone(fire, job));
        *in_bulk_jobs.entry(fire.job_id).or_insert(true) &= alone;
    }
    let (bulk, chained): (Vec<usize>, Vec<usize>) =
        (0..fires.len()).partition(|&index| in_bulk_jobs.get(&fires[index].job_id) == Some(&true));
    let mut in_bulk = fire_in_bulk(tx, fires, &bulk, &jobs, now).await?;
    // A job's instants depend on each other (overlap counts, the firing state's advance);
    // different jobs' do not.
    let keys: Vec<i64> = chained.iter().map(|&index| fires[index].job_id).collect();
    let jobs = &jobs;
    let one_by_one = in_chains(&keys, |k| {
        let fire = &fires[chained[k]];
        fire_one(tx, fire, jobs.get(&fire.job_id), now)
    })
    .await?;
    let mut one_by_one: HashMap<usize, _> = chained.iter().copied().zip(one_by_one).collect();
    let mut outcome = FireOutcome::default();
    let mut ended = Vec::new();
    for (index, fire) in fires.iter().enumerate() {
        let (run, cancel_requested, cancelled) = match in_bulk.remove(&index) {
            Some(run) => (run, Vec::new(), Vec::new()),
            None => one_by_one.remove(&index).ok_or_else(|| {
                StoreError::Database(format!("fire {index} of the batch was not recorded"))
            })?,
        };
        ended.extend(cancelled);
        if run.inserted && run.state.is_terminal() {
            if let Some(job) = jobs.get(&fire.job_id) {
                for run_id in run.all_runs() {
                    ended.push(Ended {
                        namespace: job.namespace.clone(),
                        job: job.name.clone(),
                        scheduled_for: fire.scheduled_for,
                        run_id,
                        state: run.state,
                    });
                }
            }
        }
        outcome.runs.push(run);
        outcome.cancel_requested.extend(cancel_requested);
    }
    let settled = settle(tx, ended, Vec::new(), now).await?;
    outcome.released = settled.queued;
    outcome.cancel_requested.extend(settled.cancel_requested);
    Ok(outcome)
}

/// Whether the fire's run can be written without reading any other run of its job: a skip, a
/// manual run, or an instant of a job that neither overlap nor dependencies hold back; not a
/// heartbeat's (it takes a kept ping) nor a broadcast's (it reads the live workers).
fn decided_alone(fire: &Fire, job: &FiringJob) -> bool {
    job.ping_grace.is_none()
        && !job.broadcast
        && (fire.skip.is_some()
            || fire.trigger == Trigger::Manual
            || (job.overlap.for_trigger(fire.trigger) == OverlapPolicy::Allow
                && job.depends_on().is_none()))
}

/// Records the fires at `indexes` (each decided alone, each instant once, every fire of their
/// jobs in the batch) in a fixed number of statements: every run and shard in one `INSERT`,
/// the instants recorded already read back in one `SELECT`, every job's advance of its firing
/// state in one `UPDATE`. Returns each fire's run, by index.
async fn fire_in_bulk(
    tx: &Tx<'_>,
    fires: &[Fire],
    indexes: &[usize],
    jobs: &HashMap<i64, FiringJob>,
    now: Instant,
) -> PgResult<HashMap<usize, FiredRun>> {
    let mut fired = HashMap::with_capacity(indexes.len());
    if indexes.is_empty() {
        return Ok(fired);
    }
    let mut rows = BulkFires::default();
    for &index in indexes {
        let fire = &fires[index];
        let Some(job) = jobs.get(&fire.job_id) else {
            continue;
        };
        rows.push(fire, job);
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
             skip_reason, priority, ready_at, created_at, finished_at, job_version, shard, \
             shard_count, error, nominal_for) \
             SELECT u.job_id, u.namespace, u.job, u.scheduled_for, u.trigger, u.state, \
             u.skip_reason, u.priority, u.ready_at, $11::bigint, \
             CASE WHEN u.skip_reason IS NOT NULL THEN $11::bigint END, u.version, s.shard, \
             u.shards, u.error, u.nominal_for \
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], \
                 $6::text[], $7::int[], $8::bigint[], $9::int[], $10::int[], $12::text[], \
                 $13::text[], $14::bigint[]) \
                 AS u(job_id, namespace, job, scheduled_for, trigger, state, priority, \
                      ready_at, version, shards, skip_reason, error, nominal_for) \
             CROSS JOIN LATERAL generate_series(0, u.shards - 1) AS s(shard) \
             ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING \
             RETURNING job_id, scheduled_for, shard, id",
        )
        .await?;
    let params: [&(dyn ToSql + Sync); 14] = [
        &rows.job_ids,
        &rows.namespaces,
        &rows.names,
        &rows.instants,
        &rows.triggers,
        &rows.states,
        &rows.priorities,
        &rows.ready_at,
        &rows.versions,
        &rows.shards,
        &micros(now),
        &rows.skip_reasons,
        &rows.errors,
        &rows.nominal_for,
    ];
    // Each instant is once in the batch, so its job and instant name the fire.
    let mut written: HashMap<(i64, i64), Vec<(i32, i64)>> = HashMap::new();
    for row in tx.query(&stmt, &params).await? {
        let shard = (row.try_get(2)?, row.try_get(3)?);
        let instant = (row.try_get(0)?, row.try_get(1)?);
        written.entry(instant).or_default().push(shard);
    }
    // The instants recorded already (another node's fire, a repeated batch), as they stand.
    let (taken_jobs, taken_instants): (Vec<i64>, Vec<i64>) = rows
        .job_ids
        .iter()
        .zip(&rows.instants)
        .filter(|&(&job_id, &instant)| !written.contains_key(&(job_id, instant)))
        .unzip();
    let mut recorded: HashMap<(i64, i64), (i64, RunState)> = HashMap::new();
    if !taken_jobs.is_empty() {
        let stmt = tx
            .prepare_cached(
                "SELECT r.job_id, r.scheduled_for, r.id, r.state FROM runs r \
                 JOIN unnest($1::bigint[], $2::bigint[]) AS u(job_id, scheduled_for) \
                   ON r.job_id = u.job_id AND r.scheduled_for = u.scheduled_for \
                 WHERE r.shard = 0",
            )
            .await?;
        for row in tx.query(&stmt, &[&taken_jobs, &taken_instants]).await? {
            let run = (row.try_get(2)?, rows::run_state(row.try_get(3)?)?);
            recorded.insert((row.try_get(0)?, row.try_get(1)?), run);
        }
    }
    let advanced = advance_in_bulk(tx, fires, indexes, jobs).await?;
    for &index in indexes {
        let fire = &fires[index];
        let Some(job) = jobs.get(&fire.job_id) else {
            fired.insert(index, FiredRun::gone());
            continue;
        };
        let instant = (fire.job_id, micros(fire.scheduled_for));
        let (run_id, state, inserted, other_shards) = match written.remove(&instant) {
            Some(mut shards) => {
                // Every shard or none: the instant's runs are only written under its job's
                // lock, held here, so a part of them missing means another writer raced it;
                // the whole batch is rolled back rather than leave an instant half recorded.
                shards.sort_unstable();
                let whole = shards.len() == usize::try_from(job.shards).unwrap_or(1)
                    && shards.first().is_some_and(|(shard, _)| *shard == 0);
                if !whole {
                    return Err(StoreError::Database(format!(
                        "the runs of job {} at {} were written concurrently",
                        fire.job_id, fire.scheduled_for
                    ))
                    .into());
                }
                let mut ids = shards.into_iter().map(|(_, id)| id);
                let first = ids.next().unwrap_or_default();
                (first, bulk_state(fire), true, ids.collect())
            }
            None => {
                let (id, state) = recorded.get(&instant).copied().ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "run of job {} at {} conflicts but cannot be found",
                        fire.job_id, fire.scheduled_for
                    ))
                })?;
                (id, state, false, Vec::new())
            }
        };
        let run = FiredRun {
            run_id,
            state,
            inserted,
            advanced: advanced.contains(&index),
            other_shards,
            placed: job.shards > 1,
        };
        fired.insert(index, run);
    }
    Ok(fired)
}

/// The state a run decided alone is written in.
fn bulk_state(fire: &Fire) -> RunState {
    match fire.skip {
        Some(_) => RunState::Skipped,
        None => RunState::Queued,
    }
}

/// The columns of the runs `fire_in_bulk` writes, one entry per fire.
#[derive(Default)]
struct BulkFires<'a> {
    job_ids: Vec<i64>,
    namespaces: Vec<&'a str>,
    names: Vec<&'a str>,
    instants: Vec<i64>,
    triggers: Vec<&'static str>,
    states: Vec<&'static str>,
    skip_reasons: Vec<Option<&'static str>>,
    /// Why a skipped fire was skipped, in words (`shared::skip_error`).
    errors: Vec<Option<&'a str>>,
    nominal_for: Vec<Option<i64>>,
    priorities: Vec<i32>,
    ready_at: Vec<i64>,
    versions: Vec<i32>,
    shards: Vec<i32>,
}

impl<'a> BulkFires<'a> {
    fn push(&mut self, fire: &'a Fire, job: &'a FiringJob) {
        self.job_ids.push(fire.job_id);
        self.namespaces.push(&job.namespace);
        self.names.push(&job.name);
        self.instants.push(micros(fire.scheduled_for));
        self.triggers.push(fire.trigger.as_str());
        self.states.push(bulk_state(fire).as_str());
        self.skip_reasons.push(fire.skip.map(SkipReason::as_str));
        self.errors.push(crate::shared::skip_error(fire));
        self.nominal_for.push(fire.nominal_for.map(micros));
        self.priorities.push(job.priority);
        self.ready_at.push(micros(fire.ready_at));
        self.versions.push(job.version);
        self.shards.push(job.shards);
    }
}

/// Advances the firing state of the jobs of the fires at `indexes` in one statement; returns
/// the fires whose advance was applied. A job's fires apply in their order, each only while
/// the job's firing state is the one that fire's loop started from (as locked in `jobs`), as
/// they would one statement at a time; the job's row is written once, with where they end.
async fn advance_in_bulk(
    tx: &Tx<'_>,
    fires: &[Fire],
    indexes: &[usize],
    jobs: &HashMap<i64, FiringJob>,
) -> PgResult<HashSet<usize>> {
    // Per job: its state as locked, where its fires take it, and the fires applied.
    struct Moved {
        job_id: i64,
        epoch: i64,
        from: i64,
        to: i64,
        next_fire_at: Option<i64>,
        applied: Vec<usize>,
    }
    let mut moved: Vec<Moved> = Vec::new();
    let mut slot_of: HashMap<i64, usize> = HashMap::new();
    for &index in indexes {
        let fire = &fires[index];
        let (Some(advance), Some(job)) = (&fire.advance, jobs.get(&fire.job_id)) else {
            continue;
        };
        let slot = *slot_of.entry(fire.job_id).or_insert_with(|| {
            moved.push(Moved {
                job_id: fire.job_id,
                epoch: job.epoch,
                from: job.fired_count,
                to: job.fired_count,
                next_fire_at: None,
                applied: Vec::new(),
            });
            moved.len() - 1
        });
        let job_moved = &mut moved[slot];
        let fired_before = i64::try_from(advance.fired_before)
            .map_err(|_| StoreError::Database("fired count out of range".into()))?;
        if micros(advance.epoch) == job_moved.epoch && fired_before == job_moved.to {
            job_moved.to = fired_before + 1;
            job_moved.next_fire_at = advance.next_fire_at.map(micros);
            job_moved.applied.push(index);
        }
    }
    moved.retain(|m| !m.applied.is_empty());
    let mut advanced = HashSet::new();
    if moved.is_empty() {
        return Ok(advanced);
    }
    let ids: Vec<i64> = moved.iter().map(|m| m.job_id).collect();
    let epochs: Vec<i64> = moved.iter().map(|m| m.epoch).collect();
    let from: Vec<i64> = moved.iter().map(|m| m.from).collect();
    let to: Vec<i64> = moved.iter().map(|m| m.to).collect();
    let next: Vec<Option<i64>> = moved.iter().map(|m| m.next_fire_at).collect();
    let stmt = tx
        .prepare_cached(
            "UPDATE jobs SET fired_count = u.fired_to, next_fire_at = u.next_fire_at, \
             state = CASE WHEN u.next_fire_at IS NULL THEN 'completed' ELSE jobs.state END \
             FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], \
                 $5::bigint[]) AS u(id, epoch, fired_from, fired_to, next_fire_at) \
             WHERE jobs.id = u.id AND jobs.schedule_epoch = u.epoch \
             AND jobs.fired_count = u.fired_from \
             RETURNING jobs.id",
        )
        .await?;
    let applied: HashMap<i64, &[usize]> = moved
        .iter()
        .map(|m| (m.job_id, m.applied.as_slice()))
        .collect();
    for row in tx.query(&stmt, &[&ids, &epochs, &from, &to, &next]).await? {
        let id: i64 = row.try_get(0)?;
        advanced.extend(applied.get(&id).copied().unwrap_or_default());
    }
    Ok(advanced)
}

/// Runs `work` for every item, in chains: items of one key one after another, in their order;
/// chains side by side, so their statements are pipelined on the transaction's connection
/// instead of each waiting a round trip. Results come back in the items' order.
async fn in_chains<K, T, Fut>(keys: &[K], work: impl Fn(usize) -> Fut) -> PgResult<Vec<T>>
where
    K: std::hash::Hash + Eq,
    Fut: std::future::Future<Output = PgResult<T>>,
{
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: HashMap<&K, usize> = HashMap::new();
    for (index, key) in keys.iter().enumerate() {
        let chain = *chain_of.entry(key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(index);
    }
    let work = &work;
    let done = futures_util::future::try_join_all(chains.into_iter().map(|chain| async move {
        let mut out = Vec::with_capacity(chain.len());
        for index in chain {
            out.push((index, work(index).await?));
        }
        PgResult::Ok(out)
    }))
    .await?;
    let mut results: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
    for (index, result) in done.into_iter().flatten() {
        results[index] = Some(result);
    }
    Ok(results.into_iter().flatten().collect())
}

/// Records one instant of `job` (`None`: the job is gone) and advances its firing state; also
/// returns the running runs an overlap `cancel_running` asked to stop, and the runs it
/// cancelled. The caller holds the job's lock.
async fn fire_one(
    tx: &Tx<'_>,
    fire: &Fire,
    job: Option<&FiringJob>,
    now: Instant,
) -> PgResult<(FiredRun, Vec<i64>, Vec<Ended>)> {
    let mut cancel_requested = Vec::new();
    let mut cancelled = Vec::new();
    let Some(job) = job else {
        // Deleted since the instant was computed: nothing is owed any more.
        let gone = FiredRun::gone();
        return Ok((gone, cancel_requested, cancelled));
    };
    let stmt = tx
        .prepare_cached(
            "SELECT id, state FROM runs WHERE job_id = $1 AND scheduled_for = $2 AND shard = 0",
        )
        .await?;
    let existing = tx
        .query_opt(&stmt, &[&fire.job_id, &micros(fire.scheduled_for)])
        .await?;
    let mut other_shards = Vec::new();
    let (run_id, state, inserted) = match existing {
        Some(row) => (row.try_get(0)?, rows::run_state(row.try_get(1)?)?, false),
        None => {
            let new =
                decide_fire(tx, fire, job, now, &mut cancel_requested, &mut cancelled).await?;
            let state = new.state();
            let finished = state.is_terminal().then(|| micros(now));
            let waiting_reason = new.waiting_reason();
            let (waiting_for, waiting_until) = (new.waiting_for(), new.waiting_until());
            // Every shard of the instant in one statement, sharing its one decision.
            let places = placements(tx, job).await?;
            // At most `sked_core::shard::MAX_SHARDS`.
            let count = i32::try_from(places.len()).unwrap_or(i32::MAX);
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
                     skip_reason, priority, ready_at, created_at, finished_at, error, \
                     waiting_reason, waiting_for, waiting_until, job_version, shard, \
                     shard_count, pinned_worker, nominal_for) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                     $16, (p.shard - 1)::int, $17, p.worker, $19 \
                     FROM unnest($18::text[]) WITH ORDINALITY AS p(worker, shard) \
                     ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING RETURNING id, shard",
                )
                .await?;
            let mut written = tx
                .query(
                    &stmt,
                    &[
                        &fire.job_id,
                        &job.namespace,
                        &job.name,
                        &micros(fire.scheduled_for),
                        &fire.trigger.as_str(),
                        &state.as_str(),
                        &new.skip.map(SkipReason::as_str),
                        &job.priority,
                        &micros(fire.ready_at),
                        &micros(now),
                        &finished,
                        &new.error,
                        &waiting_reason.map(WaitReason::as_str),
                        &waiting_for,
                        &waiting_until,
                        &job.version,
                        &count,
                        &places,
                        &fire.nominal_for.map(micros),
                    ],
                )
                .await?
                .iter()
                .map(|row| Ok((row.try_get::<_, i32>(1)?, row.try_get::<_, i64>(0)?)))
                .collect::<PgResult<Vec<_>>>()?;
            written.sort_unstable();
            // Runs are only written under their job's lock, which this transaction holds,
            // so the instant cannot have been taken meanwhile; should it have been, the
            // whole batch (and the overlap decision's effects) is rolled back.
            if written.len() != places.len() {
                return Err(StoreError::Database(format!(
                    "the run of job {} at {} was written concurrently",
                    fire.job_id, fire.scheduled_for
                ))
                .into());
            }
            let mut ids = written.into_iter().map(|(_, id)| id);
            let first = ids.next().unwrap_or_default();
            other_shards.extend(ids);
            (first, state, true)
        }
    };
    let advanced = match &fire.advance {
        None => false,
        Some(advance) => {
            // Applied only while the job's firing state is the one the loop started from.
            let fired_before = i64::try_from(advance.fired_before)
                .map_err(|_| StoreError::Database("fired count out of range".into()))?;
            let stmt = tx
                .prepare_cached(
                    "UPDATE jobs SET fired_count = $4, next_fire_at = $5, \
                     state = CASE WHEN $5::bigint IS NULL THEN 'completed' ELSE state END \
                     WHERE id = $1 AND schedule_epoch = $2 AND fired_count = $3",
                )
                .await?;
            let changed = tx
                .execute(
                    &stmt,
                    &[
                        &fire.job_id,
                        &micros(advance.epoch),
                        &fired_before,
                        &(fired_before + 1),
                        &advance.next_fire_at.map(micros),
                    ],
                )
                .await?;
            changed == 1
        }
    };
    let run = FiredRun {
        run_id,
        state,
        inserted,
        advanced,
        other_shards,
        placed: job.shards > 1 || job.broadcast,
    };
    Ok((run, cancel_requested, cancelled))
}

/// The jobs that still exist among `ids` (sorted), their rows locked.
async fn firing_jobs(tx: &Tx<'_>, ids: &[i64]) -> PgResult<HashMap<i64, FiringJob>> {
    let mut jobs = HashMap::new();
    if ids.is_empty() {
        return Ok(jobs);
    }
    let stmt = tx
        .prepare_cached(
            "SELECT id, namespace, name, overlap, priority, \
             CASE WHEN has_dependencies OR broadcast THEN spec END, version, ping_grace, shards, \
             broadcast, schedule_epoch, fired_count FROM jobs \
             WHERE id = ANY($1) \
             ORDER BY id FOR UPDATE",
        )
        .await?;
    for row in tx.query(&stmt, &[&ids]).await? {
        let overlap: &str = row.try_get(3)?;
        let overlap = OverlapPolicy::parse(overlap)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown overlap policy {overlap:?}")))?;
        jobs.insert(
            row.try_get(0)?,
            FiringJob {
                namespace: row.try_get(1)?,
                name: row.try_get(2)?,
                overlap,
                priority: row.try_get(4)?,
                version: row.try_get(6)?,
                spec: row
                    .try_get::<_, Option<&str>>(5)?
                    .map(rows::spec)
                    .transpose()?,
                ping_grace: row.try_get(7)?,
                shards: row.try_get::<_, i32>(8)?.max(1),
                broadcast: row.try_get(9)?,
                epoch: row.try_get(10)?,
                fired_count: row.try_get(11)?,
            },
        );
    }
    Ok(jobs)
}

/// The new run's state: skipped as the fire says; else, for a scheduled instant, waiting
/// while its dependencies are unmet (skipped when they never can be), then by the job's
/// overlap policy, whose `cancel_running` also ends the job's active runs here. The caller
/// holds the job's lock.
async fn decide_fire(
    tx: &Tx<'_>,
    fire: &Fire,
    job: &FiringJob,
    now: Instant,
    cancel_requested: &mut Vec<i64>,
    cancelled: &mut Vec<Ended>,
) -> PgResult<NewRun> {
    if let Some(reason) = fire.skip {
        return Ok(NewRun::skipped_fire(reason, fire));
    }
    // A heartbeat's runs wait for pings, each on its own: no overlap, nothing to run. One
    // that a ping came just before already has it.
    if let Some(grace) = job.ping_grace {
        if super::heartbeats::take_kept_ping(tx, fire.job_id, fire.scheduled_for, grace).await? {
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
        let verdict = dependencies::judge(tx, &job.namespace, spec, fire.scheduled_for).await?;
        if let Some(new) = NewRun::by_dependencies(verdict, spec, now)? {
            return Ok(new);
        }
    }
    let overlap = job.overlap.for_trigger(fire.trigger);
    if overlap == OverlapPolicy::Allow {
        return Ok(NewRun::default());
    }
    let admitted =
        admit_by_overlap(tx, fire.job_id, fire.scheduled_for, overlap, now, cancelled).await?;
    cancel_requested.extend(admitted.cancel_requested);
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
/// start (added to `ended`) and asks its running ones to stop. Runs waiting for their
/// dependencies are not active yet and are left alone. Overlap is between instants: the
/// shards of `instant` are not in its way. The caller holds the job's lock.
pub(super) async fn admit_by_overlap(
    tx: &Tx<'_>,
    job_id: i64,
    instant: Instant,
    overlap: OverlapPolicy,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<Admitted> {
    let stmt = tx
        .prepare_cached(
            "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')), \
                    count(*) FILTER (WHERE state = 'waiting' AND waiting_reason = 'overlap') \
             FROM runs WHERE job_id = $1 AND state IN ('waiting', 'queued', 'running') \
             AND scheduled_for <> $2",
        )
        .await?;
    let row = tx.query_one(&stmt, &[&job_id, &micros(instant)]).await?;
    let active = rows::count("active runs", row.try_get::<_, i64>(0)?)?;
    let waiting = rows::count("waiting runs", row.try_get::<_, i64>(1)?)?;
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
                cancel_active(tx, job_id, reason, false, Some(instant), now, ended).await?;
        }
    }
    Ok(admitted)
}

/// Cancels the job's queued and waiting runs (those waiting for dependencies only with
/// `with_dependency_waits`) and asks its running ones to stop, except the shards of
/// `sparing`; returns the running ones, and adds the cancelled ones to `ended`. The caller
/// holds the job's lock.
pub(super) async fn cancel_active(
    tx: &Tx<'_>,
    job_id: i64,
    reason: &str,
    with_dependency_waits: bool,
    sparing: Option<Instant>,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<Vec<i64>> {
    let sparing = sparing.map(micros);
    // By id first, as every transaction locks runs: the updates below meet them in their
    // plans' order, which a node starting some of them at the same time does not share.
    let stmt = tx
        .prepare_cached(
            "SELECT id FROM runs WHERE job_id = $1 AND state IN ('queued', 'waiting', 'running') \
             ORDER BY id FOR UPDATE",
        )
        .await?;
    tx.execute(&stmt, &[&job_id]).await?;
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET state = 'cancelled', finished_at = $2, error = $3 \
             WHERE job_id = $1 AND state IN ('queued', 'waiting') \
             AND ($4 OR waiting_reason IS DISTINCT FROM 'dependencies') \
             AND scheduled_for IS DISTINCT FROM $5 \
             RETURNING namespace, job, scheduled_for, id",
        )
        .await?;
    let cancelled = tx
        .query(
            &stmt,
            &[
                &job_id,
                &micros(now),
                &reason,
                &with_dependency_waits,
                &sparing,
            ],
        )
        .await?;
    for row in cancelled {
        ended.push(Ended {
            namespace: row.try_get(0)?,
            job: row.try_get(1)?,
            scheduled_for: rows::instant(row.try_get(2)?)?,
            run_id: row.try_get(3)?,
            state: RunState::Cancelled,
        });
    }
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET cancel_requested = true, \
             error = CASE WHEN cancel_requested THEN error END \
             WHERE job_id = $1 AND state = 'running' AND scheduled_for IS DISTINCT FROM $2 \
             RETURNING id",
        )
        .await?;
    let mut ids = tx
        .query(&stmt, &[&job_id, &sparing])
        .await?
        .iter()
        .map(|r| r.try_get::<_, i64>(0))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort_unstable();
    Ok(ids)
}

/// Ends a run that never started as skipped, for `reason`, saying why.
pub(super) async fn skip_run(
    tx: &Tx<'_>,
    run_id: i64,
    reason: SkipReason,
    why: &str,
    now: Instant,
) -> PgResult<()> {
    skip_runs(tx, &[run_id], &[why], reason, now).await
}

/// [`skip_run`] for each of `run_ids`, each saying its `whys`, in one statement.
pub(super) async fn skip_runs(
    tx: &Tx<'_>,
    run_ids: &[i64],
    whys: &[&str],
    reason: SkipReason,
    now: Instant,
) -> PgResult<()> {
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET state = 'skipped', skip_reason = $3, error = u.why, \
             finished_at = $4 \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, why) WHERE runs.id = u.id",
        )
        .await?;
    tx.execute(&stmt, &[&run_ids, &whys, &reason.as_str(), &micros(now)])
        .await?;
    Ok(())
}

pub async fn queued_runs(tx: &Tx<'_>, ids: Option<&[i64]>) -> PgResult<Vec<QueuedRun>> {
    const SELECT: &str = "SELECT r.id, r.job_id, r.namespace, r.job, r.scheduled_for, \
         r.priority, r.ready_at, j.spec, r.event_key, r.event_id, e.payload, r.shard, \
         r.shard_count, r.pinned_worker, r.params, r.trace_parent \
         FROM runs r JOIN jobs j ON j.id = r.job_id LEFT JOIN events e \
         ON e.namespace = r.namespace AND e.key = r.event_key AND e.event_id = r.event_id \
         WHERE r.state = 'queued'";
    let rows = match ids {
        None => {
            let stmt = tx
                .prepare_cached(&format!("{SELECT} ORDER BY r.id"))
                .await?;
            tx.query(&stmt, &[]).await?
        }
        Some(ids) => {
            let stmt = tx
                .prepare_cached(&format!("{SELECT} AND r.id = ANY($1)"))
                .await?;
            tx.query(&stmt, &[&ids]).await?
        }
    };
    let mut specs: HashMap<i64, sked_core::job::JobSpec> = HashMap::new();
    let mut found: HashMap<i64, QueuedRun> = HashMap::new();
    let mut order = Vec::with_capacity(rows.len());
    for row in &rows {
        let job_id: i64 = row.try_get(1)?;
        let spec = match specs.entry(job_id) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(rows::spec(row.try_get(7)?)?),
        };
        let run = QueuedRun {
            run_id: row.try_get(0)?,
            job_id,
            namespace: row.try_get(2)?,
            job: row.try_get(3)?,
            scheduled_for: rows::instant(row.try_get(4)?)?,
            priority: row.try_get(5)?,
            ready_at: rows::instant(row.try_get(6)?)?,
            target: spec.target.clone(),
            timeout: spec.timeout.map(|t| t.0),
            routing: spec.routing.clone(),
            event: crate::shared::run_event(row.try_get(8)?, row.try_get(9)?, row.try_get(10)?)?,
            graph_ranked: spec.priority.is_auto(),
            shard: sked_core::shard::Shard::of_run(
                i64::from(row.try_get::<_, i32>(11)?),
                i64::from(row.try_get::<_, i32>(12)?),
            ),
            pinned_worker: row.try_get(13)?,
            gates: Default::default(),
            params: crate::shared::json_column("trigger parameters", row.try_get(14)?)?,
            trace_parent: row.try_get(15)?,
        }
        .gated_by(spec);
        order.push(run.run_id);
        found.insert(run.run_id, run);
    }
    // In the order asked for (as SQLite answers), else in id order.
    Ok(match ids {
        None => order.iter().filter_map(|id| found.remove(id)).collect(),
        Some(ids) => ids.iter().filter_map(|id| found.get(id).cloned()).collect(),
    })
}

/// Through `runs_queued`, so a page costs its own size, not the ledger's.
pub async fn queued_before(
    tx: &Tx<'_>,
    ready_before: Instant,
    after_id: i64,
    limit: u32,
) -> PgResult<Vec<i64>> {
    let stmt = tx
        .prepare_cached(
            "SELECT id FROM runs WHERE state = 'queued' AND id > $1 AND ready_at < $2 \
             ORDER BY id LIMIT $3",
        )
        .await?;
    let rows = tx
        .query(
            &stmt,
            &[&after_id, &micros(ready_before), &i64::from(limit)],
        )
        .await?;
    rows.iter()
        .map(|row| row.try_get(0).map_err(Into::into))
        .collect()
}

pub async fn start_attempts(
    tx: &Tx<'_>,
    starts: &[AttemptStart],
    now: Instant,
) -> PgResult<Vec<StartOutcome>> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    // Runs with keys: their keys are locked first (`flow::BatchGate`), then their runs, and
    // each is admitted or held in the batch's order before anything starts.
    let mut gate = super::flow::BatchGate::load(tx, starts).await?;
    let now = gate.as_ref().map_or(now, |g| g.start_instant(now));
    let mut held: HashMap<i64, NotStarted> = HashMap::new();
    if let Some(gate) = gate.as_mut() {
        let gated: Vec<i64> = sorted(starts.iter().filter(|s| s.flow.is_some()).map(|s| s.run_id));
        let stmt = tx
            .prepare_cached(
                // A debounced run whose `ready_at` a later trigger moved ahead is not startable
                // yet: it spends no key.
                "SELECT id FROM runs WHERE id = ANY($1) AND state = 'queued' \
                 AND (absorbed IS NULL OR ready_at <= $2) ORDER BY id FOR UPDATE",
            )
            .await?;
        let queued: HashSet<i64> = tx
            .query(&stmt, &[&gated, &micros(now)])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        // A second start of a run is passed over: only the first is answered (below), and
        // the run is admitted or held once.
        let mut seen = HashSet::new();
        for start in starts {
            let Some(claim) = &start.flow else { continue };
            if !seen.insert(start.run_id) {
                continue;
            }
            if !queued.contains(&start.run_id) {
                held.insert(start.run_id, NotStarted::NotQueued);
            } else if let Err(hold) = gate.book.admit(&claim.namespace, &claim.gates, now) {
                held.insert(start.run_id, NotStarted::Held(hold));
            }
        }
    }
    // The first start of each run in the batch; a second start of the same run gets nothing.
    let mut firsts = HashSet::new();
    let (mut run_ids, mut workers, mut tokens, mut leases) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for start in starts
        .iter()
        .filter(|s| !held.contains_key(&s.run_id) && firsts.insert(s.run_id))
    {
        run_ids.push(start.run_id);
        workers.push(start.worker_id.as_str());
        tokens.push(start.token);
        leases.push(micros(start.lease_expires_at));
    }
    // One statement, so one round trip. Its runs are locked first, by id, as every transaction
    // locks runs: an update alone locks them in the order its plan meets them, which differs
    // between plans (an index scan, a bitmap scan), and two nodes starting the same runs
    // deadlocked, each deadlock costing PostgreSQL's `deadlock_timeout` while the leases ran
    // out. The lock rechecks `state = 'queued'` on the newest version of a row another
    // transaction held, so a run started meanwhile drops out: a run gets one attempt however
    // many nodes hand it out.
    let stmt = tx
        .prepare_cached(
            "WITH queued AS MATERIALIZED ( \
                 SELECT id FROM runs WHERE id = ANY($1) AND state = 'queued' \
                 AND (absorbed IS NULL OR ready_at <= $5) \
                 ORDER BY id FOR UPDATE), \
             started AS ( \
                 UPDATE runs SET state = 'running', attempts = runs.attempts + 1, \
                     started_at = coalesce(runs.started_at, $5) \
                 FROM queued WHERE runs.id = queued.id AND runs.state = 'queued' \
                     AND (runs.absorbed IS NULL OR runs.ready_at <= $5) \
                 RETURNING runs.id, runs.attempts, runs.scheduled_for) \
             INSERT INTO attempts (run_id, number, worker_id, token, state, started_at, \
                 lease_expires_at, run_scheduled_for) \
             SELECT s.id, s.attempts, u.worker_id, u.token, 'running', $5, u.lease, \
                 s.scheduled_for \
             FROM started s \
             JOIN unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[]) \
                 AS u(run_id, worker_id, token, lease) ON u.run_id = s.id \
             RETURNING run_id, id, number, run_scheduled_for",
        )
        .await?;
    let mut started: HashMap<i64, (StartedAttempt, i64)> = HashMap::new();
    if !run_ids.is_empty() {
        for row in tx
            .query(&stmt, &[&run_ids, &workers, &tokens, &leases, &micros(now)])
            .await?
        {
            let attempt = StartedAttempt {
                attempt_id: row.try_get(1)?,
                number: rows::count("attempt number", row.try_get::<_, i32>(2)?)?,
            };
            started.insert(row.try_get(0)?, (attempt, row.try_get(3)?));
        }
    }
    if let Some(gate) = gate {
        let holders: Vec<_> = starts
            .iter()
            .filter_map(|s| {
                let (attempt, scheduled_for) = started.get(&s.run_id)?;
                Some((
                    s.flow.as_ref()?,
                    attempt.attempt_id,
                    s.run_id,
                    *scheduled_for,
                ))
            })
            .collect();
        gate.save(tx, &holders, now).await?;
    }
    // Removed once answered, so only the first start of a run is told it started.
    Ok(starts
        .iter()
        .map(|start| match started.remove(&start.run_id) {
            Some((attempt, _)) => Ok(attempt),
            None => Err(held.remove(&start.run_id).unwrap_or(NotStarted::NotQueued)),
        })
        .collect())
}

pub async fn complete_attempts(
    tx: &Tx<'_>,
    reports: &[AttemptReport],
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> PgResult<Vec<CompletionEffect>> {
    if reports.is_empty() {
        return Ok(Vec::new());
    }
    let attempt_ids = sorted(reports.iter().map(|r| r.attempt_id));
    // A run's job never changes, so the jobs, and what the completion needs of them, can be
    // learnt before anything is locked.
    let stmt = tx
        .prepare_cached(
            "SELECT DISTINCT r.job_id, j.overlap, j.emits, CASE WHEN j.job_metrics THEN j.name END \
             FROM attempts a JOIN runs r ON r.id = a.run_id LEFT JOIN jobs j ON j.id = r.job_id \
             WHERE a.id = ANY($1)",
        )
        .await?;
    let mut jobs: HashMap<i64, CompletingJob> = HashMap::new();
    for row in tx.query(&stmt, &[&attempt_ids]).await? {
        let job = CompletingJob::new(row.try_get(1)?, row.try_get(2)?, row.try_get(3)?)?;
        jobs.insert(row.try_get(0)?, job);
    }
    // Locked: a job whose policy holds runs back (releasing them reads how many of its runs
    // are active) and the jobs depending on any of the batch's (an ended run may release
    // theirs). A job with `overlap: allow` and no dependants is not locked at all, so its
    // completions never queue behind a fire of it, nor a fire behind them.
    let below = dependants_of(tx, &sorted(jobs.keys().copied())).await?;
    let holding = jobs.iter().filter(|(_, job)| job.holds_back());
    lock_jobs(tx, &sorted(holding.map(|(id, _)| *id).chain(below))).await?;
    let (mut runs, mut attempts) = lock_attempts_and_runs(tx, &attempt_ids).await?;
    let failing = reports
        .iter()
        .filter(|r| crate::shared::counts_against_retries(r.outcome))
        .filter_map(|r| attempts.get(&r.attempt_id))
        .filter_map(|a| runs.get(&a.run_id))
        .map(|run| run.job_id);
    let retries = retry_policies(tx, &sorted(failing)).await?;
    let mut effects = Vec::with_capacity(reports.len());
    let mut writes = CompletionWrites::default();
    // The jobs to release runs of, with the effect that lists what is released.
    let mut releasing: BTreeMap<i64, usize> = BTreeMap::new();
    for report in reports {
        let found = attempts.get(&report.attempt_id).and_then(|attempt| {
            let run = runs.get(&attempt.run_id)?;
            Some(ReportedAttempt {
                run_id: attempt.run_id,
                job_id: run.job_id,
                token: attempt.token,
                attempt_state: attempt.state.clone(),
                run_state: run.state.clone(),
                failures: run.failures,
                cancel_requested: run.cancel_requested,
                worker_id: attempt.worker_id.clone(),
                namespace: run.namespace.clone(),
                started_at: attempt.started_at,
            })
        });
        let attempt = match crate::shared::admit_report(found, report) {
            Ok(attempt) => attempt,
            Err(refused) => {
                effects.push(refused);
                continue;
            }
        };
        let error = crate::shared::report_error(report);
        let attempt_state = sked_core::AttemptState::from(report.outcome).as_str();
        writes.attempt(report, attempt_state, error.clone());
        // Read above for every job with a failure in the batch; a deleted job's is the default.
        let retry =
            || Ok::<_, StoreError>(retries.get(&attempt.job_id).copied().unwrap_or_default());
        let (failures, decision) = crate::shared::after_report(&attempt, report, now, retry)?;
        let (run_state, requeued) = match decision {
            AfterAttempt::Retry { ready_at } => {
                writes
                    .retried
                    .push(attempt.run_id, ready_at, failures, error)?;
                (RunState::Queued, vec![attempt.run_id])
            }
            AfterAttempt::Finish(state) => {
                writes.finish(attempt.run_id, attempt.job_id, state, failures, error)?;
                if jobs
                    .get(&attempt.job_id)
                    .is_some_and(CompletingJob::holds_back)
                {
                    releasing.insert(attempt.job_id, effects.len());
                }
                (state, Vec::new())
            }
        };
        // What a later report of the batch about the same attempt or run finds.
        if let Some(reported) = attempts.get_mut(&report.attempt_id) {
            reported.state = attempt_state.to_string();
        }
        if let Some(run) = runs.get_mut(&attempt.run_id) {
            run.state = run_state.as_str().to_string();
        }
        let job_label = jobs
            .get(&attempt.job_id)
            .and_then(|job| job.job_label.clone());
        effects.push(CompletionEffect::Accepted {
            run_id: attempt.run_id,
            run_state,
            requeued,
            namespace: attempt.namespace,
            started_at: attempt.started_at,
            job_label,
        });
    }
    let ended = writes.apply(tx, now).await?;
    // Each job's oldest instant held back, once nothing of it is active; the jobs side by side.
    let released = futures_util::future::try_join_all(
        releasing.keys().map(|&job_id| release_waiting(tx, job_id)),
    )
    .await?;
    for (&index, released) in releasing.values().zip(released) {
        if let Some(CompletionEffect::Accepted { requeued, .. }) = effects.get_mut(index) {
            requeued.extend(released);
        }
    }
    let mut events = Vec::new();
    for (run, job_id) in &ended {
        let emits = jobs.get(job_id).and_then(|job| job.emits.as_deref());
        if let (RunState::Succeeded, Some(key)) = (run.state, emits) {
            let emitted = crate::shared::emission(run, run.run_id, key);
            let (event, created) =
                events::record(tx, &run.namespace, &emitted, Some(run.run_id), now).await?;
            if created {
                events.push(event);
            }
        }
    }
    // The batch's runs that ended, and the events they emitted, move their dependants together.
    let ended = ended.into_iter().map(|(run, _)| run).collect();
    let released = super::dependencies::settle_admitting(tx, ended, events, backlog, now)
        .await?
        .queued;
    crate::shared::list_released(&mut effects, released);
    Ok(effects)
}

/// The retry policies of jobs `ids` (sorted); a deleted job is absent.
async fn retry_policies(tx: &Tx<'_>, ids: &[i64]) -> PgResult<HashMap<i64, RetryPolicy>> {
    let mut policies = HashMap::new();
    if ids.is_empty() {
        return Ok(policies);
    }
    let stmt = tx
        .prepare_cached("SELECT id, retry FROM jobs WHERE id = ANY($1)")
        .await?;
    for row in tx.query(&stmt, &[&ids]).await? {
        let retry = crate::shared::retry_policy(row.try_get(1)?)?;
        policies.insert(row.try_get(0)?, retry);
    }
    Ok(policies)
}

/// What a batch of completions writes, gathered as its reports are decided, then written in
/// three statements whatever the batch's size: the attempts' ends, the runs queued again for a
/// retry, the runs that ended.
#[derive(Default)]
struct CompletionWrites {
    attempts: AttemptEnds,
    retried: Retries,
    finished: Finishes,
}

#[derive(Default)]
struct AttemptEnds {
    ids: Vec<i64>,
    states: Vec<&'static str>,
    exit_codes: Vec<Option<i32>>,
    http_statuses: Vec<Option<i32>>,
    errors: Vec<Option<String>>,
}

/// Runs queued again, each ready at `ready_at`.
#[derive(Default)]
struct Retries {
    ids: Vec<i64>,
    ready_at: Vec<i64>,
    failures: Vec<i32>,
    errors: Vec<Option<String>>,
}

impl Retries {
    fn push(
        &mut self,
        run_id: i64,
        ready_at: Instant,
        failures: u32,
        error: Option<String>,
    ) -> PgResult<()> {
        self.ids.push(run_id);
        self.ready_at.push(micros(ready_at));
        self.failures.push(rows::int("failures", failures)?);
        self.errors.push(error);
        Ok(())
    }
}

/// Runs ended, with their jobs, in the reports' order.
#[derive(Default)]
struct Finishes {
    ids: Vec<i64>,
    jobs: Vec<i64>,
    states: Vec<RunState>,
    failures: Vec<i32>,
    errors: Vec<Option<String>>,
}

impl CompletionWrites {
    fn attempt(&mut self, report: &AttemptReport, state: &'static str, error: Option<String>) {
        let ends = &mut self.attempts;
        ends.ids.push(report.attempt_id);
        ends.states.push(state);
        ends.exit_codes.push(report.exit_code);
        ends.http_statuses.push(report.http_status.map(i32::from));
        ends.errors.push(error);
    }

    fn finish(
        &mut self,
        run_id: i64,
        job_id: i64,
        state: RunState,
        failures: u32,
        error: Option<String>,
    ) -> PgResult<()> {
        let finished = &mut self.finished;
        finished.ids.push(run_id);
        finished.jobs.push(job_id);
        finished.states.push(state);
        finished.failures.push(rows::int("failures", failures)?);
        finished.errors.push(error);
        Ok(())
    }

    /// Writes everything gathered; returns the runs that ended, with their jobs, in the
    /// reports' order.
    async fn apply(self, tx: &Tx<'_>, now: Instant) -> PgResult<Vec<(Ended, i64)>> {
        let ends = &self.attempts;
        if !ends.ids.is_empty() {
            let stmt = tx
                .prepare_cached(
                    "UPDATE attempts SET state = u.state, finished_at = $6, \
                     exit_code = u.exit_code, http_status = u.http_status, error = u.error \
                     FROM unnest($1::bigint[], $2::text[], $3::int[], $4::int[], $5::text[]) \
                         AS u(id, state, exit_code, http_status, error) \
                     WHERE attempts.id = u.id",
                )
                .await?;
            let params: [&(dyn ToSql + Sync); 6] = [
                &ends.ids,
                &ends.states,
                &ends.exit_codes,
                &ends.http_statuses,
                &ends.errors,
                &micros(now),
            ];
            tx.execute(&stmt, &params).await?;
        }
        let retried = &self.retried;
        if !retried.ids.is_empty() {
            let stmt = tx
                .prepare_cached(
                    "UPDATE runs SET state = 'queued', ready_at = u.ready_at, \
                     failures = u.failures, error = u.error \
                     FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[]) \
                         AS u(id, ready_at, failures, error) \
                     WHERE runs.id = u.id",
                )
                .await?;
            let params: [&(dyn ToSql + Sync); 4] = [
                &retried.ids,
                &retried.ready_at,
                &retried.failures,
                &retried.errors,
            ];
            tx.execute(&stmt, &params).await?;
        }
        let finished = &self.finished;
        if finished.ids.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE runs SET state = u.state, finished_at = $5, failures = u.failures, \
                 error = CASE WHEN u.state = 'cancelled' AND runs.cancel_requested \
                     AND runs.error IS NOT NULL THEN runs.error ELSE u.error END \
                 FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[]) \
                     AS u(id, state, failures, error) \
                 WHERE runs.id = u.id \
                 RETURNING runs.id, runs.namespace, runs.job, runs.scheduled_for",
            )
            .await?;
        let states: Vec<&str> = finished.states.iter().map(|s| s.as_str()).collect();
        let params: [&(dyn ToSql + Sync); 5] = [
            &finished.ids,
            &states,
            &finished.failures,
            &finished.errors,
            &micros(now),
        ];
        let mut written: HashMap<i64, (String, String, i64)> = HashMap::new();
        for row in tx.query(&stmt, &params).await? {
            let run = (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
            written.insert(row.try_get(0)?, run);
        }
        let mut ended = Vec::with_capacity(finished.ids.len());
        for ((&run_id, &state), &job_id) in finished
            .ids
            .iter()
            .zip(&finished.states)
            .zip(&finished.jobs)
        {
            let (namespace, job, instant) = written.remove(&run_id).ok_or_else(|| {
                StoreError::Database(format!("run {run_id} vanished while it was ended"))
            })?;
            let run = Ended {
                namespace,
                job,
                scheduled_for: rows::instant(instant)?,
                run_id,
                state,
            };
            ended.push((run, job_id));
        }
        Ok(ended)
    }
}

/// A run as a completion finds it, locked.
struct LockedRun {
    job_id: i64,
    state: String,
    failures: u32,
    cancel_requested: bool,
    namespace: String,
}

/// An attempt as a completion finds it, locked.
struct LockedAttempt {
    run_id: i64,
    token: i64,
    state: String,
    worker_id: String,
    started_at: Instant,
}

/// Locks these attempts' runs, then the attempts themselves, each in id order, and returns
/// them as they are under the locks.
async fn lock_attempts_and_runs(
    tx: &Tx<'_>,
    attempt_ids: &[i64],
) -> PgResult<(HashMap<i64, LockedRun>, HashMap<i64, LockedAttempt>)> {
    let stmt = tx
        .prepare_cached(
            "SELECT id, job_id, state, failures, cancel_requested, namespace FROM runs \
             WHERE id IN (SELECT run_id FROM attempts WHERE id = ANY($1)) \
             ORDER BY id FOR UPDATE",
        )
        .await?;
    let mut runs = HashMap::new();
    for row in tx.query(&stmt, &[&attempt_ids]).await? {
        let run = LockedRun {
            job_id: row.try_get(1)?,
            state: row.try_get(2)?,
            failures: rows::count("failures", row.try_get::<_, i32>(3)?)?,
            cancel_requested: row.try_get(4)?,
            namespace: row.try_get(5)?,
        };
        runs.insert(row.try_get(0)?, run);
    }
    let stmt = tx
        .prepare_cached(
            "SELECT id, run_id, token, state, worker_id, started_at FROM attempts \
             WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        )
        .await?;
    let mut attempts = HashMap::new();
    for row in tx.query(&stmt, &[&attempt_ids]).await? {
        let attempt = LockedAttempt {
            run_id: row.try_get(1)?,
            token: row.try_get(2)?,
            state: row.try_get(3)?,
            worker_id: row.try_get(4)?,
            started_at: rows::instant(row.try_get(5)?)?,
        };
        attempts.insert(row.try_get(0)?, attempt);
    }
    Ok((runs, attempts))
}

/// Ends a run in `state`; the run as its dependants learn of it.
pub(super) async fn finish_run(
    tx: &Tx<'_>,
    run_id: i64,
    state: RunState,
    failures: u32,
    error: Option<&str>,
    now: Instant,
) -> PgResult<Ended> {
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET state = $2, finished_at = $3, failures = $4, \
             error = CASE WHEN $2 = 'cancelled' AND cancel_requested AND error IS NOT NULL \
                 THEN error ELSE $5 END \
             WHERE id = $1 RETURNING namespace, job, scheduled_for",
        )
        .await?;
    let row = tx
        .query_one(
            &stmt,
            &[
                &run_id,
                &state.as_str(),
                &micros(now),
                &rows::int("failures", failures)?,
                &error,
            ],
        )
        .await?;
    Ok(Ended {
        namespace: row.try_get(0)?,
        job: row.try_get(1)?,
        scheduled_for: rows::instant(row.try_get(2)?)?,
        run_id,
        state,
    })
}

/// Queues the oldest instant of the job held back by overlap (every shard of it), once none of
/// its runs is active. The caller holds the job's lock, so no other transaction counts or
/// changes its active runs.
async fn release_waiting(tx: &Tx<'_>, job_id: i64) -> PgResult<Vec<i64>> {
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET state = 'queued', waiting_reason = NULL \
             WHERE job_id = $1 AND state = 'waiting' AND waiting_reason = 'overlap' \
             AND scheduled_for = ( \
                SELECT scheduled_for FROM runs WHERE job_id = $1 AND state = 'waiting' \
                AND waiting_reason = 'overlap' ORDER BY scheduled_for, id LIMIT 1) \
             AND NOT EXISTS (SELECT 1 FROM runs WHERE job_id = $1 \
                             AND state IN ('queued', 'running')) \
             RETURNING id",
        )
        .await?;
    tx.query(&stmt, &[&job_id])
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

async fn get_run(tx: &Tx<'_>, run_id: i64, lock: bool) -> PgResult<Option<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&run_id])
        .await?
        .as_ref()
        .map(rows::run)
        .transpose()
}

/// The run `run_id`, locked after its job and the jobs depending on it (the lock order: a
/// change to the run may move its dependants).
async fn lock_run(tx: &Tx<'_>, run_id: i64) -> PgResult<Option<RunRecord>> {
    let stmt = tx
        .prepare_cached("SELECT job_id FROM runs WHERE id = $1")
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&run_id]).await? else {
        return Ok(None);
    };
    // A run's job never changes.
    let job_id: i64 = row.try_get(0)?;
    let below = dependants_of(tx, &[job_id]).await?;
    lock_jobs(tx, &sorted(below.into_iter().chain([job_id]))).await?;
    get_run(tx, run_id, true).await
}

pub async fn retry_run(tx: &Tx<'_>, run_id: i64, now: Instant) -> PgResult<Option<RetryOutcome>> {
    let Some(run) = lock_run(tx, run_id).await? else {
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
    let stmt = tx
        .prepare_cached("SELECT spec FROM jobs WHERE id = $1")
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&run.job_id]).await? else {
        return refused(run, "its job was deleted");
    };
    let spec = rows::spec(row.try_get(0)?)?;
    let verdict = if spec.depends_on.is_empty() {
        None
    } else {
        Some(dependencies::judge(tx, &run.namespace, &spec, run.scheduled_for).await?)
    };
    let new = match crate::shared::reopening(&spec, verdict, now)? {
        Ok(new) => new,
        Err(reason) => return refused(run, &reason),
    };
    let (waiting_for, waiting_until) = new.dependencies.clone().unzip();
    let stmt = tx
        .prepare_cached(&crate::shared::reopen_run_sql('$'))
        .await?;
    tx.execute(
        &stmt,
        &[
            &run_id,
            &new.state().as_str(),
            &micros(now),
            &new.waiting_reason().map(WaitReason::as_str),
            &waiting_for,
            &waiting_until,
        ],
    )
    .await?;
    let mut settled = crate::shared::Settled::default();
    let reopened = dependencies::reopen(tx, &run, now, &mut settled).await?;
    let mut queued = settled.queued;
    if new.state() == RunState::Queued {
        queued.insert(0, run_id);
    }
    Ok(Some(RetryOutcome::Retried {
        was: run.state,
        run: refetch(tx, run_id).await?,
        queued,
        reopened,
    }))
}

/// Running runs a blackout window with `cancel_running` may stop
/// (`Store::runs_under_windows`), found through the active runs' partial index.
pub async fn runs_under_windows(
    tx: &Tx<'_>,
    namespaces: &[String],
    after: i64,
    limit: u32,
) -> PgResult<Vec<RunUnderWindows>> {
    let stmt = tx
        .prepare_cached(
            "SELECT r.id, r.namespace, r.job, r.trigger, r.started_at, j.spec \
             FROM runs r JOIN jobs j ON j.id = r.job_id \
             WHERE r.state IN ('waiting', 'queued', 'running') AND r.state = 'running' \
             AND NOT r.cancel_requested AND r.trigger IN ('schedule', 'backfill') \
             AND r.started_at IS NOT NULL AND r.id > $1 \
             AND (r.namespace = ANY($2) \
                  OR j.spec::jsonb -> 'blackouts' @> '[{\"cancel_running\": true}]'::jsonb) \
             ORDER BY r.id LIMIT $3",
        )
        .await?;
    let rows = tx
        .query(&stmt, &[&after, &namespaces, &i64::from(limit)])
        .await?;
    rows.iter()
        .map(|row| {
            Ok(RunUnderWindows {
                run_id: row.try_get(0)?,
                namespace: row.try_get(1)?,
                job: row.try_get(2)?,
                trigger: rows::trigger(row.try_get(3)?)?,
                started_at: rows::instant(row.try_get(4)?)?,
                blackouts: rows::spec(row.try_get(5)?)?.blackouts,
            })
        })
        .collect()
}

/// Asks the runs of `stops` still running, and not asked yet, to stop, each with its reason
/// kept as its error (`Store::stop_runs`): one run at a time, in id order, as the row lock
/// order asks.
pub async fn stop_runs(tx: &Tx<'_>, stops: &[(i64, String)]) -> PgResult<Vec<i64>> {
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET cancel_requested = true, error = $2 \
             WHERE id = $1 AND state = 'running' AND NOT cancel_requested RETURNING id",
        )
        .await?;
    let mut ordered: Vec<&(i64, String)> = stops.iter().collect();
    ordered.sort_unstable_by_key(|(id, _)| *id);
    let mut asked = Vec::new();
    for (id, reason) in ordered {
        if let Some(row) = tx.query_opt(&stmt, &[id, reason]).await? {
            asked.push(row.try_get::<_, i64>(0)?);
        }
    }
    Ok(asked)
}

pub async fn cancel_run(tx: &Tx<'_>, run_id: i64, now: Instant) -> PgResult<Option<CancelOutcome>> {
    let Some(run) = lock_run(tx, run_id).await? else {
        return Ok(None);
    };
    let outcome = match run.state {
        s if s.is_terminal() => CancelOutcome::AlreadyFinished(run),
        RunState::Running => {
            let stmt = tx
                .prepare_cached(
                    "UPDATE runs SET cancel_requested = true, \
                     error = CASE WHEN cancel_requested THEN error END WHERE id = $1",
                )
                .await?;
            tx.execute(&stmt, &[&run_id]).await?;
            CancelOutcome::Requested(refetch(tx, run_id).await?)
        }
        RunState::Queued | RunState::Waiting => {
            let ended = finish_run(
                tx,
                run_id,
                RunState::Cancelled,
                run.failures,
                Some("cancelled by a user"),
                now,
            )
            .await?;
            let mut released = release_waiting(tx, run.job_id).await?;
            released.extend(settle(tx, vec![ended], Vec::new(), now).await?.queued);
            CancelOutcome::Cancelled {
                run: refetch(tx, run_id).await?,
                released,
            }
        }
        // Every state is terminal or one of the three above.
        _ => CancelOutcome::AlreadyFinished(run),
    };
    Ok(Some(outcome))
}

async fn refetch(tx: &Tx<'_>, run_id: i64) -> PgResult<RunRecord> {
    get_run(tx, run_id, false)
        .await?
        .ok_or_else(|| StoreError::Database(format!("run {run_id} vanished")).into())
}

/// Attempts whose lease ran out, and every attempt of a worker that is not alive.
const LOST: &str = "a.state = 'running' AND (a.lease_expires_at < $1 OR NOT EXISTS ( \
     SELECT 1 FROM workers w WHERE w.id = a.worker_id AND w.alive))";

pub async fn reap(tx: &Tx<'_>, silent_since: Instant, now: Instant) -> PgResult<ReapOutcome> {
    let mut outcome = ReapOutcome::default();
    let stmt = tx
        .prepare_cached(
            "UPDATE workers SET alive = false WHERE alive AND last_heartbeat_at < $1 RETURNING id",
        )
        .await?;
    for row in tx.query(&stmt, &[&micros(silent_since)]).await? {
        outcome.dead_workers.push(row.try_get(0)?);
    }
    outcome.dead_workers.sort();
    // Find the lost attempts, lock their jobs, runs and attempts in that order, then look again
    // under the locks: a heartbeat may have renewed a lease, or a report ended an attempt.
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT a.id, r.job_id FROM attempts a JOIN runs r ON r.id = a.run_id WHERE {LOST}"
        ))
        .await?;
    let candidates = tx.query(&stmt, &[&micros(now)]).await?;
    // A broadcast's shard pinned to a worker that is gone can run nowhere else.
    let stmt = tx
        .prepare_cached(&format!("SELECT r.job_id FROM runs r WHERE {STRANDED}"))
        .await?;
    let stranded = tx.query(&stmt, &[]).await?;
    let stmt = tx.prepare_cached(HELD_BACK).await?;
    let held_back = tx.query(&stmt, &[]).await?;
    if candidates.is_empty() && stranded.is_empty() && held_back.is_empty() {
        return Ok(outcome);
    }
    let mut attempt_ids = Vec::with_capacity(candidates.len());
    let mut job_ids = Vec::with_capacity(candidates.len() + stranded.len());
    for row in &candidates {
        attempt_ids.push(row.try_get::<_, i64>(0)?);
        job_ids.push(row.try_get::<_, i64>(1)?);
    }
    for row in stranded.iter().chain(&held_back) {
        job_ids.push(row.try_get::<_, i64>(0)?);
    }
    let attempt_ids = sorted(attempt_ids);
    let job_ids = sorted(job_ids);
    let below = dependants_of(tx, &job_ids).await?;
    lock_jobs(tx, &sorted(job_ids.iter().copied().chain(below))).await?;
    lock_attempts_and_runs(tx, &attempt_ids).await?;
    let mut ended = Vec::new();
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT a.id, a.run_id, r.job_id, r.cancel_requested, r.failures \
             FROM attempts a JOIN runs r ON r.id = a.run_id \
             WHERE a.id = ANY($2) AND {LOST} ORDER BY a.id"
        ))
        .await?;
    let lost = tx.query(&stmt, &[&micros(now), &attempt_ids]).await?;
    for row in lost {
        let (attempt_id, run_id, job_id): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let cancel_requested: bool = row.try_get(3)?;
        let stmt = tx
            .prepare_cached(
                "UPDATE attempts SET state = 'lost', finished_at = $2, \
                 error = 'the worker stopped heartbeating; its lease was taken away' \
                 WHERE id = $1",
            )
            .await?;
        tx.execute(&stmt, &[&attempt_id, &micros(now)]).await?;
        if cancel_requested {
            let failures = rows::count("failures", row.try_get::<_, i32>(4)?)?;
            ended.push(
                finish_run(
                    tx,
                    run_id,
                    RunState::Cancelled,
                    failures,
                    Some("cancelled; its worker was lost"),
                    now,
                )
                .await?,
            );
            outcome.cancelled.push(run_id);
            outcome.requeued.extend(release_waiting(tx, job_id).await?);
        } else {
            // A lost attempt is sked's failure, not the job's: the retry budget is untouched.
            let stmt = tx
                .prepare_cached("UPDATE runs SET state = 'queued', ready_at = $2 WHERE id = $1")
                .await?;
            tx.execute(&stmt, &[&run_id, &micros(now)]).await?;
            outcome.requeued.push(run_id);
        }
    }
    // Under the jobs' locks: those found above, and those the lost attempts just queued again.
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT r.id, r.job_id, r.failures, r.pinned_worker FROM runs r \
             WHERE {STRANDED} AND r.job_id = ANY($1) ORDER BY r.id FOR UPDATE"
        ))
        .await?;
    for row in tx.query(&stmt, &[&job_ids]).await? {
        let (run_id, job_id): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        let failures = rows::count("failures", row.try_get::<_, i32>(2)?)?;
        let error = sked_core::shard::worker_lost(row.try_get(3)?);
        ended.push(finish_run(tx, run_id, RunState::Failed, failures, Some(&error), now).await?);
        outcome.failed.push(run_id);
        outcome.requeued.extend(release_waiting(tx, job_id).await?);
    }
    // Looked at again under the jobs' locks: the release itself asks that nothing be active.
    for row in &held_back {
        let job_id: i64 = row.try_get(0)?;
        outcome.requeued.extend(release_waiting(tx, job_id).await?);
    }
    outcome
        .requeued
        .extend(settle(tx, ended, Vec::new(), now).await?.queued);
    Ok(outcome)
}

/// Jobs with runs held back by overlap while none of theirs is queued or running (through
/// `runs_overlap_waiting`). A completion releases them only for a job whose policy holds runs
/// back, read without its lock: the reaper's pass releases those left by a policy changed
/// meanwhile (or changed to `allow`).
const HELD_BACK: &str = "SELECT DISTINCT w.job_id FROM runs w \
     WHERE w.state = 'waiting' AND w.waiting_reason = 'overlap' \
     AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.job_id = w.job_id \
                     AND a.state IN ('queued', 'running'))";

/// Queued shards of a broadcast whose worker is no longer alive (through `runs_pinned`).
const STRANDED: &str = "r.state = 'queued' AND r.pinned_worker IS NOT NULL \
     AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = r.pinned_worker AND w.alive)";

//! Heartbeat jobs in PostgreSQL, as `sqlite/heartbeats.rs` keeps them. A ping locks its job (and
//! the jobs depending on it, as anything that may end a run does) before it looks for a waiting
//! run, so it and the fire path, which holds the same lock, never miss each other: a ping kept
//! while a run was being recorded is seen by that run.

use super::dependencies::{dependants_of, settle};
use super::ledger::finish_run;
use super::rows::{self, micros};
use super::{PgResult, Tx};
use crate::{ExpiredPings, PingOutcome};
use sked_core::heartbeat;
use sked_core::run::RunState;
use sked_core::Instant;
use std::time::Duration;

pub async fn ping(tx: &Tx<'_>, job_id: i64, now: Instant) -> PgResult<Option<PingOutcome>> {
    let below = dependants_of(tx, &[job_id]).await?;
    super::jobs::lock(tx, &below.into_iter().chain([job_id]).collect::<Vec<_>>()).await?;
    let stmt = tx
        .prepare_cached("SELECT ping_grace FROM jobs WHERE id = $1")
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&job_id]).await? else {
        return Ok(None);
    };
    if row.try_get::<_, Option<i64>>(0)?.is_none() {
        return Ok(Some(PingOutcome::NotHeartbeat));
    }
    let stmt = tx
        .prepare_cached(
            "SELECT id FROM runs WHERE job_id = $1 AND state = 'waiting' \
             AND waiting_reason = 'ping' AND scheduled_for <= $2 \
             ORDER BY scheduled_for, id LIMIT 1 FOR UPDATE",
        )
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&job_id, &micros(now)]).await? else {
        let stmt = tx
            .prepare_cached("UPDATE jobs SET last_ping_at = $2 WHERE id = $1")
            .await?;
        tx.execute(&stmt, &[&job_id, &micros(now)]).await?;
        return Ok(Some(PingOutcome::Kept));
    };
    let run_id: i64 = row.try_get(0)?;
    let ended = finish_run(tx, run_id, RunState::Succeeded, 0, None, now).await?;
    let released = settle(tx, vec![ended], Vec::new(), now).await?.queued;
    Ok(Some(PingOutcome::Answered { run_id, released }))
}

/// Whether the job's kept ping credits its run of `instant`; a credited ping is used up. The
/// caller holds the job's lock.
pub(super) async fn take_kept_ping(
    tx: &Tx<'_>,
    job_id: i64,
    instant: Instant,
    grace: i64,
) -> PgResult<bool> {
    let stmt = tx
        .prepare_cached("SELECT last_ping_at FROM jobs WHERE id = $1")
        .await?;
    let kept: Option<i64> = match tx.query_opt(&stmt, &[&job_id]).await? {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    let kept = kept.map(rows::instant).transpose()?;
    let grace = Duration::from_micros(grace.max(0) as u64);
    if !heartbeat::credits(kept, instant, grace) {
        return Ok(false);
    }
    let stmt = tx
        .prepare_cached("UPDATE jobs SET last_ping_at = NULL WHERE id = $1")
        .await?;
    tx.execute(&stmt, &[&job_id]).await?;
    Ok(true)
}

pub async fn expire(tx: &Tx<'_>, now: Instant, limit: u32) -> PgResult<ExpiredPings> {
    // Find them, lock their jobs and their dependants, then look again under the locks.
    const OVERDUE: &str = "r.state = 'waiting' AND r.waiting_reason = 'ping' \
         AND r.waiting_until < $1";
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT r.id, r.job_id FROM runs r WHERE {OVERDUE} ORDER BY r.waiting_until LIMIT $2"
        ))
        .await?;
    let candidates = tx.query(&stmt, &[&micros(now), &i64::from(limit)]).await?;
    let mut expired = ExpiredPings::default();
    if candidates.is_empty() {
        return Ok(expired);
    }
    let mut run_ids = Vec::with_capacity(candidates.len());
    let mut job_ids = Vec::with_capacity(candidates.len());
    for row in &candidates {
        run_ids.push(row.try_get::<_, i64>(0)?);
        job_ids.push(row.try_get::<_, i64>(1)?);
    }
    job_ids.extend(dependants_of(tx, &job_ids).await?);
    super::jobs::lock(tx, &job_ids).await?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT r.id, r.job_id, r.scheduled_for, j.ping_grace FROM runs r \
             LEFT JOIN jobs j ON j.id = r.job_id \
             WHERE r.id = ANY($2) AND {OVERDUE} ORDER BY r.id FOR UPDATE OF r"
        ))
        .await?;
    let overdue = tx.query(&stmt, &[&micros(now), &run_ids]).await?;
    let mut ended = Vec::with_capacity(overdue.len());
    for row in overdue {
        let run_id: i64 = row.try_get(0)?;
        let job_id: i64 = row.try_get(1)?;
        let instant = rows::instant(row.try_get(2)?)?;
        let grace = row.try_get::<_, Option<i64>>(3)?.unwrap_or(0);
        if take_kept_ping(tx, job_id, instant, grace).await? {
            ended.push(finish_run(tx, run_id, RunState::Succeeded, 0, None, now).await?);
            expired.succeeded.push(run_id);
        } else {
            let why = heartbeat::missing_ping(Duration::from_micros(grace.max(0) as u64));
            ended.push(finish_run(tx, run_id, RunState::Failed, 1, Some(&why), now).await?);
            expired.failed.push(run_id);
        }
    }
    expired.queued = settle(tx, ended, Vec::new(), now).await?.queued;
    Ok(expired)
}

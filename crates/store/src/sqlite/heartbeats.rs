//! Heartbeat jobs in SQLite: a ping answers the oldest run waiting for one, or is kept on the
//! job's row; a run whose grace passed ends `succeeded` if a kept ping credits it, else
//! `failed`. Runs are recorded waiting for a ping by the fire path (`ledger.rs`). The verdicts
//! are `sked_core::heartbeat`'s.

use super::dependencies::settle;
use super::ledger::finish_run;
use super::rows::{self, micros};
use crate::{ExpiredPings, PingOutcome, Result};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::heartbeat;
use sked_core::run::RunState;
use sked_core::Instant;
use std::time::Duration;

pub fn ping(tx: &Transaction<'_>, job_id: i64, now: Instant) -> Result<Option<PingOutcome>> {
    let grace: Option<Option<i64>> = tx
        .prepare_cached("SELECT ping_grace FROM jobs WHERE id = ?1")?
        .query_row(params![job_id], |r| r.get(0))
        .optional()?;
    match grace {
        None => return Ok(None),
        Some(None) => return Ok(Some(PingOutcome::NotHeartbeat)),
        Some(Some(_)) => {}
    }
    let waiting: Option<i64> = tx
        .prepare_cached(
            "SELECT id FROM runs WHERE job_id = ?1 AND state = 'waiting' \
             AND waiting_reason = 'ping' AND scheduled_for <= ?2 \
             ORDER BY scheduled_for, id LIMIT 1",
        )?
        .query_row(params![job_id, micros(now)], |r| r.get(0))
        .optional()?;
    let Some(run_id) = waiting else {
        tx.prepare_cached("UPDATE jobs SET last_ping_at = ?2 WHERE id = ?1")?
            .execute(params![job_id, micros(now)])?;
        return Ok(Some(PingOutcome::Kept));
    };
    let ended = finish_run(tx, run_id, RunState::Succeeded, 0, None, now)?;
    let released = settle(tx, vec![ended], Vec::new(), now)?.queued;
    Ok(Some(PingOutcome::Answered { run_id, released }))
}

/// Whether the job's kept ping credits its run of `instant`; a credited ping is used up.
pub(super) fn take_kept_ping(
    tx: &Transaction<'_>,
    job_id: i64,
    instant: Instant,
    grace: i64,
) -> Result<bool> {
    let kept: Option<i64> = tx
        .prepare_cached("SELECT last_ping_at FROM jobs WHERE id = ?1")?
        .query_row(params![job_id], |r| r.get(0))
        .optional()?
        .flatten();
    let kept = kept.map(rows::instant).transpose()?;
    let grace = Duration::from_micros(grace.max(0) as u64);
    if !heartbeat::credits(kept, instant, grace) {
        return Ok(false);
    }
    tx.prepare_cached("UPDATE jobs SET last_ping_at = NULL WHERE id = ?1")?
        .execute(params![job_id])?;
    Ok(true)
}

pub fn expire(tx: &Transaction<'_>, now: Instant, limit: u32) -> Result<ExpiredPings> {
    let overdue: Vec<(i64, i64, i64, Option<i64>)> = tx
        .prepare_cached(
            "SELECT r.id, r.job_id, r.scheduled_for, j.ping_grace FROM runs r \
             LEFT JOIN jobs j ON j.id = r.job_id \
             WHERE r.state = 'waiting' AND r.waiting_reason = 'ping' AND r.waiting_until < ?1 \
             ORDER BY r.waiting_until LIMIT ?2",
        )?
        .query_map(params![micros(now), limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut expired = ExpiredPings::default();
    let mut ended = Vec::with_capacity(overdue.len());
    for (run_id, job_id, instant, grace) in overdue {
        let instant = rows::instant(instant)?;
        let grace = grace.unwrap_or(0);
        if take_kept_ping(tx, job_id, instant, grace)? {
            ended.push(finish_run(tx, run_id, RunState::Succeeded, 0, None, now)?);
            expired.succeeded.push(run_id);
        } else {
            let why = heartbeat::missing_ping(Duration::from_micros(grace.max(0) as u64));
            ended.push(finish_run(
                tx,
                run_id,
                RunState::Failed,
                1,
                Some(&why),
                now,
            )?);
            expired.failed.push(run_id);
        }
    }
    expired.queued = settle(tx, ended, Vec::new(), now)?.queued;
    Ok(expired)
}

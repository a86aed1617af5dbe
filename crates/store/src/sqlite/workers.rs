//! Workers: registration, heartbeats (which extend the leases of their attempts), a clean
//! stop, the list.

use super::rows::{self, micros, WORKER_COLUMNS};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{plan_heartbeat, RunningAttempt};
use crate::{Drained, HeartbeatOutcome, LeaseRenewal, NewWorker, Page, Result, StoreError};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::records::WorkerRecord;
use sked_core::Instant;

pub fn register(tx: &Transaction<'_>, worker: &NewWorker, now: Instant) -> Result<()> {
    let labels = serde_json::to_string(&worker.labels)
        .map_err(|e| StoreError::Database(format!("cannot encode labels: {e}")))?;
    let namespaces = crate::shared::to_json("worker namespaces", &worker.namespaces)?;
    tx.prepare_cached(
        "INSERT INTO workers (id, name, labels, slots, registered_at, last_heartbeat_at, alive, \
         namespaces, token_id, publisher) VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1, ?6, ?7, ?8)",
    )?
    .execute(params![
        worker.id,
        worker.name,
        labels,
        worker.slots,
        micros(now),
        namespaces,
        worker.token_id,
        worker.publisher,
    ])?;
    Ok(())
}

/// A worker's clean stop: no longer alive, and stopped rather than lost. The attempts it still
/// holds lose their lease now, for the reaper to queue their runs again. `None` when the
/// worker is unknown or no longer alive (declared dead, or stopped already).
pub fn deregister(tx: &Transaction<'_>, id: &str, now: Instant) -> Result<Option<WorkerRecord>> {
    let changed = tx
        .prepare_cached(
            "UPDATE workers SET alive = 0, stopped = 1, last_heartbeat_at = ?2 \
             WHERE id = ?1 AND alive = 1",
        )?
        .execute(params![id, micros(now)])?;
    if changed == 0 {
        return Ok(None);
    }
    tx.prepare_cached(
        "UPDATE attempts SET lease_expires_at = ?2 \
         WHERE worker_id = ?1 AND state = 'running' AND lease_expires_at > ?2",
    )?
    .execute(params![id, micros(now)])?;
    get(tx, id)
}

pub fn heartbeat(
    tx: &Transaction<'_>,
    worker_id: &str,
    running: &[i64],
    now: Instant,
    lease: LeaseRenewal,
    forgotten_before: Instant,
) -> Result<HeartbeatOutcome> {
    let found: Option<(bool, bool)> = tx
        .prepare_cached("SELECT alive, draining FROM workers WHERE id = ?1")?
        .query_row(params![worker_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let draining = match found {
        Some((true, draining)) => draining,
        _ => {
            return Ok(HeartbeatOutcome {
                known: false,
                stop: running.to_vec(),
                forgotten: Vec::new(),
                draining: false,
            })
        }
    };
    tx.prepare_cached("UPDATE workers SET last_heartbeat_at = ?2 WHERE id = ?1")?
        .execute(params![worker_id, micros(now)])?;
    let on_worker = tx
        .prepare_cached(
            "SELECT a.id, a.started_at, a.lease_expires_at, r.cancel_requested \
             FROM attempts a JOIN runs r ON r.id = a.run_id \
             WHERE a.worker_id = ?1 AND a.state = 'running'",
        )?
        .query_map(params![worker_id], |r| {
            Ok(RunningAttempt {
                id: r.get(0)?,
                started_at: r.get(1)?,
                lease_expires_at: r.get(2)?,
                cancel_requested: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let plan = plan_heartbeat(running, &on_worker, now, lease, forgotten_before);
    let mut extend =
        tx.prepare_cached("UPDATE attempts SET lease_expires_at = ?2 WHERE id = ?1")?;
    for &attempt_id in &plan.renew {
        extend.execute(params![attempt_id, micros(lease.until)])?;
    }
    for &attempt_id in &plan.forgotten {
        extend.execute(params![attempt_id, micros(now)])?;
    }
    Ok(HeartbeatOutcome {
        known: true,
        stop: plan.stop,
        forgotten: plan.forgotten,
        draining,
    })
}

pub fn drain(tx: &Transaction<'_>, id: &str) -> Result<Option<Drained>> {
    let changed = tx
        .prepare_cached(
            "UPDATE workers SET draining = 1 WHERE id = ?1 AND alive = 1 AND draining = 0",
        )?
        .execute(params![id])?;
    Ok(get(tx, id)?.filter(|w| w.alive).map(|worker| Drained {
        worker,
        newly: changed == 1,
    }))
}

pub fn list(tx: &Transaction<'_>, limit: u32, cursor: Option<&str>) -> Result<Page<WorkerRecord>> {
    let limit = page_size(limit);
    let after = match cursor {
        Some(raw) => Some(Cursor::decode(raw)?.text(raw)?.to_string()),
        None => None,
    };
    let sql = format!(
        "SELECT {WORKER_COLUMNS} FROM workers w WHERE (?1 IS NULL OR w.id > ?1) \
         ORDER BY w.id LIMIT ?2"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![after, i64::from(limit) + 1])?;
    let mut workers = Vec::new();
    while let Some(row) = rows.next()? {
        workers.push(rows::worker(row)?);
    }
    Ok(cursor::page(workers, limit, cursor::after_worker))
}

pub fn get(tx: &Transaction<'_>, id: &str) -> Result<Option<WorkerRecord>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM workers w WHERE w.id = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![id])?;
    rows.next()?.map(rows::worker).transpose()
}

pub fn delete_dead(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM workers WHERE id IN (SELECT id FROM workers \
             WHERE alive = 0 AND last_heartbeat_at < ?1 LIMIT ?2)",
        )?
        .execute(params![micros(before), i64::from(limit)])?;
    Ok(deleted as u64)
}

//! Workers: registration, heartbeats (which extend the leases of their attempts), a clean
//! stop, the list.

use super::rows::{self, micros, WORKER_COLUMNS};
use super::{PgResult, Tx};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{plan_heartbeat, RunningAttempt};
use crate::{Drained, HeartbeatOutcome, LeaseRenewal, NewWorker, Page, StoreError};
use sked_core::records::WorkerRecord;
use sked_core::Instant;
use std::collections::HashSet;

pub async fn register(tx: &Tx<'_>, worker: &NewWorker, now: Instant) -> PgResult<()> {
    let labels = serde_json::to_string(&worker.labels)
        .map_err(|e| StoreError::Database(format!("cannot encode labels: {e}")))?;
    let namespaces = crate::shared::to_json("worker namespaces", &worker.namespaces)?;
    let stmt = tx
        .prepare_cached(
            "INSERT INTO workers (id, name, labels, slots, registered_at, last_heartbeat_at, \
             alive, namespaces, token_id, publisher) \
             VALUES ($1, $2, $3, $4, $5, $5, true, $6, $7, $8)",
        )
        .await?;
    tx.execute(
        &stmt,
        &[
            &worker.id,
            &worker.name,
            &labels,
            &i64::from(worker.slots),
            &micros(now),
            &namespaces,
            &worker.token_id,
            &worker.publisher,
        ],
    )
    .await?;
    Ok(())
}

/// A worker's clean stop: no longer alive, and stopped rather than lost. The attempts it still
/// holds lose their lease now, for the reaper to queue their runs again. `None` when the
/// worker is unknown or no longer alive (declared dead, or stopped already).
pub async fn deregister(tx: &Tx<'_>, id: &str, now: Instant) -> PgResult<Option<WorkerRecord>> {
    let stmt = tx
        .prepare_cached(
            "UPDATE workers SET alive = false, stopped = true, last_heartbeat_at = $2 \
             WHERE id = $1 AND alive",
        )
        .await?;
    if tx.execute(&stmt, &[&id, &micros(now)]).await? == 0 {
        return Ok(None);
    }
    let stmt = tx
        .prepare_cached(
            "UPDATE attempts SET lease_expires_at = $2 \
             WHERE worker_id = $1 AND state = 'running' AND lease_expires_at > $2",
        )
        .await?;
    tx.execute(&stmt, &[&id, &micros(now)]).await?;
    get(tx, id).await
}

pub async fn heartbeat(
    tx: &Tx<'_>,
    worker_id: &str,
    running: &[i64],
    now: Instant,
    lease: LeaseRenewal,
    forgotten_before: Instant,
) -> PgResult<HeartbeatOutcome> {
    // The worker's row first: a reaper declaring it dead waits for this heartbeat, or this
    // heartbeat finds it dead.
    let stmt = tx
        .prepare_cached(
            "UPDATE workers SET last_heartbeat_at = $2 WHERE id = $1 AND alive \
             RETURNING draining",
        )
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&worker_id, &micros(now)]).await? else {
        return Ok(HeartbeatOutcome {
            known: false,
            stop: running.to_vec(),
            forgotten: Vec::new(),
            draining: false,
        });
    };
    let draining: bool = row.try_get(0)?;
    // What the store has running on the worker, read through the running attempts' partial
    // index, without a lock: a worker holding thousands of attempts has few that need
    // anything written. Each run is found in its own partition by its instant; an attempt
    // from before the tables were partitioned says instant 0, not its run's, and its run is
    // looked up by id alone (a probe of the legacy partition's attempts, empty once they end).
    let stmt = tx
        .prepare_cached(
            "SELECT a.id, a.started_at, a.lease_expires_at, r.cancel_requested \
             FROM attempts a JOIN runs r \
               ON r.id = a.run_id AND r.scheduled_for = a.run_scheduled_for \
             WHERE a.worker_id = $1 AND a.state = 'running' AND a.run_scheduled_for <> 0 \
             UNION ALL \
             SELECT a.id, a.started_at, a.lease_expires_at, r.cancel_requested \
             FROM attempts a JOIN runs r ON r.id = a.run_id \
             WHERE a.worker_id = $1 AND a.state = 'running' AND a.run_scheduled_for = 0",
        )
        .await?;
    let mut on_worker = Vec::new();
    for row in tx.query(&stmt, &[&worker_id]).await? {
        on_worker.push(RunningAttempt {
            id: row.try_get(0)?,
            started_at: row.try_get(1)?,
            lease_expires_at: row.try_get(2)?,
            cancel_requested: row.try_get(3)?,
        });
    }
    let plan = plan_heartbeat(running, &on_worker, now, lease, forgotten_before);
    // Locked in id order, as every transaction locks attempts.
    let mut locked = Vec::new();
    let to_lock: Vec<i64> = {
        let mut ids: Vec<i64> = plan.renew.iter().chain(&plan.forgotten).copied().collect();
        ids.sort_unstable();
        ids
    };
    if !to_lock.is_empty() {
        let stmt = tx
            .prepare_cached(
                "SELECT id FROM attempts WHERE id = ANY($1) AND worker_id = $2 \
                 AND state = 'running' ORDER BY id FOR UPDATE",
            )
            .await?;
        for row in tx.query(&stmt, &[&to_lock, &worker_id]).await? {
            locked.push(row.try_get::<_, i64>(0)?);
        }
    }
    let is_locked = |id: &i64| locked.binary_search(id).is_ok();
    let renewed: Vec<i64> = plan.renew.iter().copied().filter(is_locked).collect();
    if !renewed.is_empty() {
        let stmt = tx
            .prepare_cached("UPDATE attempts SET lease_expires_at = $2 WHERE id = ANY($1)")
            .await?;
        tx.execute(&stmt, &[&renewed, &micros(lease.until)]).await?;
    }
    let forgotten: Vec<i64> = plan.forgotten.iter().copied().filter(is_locked).collect();
    if !forgotten.is_empty() {
        let stmt = tx
            .prepare_cached("UPDATE attempts SET lease_expires_at = $2 WHERE id = ANY($1)")
            .await?;
        tx.execute(&stmt, &[&forgotten, &micros(now)]).await?;
    }
    // One no longer running when locked ended meanwhile (a completion, the reaper).
    let stopping: HashSet<i64> = plan
        .stop
        .iter()
        .copied()
        .chain(plan.renew.iter().copied().filter(|id| !is_locked(id)))
        .collect();
    Ok(HeartbeatOutcome {
        known: true,
        stop: running
            .iter()
            .copied()
            .filter(|id| stopping.contains(id))
            .collect(),
        forgotten,
        draining,
    })
}

pub async fn drain(tx: &Tx<'_>, id: &str) -> PgResult<Option<Drained>> {
    let stmt = tx
        .prepare_cached(
            "UPDATE workers SET draining = true WHERE id = $1 AND alive AND NOT draining",
        )
        .await?;
    let changed = tx.execute(&stmt, &[&id]).await?;
    Ok(get(tx, id)
        .await?
        .filter(|w| w.alive)
        .map(|worker| Drained {
            worker,
            newly: changed == 1,
        }))
}

pub async fn list(tx: &Tx<'_>, limit: u32, cursor: Option<&str>) -> PgResult<Page<WorkerRecord>> {
    let limit = page_size(limit);
    let after = match cursor {
        Some(raw) => Some(Cursor::decode(raw)?.text(raw)?.to_string()),
        None => None,
    };
    let sql = format!(
        "SELECT {WORKER_COLUMNS} FROM workers w WHERE ($1::text IS NULL OR w.id > $1) \
         ORDER BY w.id LIMIT $2"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let workers = tx
        .query(&stmt, &[&after, &(i64::from(limit) + 1)])
        .await?
        .iter()
        .map(rows::worker)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(cursor::page(workers, limit, cursor::after_worker))
}

pub async fn get(tx: &Tx<'_>, id: &str) -> PgResult<Option<WorkerRecord>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM workers w WHERE w.id = $1");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&id])
        .await?
        .as_ref()
        .map(rows::worker)
        .transpose()
}

pub async fn delete_dead(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let stmt = tx
        .prepare_cached(
            "DELETE FROM workers WHERE id IN (SELECT id FROM workers \
             WHERE NOT alive AND last_heartbeat_at < $1 ORDER BY id LIMIT $2 FOR UPDATE)",
        )
        .await?;
    Ok(tx
        .execute(&stmt, &[&micros(before), &i64::from(limit)])
        .await?)
}

//! Reading the ledger (runs, attempts, statistics), captured output, and retention.

use super::rows::{self, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use super::{partitions, PgResult, Tx};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{AttemptCounts, ATTEMPT_COUNTS_SQL, SKIP_REASONS_SQL, UNENDED_RUNS};
use crate::{AppendOutcome, Page, RunQuery, StoreError};
use sked_core::records::{AttemptRecord, JobStats, RunRecord};
use sked_core::Instant;
use std::collections::BTreeMap;
use tokio_postgres::types::ToSql;

/// Statistics look at this many of the job's newest runs for percentiles.
pub const STATS_WINDOW: u32 = 10_000;

pub async fn get_run(
    tx: &Tx<'_>,
    run_id: i64,
) -> PgResult<Option<(RunRecord, Vec<AttemptRecord>)>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1");
    let stmt = tx.prepare_cached(&sql).await?;
    let run = match tx.query_opt(&stmt, &[&run_id]).await? {
        Some(row) => rows::run(&row)?,
        None => return Ok(None),
    };
    let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = $1 ORDER BY number");
    let stmt = tx.prepare_cached(&sql).await?;
    let attempts = tx
        .query(&stmt, &[&run_id])
        .await?
        .iter()
        .map(rows::attempt)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(Some((run, attempts)))
}

/// Only the filters asked for are written into the statement, so that its plan seeks the
/// index with the cursor (a `$n IS NULL OR ...` condition would hide it from a generic plan,
/// and each page would scan every newer run).
pub async fn list_runs(tx: &Tx<'_>, query: &RunQuery) -> PgResult<Page<RunRecord>> {
    let limit = page_size(query.limit);
    let mut conditions = vec!["namespace = $1".to_string()];
    let mut values: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(query.namespace.clone())];
    if let Some(job) = &query.job {
        values.push(Box::new(job.clone()));
        conditions.push(format!("job = ${}", values.len()));
    }
    if let Some(state) = query.state {
        values.push(Box::new(state.as_str()));
        conditions.push(format!("state = ${}", values.len()));
        if !state.is_terminal() {
            conditions.push(UNENDED_RUNS.into());
        }
    }
    // Each matches its partial index, which holds only the marked runs.
    if query.deadline_missed {
        conditions.push("deadline_missed IS NOT NULL".into());
    }
    if query.at_risk {
        conditions.push("at_risk IS NOT NULL".into());
    }
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        values.push(Box::new(cursor.micros(raw)?));
        values.push(Box::new(cursor.id));
        let n = values.len();
        conditions.push(format!("(scheduled_for, id) < (${}, ${n})", n - 1));
    }
    values.push(Box::new(i64::from(limit) + 1));
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE {} ORDER BY scheduled_for DESC, id DESC LIMIT ${}",
        conditions.join(" AND "),
        values.len()
    );
    let params: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect();
    let stmt = tx.prepare_cached(&sql).await?;
    let items = tx
        .query(&stmt, &params)
        .await?
        .iter()
        .map(rows::run)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(cursor::page(items, limit, cursor::after_run))
}

pub async fn job_stats(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<Option<JobStats>> {
    let mut by_state = BTreeMap::new();
    let mut runs = 0u64;
    let stmt = tx
        .prepare_cached(
            "SELECT state, count(*) FROM runs WHERE namespace = $1 AND job = $2 GROUP BY state",
        )
        .await?;
    for row in tx.query(&stmt, &[&namespace, &name]).await? {
        let state: &str = row.try_get(0)?;
        let count: i64 = row.try_get(1)?;
        runs += count as u64;
        by_state.insert(rows::run_state(state)?.to_string(), count as u64);
    }
    if runs == 0 && super::jobs::get(tx, namespace, name).await?.is_none() {
        return Ok(None);
    }
    let mut skipped_by_reason = BTreeMap::new();
    let stmt = tx.prepare_cached(SKIP_REASONS_SQL).await?;
    for row in tx.query(&stmt, &[&namespace, &name]).await? {
        let (reason, count): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        skipped_by_reason.insert(reason, count as u64);
    }
    let stmt = tx.prepare_cached(ATTEMPT_COUNTS_SQL).await?;
    let row = tx.query_one(&stmt, &[&namespace, &name]).await?;
    let attempts = AttemptCounts {
        retries: row.try_get::<_, i64>(0)? as u64,
        lost: row.try_get::<_, i64>(1)? as u64,
    };
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE namespace = $1 AND job = $2 \
         ORDER BY scheduled_for DESC, id DESC LIMIT 1"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let last_run = tx
        .query_opt(&stmt, &[&namespace, &name])
        .await?
        .as_ref()
        .map(rows::run)
        .transpose()?;
    let (mut fired, mut started) = (Vec::new(), Vec::new());
    let stmt = tx
        .prepare_cached(
            "SELECT created_at - scheduled_for, started_at - scheduled_for FROM runs \
             WHERE namespace = $1 AND job = $2 AND trigger = 'schedule' \
             ORDER BY scheduled_for DESC LIMIT $3",
        )
        .await?;
    for row in tx
        .query(&stmt, &[&namespace, &name, &i64::from(STATS_WINDOW)])
        .await?
    {
        fired.push(row.try_get::<_, i64>(0)? as f64 / 1000.0);
        if let Some(us) = row.try_get::<_, Option<i64>>(1)? {
            started.push(us as f64 / 1000.0);
        }
    }
    Ok(Some(crate::shared::job_stats(
        by_state,
        skipped_by_reason,
        attempts,
        last_run,
        fired,
        started,
    )))
}

pub async fn append_output(
    tx: &Tx<'_>,
    attempt_id: i64,
    token: i64,
    worker_id: &str,
    bytes: &[u8],
    cap: u64,
) -> PgResult<AppendOutcome> {
    // The attempt's row is locked: appends of one attempt take turns, each at the end.
    let stmt = tx
        .prepare_cached(
            "SELECT token, state, output_bytes, output_truncated, worker_id, run_scheduled_for \
             FROM attempts WHERE id = $1 FOR UPDATE",
        )
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&attempt_id]).await? else {
        return Ok(AppendOutcome::Rejected);
    };
    let (held, state, stored, truncated, holder, run_scheduled_for): (
        i64,
        &str,
        i64,
        bool,
        &str,
        i64,
    ) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
        row.try_get(5)?,
    );
    if held != token || state != "running" || holder != worker_id {
        return Ok(AppendOutcome::Rejected);
    }
    let stored = u64::try_from(stored)
        .map_err(|_| StoreError::Corrupt(format!("output size {stored} is out of range")))?;
    let room = cap.saturating_sub(stored);
    let kept = room.min(bytes.len() as u64);
    let truncated = truncated || kept < bytes.len() as u64;
    let offset = |n: u64| {
        i64::try_from(n).map_err(|_| StoreError::Database(format!("output offset {n} too large")))
    };
    if kept > 0 {
        let stmt = tx
            .prepare_cached(
                "INSERT INTO output (attempt_id, \"offset\", data, run_scheduled_for) \
                 VALUES ($1, $2, $3, $4)",
            )
            .await?;
        let data = bytes.get(..kept as usize).unwrap_or(bytes);
        tx.execute(
            &stmt,
            &[&attempt_id, &offset(stored)?, &data, &run_scheduled_for],
        )
        .await?;
    }
    let stmt = tx
        .prepare_cached(
            "UPDATE attempts SET output_bytes = $2, output_truncated = $3 WHERE id = $1",
        )
        .await?;
    tx.execute(&stmt, &[&attempt_id, &offset(stored + kept)?, &truncated])
        .await?;
    Ok(AppendOutcome::Accepted { kept, truncated })
}

pub async fn read_output(tx: &Tx<'_>, attempt_id: i64, offset: u64) -> PgResult<Vec<u8>> {
    let from = i64::try_from(offset).unwrap_or(i64::MAX);
    let stmt = tx
        .prepare_cached(
            "SELECT \"offset\", data FROM output \
             WHERE attempt_id = $1 AND \"offset\" + length(data) > $2 ORDER BY \"offset\"",
        )
        .await?;
    let mut out = Vec::new();
    for row in tx.query(&stmt, &[&attempt_id, &from]).await? {
        let start: i64 = row.try_get(0)?;
        let data: &[u8] = row.try_get(1)?;
        let skip = usize::try_from((from - start).max(0)).unwrap_or(usize::MAX);
        out.extend_from_slice(data.get(skip..).unwrap_or_default());
    }
    Ok(out)
}

/// Deletes up to `limit` runs that finished before `before`, with their attempts and output,
/// except those in time partitions still within retention (`partitions::live_instants`): those
/// go whole, by `partitions::drop_one`, once the partition has expired.
pub async fn delete_finished_runs(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let spans = partitions::spans(tx).await?;
    let (live_starts, live_ends) =
        partitions::live_instants(&spans, micros(before)).unwrap_or((i64::MAX, i64::MAX));
    let stmt = tx
        .prepare_cached(
            "WITH gone AS ( \
                 DELETE FROM runs WHERE id IN (SELECT id FROM runs \
                     WHERE finished_at < $1 AND state NOT IN ('waiting', 'queued', 'running') \
                     AND (scheduled_for < $3 OR scheduled_for >= $4) \
                     LIMIT $2) \
                 RETURNING id), \
             gone_attempts AS ( \
                 DELETE FROM attempts WHERE run_id IN (SELECT id FROM gone) RETURNING id), \
             gone_output AS ( \
                 DELETE FROM output WHERE attempt_id IN (SELECT id FROM gone_attempts)) \
             SELECT count(*) FROM gone",
        )
        .await?;
    let row = tx
        .query_one(
            &stmt,
            &[&micros(before), &i64::from(limit), &live_starts, &live_ends],
        )
        .await?;
    let deleted: i64 = row.try_get(0)?;
    Ok(u64::try_from(deleted).unwrap_or(0))
}

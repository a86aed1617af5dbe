//! Reading the ledger (runs, attempts, statistics), captured output, and retention.

use super::rows::{self, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{AttemptCounts, ATTEMPT_COUNTS_SQL, SKIP_REASONS_SQL, UNENDED_RUNS};
use crate::{AppendOutcome, Page, Result, RunQuery};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, OptionalExtension, Transaction};
use sked_core::records::{AttemptRecord, JobStats, RunRecord};
use sked_core::Instant;
use std::collections::BTreeMap;

/// Statistics look at this many of the job's newest runs for percentiles.
pub const STATS_WINDOW: u32 = 10_000;

pub fn get_run(
    tx: &Transaction<'_>,
    run_id: i64,
) -> Result<Option<(RunRecord, Vec<AttemptRecord>)>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
    let run = {
        let mut stmt = tx.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![run_id])?;
        match rows.next()? {
            Some(row) => rows::run(row)?,
            None => return Ok(None),
        }
    };
    let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = ?1 ORDER BY number");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![run_id])?;
    let mut attempts = Vec::new();
    while let Some(row) = rows.next()? {
        attempts.push(rows::attempt(row)?);
    }
    Ok(Some((run, attempts)))
}

/// Only the filters asked for are written into the statement, so that the cursor seeks the
/// index (a `?n IS NULL OR ...` condition would hide it, and each page would scan every newer
/// run: paging through a long history would take time quadratic in its length).
pub fn list_runs(tx: &Transaction<'_>, query: &RunQuery) -> Result<Page<RunRecord>> {
    let limit = page_size(query.limit);
    let (sql, values) = runs_statement(query, limit)?;
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(values))?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(rows::run(row)?);
    }
    Ok(cursor::page(items, limit, cursor::after_run))
}

/// The statement that lists a page of `query`'s runs (one more than `limit`), and its values.
fn runs_statement(query: &RunQuery, limit: u32) -> Result<(String, Vec<Value>)> {
    let mut conditions = vec!["namespace = ?"];
    let mut values: Vec<Value> = vec![query.namespace.clone().into()];
    if let Some(job) = &query.job {
        conditions.push("job = ?");
        values.push(job.clone().into());
    }
    if let Some(state) = query.state {
        conditions.push("state = ?");
        values.push(state.as_str().to_string().into());
        if !state.is_terminal() {
            conditions.push(UNENDED_RUNS);
        }
    }
    // Each matches its partial index, which holds only the marked runs.
    if query.deadline_missed {
        conditions.push("deadline_missed IS NOT NULL");
    }
    if query.at_risk {
        conditions.push("at_risk IS NOT NULL");
    }
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        conditions.push("(scheduled_for, id) < (?, ?)");
        values.push(cursor.micros(raw)?.into());
        values.push(cursor.id.into());
    }
    values.push((i64::from(limit) + 1).into());
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE {} ORDER BY scheduled_for DESC, id DESC LIMIT ?",
        conditions.join(" AND ")
    );
    Ok((sql, values))
}

pub fn job_stats(tx: &Transaction<'_>, namespace: &str, name: &str) -> Result<Option<JobStats>> {
    let mut by_state = BTreeMap::new();
    let mut runs = 0u64;
    {
        let mut stmt = tx.prepare_cached(
            "SELECT state, count(*) FROM runs WHERE namespace = ?1 AND job = ?2 GROUP BY state",
        )?;
        let mut rows = stmt.query(params![namespace, name])?;
        while let Some(row) = rows.next()? {
            let (state, count): (String, i64) = (row.get(0)?, row.get(1)?);
            runs += count as u64;
            by_state.insert(rows::run_state(&state)?.to_string(), count as u64);
        }
    }
    if runs == 0 && super::jobs::get(tx, namespace, name)?.is_none() {
        return Ok(None);
    }
    let mut skipped_by_reason = BTreeMap::new();
    {
        let mut stmt = tx.prepare_cached(SKIP_REASONS_SQL)?;
        let mut rows = stmt.query(params![namespace, name])?;
        while let Some(row) = rows.next()? {
            let (reason, count): (String, i64) = (row.get(0)?, row.get(1)?);
            skipped_by_reason.insert(reason, count as u64);
        }
    }
    let attempts =
        tx.prepare_cached(ATTEMPT_COUNTS_SQL)?
            .query_row(params![namespace, name], |row| {
                Ok(AttemptCounts {
                    retries: row.get::<_, i64>(0)? as u64,
                    lost: row.get::<_, i64>(1)? as u64,
                })
            })?;
    let last_run = {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE namespace = ?1 AND job = ?2 \
             ORDER BY scheduled_for DESC, id DESC LIMIT 1"
        );
        let mut stmt = tx.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![namespace, name])?;
        rows.next()?.map(rows::run).transpose()?
    };
    let (mut fired, mut started) = (Vec::new(), Vec::new());
    {
        let mut stmt = tx.prepare_cached(
            "SELECT created_at - scheduled_for, started_at - scheduled_for FROM runs \
             WHERE namespace = ?1 AND job = ?2 AND trigger = 'schedule' \
             ORDER BY scheduled_for DESC LIMIT ?3",
        )?;
        let mut rows = stmt.query(params![namespace, name, STATS_WINDOW])?;
        while let Some(row) = rows.next()? {
            fired.push(row.get::<_, i64>(0)? as f64 / 1000.0);
            if let Some(us) = row.get::<_, Option<i64>>(1)? {
                started.push(us as f64 / 1000.0);
            }
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

pub fn append_output(
    tx: &Transaction<'_>,
    attempt_id: i64,
    token: i64,
    worker_id: &str,
    bytes: &[u8],
    cap: u64,
) -> Result<AppendOutcome> {
    let found: Option<(i64, String, i64, bool, String)> = tx
        .prepare_cached(
            "SELECT token, state, output_bytes, output_truncated, worker_id FROM attempts \
             WHERE id = ?1",
        )?
        .query_row(params![attempt_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    let Some((held, state, stored, truncated, holder)) = found else {
        return Ok(AppendOutcome::Rejected);
    };
    if held != token || state != "running" || holder != worker_id {
        return Ok(AppendOutcome::Rejected);
    }
    let stored = stored as u64;
    let room = cap.saturating_sub(stored);
    let kept = room.min(bytes.len() as u64);
    let truncated = truncated || kept < bytes.len() as u64;
    if kept > 0 {
        tx.prepare_cached("INSERT INTO output (attempt_id, offset, data) VALUES (?1, ?2, ?3)")?
            .execute(params![attempt_id, stored as i64, &bytes[..kept as usize]])?;
    }
    tx.prepare_cached(
        "UPDATE attempts SET output_bytes = ?2, output_truncated = ?3 WHERE id = ?1",
    )?
    .execute(params![attempt_id, (stored + kept) as i64, truncated])?;
    Ok(AppendOutcome::Accepted { kept, truncated })
}

pub fn read_output(tx: &Transaction<'_>, attempt_id: i64, offset: u64) -> Result<Vec<u8>> {
    let mut stmt = tx.prepare_cached(
        "SELECT offset, data FROM output WHERE attempt_id = ?1 AND offset + length(data) > ?2 \
         ORDER BY offset",
    )?;
    let mut rows = stmt.query(params![attempt_id, offset as i64])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let start: i64 = row.get(0)?;
        let data: Vec<u8> = row.get(1)?;
        let skip = (offset as i64 - start).max(0) as usize;
        out.extend_from_slice(data.get(skip..).unwrap_or_default());
    }
    Ok(out)
}

pub fn delete_finished_runs(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM runs WHERE id IN (SELECT id FROM runs \
             WHERE finished_at < ?1 AND state NOT IN ('waiting', 'queued', 'running') LIMIT ?2)",
        )?
        .execute(params![micros(before), limit])?;
    Ok(deleted as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_core::run::RunState;

    /// The runs of a state not yet ended are read from the small partial index, so listing
    /// what runs now costs the same beside ten runs or ten million ended ones.
    #[test]
    fn unended_runs_are_listed_from_their_partial_index() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        for state in [RunState::Waiting, RunState::Queued, RunState::Running] {
            let query = RunQuery {
                namespace: "default".into(),
                state: Some(state),
                ..RunQuery::default()
            };
            let (sql, _) = runs_statement(&query, 50).unwrap();
            let plan = super::super::query_plan(&conn, &sql).join("; ");
            assert!(plan.contains("INDEX runs_unended"), "{state:?}: {plan}");
        }
    }
}

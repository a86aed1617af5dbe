//! Tracing reads (`TraceStore`) on SQLite: ended runs walked through `runs_finished`
//! (finished_at, where set) from a cursor, and the attempts of a few runs by their run. It
//! reads `runs` and `attempts` only and writes nothing.

use super::rows::{self, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use crate::traces::{self, EndedCursor};
use crate::Result;
use rusqlite::{params, Transaction};
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::Instant;

fn ended(
    tx: &Transaction<'_>,
    after: EndedCursor,
    until: Instant,
    limit: u32,
) -> Result<Vec<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs INDEXED BY runs_finished \
         WHERE finished_at >= ?1 AND finished_at < ?3 \
         AND (finished_at > ?1 OR id > ?2) \
         ORDER BY finished_at, id LIMIT ?4"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![
        micros(after.finished_at),
        after.run_id,
        micros(until),
        traces::page(limit)
    ])?;
    let mut runs = Vec::new();
    while let Some(row) = found.next()? {
        runs.push(rows::run(row)?);
    }
    Ok(runs)
}

fn attempts(tx: &Transaction<'_>, run_ids: &[i64]) -> Result<Vec<AttemptRecord>> {
    let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = ?1 ORDER BY number");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut all = Vec::new();
    for id in traces::bounded(run_ids) {
        let mut found = stmt.query(params![id])?;
        while let Some(row) = found.next()? {
            all.push(rows::attempt(row)?);
        }
    }
    Ok(all)
}

#[async_trait::async_trait]
impl crate::TraceStore for super::SqliteStore {
    async fn ended_runs(
        &self,
        after: EndedCursor,
        until: Instant,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        self.read(move |tx| ended(tx, after, until, limit)).await
    }

    async fn attempts_of(&self, run_ids: &[i64]) -> Result<Vec<AttemptRecord>> {
        let ids = run_ids.to_vec();
        self.read(move |tx| attempts(tx, &ids)).await
    }
}

//! Tracing reads (`TraceStore`) on SQLite: ended runs walked through `runs_finished`
//! (finished_at, where set) from a cursor, a few columns each, and a few runs whole with their
//! attempts. It reads `runs` and `attempts` only and writes nothing.

use super::rows::{self, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use crate::shared::{instant, opt_instant, run_state};
use crate::traces::{self, EndedCursor, EndedRun, ENDED_COLUMNS};
use crate::Result;
use rusqlite::{params, Transaction};
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::trace::EndFacts;
use sked_core::Instant;

/// What a run (`u`) hands the runs that join its trace as children of its root
/// (`sked_core::trace::Joined`): its trace's origin (the one it joined, or itself), then itself.
pub(super) const JOINED_UNDER: &str = "coalesce(substr(u.trace_parent, 1, \
     instr(u.trace_parent, '/') - 1), 'r:' || u.id) || '/r:' || u.id";

fn ended(
    tx: &Transaction<'_>,
    after: EndedCursor,
    until: Instant,
    limit: u32,
) -> Result<Vec<EndedRun>> {
    let sql = format!(
        "SELECT {ENDED_COLUMNS} FROM runs INDEXED BY runs_finished \
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
        runs.push(EndedRun {
            id: row.get(0)?,
            job_id: row.get(1)?,
            trace_parent: row.get(2)?,
            facts: EndFacts {
                state: run_state(&row.get::<_, String>(3)?)?,
                attempts: row.get(4)?,
                failures: row.get(5)?,
                scheduled_for: instant(row.get(6)?)?,
                started_at: opt_instant(row.get(7)?)?,
                finished_at: opt_instant(row.get(8)?)?,
                deadline_marked: row.get(9)?,
            },
        });
    }
    Ok(runs)
}

fn told(tx: &Transaction<'_>, run_ids: &[i64]) -> Result<Vec<(RunRecord, Vec<AttemptRecord>)>> {
    let ids = traces::bounded(run_ids);
    let run_sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
    let attempt_sql =
        format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = ?1 ORDER BY number");
    let (mut run_stmt, mut attempt_stmt) = (
        tx.prepare_cached(&run_sql)?,
        tx.prepare_cached(&attempt_sql)?,
    );
    let (mut runs, mut attempts) = (Vec::new(), Vec::new());
    for id in ids {
        let mut found = run_stmt.query(params![id])?;
        while let Some(row) = found.next()? {
            runs.push(rows::run(row)?);
        }
        let mut found = attempt_stmt.query(params![id])?;
        while let Some(row) = found.next()? {
            attempts.push(rows::attempt(row)?);
        }
    }
    Ok(traces::in_order(ids, runs, attempts))
}

#[async_trait::async_trait]
impl crate::TraceStore for super::SqliteStore {
    async fn ended_runs(
        &self,
        after: EndedCursor,
        until: Instant,
        limit: u32,
    ) -> Result<Vec<EndedRun>> {
        self.read(move |tx| ended(tx, after, until, limit)).await
    }

    async fn told_runs(&self, run_ids: &[i64]) -> Result<Vec<(RunRecord, Vec<AttemptRecord>)>> {
        let ids = run_ids.to_vec();
        self.read(move |tx| told(tx, &ids)).await
    }
}

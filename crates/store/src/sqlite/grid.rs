//! The runs grid (`GridStore`) on SQLite: one read transaction, in which one prepared
//! statement takes each job's newest runs in the window through `runs_by_job_name`
//! (namespace, job, scheduled_for DESC, id DESC), a bounded seek per job (a statement here is
//! a function call, not a round trip). It reads `runs` only and writes nothing.

use super::rows::micros;
use crate::grid::{self, GridQuery, GridRun};
use crate::shared::{instant, opt_instant, run_state};
use crate::Result;
use rusqlite::{params, Transaction};

const GRID: &str = "SELECT id, job, scheduled_for, state, started_at, finished_at \
     FROM runs INDEXED BY runs_by_job_name \
     WHERE namespace = ?1 AND job = ?2 AND scheduled_for >= ?3 AND scheduled_for < ?4 \
     ORDER BY scheduled_for DESC, id DESC LIMIT ?5";

fn read(tx: &Transaction<'_>, query: &GridQuery) -> Result<Vec<GridRun>> {
    let names = query.names();
    if names.is_empty() || query.from >= query.to {
        return Ok(Vec::new());
    }
    let (from, to, limit) = (micros(query.from), micros(query.to), query.limit());
    let mut stmt = tx.prepare_cached(GRID)?;
    let mut runs = Vec::new();
    for name in &names {
        let mut found = stmt.query(params![query.namespace, name, from, to, limit])?;
        while let Some(row) = found.next()? {
            runs.push(GridRun {
                id: row.get(0)?,
                job: row.get(1)?,
                scheduled_for: instant(row.get(2)?)?,
                state: run_state(&row.get::<_, String>(3)?)?,
                started_at: opt_instant(row.get(4)?)?,
                finished_at: opt_instant(row.get(5)?)?,
            });
        }
    }
    Ok(grid::in_order(&names, runs))
}

#[async_trait::async_trait]
impl crate::GridStore for super::SqliteStore {
    async fn grid_runs(&self, query: &GridQuery) -> Result<Vec<GridRun>> {
        let query = query.clone();
        self.read(move |tx| read(tx, &query)).await
    }
}

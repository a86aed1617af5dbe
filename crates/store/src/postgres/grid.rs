//! The runs grid (`GridStore`) on PostgreSQL: one statement, a lateral seek per job name on
//! `runs_by_job_name` (namespace, job, scheduled_for DESC, id DESC), each bounded by the window
//! (which also prunes the partitions of `runs` outside it) and the limit per job. It reads
//! `runs` only and writes nothing.

use super::rows::micros;
use super::{PgResult, PgStore, Tx, TRIES};
use crate::grid::{self, GridQuery, GridRun};
use crate::shared::{instant, opt_instant, run_state};
use crate::{Result, StoreError};
use tokio_postgres::IsolationLevel;

const GRID: &str = "SELECT r.id, r.job, r.scheduled_for, r.state, r.started_at, r.finished_at \
     FROM unnest($2::text[]) AS j(name) CROSS JOIN LATERAL ( \
         SELECT id, job, scheduled_for, state, started_at, finished_at FROM runs \
         WHERE namespace = $1 AND job = j.name \
         AND scheduled_for >= $3 AND scheduled_for < $4 \
         ORDER BY scheduled_for DESC, id DESC LIMIT $5) r";

async fn cells(tx: &Tx<'_>, query: &GridQuery) -> PgResult<Vec<GridRun>> {
    let names = query.names();
    if names.is_empty() || query.from >= query.to {
        return Ok(Vec::new());
    }
    let (from, to, limit) = (
        micros(query.from),
        micros(query.to),
        i64::from(query.limit()),
    );
    let stmt = tx.prepare_cached(GRID).await?;
    let rows = tx
        .query(&stmt, &[&query.namespace, &names, &from, &to, &limit])
        .await?;
    let mut runs = Vec::with_capacity(rows.len());
    for row in rows {
        runs.push(GridRun {
            id: row.try_get(0)?,
            job: row.try_get(1)?,
            scheduled_for: instant(row.try_get(2)?)?,
            state: run_state(row.try_get::<_, &str>(3)?)?,
            started_at: opt_instant(row.try_get(4)?)?,
            finished_at: opt_instant(row.try_get(5)?)?,
        });
    }
    Ok(grid::in_order(&names, runs))
}

#[async_trait::async_trait]
impl crate::GridStore for PgStore {
    async fn grid_runs(&self, query: &GridQuery) -> Result<Vec<GridRun>> {
        transact!(self, read, |tx| cells(&tx, query).await?)
    }
}

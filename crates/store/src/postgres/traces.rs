//! Tracing reads (`TraceStore`) on PostgreSQL, as `sqlite/traces.rs` keeps them: ended runs
//! walked through each partition's `runs_finished` from a cursor in one statement, and the
//! attempts of a few runs in one statement. It reads `runs` and `attempts` only.

use super::rows::{self, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use super::{PgResult, PgStore, Tx, TRIES};
use crate::traces::{self, EndedCursor};
use crate::{Result, StoreError};
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::Instant;
use tokio_postgres::IsolationLevel;

async fn ended(
    tx: &Tx<'_>,
    after: EndedCursor,
    until: Instant,
    limit: u32,
) -> PgResult<Vec<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs \
         WHERE finished_at >= $1 AND finished_at < $3 AND (finished_at, id) > ($1, $2) \
         ORDER BY finished_at, id LIMIT $4"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let limit = i64::from(traces::page(limit));
    tx.query(
        &stmt,
        &[
            &micros(after.finished_at),
            &after.run_id,
            &micros(until),
            &limit,
        ],
    )
    .await?
    .iter()
    .map(rows::run)
    .collect()
}

async fn attempts(tx: &Tx<'_>, run_ids: &[i64]) -> PgResult<Vec<AttemptRecord>> {
    let sql = format!(
        "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = ANY($1) ORDER BY run_id, number"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let ids = traces::bounded(run_ids).to_vec();
    tx.query(&stmt, &[&ids])
        .await?
        .iter()
        .map(rows::attempt)
        .collect()
}

#[async_trait::async_trait]
impl crate::TraceStore for PgStore {
    async fn ended_runs(
        &self,
        after: EndedCursor,
        until: Instant,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        transact!(self, read, |tx| ended(&tx, after, until, limit).await?)
    }

    async fn attempts_of(&self, run_ids: &[i64]) -> Result<Vec<AttemptRecord>> {
        transact!(self, read, |tx| attempts(&tx, run_ids).await?)
    }
}

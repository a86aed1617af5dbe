//! Tracing reads (`TraceStore`) on PostgreSQL, as `sqlite/traces.rs` keeps them: ended runs
//! walked through each partition's `runs_finished` from a cursor in one statement, a few
//! columns each, and a few runs whole with their attempts in two statements. It reads `runs`
//! and `attempts` only.

use super::rows::{self, count, micros, ATTEMPT_COLUMNS, RUN_COLUMNS};
use super::{PgResult, PgStore, Tx, TRIES};
use crate::shared::{instant, opt_instant, run_state};
use crate::traces::{self, EndedCursor, EndedRun, ENDED_COLUMNS};
use crate::{Result, StoreError};
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::trace::EndFacts;
use sked_core::Instant;
use tokio_postgres::IsolationLevel;

/// What a run (`u`) hands the runs that join its trace (`sqlite/traces.rs`).
pub(super) const JOINED_UNDER: &str =
    "coalesce(split_part(u.trace_parent, '/', 1), 'r:' || u.id) || '/r:' || u.id";

async fn ended(
    tx: &Tx<'_>,
    after: EndedCursor,
    until: Instant,
    limit: u32,
) -> PgResult<Vec<EndedRun>> {
    let sql = format!(
        "SELECT {ENDED_COLUMNS} FROM runs \
         WHERE finished_at >= $1 AND finished_at < $3 AND (finished_at, id) > ($1, $2) \
         ORDER BY finished_at, id LIMIT $4"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let limit = i64::from(traces::page(limit));
    let rows = tx
        .query(
            &stmt,
            &[
                &micros(after.finished_at),
                &after.run_id,
                &micros(until),
                &limit,
            ],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(EndedRun {
                id: row.try_get(0)?,
                job_id: row.try_get(1)?,
                trace_parent: row.try_get(2)?,
                facts: EndFacts {
                    state: run_state(row.try_get(3)?)?,
                    attempts: count("attempts", row.try_get::<_, i32>(4)?)?,
                    failures: count("failures", row.try_get::<_, i32>(5)?)?,
                    scheduled_for: instant(row.try_get(6)?)?,
                    started_at: opt_instant(row.try_get(7)?)?,
                    finished_at: opt_instant(row.try_get(8)?)?,
                    deadline_marked: row.try_get(9)?,
                },
            })
        })
        .collect()
}

async fn told(tx: &Tx<'_>, run_ids: &[i64]) -> PgResult<Vec<(RunRecord, Vec<AttemptRecord>)>> {
    let ids = traces::bounded(run_ids).to_vec();
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE id = ANY($1)"
        ))
        .await?;
    let runs = tx
        .query(&stmt, &[&ids])
        .await?
        .iter()
        .map(rows::run)
        .collect::<PgResult<Vec<_>>>()?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run_id = ANY($1)"
        ))
        .await?;
    let attempts = tx
        .query(&stmt, &[&ids])
        .await?
        .iter()
        .map(rows::attempt)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(traces::in_order(&ids, runs, attempts))
}

#[async_trait::async_trait]
impl crate::TraceStore for PgStore {
    async fn ended_runs(
        &self,
        after: EndedCursor,
        until: Instant,
        limit: u32,
    ) -> Result<Vec<EndedRun>> {
        transact!(self, read, |tx| ended(&tx, after, until, limit).await?)
    }

    async fn told_runs(&self, run_ids: &[i64]) -> Result<Vec<(RunRecord, Vec<AttemptRecord>)>> {
        transact!(self, read, |tx| told(&tx, run_ids).await?)
    }
}

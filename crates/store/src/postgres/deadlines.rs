//! Deadlines (`DeadlineStore`) on PostgreSQL, as `sqlite/deadlines.rs` keeps them: reads the
//! runs of the jobs flagged `has_deadline` and a job's durations, and writes only the three
//! deadline columns of `runs` (each run locked while its mark is merged) and the
//! notifications the marks raise.

use super::rows::{self, micros, JOB_COLUMNS, RUN_COLUMNS};
use super::{PgResult, PgStore, Tx, TRIES};
use crate::deadlines::{self, DeadlineJob, DeadlineMark, NewMarks, RUNS_PER_JOB};
use crate::shared::Ended;
use crate::{observe_write, Result, StoreError};
use sked_core::records::RunRecord;
use sked_core::Instant;
use std::collections::HashMap;
use std::time::Duration;
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;

async fn runs(tx: &Tx<'_>, sql: &str, params: &[&(dyn ToSql + Sync)]) -> PgResult<Vec<RunRecord>> {
    let stmt = tx.prepare_cached(sql).await?;
    tx.query(&stmt, params)
        .await?
        .iter()
        .map(rows::run)
        .collect()
}

async fn open(tx: &Tx<'_>, job_ids: &[i64]) -> PgResult<Vec<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r WHERE r.id IN ( \
             SELECT o.id FROM unnest($1::bigint[]) AS j(id) CROSS JOIN LATERAL ( \
                 SELECT id FROM runs WHERE job_id = j.id \
                 AND state IN ('waiting', 'queued', 'running') \
                 ORDER BY scheduled_for, id LIMIT $2) o) \
         ORDER BY r.job_id, r.scheduled_for, r.id"
    );
    runs(tx, &sql, &[&job_ids, &i64::from(RUNS_PER_JOB)]).await
}

async fn watched(tx: &Tx<'_>, ended_since: Instant) -> PgResult<Vec<DeadlineJob>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE has_deadline ORDER BY id");
    let stmt = tx.prepare_cached(&sql).await?;
    let jobs = tx
        .query(&stmt, &[])
        .await?
        .iter()
        .map(rows::job)
        .collect::<PgResult<Vec<_>>>()?;
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    let mut by_job: HashMap<i64, Vec<RunRecord>> = HashMap::new();
    for run in open(tx, &ids).await? {
        by_job.entry(run.job_id).or_default().push(run);
    }
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE finished_at >= $1 AND state <> 'skipped' \
         AND job_id = ANY($2) ORDER BY finished_at, id LIMIT $3"
    );
    let cap = i64::from(RUNS_PER_JOB) * ids.len() as i64;
    let mut ended: HashMap<i64, usize> = HashMap::new();
    for run in runs(tx, &sql, &[&micros(ended_since), &ids, &cap]).await? {
        let count = ended.entry(run.job_id).or_default();
        if *count < RUNS_PER_JOB as usize {
            *count += 1;
            by_job.entry(run.job_id).or_default().push(run);
        }
    }
    Ok(jobs
        .into_iter()
        .map(|job| {
            let runs = by_job.remove(&job.id).unwrap_or_default();
            DeadlineJob { job, runs }
        })
        .collect())
}

async fn durations(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    limit: u32,
) -> PgResult<Vec<Duration>> {
    let stmt = tx
        .prepare_cached(
            "SELECT started_at, finished_at FROM runs WHERE namespace = $1 AND job = $2 \
             AND state = 'succeeded' ORDER BY scheduled_for DESC, id DESC LIMIT $3",
        )
        .await?;
    let rows = tx
        .query(&stmt, &[&namespace, &name, &i64::from(limit)])
        .await?;
    let mut found = Vec::with_capacity(rows.len());
    for row in rows {
        if let Some(took) = deadlines::took(row.try_get(0)?, row.try_get(1)?) {
            found.push(took);
        }
    }
    Ok(found)
}

async fn mark(tx: &Tx<'_>, marks: &[DeadlineMark], now: Instant) -> PgResult<Vec<NewMarks>> {
    let mut marks: Vec<&DeadlineMark> = marks.iter().collect();
    // Runs are locked in one order, as everywhere else.
    marks.sort_by_key(|m| m.run_id);
    let read = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 FOR UPDATE");
    let update = tx
        .prepare_cached(
            "UPDATE runs SET deadline = coalesce($2, deadline), \
             deadline_missed = coalesce($3, deadline_missed), at_risk = coalesce($4, at_risk) \
             WHERE id = $1",
        )
        .await?;
    let mut added = Vec::new();
    for mark in marks {
        let Some(run) = runs(tx, &read, &[&mark.run_id]).await?.pop() else {
            continue;
        };
        let merged = deadlines::merge(&run, mark);
        if merged.changes_nothing() {
            continue;
        }
        let [deadline, missed, at_risk] = deadlines::columns(&merged)?;
        tx.execute(&update, &[&mark.run_id, &deadline, &missed, &at_risk])
            .await?;
        if merged.new.is_empty() {
            continue;
        }
        let ended = [Ended {
            namespace: run.namespace.clone(),
            job: run.job.clone(),
            scheduled_for: run.scheduled_for,
            run_id: run.id,
            state: run.state,
        }];
        let rules = super::notifications::rules_of(tx, &ended)
            .await?
            .remove(&(run.namespace.clone(), run.job.clone()))
            .unwrap_or_default();
        for new in deadlines::raised(&rules, &merged.new, now)? {
            super::notifications::insert(tx, &merged.new.run, &new, now).await?;
        }
        added.push(merged.new);
    }
    Ok(added)
}

#[async_trait::async_trait]
impl crate::DeadlineStore for PgStore {
    async fn deadline_runs(&self, ended_since: Instant) -> Result<Vec<DeadlineJob>> {
        transact!(self, read, |tx| watched(&tx, ended_since).await?)
    }

    async fn open_runs(&self, job_ids: &[i64]) -> Result<Vec<RunRecord>> {
        transact!(self, read, |tx| open(&tx, job_ids).await?)
    }

    async fn run_durations(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
    ) -> Result<Vec<Duration>> {
        transact!(self, read, |tx| durations(&tx, namespace, name, limit)
            .await?)
    }

    async fn mark_deadlines(&self, marks: &[DeadlineMark], now: Instant) -> Result<Vec<NewMarks>> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        transact!(self, write, |tx| mark(&tx, marks, now).await?)
    }
}

//! Deadlines (`DeadlineStore`) on SQLite: reads the runs of the jobs flagged `has_deadline`
//! (through `jobs_with_deadline`, `runs_active` and `runs_finished`) and a job's durations,
//! and writes only the three deadline columns of `runs` and the notifications their marks
//! raise (`notifications::insert`, whose key tells each once).

use super::rows::{self, micros, JOB_COLUMNS, RUN_COLUMNS};
use crate::deadlines::{self, DeadlineJob, DeadlineMark, NewMarks, RUNS_PER_JOB};
use crate::Result;
use rusqlite::{params, Transaction};
use sked_core::records::RunRecord;
use sked_core::Instant;
use std::collections::HashMap;
use std::time::Duration;

fn runs(tx: &Transaction<'_>, sql: &str, params: impl rusqlite::Params) -> Result<Vec<RunRecord>> {
    let mut stmt = tx.prepare_cached(sql)?;
    let mut found = stmt.query(params)?;
    let mut runs = Vec::new();
    while let Some(row) = found.next()? {
        runs.push(rows::run(row)?);
    }
    Ok(runs)
}

fn open(tx: &Transaction<'_>, job_id: i64) -> Result<Vec<RunRecord>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE job_id = ?1 \
         AND state IN ('waiting', 'queued', 'running') ORDER BY scheduled_for, id LIMIT ?2"
    );
    runs(tx, &sql, params![job_id, RUNS_PER_JOB])
}

fn watched(tx: &Transaction<'_>, ended_since: Instant) -> Result<Vec<DeadlineJob>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE has_deadline = 1 ORDER BY id");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query([])?;
    let mut jobs = Vec::new();
    while let Some(row) = found.next()? {
        jobs.push(rows::job(row)?);
    }
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE finished_at >= ?1 AND state != 'skipped' \
         AND job_id IN (SELECT id FROM jobs WHERE has_deadline = 1) \
         ORDER BY finished_at, id LIMIT ?2"
    );
    let cap = RUNS_PER_JOB.saturating_mul(u32::try_from(jobs.len()).unwrap_or(u32::MAX));
    let mut ended: HashMap<i64, Vec<RunRecord>> = HashMap::new();
    for run in runs(tx, &sql, params![micros(ended_since), cap])? {
        ended.entry(run.job_id).or_default().push(run);
    }
    jobs.into_iter()
        .map(|job| {
            let mut runs = open(tx, job.id)?;
            let mut done = ended.remove(&job.id).unwrap_or_default();
            done.truncate(RUNS_PER_JOB as usize);
            runs.extend(done);
            Ok(DeadlineJob { job, runs })
        })
        .collect()
}

fn durations(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    limit: u32,
) -> Result<Vec<Duration>> {
    let mut stmt = tx.prepare_cached(
        "SELECT started_at, finished_at FROM runs WHERE namespace = ?1 AND job = ?2 \
         AND state = 'succeeded' ORDER BY scheduled_for DESC, id DESC LIMIT ?3",
    )?;
    let found = stmt
        .query_map(params![namespace, name, limit], |r| {
            Ok(deadlines::took(r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(found.into_iter().flatten().collect())
}

fn mark(tx: &Transaction<'_>, marks: &[DeadlineMark], now: Instant) -> Result<Vec<NewMarks>> {
    let read = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
    let mut added = Vec::new();
    for mark in marks {
        let Some(run) = runs(tx, &read, params![mark.run_id])?.pop() else {
            continue;
        };
        let merged = deadlines::merge(&run, mark);
        if merged.changes_nothing() {
            continue;
        }
        let [deadline, missed, at_risk] = deadlines::columns(&merged)?;
        tx.prepare_cached(
            "UPDATE runs SET deadline = coalesce(?2, deadline), \
             deadline_missed = coalesce(?3, deadline_missed), at_risk = coalesce(?4, at_risk) \
             WHERE id = ?1",
        )?
        .execute(params![mark.run_id, deadline, missed, at_risk])?;
        if merged.new.is_empty() {
            continue;
        }
        let rules = super::notifications::rules_of(tx, &run.namespace, &run.job)?;
        for new in deadlines::raised(&rules, &merged.new, now)? {
            super::notifications::insert(tx, &merged.new.run, &new, now)?;
        }
        added.push(merged.new);
    }
    Ok(added)
}

#[async_trait::async_trait]
impl crate::DeadlineStore for super::SqliteStore {
    async fn deadline_runs(&self, ended_since: Instant) -> Result<Vec<DeadlineJob>> {
        self.read(move |tx| watched(tx, ended_since)).await
    }

    async fn open_runs(&self, job_ids: &[i64]) -> Result<Vec<RunRecord>> {
        let ids = job_ids.to_vec();
        self.read(move |tx| {
            let mut all = Vec::new();
            for id in ids {
                all.extend(open(tx, id)?);
            }
            Ok(all)
        })
        .await
    }

    async fn run_durations(
        &self,
        namespace: &str,
        name: &str,
        limit: u32,
    ) -> Result<Vec<Duration>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| durations(tx, &namespace, &name, limit))
            .await
    }

    async fn mark_deadlines(&self, marks: &[DeadlineMark], now: Instant) -> Result<Vec<NewMarks>> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        let marks = marks.to_vec();
        self.write(move |tx| mark(tx, &marks, now)).await
    }
}

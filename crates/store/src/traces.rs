//! The tracing capability of a store: the runs that ended in a window of time, in the order
//! they ended, a page at a time, each as the few facts sampling judges it by, and a few runs
//! whole with their attempts, so the server's trace exporter reads whole only the runs it
//! tells as spans (`sked_core::trace`). The store only reads: it changes nothing, and what a
//! run's spans are is core's.

use crate::Result;
use async_trait::async_trait;
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::trace::EndFacts;
use sked_core::Instant;

/// Runs one page of [`TraceStore::ended_runs`] holds at most.
pub const MAX_ENDED_PAGE: u32 = 5_000;

/// Runs one call of [`TraceStore::told_runs`] reads at most; ids past it are left out.
pub const MAX_ATTEMPT_RUNS: usize = 1_000;

/// Where a walk of ended runs is: the end of the last run read, and its id (runs that ended
/// at one instant are read in id order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndedCursor {
    pub finished_at: Instant,
    pub run_id: i64,
}

/// An ended run as the walk sees it: enough to name its trace and judge it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedRun {
    pub id: i64,
    pub job_id: i64,
    /// The trace it joined (`RunRecord::trace_parent`).
    pub trace_parent: Option<String>,
    pub facts: EndFacts,
}

impl EndedRun {
    /// Where a walk that read this run goes on from.
    pub fn cursor(&self) -> Option<EndedCursor> {
        self.facts.finished_at.map(|finished_at| EndedCursor {
            finished_at,
            run_id: self.id,
        })
    }
}

#[async_trait]
pub trait TraceStore: Send + Sync {
    /// The runs that ended after `after` and before `until` (excluded), in the order of
    /// `(finished_at, id)`, at most `limit` (within `1..=MAX_ENDED_PAGE`).
    async fn ended_runs(
        &self,
        after: EndedCursor,
        until: Instant,
        limit: u32,
    ) -> Result<Vec<EndedRun>>;

    /// These runs whole (the first [`MAX_ATTEMPT_RUNS`] ids; a run gone meanwhile is left
    /// out), each with its attempts by number.
    async fn told_runs(&self, run_ids: &[i64]) -> Result<Vec<(RunRecord, Vec<AttemptRecord>)>>;
}

/// The columns of [`EndedRun`], in the order both stores read them.
pub(crate) const ENDED_COLUMNS: &str = "id, job_id, trace_parent, state, attempts, failures, \
     scheduled_for, started_at, finished_at, \
     (deadline_missed IS NOT NULL OR at_risk IS NOT NULL)";

/// Runs with their attempts, in the order of `order`, from rows read in any order.
pub(crate) fn in_order(
    order: &[i64],
    runs: Vec<RunRecord>,
    attempts: Vec<AttemptRecord>,
) -> Vec<(RunRecord, Vec<AttemptRecord>)> {
    let mut by_run: std::collections::HashMap<i64, Vec<AttemptRecord>> =
        std::collections::HashMap::new();
    for attempt in attempts {
        by_run.entry(attempt.run_id).or_default().push(attempt);
    }
    let mut runs: std::collections::HashMap<i64, RunRecord> =
        runs.into_iter().map(|r| (r.id, r)).collect();
    order
        .iter()
        .filter_map(|id| {
            let run = runs.remove(id)?;
            let mut attempts = by_run.remove(id).unwrap_or_default();
            attempts.sort_by_key(|a| a.number);
            Some((run, attempts))
        })
        .collect()
}

/// A page size within bounds.
pub(crate) fn page(limit: u32) -> u32 {
    limit.clamp(1, MAX_ENDED_PAGE)
}

/// The ids a store reads: the first [`MAX_ATTEMPT_RUNS`].
pub(crate) fn bounded(run_ids: &[i64]) -> &[i64] {
    &run_ids[..run_ids.len().min(MAX_ATTEMPT_RUNS)]
}

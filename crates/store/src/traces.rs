//! The tracing capability of a store: the runs that ended in a window of time, in the order
//! they ended, a page at a time, and the attempts of a few runs, so the server's trace
//! exporter can tell each ended run as spans (`sked_core::trace`). The store only reads: it
//! changes nothing, and what a run's spans are is core's.

use crate::Result;
use async_trait::async_trait;
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::Instant;

/// Runs one page of [`TraceStore::ended_runs`] holds at most.
pub const MAX_ENDED_PAGE: u32 = 5_000;

/// Runs whose attempts one call of [`TraceStore::attempts_of`] reads at most; ids past it are
/// left out.
pub const MAX_ATTEMPT_RUNS: usize = 1_000;

/// Where a walk of ended runs is: the end of the last run read, and its id (runs that ended
/// at one instant are read in id order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndedCursor {
    pub finished_at: Instant,
    pub run_id: i64,
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
    ) -> Result<Vec<RunRecord>>;

    /// The attempts of these runs (the first [`MAX_ATTEMPT_RUNS`]), by run and number.
    async fn attempts_of(&self, run_ids: &[i64]) -> Result<Vec<AttemptRecord>>;
}

/// A page size within bounds.
pub(crate) fn page(limit: u32) -> u32 {
    limit.clamp(1, MAX_ENDED_PAGE)
}

/// The ids a store reads: the first [`MAX_ATTEMPT_RUNS`].
pub(crate) fn bounded(run_ids: &[i64]) -> &[i64] {
    &run_ids[..run_ids.len().min(MAX_ATTEMPT_RUNS)]
}

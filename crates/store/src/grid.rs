//! The runs-grid capability of a store: for a few named jobs of one namespace, their runs whose
//! instants fall in a window, newest first, a bounded number per job, read in one statement
//! on the `(namespace, job, scheduled_for)` index. Which jobs make the rows (filters, paging)
//! is the job list's; how instants become columns is the console's. The store only reads: it
//! changes nothing and touches no other capability's tables.

use crate::Result;
use async_trait::async_trait;
use sked_core::run::RunState;
use sked_core::Instant;

/// Jobs one call reads, at most: names past it are left out.
pub const MAX_GRID_JOBS: usize = 500;

/// Runs one call reads per job, at most.
pub const MAX_GRID_RUNS_PER_JOB: u32 = 100;

/// What one grid read asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct GridQuery {
    pub namespace: String,
    /// The jobs' names, at most [`MAX_GRID_JOBS`] (those past it are not read).
    pub jobs: Vec<String>,
    /// The window of instants: `from` included, `to` excluded.
    pub from: Instant,
    pub to: Instant,
    /// Runs per job, the newest instants first; at most [`MAX_GRID_RUNS_PER_JOB`].
    pub per_job: u32,
}

impl GridQuery {
    /// The names a store reads: the first [`MAX_GRID_JOBS`], each once.
    pub fn names(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.jobs
            .iter()
            .take(MAX_GRID_JOBS)
            .filter(|name| seen.insert(name.as_str()))
            .cloned()
            .collect()
    }

    /// Runs per job a store reads: `per_job` within `1..=MAX_GRID_RUNS_PER_JOB`.
    pub fn limit(&self) -> u32 {
        self.per_job.clamp(1, MAX_GRID_RUNS_PER_JOB)
    }
}

/// One cell of the grid: a run, as much of it as a cell shows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GridRun {
    pub id: i64,
    pub job: String,
    pub scheduled_for: Instant,
    pub state: RunState,
    pub started_at: Option<Instant>,
    pub finished_at: Option<Instant>,
}

#[async_trait]
pub trait GridStore: Send + Sync {
    /// The runs of `query.jobs` in `query.namespace` whose instant is in
    /// `[query.from, query.to)`: for each job its newest [`GridQuery::limit`] by instant
    /// (then id), grouped by job in the order the names were given, newest first within a
    /// job. A name with no job (or no runs in the window) reads nothing; runs of a deleted job
    /// of that name are included, as the run list includes them.
    async fn grid_runs(&self, query: &GridQuery) -> Result<Vec<GridRun>>;
}

/// Puts runs read for several jobs in the order of the names asked for, each job's newest
/// first. Shared by both stores.
pub(crate) fn in_order(names: &[String], mut runs: Vec<GridRun>) -> Vec<GridRun> {
    let rank: std::collections::HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    runs.sort_by(|a, b| {
        let ra = rank.get(a.job.as_str()).copied().unwrap_or(usize::MAX);
        let rb = rank.get(b.job.as_str()).copied().unwrap_or(usize::MAX);
        ra.cmp(&rb)
            .then(b.scheduled_for.cmp(&a.scheduled_for))
            .then(b.id.cmp(&a.id))
    });
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn query(jobs: &[&str], per_job: u32) -> GridQuery {
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        GridQuery {
            namespace: "default".into(),
            jobs: jobs.iter().map(|s| s.to_string()).collect(),
            from: t,
            to: t,
            per_job,
        }
    }

    #[test]
    fn names_are_bounded_and_each_read_once() {
        assert_eq!(query(&["b", "a", "b"], 1).names(), ["b", "a"]);
        let many: Vec<String> = (0..MAX_GRID_JOBS + 5).map(|i| format!("j{i}")).collect();
        let q = GridQuery {
            jobs: many,
            ..query(&[], 1)
        };
        assert_eq!(q.names().len(), MAX_GRID_JOBS);
    }

    #[test]
    fn runs_per_job_stay_within_bounds() {
        assert_eq!(query(&[], 0).limit(), 1);
        assert_eq!(query(&[], 7).limit(), 7);
        assert_eq!(query(&[], 10_000).limit(), MAX_GRID_RUNS_PER_JOB);
    }

    #[test]
    fn runs_come_in_the_order_of_the_names_newest_first() {
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let run = |id, job: &str, secs| GridRun {
            id,
            job: job.into(),
            scheduled_for: t + chrono::Duration::seconds(secs),
            state: RunState::Succeeded,
            started_at: None,
            finished_at: None,
        };
        let names = vec!["z".to_string(), "a".to_string()];
        let sorted = in_order(&names, vec![run(1, "a", 1), run(2, "z", 1), run(3, "z", 2)]);
        let ids: Vec<i64> = sorted.iter().map(|r| r.id).collect();
        assert_eq!(ids, [3, 2, 1]);
    }
}

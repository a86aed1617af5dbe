//! The deadlines capability of a store: the runs the server's deadline watcher judges (of the
//! jobs with a `deadline`), the history its estimates read, and recording what it found —
//! each run's deadlines, the ones it missed, its being at risk, and the notifications those
//! raise — in one transaction per batch. What a deadline makes of an instant, whether a run
//! missed one and when it is at risk are `sked_core::deadline`'s; the store keeps the marks
//! and makes sure each is recorded, and told, once.

use crate::Result;
use async_trait::async_trait;
use sked_core::deadline::{AtRisk, DeadlineKind, Miss, RunDeadline};
use sked_core::records::{JobRecord, RunRecord};
use sked_core::Instant;
use std::time::Duration;

/// A job with a `deadline`, and those of its runs the watcher judges.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadlineJob {
    pub job: JobRecord,
    pub runs: Vec<RunRecord>,
}

/// What the watcher found of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadlineMark {
    pub run_id: i64,
    /// Kept when the run has none yet; a run's deadlines, once recorded, do not move.
    pub deadline: RunDeadline,
    /// Merged with those recorded (`sked_core::deadline::merge_misses`).
    pub missed: Vec<Miss>,
    /// Kept when the run was not at risk yet.
    pub at_risk: Option<AtRisk>,
}

/// What a mark added to a run: the deadlines it missed that were not recorded before, and
/// whether it became at risk. Each is told (`deadline_missed`, `at_risk`) under its job's
/// `notify` rules in the same transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMarks {
    pub run: RunRecord,
    pub missed: Vec<DeadlineKind>,
    pub at_risk: bool,
}

impl NewMarks {
    pub fn is_empty(&self) -> bool {
        self.missed.is_empty() && !self.at_risk
    }
}

/// Runs read per job in one pass of the watcher; more wait for the next.
pub const RUNS_PER_JOB: u32 = 200;

#[async_trait]
pub trait DeadlineStore: Send + Sync {
    /// The jobs with a `deadline`, each with its runs not ended (the oldest first) and those
    /// that ended at or after `ended_since` (skipped runs left out: they never ran), at most
    /// [`RUNS_PER_JOB`] of each.
    async fn deadline_runs(&self, ended_since: Instant) -> Result<Vec<DeadlineJob>>;

    /// The runs of these jobs that have not ended, the oldest first, at most
    /// [`RUNS_PER_JOB`] a job: the upstream steps of a waiting run.
    async fn open_runs(&self, job_ids: &[i64]) -> Result<Vec<RunRecord>>;

    /// How long the latest `limit` runs of job `name` that succeeded took, from their start to
    /// their end, newest first.
    async fn run_durations(&self, namespace: &str, name: &str, limit: u32)
        -> Result<Vec<Duration>>;

    /// Records `marks` in one transaction and answers, for each run a mark added something
    /// to, what it added. A mark for a run that no longer exists is passed over.
    async fn mark_deadlines(&self, marks: &[DeadlineMark], now: Instant) -> Result<Vec<NewMarks>>;
}

/// A mark merged with what `run` has recorded: the columns to write (`None`: unchanged), and
/// what is new. Shared by both stores.
pub(crate) struct Merged {
    pub deadline: Option<RunDeadline>,
    pub missed: Option<Vec<Miss>>,
    pub at_risk: Option<AtRisk>,
    pub new: NewMarks,
}

pub(crate) fn merge(run: &RunRecord, mark: &DeadlineMark) -> Merged {
    let deadline = run.deadline.is_none().then_some(mark.deadline);
    let merged = sked_core::deadline::merge_misses(&run.deadline_missed, &mark.missed);
    let new_kinds: Vec<DeadlineKind> = merged
        .iter()
        .map(|m| m.kind)
        .filter(|k| !run.deadline_missed.iter().any(|m| m.kind == *k))
        .collect();
    let missed = (merged != run.deadline_missed).then_some(merged);
    let at_risk = mark.at_risk.filter(|_| run.at_risk.is_none());
    let mut after = run.clone();
    if let Some(d) = deadline {
        after.deadline = Some(d);
    }
    if let Some(m) = &missed {
        after.deadline_missed = m.clone();
    }
    if at_risk.is_some() {
        after.at_risk = at_risk;
    }
    Merged {
        deadline,
        missed,
        at_risk,
        new: NewMarks {
            run: after,
            missed: new_kinds,
            at_risk: at_risk.is_some(),
        },
    }
}

impl Merged {
    pub fn changes_nothing(&self) -> bool {
        self.deadline.is_none() && self.missed.is_none() && self.at_risk.is_none()
    }
}

/// The notifications what a mark added raises, under the run's job's rules: one
/// `deadline_missed` (for the first deadline it missed) and one `at_risk` per rule that names
/// them; the store's key keeps either from being told twice.
pub(crate) fn raised(
    rules: &[sked_core::notify::NotifyRule],
    new: &NewMarks,
    now: Instant,
) -> Result<Vec<crate::shared::NewNotification>> {
    use sked_core::notify::{DeadlineNotice, NotifyEvent};
    let run = &new.run;
    let deadline = run.deadline.unwrap_or_default();
    let mut notices = Vec::new();
    if let Some(kind) = new.missed.first() {
        let at = match kind {
            DeadlineKind::StartBy => deadline.start_by,
            DeadlineKind::FinishBy => deadline.finish_by,
            DeadlineKind::MaxDuration => deadline
                .max_duration
                .zip(run.started_at)
                .and_then(|(max, started)| started.checked_add_signed(max.as_chrono())),
        };
        let by = run.deadline_missed.iter().find(|m| m.kind == *kind);
        if let Some(at) = at {
            let notice = DeadlineNotice {
                kind: *kind,
                deadline: at,
                by_ms: by.map(|m| m.by_ms),
                estimated_finish: None,
            };
            notices.push((NotifyEvent::DeadlineMissed, notice));
        }
    }
    if let (true, Some(risk), Some(finish_by)) = (new.at_risk, run.at_risk, deadline.finish_by) {
        let notice = DeadlineNotice {
            kind: DeadlineKind::FinishBy,
            deadline: finish_by,
            by_ms: None,
            estimated_finish: risk.estimated_finish,
        };
        notices.push((NotifyEvent::AtRisk, notice));
    }
    let mut raised = Vec::new();
    for (event, notice) in notices {
        for (i, rule) in rules.iter().enumerate() {
            if rule.on.contains(&event) {
                raised.push(crate::shared::notification_about(
                    rules,
                    i,
                    event,
                    run,
                    Some(notice),
                    now,
                )?);
            }
        }
    }
    Ok(raised)
}

/// The JSON a run's deadline column keeps.
pub(crate) fn columns(merged: &Merged) -> Result<[Option<String>; 3]> {
    use crate::shared::to_json;
    Ok([
        merged
            .deadline
            .as_ref()
            .map(|d| to_json("a run's deadline", d))
            .transpose()?,
        merged
            .missed
            .as_ref()
            .map(|m| to_json("a run's missed deadlines", m))
            .transpose()?,
        merged
            .at_risk
            .as_ref()
            .map(|r| to_json("a run's risk", r))
            .transpose()?,
    ])
}

/// A run's duration from its start to its end, none unless it has both.
pub(crate) fn took(started: Option<i64>, finished: Option<i64>) -> Option<Duration> {
    let (started, finished) = (started?, finished?);
    u64::try_from(finished - started)
        .ok()
        .map(Duration::from_micros)
}

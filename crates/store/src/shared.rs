//! What every store decides or decodes the same way, whatever its SQL: the fencing verdict on a
//! worker's report, what a heartbeat renews, stops and forgets, the reason shown on a run that did not succeed, a job's firing state after
//! a put, job statistics from the ledger's figures, and stored values (instants, state names,
//! the JSON of definitions, grants and audit entries) written and read back into sked's types.
//!
//! Plain functions over plain values: no SQL, no IO. A rule written here holds for SQLite and
//! PostgreSQL alike.

use crate::{AttemptReport, CompletionEffect, StoreError};
use sked_core::auth::{LabelRule, Role};
use sked_core::dependency::{Awaited, UpstreamRuns};
use sked_core::job::{firing_state_after_put, FiringState, JobSpec, JobState, ValidJob};
use sked_core::policy::{MisfirePolicy, OverlapPolicy, RetryPolicy};
use sked_core::records::{JobRecord, JobStats, RunRecord, ScheduledJob};
use sked_core::run::{
    after_attempt, AfterAttempt, AttemptOutcome, AttemptState, RunState, SkipReason, WaitReason,
};
use sked_core::schedule::ScheduleSpec;
use sked_core::stats::percentiles;
use sked_core::Instant;
use std::collections::BTreeMap;

/// The condition of the `runs_unended` partial index, written word for word into a listing of
/// runs by a state not yet ended: SQLite uses a partial index only when the query's condition
/// holds the index's own, and a generic PostgreSQL plan cannot prove it from a parameter.
pub const UNENDED_RUNS: &str = "state IN ('waiting', 'queued', 'running')";

/// How many definitions of a job are kept: the newest, back to this many versions.
pub const KEPT_VERSIONS: u32 = 100;

/// The attempt a worker's report is about, as the store found it, with what deciding the run's
/// fate needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedAttempt {
    pub run_id: i64,
    pub job_id: i64,
    pub token: i64,
    pub worker_id: String,
    pub attempt_state: String,
    pub run_state: String,
    pub failures: u32,
    pub cancel_requested: bool,
    pub namespace: String,
    pub started_at: Instant,
}

/// Admits a report, or says why it is refused: the attempt is unknown, it is another worker's
/// (`another_worker`), it no longer holds its run's lease (`fenced`: another token, lost with
/// its worker, or the run moved on), or it was reported already.
pub fn admit_report(
    found: Option<ReportedAttempt>,
    report: &AttemptReport,
) -> Result<ReportedAttempt, CompletionEffect> {
    let refuse = |reason: &str| {
        Err(CompletionEffect::Rejected {
            reason: reason.to_string(),
        })
    };
    let Some(attempt) = found else {
        return refuse("unknown_attempt");
    };
    if attempt.worker_id != report.worker_id {
        return refuse("another_worker");
    }
    if attempt.token != report.token || attempt.attempt_state == AttemptState::Lost.as_str() {
        return refuse("fenced");
    }
    // Before the run's state: a report sent again (its first answer was lost with a server
    // node) finds its own result recorded and the run ended by it, and is told just that.
    if attempt.attempt_state != AttemptState::Running.as_str() {
        return refuse("already_reported");
    }
    if attempt.run_state != RunState::Running.as_str() {
        return refuse("fenced");
    }
    Ok(attempt)
}

/// What recording an attempt's end needs of the attempt's job, read with the attempt (no
/// statement of its own, and no lock).
#[derive(Debug, Clone, Default)]
pub struct CompletingJob {
    /// Its overlap policy; `None` once the job is deleted.
    pub overlap: Option<OverlapPolicy>,
    /// The event key its succeeded runs emit.
    pub emits: Option<String>,
    /// Its name, when it asked for metrics by name.
    pub job_label: Option<String>,
}

impl CompletingJob {
    pub fn new(
        overlap: Option<&str>,
        emits: Option<String>,
        job_label: Option<String>,
    ) -> Result<Self, StoreError> {
        let overlap = overlap
            .map(|text| {
                OverlapPolicy::parse(text)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown overlap policy {text:?}")))
            })
            .transpose()?;
        Ok(Self {
            overlap,
            emits,
            job_label,
        })
    }

    /// Whether the end of one of its runs may release runs held back by overlap. `allow` holds
    /// none back, so its completions release nothing (and, on PostgreSQL, lock nothing of the
    /// job); runs left waiting from an earlier policy are released by the reaper's pass.
    pub fn holds_back(&self) -> bool {
        self.overlap
            .is_some_and(|policy| policy != OverlapPolicy::Allow)
    }
}

/// How a dependant's run begins at an upstream run's instant, the same in every store.
pub struct DependantStart {
    pub state: RunState,
    /// Why it is skipped: its job is paused, or the instant was skipped for it (`at.skip`).
    pub skip: Option<SkipReason>,
    /// Why it waits, when it does: for its dependencies.
    pub waiting_reason: Option<&'static str>,
}

/// A paused dependant's run is skipped (`paused`), as is one whose instant was skipped
/// (`skip`); any other waits for its dependencies.
pub fn dependant_start(paused: bool, skip: Option<SkipReason>) -> DependantStart {
    let skip = if paused {
        Some(SkipReason::Paused)
    } else {
        skip
    };
    match skip {
        Some(reason) => DependantStart {
            state: RunState::Skipped,
            skip: Some(reason),
            waiting_reason: None,
        },
        None => DependantStart {
            state: RunState::Waiting,
            skip: None,
            waiting_reason: Some("dependencies"),
        },
    }
}

/// Whether deciding what follows an attempt with this outcome reads the job's retry policy:
/// only a failure, which counts against the retry budget, does; a success reads none.
pub fn counts_against_retries(outcome: AttemptOutcome) -> bool {
    matches!(outcome, AttemptOutcome::Failed | AttemptOutcome::TimedOut)
}

/// What follows an admitted report (`sked_core::run::after_attempt`): the run's failures with
/// this one counted, and whether it is retried or ends. `retry` gives the job's retry policy
/// and is called only for a failure, so a success reads none.
pub fn after_report<E>(
    attempt: &ReportedAttempt,
    report: &AttemptReport,
    now: Instant,
    retry: impl FnOnce() -> Result<RetryPolicy, E>,
) -> Result<(u32, AfterAttempt), E> {
    let counts = counts_against_retries(report.outcome);
    let failures = attempt.failures + u32::from(counts);
    let policy = if counts {
        retry()?
    } else {
        RetryPolicy::default()
    };
    let decision = after_attempt(
        report.outcome,
        failures,
        &policy,
        attempt.cancel_requested,
        now,
        rand::random::<f64>(),
    );
    Ok((failures, decision))
}

/// A job's stored retry policy (its `retry` column).
pub fn retry_policy(text: &str) -> Result<RetryPolicy, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("a stored retry policy does not parse: {e}")))
}

/// The firing state a job's definition moves to when it is stored over `existing`.
pub fn firing_after_put(
    existing: Option<&JobRecord>,
    job: &ValidJob,
    now: Instant,
) -> Result<FiringState, StoreError> {
    let previous = existing.map(|old| {
        let state = FiringState {
            state: old.state,
            next_fire_at: old.next_fire_at,
            fired_count: old.fired_count,
            schedule_epoch: old.schedule_epoch,
        };
        (&old.spec, state)
    });
    firing_state_after_put(previous.as_ref().map(|(s, f)| (*s, f)), job, now)
        .map_err(|e| StoreError::Corrupt(format!("a validated schedule does not compile: {e}")))
}

/// The reason shown on a run for an attempt that did not succeed.
pub fn report_error(report: &AttemptReport) -> Option<String> {
    if report.outcome == AttemptOutcome::Succeeded {
        return None;
    }
    if let Some(error) = &report.error {
        return Some(error.clone());
    }
    if let Some(code) = report.exit_code {
        return Some(format!("exited with code {code}"));
    }
    if let Some(status) = report.http_status {
        return Some(format!("answered with HTTP status {status}"));
    }
    match report.outcome {
        AttemptOutcome::TimedOut => Some("timed out".to_string()),
        AttemptOutcome::Cancelled => Some("cancelled".to_string()),
        _ => None,
    }
}

/// A job's statistics from its runs counted by state, its attempt counts, its newest run, and
/// the firing and start lateness (milliseconds) of its recent scheduled runs.
pub fn job_stats(
    by_state: BTreeMap<String, u64>,
    skipped_by_reason: BTreeMap<String, u64>,
    attempts: AttemptCounts,
    last_run: Option<RunRecord>,
    mut fired: Vec<f64>,
    mut started: Vec<f64>,
) -> JobStats {
    let count = |state: RunState| by_state.get(state.as_str()).copied().unwrap_or(0);
    JobStats {
        runs: by_state.values().sum(),
        succeeded: count(RunState::Succeeded),
        failed: count(RunState::Failed) + count(RunState::TimedOut),
        retries: attempts.retries,
        lost: attempts.lost,
        last_run,
        lateness_ms: percentiles(&mut fired),
        start_lateness_ms: percentiles(&mut started),
        by_state,
        skipped_by_reason,
    }
}

/// A job's attempts that were not simply its runs' first tries, as [`ATTEMPT_COUNTS_SQL`]
/// counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttemptCounts {
    pub retries: u64,
    pub lost: u64,
}

/// Counts a job's retries (attempts that follow a failed or timed-out attempt of their run)
/// and lost attempts; `$1`/`$2` (written `?1`/`?2` on SQLite) are the namespace and the job.
/// Plain SQL that both stores run.
pub const ATTEMPT_COUNTS_SQL: &str = "\
    SELECT coalesce(sum(CASE WHEN prev.state IN ('failed', 'timed_out') THEN 1 ELSE 0 END), 0), \
           coalesce(sum(CASE WHEN a.state = 'lost' THEN 1 ELSE 0 END), 0) \
    FROM runs r JOIN attempts a ON a.run_id = r.id \
    LEFT JOIN attempts prev ON prev.run_id = a.run_id AND prev.number = a.number - 1 \
    WHERE r.namespace = $1 AND r.job = $2";

/// Counts a job's skipped runs by reason; `$1`/`$2` are the namespace and the job.
pub const SKIP_REASONS_SQL: &str = "\
    SELECT skip_reason, count(*) FROM runs \
    WHERE namespace = $1 AND job = $2 AND state = 'skipped' AND skip_reason IS NOT NULL \
    GROUP BY skip_reason";

/// An attempt the store has running on a worker, as a heartbeat reads it (instants in
/// microseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningAttempt {
    pub id: i64,
    pub started_at: i64,
    pub lease_expires_at: i64,
    pub cancel_requested: bool,
}

/// What a heartbeat does with a worker's attempts (`Store::heartbeat`), decided from what the
/// worker reports and what the store has running on it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatPlan {
    /// Reported attempts the worker must stop (not running on it, or asked to stop), in the
    /// report's order.
    pub stop: Vec<i64>,
    /// Reported attempts whose lease is to be extended, in id order.
    pub renew: Vec<i64>,
    /// Attempts not reported that never reached the worker: their lease ends now, in id order.
    pub forgotten: Vec<i64>,
}

pub fn plan_heartbeat(
    running: &[i64],
    on_worker: &[RunningAttempt],
    now: Instant,
    lease: crate::LeaseRenewal,
    forgotten_before: Instant,
) -> HeartbeatPlan {
    let by_id: std::collections::HashMap<i64, &RunningAttempt> =
        on_worker.iter().map(|a| (a.id, a)).collect();
    let reported: std::collections::HashSet<i64> = running.iter().copied().collect();
    let renew_before = micros(lease.renew_before);
    let mut plan = HeartbeatPlan::default();
    for id in running {
        let Some(attempt) = by_id.get(id) else {
            plan.stop.push(*id);
            continue;
        };
        // One asked to stop keeps its lease while it stops.
        if attempt.cancel_requested {
            plan.stop.push(*id);
        }
        if attempt.lease_expires_at < renew_before {
            plan.renew.push(*id);
        }
    }
    plan.renew.sort_unstable();
    plan.renew.dedup();
    let (now, forgotten_before) = (micros(now), micros(forgotten_before));
    plan.forgotten = on_worker
        .iter()
        .filter(|a| {
            !reported.contains(&a.id) && a.started_at < forgotten_before && a.lease_expires_at > now
        })
        .map(|a| a.id)
        .collect();
    plan.forgotten.sort_unstable();
    plan
}

/// Instants are stored as microseconds since the epoch, UTC.
pub fn micros(t: Instant) -> i64 {
    t.timestamp_micros()
}

pub fn instant(micros: i64) -> Result<Instant, StoreError> {
    chrono::DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Corrupt(format!("instant {micros} is out of range")))
}

pub fn opt_instant(micros: Option<i64>) -> Result<Option<Instant>, StoreError> {
    micros.map(instant).transpose()
}

fn named<T>(what: &str, text: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown {what} {text:?}")))
}

pub fn run_state(text: &str) -> Result<RunState, StoreError> {
    named("run state", text, RunState::parse)
}

pub fn attempt_state(text: &str) -> Result<AttemptState, StoreError> {
    named("attempt state", text, AttemptState::parse)
}

pub fn job_state(text: &str) -> Result<JobState, StoreError> {
    named("job state", text, JobState::parse)
}

pub fn trigger(text: &str) -> Result<sked_core::run::Trigger, StoreError> {
    named("trigger", text, sked_core::run::Trigger::parse)
}

pub fn skip_reason(text: &str) -> Result<sked_core::run::SkipReason, StoreError> {
    named("skip reason", text, sked_core::run::SkipReason::parse)
}

pub fn spec(text: &str) -> Result<JobSpec, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("a stored job definition does not parse: {e}")))
}

/// A JSON column read back (`what` names it in the error); NULL is `None`.
pub fn json_column<T: serde::de::DeserializeOwned>(
    what: &str,
    text: Option<String>,
) -> Result<Option<T>, StoreError> {
    text.map(|t| {
        serde_json::from_str(&t)
            .map_err(|e| StoreError::Corrupt(format!("{what} does not parse: {e}")))
    })
    .transpose()
}

/// A value as the JSON text a column keeps (namespace lists, label rules, audit snapshots).
pub fn to_json<T: serde::Serialize + ?Sized>(what: &str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Database(format!("cannot encode {what}: {e}")))
}

/// A grant's namespaces and label rules as the `tokens` table keeps them: JSON arrays, the
/// rules NULL when the token restricts no labels.
pub fn grant_columns(
    grant: &sked_core::auth::Grant,
) -> Result<(String, Option<String>), StoreError> {
    let namespaces = to_json("token namespaces", &grant.namespaces)?;
    let labels = grant
        .labels
        .as_ref()
        .map(|rules| to_json("token label rules", rules))
        .transpose()?;
    Ok((namespaces, labels))
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("stored {what} do not parse: {e}")))
}

pub fn role(text: &str) -> Result<Role, StoreError> {
    named("token role", text, Role::parse)
}

/// A JSON array of namespace names (a token's or a worker's; `["*"]` for all).
pub fn namespaces(what: &str, text: &str) -> Result<Vec<String>, StoreError> {
    from_json(what, text)
}

/// A worker token's label rules, a JSON array of `key=value`/`key=*` strings; NULL when its
/// workers may claim any label.
pub fn label_rules(text: Option<&str>) -> Result<Option<Vec<LabelRule>>, StoreError> {
    text.map(|t| from_json("token label rules", t)).transpose()
}

/// An audit entry's before or after snapshot.
pub fn calendar_spec(text: &str) -> Result<sked_core::calendar::CalendarSpec, StoreError> {
    from_json("calendars", text)
}

pub fn namespace_spec(text: &str) -> Result<sked_core::namespace::NamespaceSpec, StoreError> {
    from_json("namespace settings", text)
}

/// The first few names of a namespace's shell jobs, found among `(name, spec)` rows whose spec
/// text mentions a shell target: enough to say which ones stand in the way.
pub fn shell_jobs(
    rows: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<String>, StoreError> {
    const SHOWN: usize = 5;
    let mut names = Vec::new();
    for (name, text) in rows {
        if matches!(spec(&text)?.target, sked_core::TargetSpec::Shell(_)) {
            names.push(name);
            if names.len() == SHOWN {
                break;
            }
        }
    }
    Ok(names)
}

/// The pattern that finds, among stored definitions, the ones that may have a shell target
/// (each candidate is then parsed): how serde writes the target's tag.
pub const SHELL_TARGET_PATTERN: &str = r#"%"target":{"shell":%"#;

pub fn snapshot(text: Option<&str>) -> Result<Option<serde_json::Value>, StoreError> {
    text.map(|t| from_json("audit snapshots", t)).transpose()
}

/// The last instant each token was used, one per token in ascending id order: the order
/// PostgreSQL locks token rows in, and no point writing an earlier instant of a token the same
/// batch also saw later.
pub fn latest_use(used: &[(i64, Instant)]) -> Vec<(i64, Instant)> {
    let mut latest: BTreeMap<i64, Instant> = BTreeMap::new();
    for &(id, at) in used {
        let kept = latest.entry(id).or_insert(at);
        *kept = (*kept).max(at);
    }
    latest.into_iter().collect()
}

/// The fields of a stored definition the firing loop reads. The rest of the text is skipped
/// without being built, which is most of the cost of loading a million schedules.
#[derive(serde::Deserialize)]
struct FiringFields {
    #[serde(default)]
    schedule: Option<ScheduleSpec>,
    #[serde(default)]
    misfire: MisfirePolicy,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    blackouts: Vec<sked_core::schedule::BlackoutSpec>,
}

/// A scheduled job from its row: id, namespace, definition text, epoch, fired count and next
/// instant.
pub fn scheduled_job(
    id: i64,
    namespace: String,
    spec: &str,
    schedule_epoch: Instant,
    fired_count: u64,
    next_fire_at: Instant,
) -> Result<ScheduledJob, StoreError> {
    let fields: FiringFields = serde_json::from_str(spec)
        .map_err(|e| StoreError::Corrupt(format!("a stored job definition does not parse: {e}")))?;
    Ok(ScheduledJob {
        id,
        namespace,
        schedule: fields.schedule,
        schedule_epoch,
        fired_count,
        next_fire_at,
        paused: fields.paused,
        misfire: fields.misfire,
        blackouts: fields.blackouts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_lease_holder_reports_once() {
        let attempt = |token, attempt_state: &str, run_state: &str| ReportedAttempt {
            run_id: 1,
            job_id: 1,
            token,
            worker_id: "w".into(),
            attempt_state: attempt_state.into(),
            run_state: run_state.into(),
            failures: 0,
            cancel_requested: false,
            namespace: "default".into(),
            started_at: Instant::UNIX_EPOCH,
        };
        let report = |token| AttemptReport {
            attempt_id: 1,
            token,
            worker_id: "w".into(),
            outcome: sked_core::AttemptOutcome::Succeeded,
            exit_code: None,
            http_status: None,
            error: None,
        };
        let reason = |found, token| match admit_report(found, &report(token)) {
            Ok(_) => None,
            Err(CompletionEffect::Rejected { reason }) => Some(reason),
            Err(other) => panic!("{other:?}"),
        };
        assert_eq!(reason(None, 1).as_deref(), Some("unknown_attempt"));
        let fenced = Some("fenced");
        assert_eq!(
            reason(Some(attempt(1, "running", "running")), 2).as_deref(),
            fenced
        );
        assert_eq!(
            reason(Some(attempt(1, "lost", "queued")), 1).as_deref(),
            fenced
        );
        assert_eq!(
            reason(Some(attempt(1, "running", "queued")), 1).as_deref(),
            fenced
        );
        assert_eq!(
            reason(Some(attempt(1, "succeeded", "running")), 1).as_deref(),
            Some("already_reported")
        );
        assert_eq!(reason(Some(attempt(1, "running", "running")), 1), None);
    }

    #[test]
    fn stats_count_timeouts_as_failures() {
        let by_state: BTreeMap<String, u64> = [
            ("succeeded".into(), 3),
            ("timed_out".into(), 2),
            ("failed".into(), 1),
        ]
        .into();
        let attempts = AttemptCounts {
            retries: 4,
            lost: 1,
        };
        let stats = job_stats(
            by_state,
            BTreeMap::new(),
            attempts,
            None,
            vec![2.0, 1.0],
            vec![],
        );
        assert_eq!((stats.runs, stats.succeeded, stats.failed), (6, 3, 3));
        assert_eq!((stats.retries, stats.lost), (4, 1));
        assert_eq!(stats.lateness_ms.max, 2.0);
    }
}

/// `record` with what it waits for, from the `waiting_reason`, `waiting_for` (a JSON array of
/// unmet dependencies) and `waiting_until` columns, shown only while the run is waiting. A
/// waiting run without a reason was held back by overlap before dependencies existed.
pub fn with_waiting(
    mut record: RunRecord,
    reason: Option<&str>,
    waiting_for: Option<&str>,
    until: Option<i64>,
) -> Result<RunRecord, StoreError> {
    if record.state != RunState::Waiting {
        return Ok(record);
    }
    record.waiting_reason = Some(match reason {
        Some(text) => named("wait reason", text, WaitReason::parse)?,
        None => WaitReason::Overlap,
    });
    if let Some(text) = waiting_for {
        record.waiting_for = serde_json::from_str(text)
            .map_err(|e| StoreError::Corrupt(format!("a run's unmet dependencies: {e}")))?;
    }
    record.waiting_until = until.map(instant).transpose()?;
    Ok(record)
}

/// A run that reached a terminal state in the current transaction: its dependants may move.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub namespace: String,
    pub job: String,
    pub scheduled_for: Instant,
    /// The run itself: an instant of a sharded job has several.
    pub run_id: i64,
    pub state: RunState,
}

/// What settling ended runs and recorded events did beyond them.
#[derive(Debug, Default)]
pub struct Settled {
    /// Runs the events started (`schedule: {event}`), whatever became of them.
    pub started: Vec<i64>,
    /// Dependant runs now queued, for the dispatcher.
    pub queued: Vec<i64>,
    /// Running runs an overlap `cancel_running` of a released run asked to stop.
    pub cancel_requested: Vec<i64>,
    /// Jobs whose run an event did not start (debounce, dedup), with the run it went to.
    pub flowed: Vec<crate::FlowedRun>,
}

/// The `waiting_for` and `waiting_until` columns of a run of `spec` that waits for its
/// dependencies from `now`: the unmet entries as JSON, and the deadline.
pub fn waiting_columns(
    spec: &JobSpec,
    missing: &[String],
    now: Instant,
) -> Result<(String, i64), StoreError> {
    let timeout = chrono::Duration::from_std(spec.deps_timeout()).unwrap_or(chrono::Duration::MAX);
    let until = now.checked_add_signed(timeout).unwrap_or(now);
    Ok((to_json("unmet dependencies", missing)?, micros(until)))
}

/// The error recorded on a run skipped because its dependencies timed out, from its
/// `waiting_for` column.
pub fn timed_out_error(waiting_for: Option<&str>) -> Result<String, StoreError> {
    let missing: Vec<String> = match waiting_for {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| StoreError::Corrupt(format!("a run's unmet dependencies: {e}")))?,
        None => Vec::new(),
    };
    Ok(if missing.is_empty() {
        "its dependencies were not met in time".to_string()
    } else {
        format!(
            "its dependencies were not met in time: {}",
            missing.join("; ")
        )
    })
}

/// The error a fire's run is written with: why the fire was skipped (a calendar's holiday),
/// when it is skipped and says why.
pub fn skip_error(fire: &crate::Fire) -> Option<&str> {
    fire.skip.and(fire.why.as_deref())
}

/// A run about to be written by the fire path: its state, and why it is skipped or what it
/// waits for. The default is a queued run.
#[derive(Debug, Default)]
pub struct NewRun {
    pub state: Option<RunState>,
    pub skip: Option<sked_core::run::SkipReason>,
    pub error: Option<String>,
    /// Waiting for dependencies: the unmet ones (JSON) and the deadline.
    pub dependencies: Option<(String, i64)>,
    /// A heartbeat job's run, waiting for a ping until this deadline (micros).
    pub ping_until: Option<i64>,
}

impl NewRun {
    pub fn state(&self) -> RunState {
        self.state.unwrap_or(RunState::Queued)
    }

    /// A run recorded skipped for `reason`.
    pub fn skipped(reason: sked_core::run::SkipReason) -> NewRun {
        NewRun {
            state: Some(RunState::Skipped),
            skip: Some(reason),
            ..NewRun::default()
        }
    }

    /// The run of a fire decided skipped before the store looked (`fire.skip`), with the
    /// fire's explanation in words, if it gives one, as its error.
    pub fn skipped_fire(reason: sked_core::run::SkipReason, fire: &crate::Fire) -> NewRun {
        NewRun {
            error: skip_error(fire).map(str::to_owned),
            ..NewRun::skipped(reason)
        }
    }

    /// A heartbeat job's run of `instant`: it waits for a ping until its grace (micros) passes.
    pub fn awaiting_ping(instant: Instant, grace: i64) -> NewRun {
        NewRun {
            state: Some(RunState::Waiting),
            ping_until: Some(micros(instant).saturating_add(grace)),
            ..NewRun::default()
        }
    }

    /// The `waiting_until` column: a dependency wait's deadline or a ping's.
    pub fn waiting_until(&self) -> Option<i64> {
        self.dependencies.as_ref().map(|d| d.1).or(self.ping_until)
    }

    /// The `waiting_for` column: a dependency wait's unmet dependencies.
    pub fn waiting_for(&self) -> Option<&str> {
        self.dependencies.as_ref().map(|d| d.0.as_str())
    }

    /// What a run of `spec` starts as by the verdict on its dependencies: `None` when they are
    /// met (the overlap policy decides next), else waiting, or skipped for good.
    pub fn by_dependencies(
        verdict: sked_core::dependency::Verdict,
        spec: &JobSpec,
        now: Instant,
    ) -> Result<Option<NewRun>, StoreError> {
        use sked_core::dependency::Verdict;
        Ok(match verdict {
            Verdict::Ready => None,
            Verdict::Waiting(missing) => Some(NewRun {
                state: Some(RunState::Waiting),
                dependencies: Some(waiting_columns(spec, &missing, now)?),
                ..NewRun::default()
            }),
            Verdict::UpstreamFailed(why) => Some(NewRun {
                error: Some(why),
                ..NewRun::skipped(sked_core::run::SkipReason::UpstreamFailed)
            }),
        })
    }

    /// The `waiting_reason` column: dependencies, a ping, or overlap for any other wait.
    pub fn waiting_reason(&self) -> Option<WaitReason> {
        match (&self.dependencies, self.ping_until, self.state()) {
            (Some(_), _, _) => Some(WaitReason::Dependencies),
            (None, Some(_), _) => Some(WaitReason::Ping),
            (None, None, RunState::Waiting) => Some(WaitReason::Overlap),
            _ => None,
        }
    }
}

/// A worker a broadcast may go to, from its stored row (`namespaces` and `labels` as JSON).
pub fn live_worker(
    id: String,
    namespaces: &str,
    labels: &str,
) -> Result<sked_core::shard::LiveWorker, StoreError> {
    Ok(sked_core::shard::LiveWorker {
        id,
        namespaces: self::namespaces("worker namespaces", namespaces)?,
        labels: serde_json::from_str(labels)
            .map_err(|e| StoreError::Corrupt(format!("worker labels do not parse: {e}")))?,
    })
}

/// The workers alive and not draining, as a broadcast sees them.
pub const LIVE_WORKERS: &str =
    "SELECT id, namespaces, labels FROM workers WHERE alive AND NOT draining ORDER BY id";

/// The shards of one upstream instant, folded into the one run a dependency's verdict sees
/// (`sked_core::shard`): active while any shard is, succeeded once every shard succeeded, and
/// otherwise ended as its first shard that did not succeed. An instant of a job that is not
/// sharded folds into its own run.
#[derive(Debug, Clone, Copy, Default)]
pub struct InstantShards {
    first_id: Option<i64>,
    active: bool,
    unsucceeded: Option<(i64, RunState)>,
}

impl InstantShards {
    pub fn add(&mut self, id: i64, state: RunState) {
        self.first_id = Some(self.first_id.map_or(id, |first| first.min(id)));
        if !state.is_terminal() {
            self.active = true;
        } else if state != RunState::Succeeded
            && self.unsucceeded.is_none_or(|(first, _)| id < first)
        {
            self.unsucceeded = Some((id, state));
        }
    }

    /// The run the instant counts as: its id and state.
    pub fn folded(&self) -> (i64, RunState) {
        let first = self.first_id.unwrap_or_default();
        match self.unsucceeded {
            _ if self.active => (first, RunState::Running),
            Some(unsucceeded) => unsucceeded,
            None => (first, RunState::Succeeded),
        }
    }
}

/// What one requirement's upstream runs inside its window did: read row by row
/// ([`WindowRuns::add`]) or as a store's aggregate over them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowRuns {
    /// Some run succeeded.
    pub succeeded: bool,
    /// Some run ended, in any state.
    pub ended: bool,
    /// Some run is waiting, queued or running.
    pub active: bool,
    /// The first run that ended otherwise than succeeded, and how.
    pub ended_unsucceeded: Option<(i64, RunState)>,
    /// The latest instant recorded in the window.
    pub latest: Option<i64>,
    /// The upstream job's next instant, when it has one.
    pub next_fire_at: Option<i64>,
}

impl WindowRuns {
    /// Counts one run of the window, read row by row.
    pub fn add(&mut self, id: i64, state: RunState, scheduled_for: i64) {
        match state {
            RunState::Succeeded => self.succeeded = true,
            s if !s.is_terminal() => self.active = true,
            s => {
                if self.ended_unsucceeded.is_none_or(|(first, _)| id < first) {
                    self.ended_unsucceeded = Some((id, s));
                }
            }
        }
        self.ended |= state.is_terminal();
        self.latest = self.latest.max(Some(scheduled_for));
    }

    /// Whether a run in the window meets a wait for `awaited`.
    fn satisfies(&self, awaited: Awaited) -> bool {
        match awaited {
            Awaited::Succeeded => self.succeeded,
            Awaited::Finished => self.ended,
        }
    }

    /// Whether the upstream's next instant could change the facts: nothing in the window
    /// settles the wait yet.
    pub fn needs_next_fire(&self, awaited: Awaited) -> bool {
        !self.active && !self.satisfies(awaited)
    }

    /// What they mean for a requirement awaiting `awaited` over a window ending at `to`.
    pub fn facts(&self, awaited: Awaited, to: i64) -> UpstreamRuns {
        UpstreamRuns {
            satisfied: self.satisfies(awaited),
            pending: self.active
                || sked_core::dependency::owes_instant(self.next_fire_at, self.latest, to),
            ended_otherwise: match awaited {
                Awaited::Succeeded => self.ended_unsucceeded,
                Awaited::Finished => None,
            },
        }
    }
}

/// The verdict on a run of `spec` at `instant`, from what each of its requirements' windows
/// held (`windows[k]`, in `sked_core::dependency::requirements` order, ending at `ends[k]`).
pub fn verdict_from(
    spec: &JobSpec,
    instant: Instant,
    windows: &[WindowRuns],
    ends: &[i64],
) -> sked_core::dependency::Verdict {
    sked_core::dependency::verdict(&spec.depends_on, instant, |k, requirement, _| {
        windows
            .get(k)
            .zip(ends.get(k))
            .map(|(runs, to)| runs.facts(requirement.state, *to))
            .unwrap_or_default()
    })
}

/// The id and state of the first run that ended otherwise than succeeded, from the text
/// `"<id, zero-padded to 20 digits> <state>"` that a SQL `min` over such runs returns (so the
/// first one's id and state come back together).
pub fn first_ended(text: Option<&str>) -> Result<Option<(i64, RunState)>, StoreError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let (id, state) = text
        .split_once(' ')
        .ok_or_else(|| StoreError::Corrupt(format!("an ended run {text:?}")))?;
    let id = id
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("an ended run {text:?}")))?;
    Ok(Some((id, named("run state", state, RunState::parse)?)))
}

/// Adds the dependants' runs a batch of completions released to the batch's effects: to the
/// last accepted one (the runs ended together, and were settled together).
pub fn list_released(effects: &mut [CompletionEffect], released: Vec<i64>) {
    if released.is_empty() {
        return;
    }
    let last = effects.iter_mut().rev().find_map(|effect| match effect {
        CompletionEffect::Accepted { requeued, .. } => Some(requeued),
        CompletionEffect::Rejected { .. } => None,
    });
    if let Some(requeued) = last {
        requeued.extend(released);
    }
}

/// The event a run was started by, from its `event_key` and `event_id` and the event's stored
/// payload (gone once retention deleted the event: the run still names it).
pub fn run_event(
    key: Option<String>,
    id: Option<String>,
    payload: Option<String>,
) -> Result<Option<sked_core::event::RunEvent>, StoreError> {
    let (Some(key), Some(id)) = (key, id) else {
        return Ok(None);
    };
    let payload = match payload {
        Some(text) => event_payload(&text)?,
        None => serde_json::Value::Null,
    };
    Ok(Some(sked_core::event::RunEvent { key, id, payload }))
}

/// A stored namespace limit (`sked_core::flow::LimitSpec`).
pub fn limit_spec(text: &str) -> Result<sked_core::flow::LimitSpec, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("a stored limit does not parse: {e}")))
}

/// A stored event payload.
pub fn event_payload(text: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("a stored event payload does not parse: {e}")))
}

/// The error when an event's run finds no free instant ([`sked_core::event::run_instants`]):
/// the event is not recorded rather than recorded without its run.
pub fn no_free_instant(event: &sked_core::records::EventRecord, job: &str) -> StoreError {
    StoreError::Database(format!(
        "event {} {:?}: job {job:?} has runs at every instant from {} on; nothing was recorded",
        event.key, event.id, event.occurred_at
    ))
}

/// The answer to a post of an event recorded before: the first one, and nothing done.
pub fn posted_before(event: sked_core::records::EventRecord) -> crate::PostedEvent {
    crate::PostedEvent {
        event,
        created: false,
        started: Vec::new(),
        queued: Vec::new(),
        cancel_requested: Vec::new(),
        flowed: Vec::new(),
    }
}

/// The statement that reopens a run (a retry, or a dependant waiting for its retried
/// upstream again): its end forgotten, a fresh retry budget; `?1` the run, then state,
/// `ready_at`, `waiting_reason`, `waiting_for`, `waiting_until` (SQLite and PostgreSQL
/// placeholders alike are numbered).
pub const REOPEN_RUN: &str = "UPDATE runs SET state = {2}, skip_reason = NULL, error = NULL, \
     failures = 0, cancel_requested = {false}, finished_at = NULL, ready_at = {3}, \
     waiting_reason = {4}, waiting_for = {5}, waiting_until = {6} WHERE id = {1}";

/// [`REOPEN_RUN`] with the placeholders of a store: `?` (SQLite) or `$` (PostgreSQL).
pub fn reopen_run_sql(mark: char) -> String {
    let mut sql = REOPEN_RUN.replace("{false}", if mark == '?' { "0" } else { "false" });
    for n in 1..=6 {
        sql = sql.replace(&format!("{{{n}}}"), &format!("{mark}{n}"));
    }
    sql
}

/// How a retried run reopens by the verdict on its own dependencies (`None`: it has none):
/// queued, or waiting with what it misses; `Err` with why when they can no longer be met.
pub fn reopening(
    spec: &JobSpec,
    verdict: Option<sked_core::dependency::Verdict>,
    now: Instant,
) -> Result<Result<NewRun, String>, StoreError> {
    if matches!(spec.target, sked_core::TargetSpec::Heartbeat(_)) {
        return Ok(Err(
            "a heartbeat run is not retried: it ended when its ping was due".to_string(),
        ));
    }
    let Some(verdict) = verdict else {
        return Ok(Ok(NewRun::default()));
    };
    Ok(match NewRun::by_dependencies(verdict, spec, now)? {
        None => Ok(NewRun::default()),
        Some(new) if new.state() == RunState::Skipped => Err(format!(
            "its dependencies can no longer be met: {}",
            new.error.unwrap_or_default()
        )),
        Some(new) => Ok(new),
    })
}

/// An event a succeeded run emits (`on_success`), to record with the run's completion.
pub fn emission(run: &Ended, run_id: i64, key: &str) -> sked_core::event::EventSpec {
    sked_core::event::EventSpec {
        key: key.to_string(),
        id: sked_core::event::emitted_id(&run.job, run.scheduled_for),
        payload: sked_core::event::emitted_payload(&run.job, run_id, run.scheduled_for),
        trace_parent: None,
    }
}

/// A namespace's dependency edges, both ways, for ranking `priority: auto` jobs.
pub struct Graph {
    /// What depends on each job.
    below: std::collections::HashMap<String, Vec<String>>,
    /// What each job depends on.
    above: std::collections::HashMap<String, Vec<String>>,
}

impl Graph {
    /// From `(job, upstream)` edges.
    pub fn new(edges: impl IntoIterator<Item = (String, String)>) -> Graph {
        let mut graph = Graph {
            below: Default::default(),
            above: Default::default(),
        };
        for (job, upstream) in edges {
            graph
                .below
                .entry(upstream.clone())
                .or_default()
                .push(job.clone());
            graph.above.entry(job).or_default().push(upstream);
        }
        graph
    }

    /// `priority: auto`'s rank of `job`: the jobs downstream of it.
    pub fn rank(&self, job: &str) -> i32 {
        let below = sked_core::dependency::downstream_count(job, |name| {
            Ok::<_, std::convert::Infallible>(self.below.get(name).cloned().unwrap_or_default())
        });
        match below {
            Ok(count) => i32::try_from(count).unwrap_or(i32::MAX),
            Err(never) => match never {},
        }
    }

    /// The jobs in `from` and every job they wait for, directly or not.
    pub fn at_or_above(
        &self,
        from: &std::collections::BTreeSet<String>,
    ) -> std::collections::BTreeSet<String> {
        let mut seen = from.clone();
        let mut frontier: Vec<&str> = from.iter().map(String::as_str).collect();
        while let Some(name) = frontier.pop() {
            for up in self.above.get(name).into_iter().flatten() {
                if seen.insert(up.clone()) {
                    frontier.push(up);
                }
            }
        }
        seen
    }
}

#[cfg(test)]
mod graph_tests {
    use super::Graph;
    use std::collections::BTreeSet;

    #[test]
    fn ranks_count_downstream_and_changes_reach_every_ancestor() {
        // root -> {a, b} -> c ; other stands alone.
        let edge = |job: &str, up: &str| (job.to_string(), up.to_string());
        let graph = Graph::new([
            edge("a", "root"),
            edge("b", "root"),
            edge("c", "a"),
            edge("c", "b"),
        ]);
        assert_eq!(graph.rank("root"), 3);
        assert_eq!(graph.rank("a"), 1);
        assert_eq!(graph.rank("c"), 0);
        assert_eq!(graph.rank("other"), 0);
        let above = graph.at_or_above(&BTreeSet::from(["c".to_string()]));
        let names: Vec<&str> = above.iter().map(String::as_str).collect();
        assert_eq!(names, ["a", "b", "c", "root"]);
    }
}

/// The `notify` columns of a job or namespace row: the rules' JSON (`None`: a job that gives
/// none and takes its namespace's, or a namespace with none), and whether any rule is for
/// `late` (the notifier's scan reads only those).
/// The `ping_grace` column of a job: its heartbeat's grace in micros, `None` for any other
/// target.
pub fn ping_grace(spec: &JobSpec) -> Option<i64> {
    match &spec.target {
        sked_core::TargetSpec::Heartbeat(h) => {
            Some(i64::try_from(h.grace.0.as_micros()).unwrap_or(i64::MAX))
        }
        _ => None,
    }
}

pub fn notify_columns(
    rules: Option<&[sked_core::notify::NotifyRule]>,
) -> Result<(Option<String>, bool), StoreError> {
    let late = rules.is_some_and(|r| sked_core::notify::earliest_late_after(r).is_some());
    let json = rules.map(|r| to_json("notify rules", r)).transpose()?;
    Ok((json, late))
}

/// A job the scan for late runs looks at: it has a `late` rule of its own, or follows its
/// namespace's rules and the namespace has one.
pub struct LateJob {
    pub job_id: i64,
    pub job_rules: Option<String>,
    pub namespace_rules: Option<String>,
}

impl LateJob {
    pub fn rules(&self) -> Vec<sked_core::notify::NotifyRule> {
        effective_rules(
            self.job_rules.as_deref(),
            self.namespace_rules.as_deref(),
            format_args!("job {}", self.job_id),
        )
    }
}

/// The rules a job's runs go by, from its row's and its namespace's `notify` columns. Rules
/// that no longer parse are logged and left out rather than returned as an error: they are read
/// in the transaction that ends a run, and an alert that cannot be sent must never keep the
/// ledger from recording the run.
///
/// `whose` names the job in that log line (`job default/nightly`, `job 42`). The line is
/// throttled: the rules are read at every end of the job's runs, and a job that ends runs many
/// times a second must not flood the log.
pub fn effective_rules(
    job: Option<&str>,
    namespace: Option<&str>,
    whose: impl std::fmt::Display,
) -> Vec<sked_core::notify::NotifyRule> {
    static THROTTLE: std::sync::Mutex<sked_core::throttle::Throttle> = std::sync::Mutex::new(
        sked_core::throttle::Throttle::new(std::time::Duration::from_secs(60)),
    );
    let Some(json) = job.or(namespace) else {
        return Vec::new();
    };
    serde_json::from_str(json).unwrap_or_else(|e| {
        let admitted = THROTTLE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(std::time::Instant::now());
        if let Some(held_back) = admitted {
            let source = if job.is_some() {
                "its own"
            } else {
                "its namespace's"
            };
            let more = match held_back {
                0 => String::new(),
                n => format!(" ({n} more such lines held back)"),
            };
            tracing::warn!(
                "the stored notify rules of {whose} ({source}) do not parse, so they raise \
                 nothing: {e}{more}"
            );
        }
        Vec::new()
    })
}

/// The notifications the end of a run raises under `rules`: each with its rule's index, the
/// channel it goes to and the message, as JSON ready to store.
pub fn raised_notifications(
    rules: &[sked_core::notify::NotifyRule],
    run: &RunRecord,
    previous: Option<RunState>,
    last_notices: &std::collections::BTreeMap<usize, Instant>,
    now: Instant,
) -> Result<Vec<NewNotification>, StoreError> {
    let ended = sked_core::notify::EndedRun {
        state: run.state,
        skip_reason: run.skip_reason,
        scheduled_for: run.scheduled_for,
        started_at: run.started_at,
    };
    sked_core::notify::raised_by_end(rules, &ended, previous, last_notices, now)
        .into_iter()
        .map(|(rule, event)| new_notification(rules, rule, event, run, now))
        .collect()
}

/// A notification of `event` about `run` under rule `rule`, ready to store.
pub fn new_notification(
    rules: &[sked_core::notify::NotifyRule],
    rule: usize,
    event: sked_core::notify::NotifyEvent,
    run: &RunRecord,
    now: Instant,
) -> Result<NewNotification, StoreError> {
    notification_about(rules, rule, event, run, None, now)
}

/// [`new_notification`], with the deadline a `deadline_missed` or `at_risk` is about.
pub fn notification_about(
    rules: &[sked_core::notify::NotifyRule],
    rule: usize,
    event: sked_core::notify::NotifyEvent,
    run: &RunRecord,
    deadline: Option<sked_core::notify::DeadlineNotice>,
    now: Instant,
) -> Result<NewNotification, StoreError> {
    let channel = rules
        .get(rule)
        .and_then(sked_core::notify::NotifyRule::channel)
        .ok_or_else(|| StoreError::Corrupt(format!("notify rule {rule} has no channel")))?;
    let message = sked_core::notify::Message {
        event,
        namespace: run.namespace.clone(),
        job: run.job.clone(),
        run_id: run.id,
        state: run.state,
        scheduled_for: run.scheduled_for,
        skip_reason: run.skip_reason,
        error: None,
        deadline,
        at: now,
    }
    .with_error(run.error.as_deref());
    Ok(NewNotification {
        rule: rule as i64,
        event: event.as_str(),
        channel: to_json("a notification channel", &channel)?,
        message: to_json("a notification", &message)?,
    })
}

/// A notification about to be stored: the run, namespace and job are the run's.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNotification {
    pub rule: i64,
    pub event: &'static str,
    pub channel: String,
    pub message: String,
}

/// Reads a stored notification's JSON columns and names back.
#[allow(clippy::too_many_arguments)]
pub fn notification(
    id: i64,
    namespace: String,
    job: String,
    run_id: i64,
    event: &str,
    rule: i64,
    channel: &str,
    message: &str,
    state: &str,
) -> Result<sked_core::notify::NotificationRecord, StoreError> {
    use sked_core::notify::{NotificationState, NotifyEvent};
    let corrupt = |what: &str| StoreError::Corrupt(format!("notification {id}: {what}"));
    Ok(sked_core::notify::NotificationRecord {
        id,
        namespace,
        job,
        run_id,
        event: NotifyEvent::parse(event).ok_or_else(|| corrupt("unknown event"))?,
        rule: u32::try_from(rule).map_err(|_| corrupt("bad rule"))?,
        channel: serde_json::from_str(channel).map_err(|e| corrupt(&e.to_string()))?,
        message: serde_json::from_str(message).map_err(|e| corrupt(&e.to_string()))?,
        state: NotificationState::parse(state).ok_or_else(|| corrupt("unknown state"))?,
        sends: 0,
        last_error: None,
        created_at: Instant::UNIX_EPOCH,
        next_send_at: Instant::UNIX_EPOCH,
        sent_at: None,
        claim: 0,
    })
}

#[cfg(test)]
mod notify_rule_tests {
    use super::effective_rules;

    #[test]
    fn a_job_s_rules_win_and_unreadable_ones_raise_nothing() {
        let job = r#"[{"on": ["failed"], "email": {"to": ["a@b.c"]}}]"#;
        let namespace = r#"[{"on": ["missed"], "email": {"to": ["n@b.c"]}}]"#;
        assert_eq!(
            effective_rules(Some(job), Some(namespace), "job a")[0]
                .on
                .len(),
            1
        );
        assert_eq!(
            effective_rules(None, Some(namespace), "job a")[0].on,
            [sked_core::notify::NotifyEvent::Missed]
        );
        assert!(
            effective_rules(Some("[]"), Some(namespace), "job a").is_empty(),
            "opted out"
        );
        assert!(effective_rules(Some(r#"[{"on": 7}]"#), None, "job a").is_empty());
        assert!(effective_rules(None, None, "job a").is_empty());
    }
}

/// In a job listing's `WHERE`: the state of a job's newest run, as `list_runs` orders them
/// (one seek on `runs_by_job_name` per job looked at).
pub const LAST_RUN_STATE: &str = "(SELECT r.state FROM runs r \
    WHERE r.namespace = jobs.namespace AND r.job = jobs.name \
    ORDER BY r.scheduled_for DESC, r.id DESC LIMIT 1)";

/// How a settle admits the runs events start: each against the server's queue
/// ([`crate::BacklogSource`]) and the runs admitted before it in the same transaction. With no
/// source (a store no server queues for), every run is admitted.
pub struct EventAdmission<'a> {
    source: Option<&'a dyn crate::BacklogSource>,
    admission: sked_core::policy::admission::Admission,
}

impl<'a> EventAdmission<'a> {
    pub fn new(source: Option<&'a dyn crate::BacklogSource>) -> EventAdmission<'a> {
        EventAdmission {
            source,
            admission: Default::default(),
        }
    }

    /// `Some(Backlog)` when a run of job `job_id` in `namespace` is past a cap.
    pub fn decide(&mut self, job_id: i64, namespace: &str) -> Option<SkipReason> {
        let source = self.source?;
        self.admission
            .admit(job_id, namespace, source.backlog(job_id, namespace))
    }
}

/// The debounce and dedup keys of one trigger or event of a job, rendered
/// (`sked_core::flow`): what both stores look up before they record a run.
#[derive(Debug, Clone, Default)]
pub struct FlowKeys {
    /// The dedup key and its window.
    pub dedup: Option<(String, chrono::Duration)>,
    /// The debounce key and its definition.
    pub debounce: Option<(String, sked_core::flow::DebounceSpec)>,
}

impl FlowKeys {
    /// The keys `spec` gives a run made of `context`; none when it has neither.
    pub fn of(spec: &JobSpec, context: &sked_core::flow::KeyContext<'_>) -> FlowKeys {
        let render = |field: &str, text: &str| {
            sked_core::flow::KeyTemplate::parse(field, text)
                .ok()
                .map(|t| t.render(context))
        };
        FlowKeys {
            dedup: spec.dedup.as_ref().and_then(|d| {
                Some((
                    render("dedup.key", &d.key)?,
                    chrono::Duration::from_std(d.window.0).unwrap_or(chrono::Duration::MAX),
                ))
            }),
            debounce: spec
                .debounce
                .as_ref()
                .and_then(|d| Some((render("debounce.key", &d.key)?, d.clone()))),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dedup.is_none() && self.debounce.is_none()
    }
}

/// `at` plus `d`, at most the largest instant.
pub fn later(at: Instant, d: chrono::Duration) -> Instant {
    at.checked_add_signed(d).unwrap_or(at)
}

/// A debounced run's absorbed record after one more trigger at `now`, and its new `ready_at`.
pub fn absorb(
    stored: Option<&str>,
    spec: &sked_core::flow::DebounceSpec,
    trigger: sked_core::flow::AbsorbedTrigger,
    now: Instant,
) -> Result<(String, Instant), StoreError> {
    let mut absorbed: sked_core::flow::Absorbed =
        json_column("a run's absorbed triggers", stored.map(str::to_string))?.unwrap_or_default();
    let first = *absorbed.first_at.get_or_insert(now);
    absorbed.absorb(trigger);
    let ready_at = sked_core::flow::trigger::debounced_ready_at(spec, first, now);
    Ok((to_json("absorbed triggers", &absorbed)?, ready_at))
}

/// The `params` column of a run.
pub fn params_column(
    params: Option<&sked_core::flow::Params>,
) -> Result<Option<String>, StoreError> {
    params
        .filter(|p| !p.is_empty())
        .map(|p| to_json("trigger parameters", p))
        .transpose()
}

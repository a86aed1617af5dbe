//! Jobs: the definition users write, its validation, and the job's lifecycle state.

use crate::dependency::DependencySpec;
use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::event::OnSuccess;
use crate::policy::{MisfirePolicy, OverlapPolicy, RetryPolicy};
use crate::schedule::{Schedule, ScheduleSpec};
use crate::target::TargetSpec;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A job definition as the API and `sked job apply` take it. Unknown fields are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Taken from the URL on `PUT /jobs/{name}`; required on `POST /jobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// No schedule: the job runs only when triggered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    pub target: TargetSpec,
    /// An attempt running longer than this is stopped and ends `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    #[serde(default)]
    pub retry: RetryPolicy,
    #[serde(default)]
    pub overlap: OverlapPolicy,
    #[serde(default)]
    pub misfire: MisfirePolicy,
    /// Higher runs first when runs wait for workers; `auto` ranks by the work downstream.
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub routing: Routing,
    /// Other jobs' runs each run waits for (`crate::dependency`). A job with dependencies and
    /// no schedule runs once per upstream run, at its instant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<DependencySpec>,
    /// How long a run waits for its dependencies before it is skipped
    /// ([`crate::dependency::DEFAULT_DEPS_TIMEOUT`] when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deps_timeout: Option<HumanDuration>,
    /// An event each succeeded run posts in the job's namespace (`crate::event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<OnSuccess>,
    /// Who is told when a run fails, times out, recovers, is missed or starts late
    /// (`crate::notify`). Absent: the namespace's default rules; `[]`: none, whatever the
    /// namespace says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<crate::notify::NotifyRule>>,
    /// Also count this job's runs and time its attempts in metrics labelled by its name
    /// (`sked_job_runs_total`, `sked_job_attempt_duration_seconds`); off by default, so that
    /// the metrics' series grow with namespaces, not with jobs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub job_metrics: bool,
    /// Split each instant into this many runs, spread over workers (`crate::shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u16>,
    /// Run each instant once on every worker that may take it, one run per worker
    /// (`crate::shard`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broadcast: bool,
    /// Windows in which the schedule's instants do not run: each is recorded `skipped
    /// (blackout)` with the window's reason (`crate::schedule::blackout`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blackouts: Vec<crate::schedule::BlackoutSpec>,
    /// When each run must have started and finished, and how long it may run
    /// (`crate::deadline`): a run that misses one is marked and notified, and one predicted to
    /// miss `finish_by` is marked at risk before it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<crate::deadline::DeadlineSpec>,
    /// At most `limit` runs holding each key at once, across every job and node
    /// (`crate::flow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concurrency: Vec<crate::flow::ConcurrencySpec>,
    /// Starts per key at a rate, shared by every job that names the key (`crate::flow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limit: Vec<crate::flow::RateLimitSpec>,
    /// A burst of triggers or events with one key becomes one run (`crate::flow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<crate::flow::DebounceSpec>,
    /// A second trigger or event with one key within a window is the first one's run
    /// (`crate::flow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup: Option<crate::flow::DedupSpec>,
    #[serde(default)]
    pub paused: bool,
}

/// A job's priority: a number (higher runs first when runs wait for workers), or `auto`: the
/// number of jobs that wait downstream of it ([`crate::dependency::downstream_count`]), so a
/// run a wide pipeline waits for goes before a leaf's. Both rank on one scale: a job with 40
/// jobs downstream ranks as priority 40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Fixed(i32),
    Auto,
}

impl Default for Priority {
    fn default() -> Self {
        Priority::Fixed(0)
    }
}

impl Priority {
    pub fn is_auto(self) -> bool {
        self == Priority::Auto
    }
}

impl Serialize for Priority {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Priority::Fixed(n) => s.serialize_i32(*n),
            Priority::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Priority;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer or \"auto\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Priority, E> {
                i32::try_from(v)
                    .map(Priority::Fixed)
                    .map_err(|_| E::custom("priority is out of range"))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Priority, E> {
                i32::try_from(v)
                    .map(Priority::Fixed)
                    .map_err(|_| E::custom("priority is out of range"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Priority, E> {
                match v {
                    "auto" => Ok(Priority::Auto),
                    _ => Err(E::custom(format!("{v:?}: expected an integer or \"auto\""))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Where a run may go and how one worker is chosen among those that may take it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// A worker must carry all of these labels with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub strategy: crate::dispatch::Strategy,
    /// The key `affinity` and `consistent_hash` route by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_key: Option<String>,
}

/// A job's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Active,
    Paused,
    /// A finite schedule that is used up.
    Completed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Active => "active",
            JobState::Paused => "paused",
            JobState::Completed => "completed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(JobState::Active),
            "paused" => Some(JobState::Paused),
            "completed" => Some(JobState::Completed),
            _ => None,
        }
    }
}

pub const MAX_NAME_LEN: usize = 128;
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Checks a job or namespace name: 1 to 128 of `A-Z a-z 0-9 . _ -`, not starting with `.`.
pub fn validate_name(field: &str, name: &str) -> Result<(), SpecError> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars || name.starts_with('.') {
        return Err(SpecError::new(
            field,
            format!(
                "{name:?} is not a valid name: use 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-'"
            ),
        ));
    }
    Ok(())
}

/// A definition that passed validation, with its schedule compiled.
#[derive(Debug, Clone)]
pub struct ValidJob {
    pub name: String,
    pub spec: JobSpec,
    pub schedule: Schedule,
}

impl JobSpec {
    /// Validates the definition. `name_from_path` is the name in the URL, when there is one; it
    /// must agree with a name in the body. `epoch` is the moment the schedule is set.
    pub fn validate(
        mut self,
        name_from_path: Option<&str>,
        epoch: Instant,
    ) -> Result<ValidJob, SpecError> {
        let name = match (name_from_path, self.name.as_deref()) {
            (Some(path), Some(body)) if path != body => {
                return Err(SpecError::new(
                    "name",
                    format!("the body names {body:?} but the URL names {path:?}"),
                ))
            }
            (Some(path), _) => path.to_string(),
            (None, Some(body)) => body.to_string(),
            (None, None) => return Err(SpecError::new("name", "is required")),
        };
        validate_name("name", &name)?;
        if let Some(schedule) = &mut self.schedule {
            schedule.normalize();
        }
        self.name = Some(name.clone());
        if self.description.as_ref().is_some_and(|d| d.len() > 4096) {
            return Err(SpecError::new("description", "must be at most 4096 bytes"));
        }
        self.target.validate()?;
        if let Some(timeout) = self.timeout {
            if timeout.0.is_zero() || timeout.0 > MAX_TIMEOUT {
                return Err(SpecError::new("timeout", "must be between 1ms and 7 days"));
            }
        }
        self.retry.validate()?;
        if self.routing.labels.keys().any(String::is_empty) {
            return Err(SpecError::new(
                "routing.labels",
                "label names must not be empty",
            ));
        }
        if self
            .routing
            .affinity_key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > crate::dispatch::MAX_AFFINITY_KEY_BYTES)
        {
            return Err(SpecError::new(
                "routing.affinity_key",
                format!(
                    "must be 1 to {} bytes",
                    crate::dispatch::MAX_AFFINITY_KEY_BYTES
                ),
            ));
        }
        crate::dependency::validate(&name, &self.depends_on, self.deps_timeout)?;
        if self.schedule.is_none()
            && !self.depends_on.is_empty()
            && crate::dependency::upstreams(&self.depends_on).is_empty()
        {
            return Err(SpecError::new(
                "depends_on",
                "a job without a schedule runs once per run of the jobs it depends on, and this \
                 one names only events: give it a schedule (schedule: {event: KEY} runs once \
                 per event)",
            ));
        }
        if let Some(on_success) = &self.on_success {
            crate::event::validate_key("on_success.emit", &on_success.emit)?;
        }
        if let Some(rules) = &self.notify {
            crate::notify::validate("notify", rules)?;
        }
        if matches!(self.target, TargetSpec::Heartbeat(_)) {
            crate::heartbeat::validate_job(&self)?;
        }
        crate::shard::validate(&self)?;
        if let Some(deadline) = &self.deadline {
            deadline.validate("deadline")?;
        }
        self.flow().validate()?;
        let schedule = self.compiled_schedule(epoch)?;
        Ok(ValidJob {
            name,
            spec: self,
            schedule,
        })
    }
}

impl JobSpec {
    /// The job's schedule compiled with its blackout windows, set at `epoch`. Windows need a
    /// timer: an event's runs and a triggered run are not the schedule's instants.
    pub fn compiled_schedule(&self, epoch: Instant) -> Result<Schedule, SpecError> {
        compile_schedule(self.schedule.as_ref(), &self.blackouts, epoch)
    }

    /// How long a run of this job waits for its dependencies.
    pub fn deps_timeout(&self) -> std::time::Duration {
        self.deps_timeout
            .map_or(crate::dependency::DEFAULT_DEPS_TIMEOUT, |t| t.0)
    }

    /// Whether the job's runs come from its upstreams' runs (dependencies, no schedule).
    pub fn follows_upstreams(&self) -> bool {
        self.schedule.is_none() && !self.depends_on.is_empty()
    }

    /// The event key whose events start this job's runs (`schedule: {event}`).
    pub fn triggering_event(&self) -> Option<&str> {
        self.schedule.as_ref()?.event.as_deref()
    }

    /// The job's flow control (`crate::flow`).
    pub fn flow(&self) -> crate::flow::FlowFields<'_> {
        crate::flow::FlowFields {
            concurrency: &self.concurrency,
            rate_limit: &self.rate_limit,
            debounce: self.debounce.as_ref(),
            dedup: self.dedup.as_ref(),
        }
    }

    /// The event key each succeeded run posts.
    pub fn emits(&self) -> Option<&str> {
        Some(self.on_success.as_ref()?.emit.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<JobSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn the_design_example_is_accepted() {
        let job = parse(
            r#"{
              "name": "nightly-report",
              "description": "sales report",
              "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/London"},
              "target": {"shell": {"command": "python3 report.py", "env": {"LEVEL": "full"}}},
              "timeout": "10m",
              "retry": {"max_attempts": 3, "backoff": {"initial": "1s", "max": "5m", "multiplier": 2.0, "jitter": true}},
              "overlap": "skip",
              "misfire": {"policy": "run_once", "catchup_window": "1h"},
              "priority": 5,
              "routing": {"labels": {"zone": "eu"}, "strategy": "least_loaded", "affinity_key": null},
              "depends_on": [],
              "paused": false
            }"#,
        )
        .unwrap();
        assert_eq!(job.overlap, OverlapPolicy::Skip);
        assert_eq!(job.retry.max_attempts, 3);
    }

    #[test]
    fn priority_is_a_number_or_auto() {
        let priority = |json: &str| {
            parse(&format!(
                r#"{{"target": {{"shell": {{"command": "true"}}}}, "priority": {json}}}"#
            ))
            .map(|j| j.priority)
        };
        assert_eq!(priority("7").unwrap(), Priority::Fixed(7));
        assert_eq!(priority("-3").unwrap(), Priority::Fixed(-3));
        assert_eq!(priority(r#""auto""#).unwrap(), Priority::Auto);
        assert!(priority(r#""high""#).is_err());
        assert!(priority("4294967296").is_err());
        assert_eq!(
            serde_json::to_value(Priority::Auto).unwrap(),
            serde_json::json!("auto")
        );
    }

    #[test]
    fn unknown_fields_and_two_targets_are_rejected() {
        assert!(parse(r#"{"target": {"shell": {"command": "true"}}, "colour": 1}"#).is_err());
        assert!(parse(
            r#"{"target": {"shell": {"command": "true"}, "http": {"url": "http://x"}}}"#
        )
        .is_err());
    }

    #[test]
    fn names_are_checked_against_the_path() {
        let job = parse(r#"{"name": "a", "target": {"shell": {"command": "true"}}}"#).unwrap();
        let now = chrono::Utc::now();
        assert_eq!(
            job.clone().validate(Some("b"), now).unwrap_err().field,
            "name"
        );
        assert_eq!(job.validate(Some("a"), now).unwrap().name, "a");
        let unnamed = parse(r#"{"target": {"shell": {"command": "true"}}}"#).unwrap();
        assert_eq!(
            unnamed.clone().validate(None, now).unwrap_err().field,
            "name"
        );
        assert!(unnamed.validate(Some("bad name"), now).is_err());
    }
}

/// `schedule` compiled with the blackout windows `blackouts`, set at `epoch`: refused when
/// there are windows and no timer to apply them to.
pub fn compile_schedule(
    schedule: Option<&crate::schedule::ScheduleSpec>,
    blackouts: &[crate::schedule::BlackoutSpec],
    epoch: Instant,
) -> Result<Schedule, SpecError> {
    let mut compiled = Schedule::compile(schedule, epoch)?;
    if !blackouts.is_empty() {
        if compiled.is_manual() {
            return Err(SpecError::new(
                "blackouts",
                "apply to a timer schedule's instants: this job has none (an event's runs and \
                 triggered runs are never blacked out)",
            ));
        }
        compiled.set_blackouts(crate::schedule::Blackouts::compile(blackouts)?);
    }
    Ok(compiled)
}

/// Where a job's schedule stands: the part of a job record the firing loop moves forward.
#[derive(Debug, Clone, PartialEq)]
pub struct FiringState {
    pub state: JobState,
    pub next_fire_at: Option<Instant>,
    pub fired_count: u64,
    pub schedule_epoch: Instant,
}

/// The firing state once `job` is stored. A job whose schedule did not change keeps its place
/// (epoch, instants fired, next instant); a new or changed schedule starts afresh at `now`, so
/// re-applying the same definition never re-fires or skips anything.
pub fn firing_state_after_put(
    previous: Option<(&JobSpec, &FiringState)>,
    job: &ValidJob,
    now: Instant,
) -> Result<FiringState, SpecError> {
    let now = crate::ledger_instant(now);
    let (epoch, fired, next, schedule) = match previous {
        Some((old, state)) if old.schedule == job.spec.schedule => {
            // The job's compiled schedule carries its calendar, resolved by the caller.
            let schedule = job.schedule.clone().with_epoch(state.schedule_epoch);
            (
                state.schedule_epoch,
                state.fired_count,
                state.next_fire_at,
                schedule,
            )
        }
        _ => {
            let schedule = job.schedule.clone().with_epoch(now);
            (now, 0, schedule.first(), schedule)
        }
    };
    let state = if next.is_none() && !schedule.is_manual() {
        JobState::Completed
    } else if job.spec.paused {
        JobState::Paused
    } else {
        JobState::Active
    };
    Ok(FiringState {
        state,
        next_fire_at: next,
        fired_count: fired,
        schedule_epoch: epoch,
    })
}

#[cfg(test)]
mod firing_state_tests {
    use super::*;

    fn job(every: &str, paused: bool) -> ValidJob {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "schedule": {"every": every},
            "target": {"shell": {"command": "true"}},
            "paused": paused,
        }))
        .unwrap();
        spec.validate(Some("j"), "2026-01-01T00:00:00Z".parse().unwrap())
            .unwrap()
    }

    #[test]
    fn an_unchanged_schedule_keeps_its_place() {
        let t0: Instant = "2026-01-01T00:00:00Z".parse().unwrap();
        let first = firing_state_after_put(None, &job("10s", false), t0).unwrap();
        assert_eq!(
            first.next_fire_at,
            Some("2026-01-01T00:00:10Z".parse().unwrap())
        );
        let moved = FiringState {
            fired_count: 3,
            next_fire_at: Some("2026-01-01T00:00:40Z".parse().unwrap()),
            ..first.clone()
        };
        let later = t0 + chrono::Duration::seconds(35);
        let old = job("10s", false);
        let again =
            firing_state_after_put(Some((&old.spec, &moved)), &job("10s", true), later).unwrap();
        assert_eq!(
            (again.fired_count, again.next_fire_at),
            (3, moved.next_fire_at)
        );
        assert_eq!(again.state, JobState::Paused);
        let changed =
            firing_state_after_put(Some((&old.spec, &moved)), &job("7s", false), later).unwrap();
        assert_eq!(changed.fired_count, 0);
        assert_eq!(changed.schedule_epoch, later);
    }
}

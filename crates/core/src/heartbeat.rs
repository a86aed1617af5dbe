//! The dead-man's switch: a job whose target is `heartbeat` runs nothing. Each of its runs,
//! recorded at its instant like any other, waits for a ping until the instant plus its `grace`;
//! a ping ends the oldest run waiting for one `succeeded`, and a run whose grace passed without
//! one ends `failed`, which is what its `notify` rules alert on.
//!
//! A ping that comes while no run waits (a script that ran a little before the instant, or a
//! second ping) is kept as the job's last ping, and a run whose grace passes credits it if it
//! came no earlier than the instant less the grace; a kept ping is credited once.
//!
//! Pure: the store keeps the waits and the last ping and applies these verdicts.

use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::job::JobSpec;
use crate::Instant;
use std::time::Duration;

/// The longest grace: a month, the longest wait anything in sked keeps open.
pub const MAX_GRACE: Duration = Duration::from_secs(31 * 24 * 3600);
/// The shortest grace: a ping's round trip and the firing loop's batching need a moment.
pub const MIN_GRACE: Duration = Duration::from_secs(1);

pub fn validate_grace(grace: HumanDuration) -> Result<(), SpecError> {
    if grace.0 < MIN_GRACE || grace.0 > MAX_GRACE {
        return Err(SpecError::new(
            "target.heartbeat.grace",
            "must be between 1s and 31 days",
        ));
    }
    Ok(())
}

/// A heartbeat job expects pings at the instants of a time schedule, and nothing else applies.
pub fn validate_job(spec: &JobSpec) -> Result<(), SpecError> {
    let timed = spec.schedule.as_ref().is_some_and(|s| s.event.is_none());
    if !timed {
        return Err(SpecError::new(
            "schedule",
            "a heartbeat job needs a schedule (cron, every or at): its instants are when pings \
             are due",
        ));
    }
    if !spec.depends_on.is_empty() {
        return Err(SpecError::new(
            "depends_on",
            "a heartbeat job waits for pings, not for other jobs",
        ));
    }
    if spec.retry.max_attempts > 1 {
        return Err(SpecError::new(
            "retry",
            "a heartbeat run is never retried: a missing ping is a fact, not an error",
        ));
    }
    Ok(())
}

/// Whether a kept ping at `last_ping` answers the run of `instant` whose `grace` has passed.
pub fn credits(last_ping: Option<Instant>, instant: Instant, grace: Duration) -> bool {
    let grace = chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
    last_ping.is_some_and(|ping| ping >= instant - grace && ping <= instant + grace)
}

/// The error of a run whose grace passed without a ping.
pub fn missing_ping(grace: Duration) -> String {
    format!("no ping within {} of its instant", HumanDuration(grace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Instant {
        Instant::UNIX_EPOCH + chrono::Duration::seconds(1_700_000_000 + secs)
    }

    #[test]
    fn a_kept_ping_answers_a_run_within_its_grace_either_side() {
        let grace = Duration::from_secs(60);
        assert!(credits(Some(at(-60)), at(0), grace), "a minute early");
        assert!(credits(Some(at(30)), at(0), grace));
        assert!(
            !credits(Some(at(-61)), at(0), grace),
            "too early: the run before's"
        );
        assert!(!credits(Some(at(61)), at(0), grace), "after the deadline");
        assert!(!credits(None, at(0), grace));
    }

    #[test]
    fn a_heartbeat_job_needs_a_time_schedule_and_no_dependencies_or_retries() {
        let job = |extra: serde_json::Value| {
            let mut json = serde_json::json!({"target": {"heartbeat": {"grace": "5m"}}});
            for (k, v) in extra.as_object().unwrap() {
                json[k] = v.clone();
            }
            serde_json::from_value::<JobSpec>(json)
                .unwrap()
                .validate(Some("backup-ping"), at(0))
                .map_err(|e| e.field)
        };
        assert!(job(serde_json::json!({"schedule": {"cron": "0 0 2 * * *"}})).is_ok());
        assert_eq!(job(serde_json::json!({})).unwrap_err(), "schedule");
        assert_eq!(
            job(serde_json::json!({"schedule": {"event": "x"}})).unwrap_err(),
            "schedule"
        );
        assert_eq!(
            job(serde_json::json!({"schedule": {"every": "1h"}, "retry": {"max_attempts": 3}}))
                .unwrap_err(),
            "retry"
        );
        let grace = |g: &str| {
            serde_json::from_value::<JobSpec>(serde_json::json!({
                "schedule": {"every": "1h"},
                "target": {"heartbeat": {"grace": g}}
            }))
            .unwrap()
            .validate(Some("p"), at(0))
            .map_err(|e| e.field)
        };
        assert_eq!(grace("500ms").unwrap_err(), "target.heartbeat.grace");
        assert_eq!(grace("32days").unwrap_err(), "target.heartbeat.grace");
        assert!(grace("1s").is_ok());
    }

    #[test]
    fn the_missing_ping_says_the_grace() {
        assert_eq!(
            missing_ping(Duration::from_secs(300)),
            "no ping within 5m of its instant"
        );
    }
}

//! Deadlines: when a job's runs must have started and finished (`deadline`), what that makes
//! of one run's instant, whether a run missed one and by how much, and when a run that has not
//! missed yet is at risk of it (with `estimate.rs`, the finish predicted from history).
//!
//! Everything here is pure: the server's deadline watcher reads the runs and their history,
//! asks these functions, and has the store record what they answer.

pub mod estimate;

use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::run::RunState;
use crate::Instant;
use chrono::{Duration as Span, NaiveTime};
use chrono_tz::Tz;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::time::Duration;

/// A time zone, as deadlines' local times are read in.
pub type Zone = Tz;

/// The latest a deadline may fall after its run's instant (and the longest `max_duration`).
pub const MAX_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most days `day_offset` moves a local time.
pub const MAX_DAY_OFFSET: u8 = 6;

/// A job's `deadline` as users write it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlineSpec {
    /// The run must have started by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_by: Option<By>,
    /// The run must have ended by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_by: Option<By>,
    /// Days after the instant's local day that the local times of `start_by` and `finish_by`
    /// fall on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub day_offset: u8,
    /// A run may run this long at most (from its first attempt's start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<HumanDuration>,
    /// Also call the run at risk once it is still unfinished this long before `finish_by`,
    /// whatever its history predicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_before: Option<HumanDuration>,
    /// The zone of the local times: the schedule's (or its calendar's) when absent, UTC when
    /// the schedule has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// A deadline: a duration after the run's instant (`"45m"`), or a local time (`"07:30"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    After(HumanDuration),
    At(NaiveTime),
}

impl Serialize for By {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            By::After(d) => d.serialize(s),
            By::At(t) if t.format("%S").to_string() == "00" => s.collect_str(&t.format("%H:%M")),
            By::At(t) => s.collect_str(&t.format("%H:%M:%S")),
        }
    }
}

impl<'de> Deserialize<'de> for By {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.contains(':') {
            crate::schedule::business::parse_time(&text)
                .map(By::At)
                .map_err(serde::de::Error::custom)
        } else {
            text.parse().map(By::After).map_err(|e: String| {
                serde::de::Error::custom(format!("{e}; or a local time of day such as \"07:30\""))
            })
        }
    }
}

/// Which deadline a run missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineKind {
    StartBy,
    FinishBy,
    MaxDuration,
}

string_enum!(DeadlineKind {
    StartBy => "start_by",
    FinishBy => "finish_by",
    MaxDuration => "max_duration",
});

/// One run's deadlines, as instants: what its job's `deadline` made of its instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunDeadline {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_by: Option<Instant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_by: Option<Instant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<HumanDuration>,
    /// From then on the run is at risk while unfinished (`finish_by` less `warn_before`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_at: Option<Instant>,
}

/// A deadline a run missed, and by how much: up to when it was judged while the run was still
/// short of it, final once the run has started (`start_by`) or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Miss {
    pub kind: DeadlineKind,
    pub by_ms: u64,
}

/// A run called at risk of missing its `finish_by`: when, and the finish predicted then
/// (`None` when `warn_before` called it, with no prediction past the deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AtRisk {
    pub at: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_finish: Option<Instant>,
}

impl DeadlineSpec {
    /// Checks a `deadline`; `field` is where it is.
    pub fn validate(&self, field: &str) -> Result<(), SpecError> {
        if self.start_by.is_none() && self.finish_by.is_none() && self.max_duration.is_none() {
            return Err(SpecError::new(
                field,
                "name at least one of start_by, finish_by or max_duration",
            ));
        }
        let within = |name: &str, d: HumanDuration| {
            if d.0.is_zero() || d.0 > MAX_DEADLINE {
                Err(SpecError::new(
                    format!("{field}.{name}"),
                    "must be between 1ms and 7 days",
                ))
            } else {
                Ok(())
            }
        };
        for (name, by) in [("start_by", self.start_by), ("finish_by", self.finish_by)] {
            if let Some(By::After(d)) = by {
                within(name, d)?;
            }
        }
        if let Some(d) = self.max_duration {
            within("max_duration", d)?;
        }
        if let (Some(By::After(start)), Some(By::After(finish))) = (self.start_by, self.finish_by) {
            if finish <= start {
                return Err(SpecError::new(
                    format!("{field}.finish_by"),
                    format!("{finish} is not after start_by ({start})"),
                ));
            }
        }
        if let (Some(By::At(start)), Some(By::At(finish))) = (self.start_by, self.finish_by) {
            if finish == start {
                return Err(SpecError::new(
                    format!("{field}.finish_by"),
                    "is the same time of day as start_by",
                ));
            }
        }
        let local = |by: Option<By>| matches!(by, Some(By::At(_)));
        let any_local = local(self.start_by) || local(self.finish_by);
        if self.day_offset > MAX_DAY_OFFSET {
            return Err(SpecError::new(
                format!("{field}.day_offset"),
                format!("must be 0 to {MAX_DAY_OFFSET}"),
            ));
        }
        if self.day_offset > 0 && !any_local {
            return Err(SpecError::new(
                format!("{field}.day_offset"),
                "applies only to local times (start_by or finish_by as \"HH:MM\")",
            ));
        }
        if let Some(name) = &self.timezone {
            if !any_local {
                return Err(SpecError::new(
                    format!("{field}.timezone"),
                    "applies only to local times (start_by or finish_by as \"HH:MM\")",
                ));
            }
            if name.parse::<Tz>().is_err() {
                return Err(SpecError::new(
                    format!("{field}.timezone"),
                    format!("{name:?} is not an IANA time zone such as Europe/London"),
                ));
            }
        }
        match (self.warn_before, self.finish_by) {
            (Some(_), None) => {
                return Err(SpecError::new(
                    format!("{field}.warn_before"),
                    "applies only with finish_by",
                ))
            }
            (Some(d), Some(_)) => within("warn_before", d)?,
            _ => {}
        }
        Ok(())
    }

    /// The calendar whose zone the local times are in, when the deadline names no zone and
    /// the job's schedule gives none but names a calendar: the caller reads its zone for
    /// [`DeadlineSpec::zone`].
    pub fn zone_calendar<'a>(&self, job: &'a crate::job::JobSpec) -> Option<&'a str> {
        let local = [self.start_by, self.finish_by]
            .iter()
            .any(|by| matches!(by, Some(By::At(_))));
        let schedule = job.schedule.as_ref()?;
        if !local || self.timezone.is_some() || schedule.timezone.is_some() {
            return None;
        }
        schedule.calendar.as_deref()
    }

    /// The zone of the local times: the deadline's own, the schedule's, the zone of the
    /// calendar it names (`calendar_zone`, read by the caller), or UTC.
    pub fn zone(&self, job: &crate::job::JobSpec, calendar_zone: Option<&str>) -> Tz {
        let schedule_zone = job.schedule.as_ref().and_then(|s| s.timezone.as_deref());
        self.timezone
            .as_deref()
            .or(schedule_zone)
            .or(calendar_zone)
            .and_then(|name| name.parse().ok())
            .unwrap_or(Tz::UTC)
    }

    /// What this deadline makes of a run's `instant`, its local times in `zone`
    /// ([`DeadlineSpec::zone`]).
    ///
    /// A local time is the first time the clock shows it at or after the instant, `day_offset`
    /// days later: `finish_by: "07:30"` of a 06:00 run is 07:30 that day, of a 23:00 run 07:30
    /// the next morning. A time a DST change skips is the first instant after the gap, a time
    /// it repeats its first pass, as cron's instants are.
    pub fn resolve(&self, instant: Instant, zone: Tz) -> RunDeadline {
        let at = |by: By| -> Option<Instant> {
            match by {
                By::After(d) => instant.checked_add_signed(d.as_chrono()),
                By::At(time) => {
                    let local = instant.with_timezone(&zone).date_naive();
                    let same_day = crate::schedule::cron::local_to_utc(local.and_time(time), zone)?;
                    let first = if same_day >= instant {
                        same_day
                    } else {
                        let next = local.succ_opt()?;
                        crate::schedule::cron::local_to_utc(next.and_time(time), zone)?
                    };
                    let date = first.with_timezone(&zone).date_naive();
                    let shifted =
                        date.checked_add_days(chrono::Days::new(self.day_offset.into()))?;
                    crate::schedule::cron::local_to_utc(shifted.and_time(time), zone)
                }
            }
        };
        let finish_by = self.finish_by.and_then(at);
        RunDeadline {
            start_by: self.start_by.and_then(at),
            finish_by,
            max_duration: self.max_duration,
            warn_at: finish_by
                .zip(self.warn_before)
                .and_then(|(f, w)| f.checked_sub_signed(w.as_chrono())),
        }
    }
}

/// What the deadlines need to know of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunProgress {
    pub state: RunState,
    pub started_at: Option<Instant>,
    pub finished_at: Option<Instant>,
}

/// The deadlines `run` has missed by `now`, each with by how much.
///
/// A deadline is missed when the run was still short of it when it passed: not started at
/// `start_by`, not ended at `finish_by`, running past `max_duration`. A skipped run never ran
/// and misses nothing; a run that ended (however) before a deadline did not miss it.
pub fn missed(deadline: &RunDeadline, run: &RunProgress, now: Instant) -> Vec<Miss> {
    if run.state == RunState::Skipped {
        return Vec::new();
    }
    let ended = if run.state.is_terminal() {
        run.finished_at.unwrap_or(now)
    } else {
        now
    };
    let late = |deadline: Instant, reached: Instant| {
        (reached > deadline).then(|| (reached - deadline).num_milliseconds().max(0) as u64)
    };
    let mut misses = Vec::new();
    if let Some(start_by) = deadline.start_by {
        // A run that ended without starting was still waiting when it ended.
        if let Some(by) = late(start_by, run.started_at.unwrap_or(ended)) {
            misses.push(Miss {
                kind: DeadlineKind::StartBy,
                by_ms: by,
            });
        }
    }
    if let Some(by) = deadline.finish_by.and_then(|f| late(f, ended)) {
        misses.push(Miss {
            kind: DeadlineKind::FinishBy,
            by_ms: by,
        });
    }
    let overran = deadline
        .max_duration
        .zip(run.started_at)
        .and_then(|(max, started)| late(started.checked_add_signed(max.as_chrono())?, ended));
    if let Some(by) = overran {
        misses.push(Miss {
            kind: DeadlineKind::MaxDuration,
            by_ms: by,
        });
    }
    misses
}

/// Whether an unfinished run is at risk at `now`: its `finish_by` has not passed yet, and
/// either `warn_before` has come or the finish `estimated` passes it.
pub fn at_risk(
    deadline: &RunDeadline,
    run: &RunProgress,
    estimated: Option<Instant>,
    now: Instant,
) -> Option<AtRisk> {
    let finish_by = deadline.finish_by?;
    if run.state.is_terminal() || now >= finish_by {
        return None;
    }
    let predicted = estimated.filter(|e| *e > finish_by);
    let warned = deadline.warn_at.is_some_and(|w| now >= w);
    (predicted.is_some() || warned).then_some(AtRisk {
        at: now,
        estimated_finish: predicted,
    })
}

/// Misses merged: those `new` adds, and `old`'s amounts brought up to date.
pub fn merge_misses(old: &[Miss], new: &[Miss]) -> Vec<Miss> {
    let mut merged = old.to_vec();
    for miss in new {
        match merged.iter_mut().find(|m| m.kind == miss.kind) {
            Some(known) => known.by_ms = known.by_ms.max(miss.by_ms),
            None => merged.push(*miss),
        }
    }
    merged.sort_by_key(|m| m.kind);
    merged
}

/// How long after `from` the instant `to` is, none when it is not.
pub(crate) fn span(from: Instant, to: Instant) -> Duration {
    (to - from).to_std().unwrap_or_default()
}

/// `t` plus `d`, saturating.
pub(crate) fn plus(t: Instant, d: Duration) -> Instant {
    Span::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn t(h: u32, m: u32) -> Instant {
        Utc.with_ymd_and_hms(2026, 3, 10, h, m, 0).unwrap()
    }

    fn spec(json: &str) -> DeadlineSpec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn durations_and_local_times_parse_and_print_back() {
        let d = spec(r#"{"start_by": "10m", "finish_by": "07:30", "day_offset": 1}"#);
        assert_eq!(d.start_by, Some(By::After(HumanDuration::from_secs(600))));
        assert_eq!(
            d.finish_by,
            Some(By::At(NaiveTime::from_hms_opt(7, 30, 0).unwrap()))
        );
        let back = serde_json::to_value(&d).unwrap();
        assert_eq!(back["finish_by"], "07:30");
        assert_eq!(back["start_by"], "10m");
        assert!(serde_json::from_str::<DeadlineSpec>(r#"{"finish_by": "25:00"}"#).is_err());
        assert!(serde_json::from_str::<DeadlineSpec>(r#"{"finish_by": "soon"}"#).is_err());
    }

    #[test]
    fn bad_deadlines_name_their_field() {
        let field = |json: &str| spec(json).validate("deadline").unwrap_err().field;
        assert_eq!(field("{}"), "deadline");
        assert_eq!(
            field(r#"{"start_by": "30m", "finish_by": "10m"}"#),
            "deadline.finish_by"
        );
        assert_eq!(
            field(r#"{"start_by": "07:00", "finish_by": "07:00"}"#),
            "deadline.finish_by"
        );
        assert_eq!(field(r#"{"finish_by": "8d"}"#), "deadline.finish_by");
        assert_eq!(field(r#"{"max_duration": "0s"}"#), "deadline.max_duration");
        assert_eq!(
            field(r#"{"finish_by": "1h", "day_offset": 1}"#),
            "deadline.day_offset"
        );
        assert_eq!(
            field(r#"{"finish_by": "07:30", "day_offset": 9}"#),
            "deadline.day_offset"
        );
        assert_eq!(
            field(r#"{"start_by": "1h", "warn_before": "5m"}"#),
            "deadline.warn_before"
        );
        assert_eq!(
            field(r#"{"finish_by": "07:30", "timezone": "Mars/Olympus"}"#),
            "deadline.timezone"
        );
        spec(r#"{"start_by": "23:30", "finish_by": "01:00", "warn_before": "30m"}"#)
            .validate("deadline")
            .unwrap();
    }

    #[test]
    fn a_local_time_is_the_first_at_or_after_the_instant_then_day_offset_days_on() {
        let d = spec(r#"{"finish_by": "07:30"}"#);
        assert_eq!(d.resolve(t(6, 0), Tz::UTC).finish_by, Some(t(7, 30)));
        let night = Utc.with_ymd_and_hms(2026, 3, 9, 23, 0, 0).unwrap();
        assert_eq!(d.resolve(night, Tz::UTC).finish_by, Some(t(7, 30)));
        let next_day = spec(r#"{"finish_by": "07:30", "day_offset": 1}"#);
        assert_eq!(
            next_day.resolve(t(6, 0), Tz::UTC).finish_by,
            Some(Utc.with_ymd_and_hms(2026, 3, 11, 7, 30, 0).unwrap())
        );
        // New York is UTC-4 on 10 March 2026 (DST began on the 8th).
        let ny = spec(r#"{"finish_by": "18:00"}"#);
        assert_eq!(
            ny.resolve(t(12, 0), chrono_tz::America::New_York).finish_by,
            Some(t(22, 0))
        );
        let after = spec(r#"{"start_by": "10m", "finish_by": "1h", "warn_before": "15m"}"#);
        let resolved = after.resolve(t(6, 0), Tz::UTC);
        assert_eq!(resolved.start_by, Some(t(6, 10)));
        assert_eq!(resolved.finish_by, Some(t(7, 0)));
        assert_eq!(resolved.warn_at, Some(t(6, 45)));
    }

    #[test]
    fn a_local_time_in_a_dst_gap_is_the_gaps_end() {
        // London skips 01:00-02:00 on 29 March 2026.
        let d = spec(r#"{"finish_by": "01:30"}"#);
        let instant = Utc.with_ymd_and_hms(2026, 3, 29, 0, 0, 0).unwrap();
        assert_eq!(
            d.resolve(instant, chrono_tz::Europe::London).finish_by,
            Some(Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap())
        );
    }

    fn progress(
        state: RunState,
        started: Option<Instant>,
        finished: Option<Instant>,
    ) -> RunProgress {
        RunProgress {
            state,
            started_at: started,
            finished_at: finished,
        }
    }

    #[test]
    fn the_zone_is_the_deadlines_the_schedules_or_its_calendars() {
        let job =
            |schedule: serde_json::Value, deadline: serde_json::Value| -> crate::job::JobSpec {
                serde_json::from_value(serde_json::json!({
                    "schedule": schedule,
                    "target": {"shell": {"command": "true"}},
                    "deadline": deadline,
                }))
                .unwrap()
            };
        let local = serde_json::json!({"finish_by": "07:30"});
        let cron = job(
            serde_json::json!({"cron": "0 6 * * *", "timezone": "Europe/London"}),
            local.clone(),
        );
        let d = cron.deadline.clone().unwrap();
        assert_eq!(d.zone_calendar(&cron), None);
        assert_eq!(d.zone(&cron, None), chrono_tz::Europe::London);
        let business = job(
            serde_json::json!({"business_day": {"nth": -1, "at": "18:00"}, "calendar": "nyse"}),
            local,
        );
        let d = business.deadline.clone().unwrap();
        assert_eq!(d.zone_calendar(&business), Some("nyse"));
        assert_eq!(
            d.zone(&business, Some("America/New_York")),
            chrono_tz::America::New_York
        );
        let own = job(
            serde_json::json!({"every": "1h"}),
            serde_json::json!({"finish_by": "07:30", "timezone": "Asia/Tokyo"}),
        );
        let d = own.deadline.clone().unwrap();
        assert_eq!(d.zone_calendar(&own), None);
        assert_eq!(d.zone(&own, None), chrono_tz::Asia::Tokyo);
        let durations = job(
            serde_json::json!({"every": "1h", "calendar": "uk"}),
            serde_json::json!({"finish_by": "30m"}),
        );
        assert_eq!(
            durations
                .deadline
                .clone()
                .unwrap()
                .zone_calendar(&durations),
            None
        );
    }

    #[test]
    fn misses_are_judged_by_when_the_run_reached_each_point() {
        let d = spec(r#"{"start_by": "10m", "finish_by": "1h", "max_duration": "30m"}"#)
            .resolve(t(6, 0), Tz::UTC);
        let kinds = |run: RunProgress, now: Instant| -> Vec<(DeadlineKind, u64)> {
            missed(&d, &run, now)
                .iter()
                .map(|m| (m.kind, m.by_ms))
                .collect()
        };
        // Started in time, still running, nothing passed yet.
        assert!(kinds(progress(RunState::Running, Some(t(6, 5)), None), t(6, 20)).is_empty());
        // Still queued after start_by: missed by how long it has waited past it so far.
        assert_eq!(
            kinds(progress(RunState::Queued, None, None), t(6, 12)),
            vec![(DeadlineKind::StartBy, 120_000)]
        );
        // Started late, ran long, ended after finish_by.
        assert_eq!(
            kinds(
                progress(RunState::Failed, Some(t(6, 15)), Some(t(7, 5))),
                t(8, 0)
            ),
            vec![
                (DeadlineKind::StartBy, 300_000),
                (DeadlineKind::FinishBy, 300_000),
                (DeadlineKind::MaxDuration, 1_200_000),
            ]
        );
        // Ended before every deadline, however it ended, and skipped runs miss nothing.
        assert!(kinds(progress(RunState::Cancelled, None, Some(t(6, 5))), t(9, 0)).is_empty());
        assert!(kinds(progress(RunState::Skipped, None, Some(t(6, 0))), t(9, 0)).is_empty());
    }

    #[test]
    fn at_risk_when_predicted_late_or_warned_and_not_once_the_deadline_passed() {
        let d = spec(r#"{"finish_by": "1h", "warn_before": "10m"}"#).resolve(t(6, 0), Tz::UTC);
        let running = progress(RunState::Running, Some(t(6, 1)), None);
        assert_eq!(at_risk(&d, &running, Some(t(6, 50)), t(6, 20)), None);
        assert_eq!(
            at_risk(&d, &running, Some(t(7, 10)), t(6, 20)),
            Some(AtRisk {
                at: t(6, 20),
                estimated_finish: Some(t(7, 10))
            })
        );
        assert_eq!(
            at_risk(&d, &running, None, t(6, 50)),
            Some(AtRisk {
                at: t(6, 50),
                estimated_finish: None
            })
        );
        assert_eq!(at_risk(&d, &running, Some(t(8, 0)), t(7, 1)), None);
        let done = progress(RunState::Succeeded, Some(t(6, 1)), Some(t(6, 30)));
        assert_eq!(at_risk(&d, &done, Some(t(8, 0)), t(6, 50)), None);
    }

    #[test]
    fn merged_misses_keep_each_kind_once_with_its_latest_amount() {
        let a = Miss {
            kind: DeadlineKind::FinishBy,
            by_ms: 1000,
        };
        let b = Miss {
            kind: DeadlineKind::StartBy,
            by_ms: 10,
        };
        let merged = merge_misses(&[a], &[Miss { by_ms: 5000, ..a }, b]);
        assert_eq!(merged, vec![b, Miss { by_ms: 5000, ..a }]);
    }
}

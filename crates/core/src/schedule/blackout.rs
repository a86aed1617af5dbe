//! Blackout windows: stretches of time in which a job's instants do not run, one-off
//! (`from`, `to`) or repeating (a `cron` start and a `duration`), each with the reason its runs
//! are recorded `skipped (blackout)` with.
//!
//! A window with `cancel_running` also stops the runs of the jobs it covers that were already
//! running when it opened ([`stops`]): judged from the run's start and the time now alone, so
//! whichever node judges, and however often, the verdict is the same.
//!
//! Pure: a window says whether it covers an instant. Which windows a job has is its
//! definition's; applying them to the instants a schedule names is the schedule's; asking the
//! runs a window stops to stop is the server's.

use super::cron::CronExpr;
use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::run::Trigger;
use crate::Instant;
use chrono::Duration;
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// Windows one job may have.
pub const MAX_BLACKOUTS: usize = 50;
/// The longest repeating window.
pub const MAX_REPEATING: std::time::Duration = std::time::Duration::from_secs(31 * 86_400);
/// The longest reason, in bytes.
pub const MAX_REASON_BYTES: usize = 200;

/// A window as the API takes it: `from` and `to`, or `cron` (with `timezone`) and `duration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlackoutSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Instant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Instant>,
    /// When each repeating window opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The zone of `cron`; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// How long each repeating window stays open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<HumanDuration>,
    pub reason: String,
    /// When the window opens, the runs of the jobs it covers that are running then are
    /// cancelled (their worker told to stop), with the reason; otherwise they go on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_running: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Window {
    Once {
        from: Instant,
        to: Instant,
    },
    Repeating {
        cron: Box<CronExpr>,
        zone: Tz,
        duration: Duration,
    },
}

/// One checked window: when it is open, why, and whether it stops running runs.
#[derive(Debug, Clone, PartialEq)]
struct Checked {
    window: Window,
    reason: String,
    cancel_running: bool,
}

/// A job's windows, checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Blackouts {
    windows: Vec<Checked>,
}

impl Blackouts {
    /// Checks `specs` (the definition's `blackouts`), naming the field at fault.
    pub fn compile(specs: &[BlackoutSpec]) -> Result<Blackouts, SpecError> {
        if specs.len() > MAX_BLACKOUTS {
            return Err(SpecError::new(
                "blackouts",
                format!("at most {MAX_BLACKOUTS} windows"),
            ));
        }
        let mut windows = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let field = |name: &str| format!("blackouts[{i}].{name}");
            let reason = spec.reason.trim();
            if reason.is_empty()
                || spec.reason.len() > MAX_REASON_BYTES
                || spec.reason.chars().any(char::is_control)
            {
                return Err(SpecError::new(
                    field("reason"),
                    format!("must be 1 to {MAX_REASON_BYTES} bytes, without control characters"),
                ));
            }
            let window = match (spec.from, spec.to, &spec.cron, spec.duration) {
                (Some(from), Some(to), None, None) => {
                    if spec.timezone.is_some() {
                        return Err(SpecError::new(
                            field("timezone"),
                            "only applies to a repeating window (cron)",
                        ));
                    }
                    if to <= from {
                        return Err(SpecError::new(field("to"), "must be after from"));
                    }
                    Window::Once {
                        from: crate::ledger_instant(from),
                        to: crate::ledger_instant(to),
                    }
                }
                (None, None, Some(expr), Some(duration)) => {
                    let cron = CronExpr::parse(expr)
                        .map_err(|message| SpecError::new(field("cron"), message))?;
                    let zone = match &spec.timezone {
                        None => Tz::UTC,
                        Some(name) => name.parse::<Tz>().map_err(|_| {
                            SpecError::new(
                                field("timezone"),
                                format!("{name:?} is not an IANA time zone such as Europe/London"),
                            )
                        })?,
                    };
                    if duration.0.is_zero() || duration.0 > MAX_REPEATING {
                        return Err(SpecError::new(
                            field("duration"),
                            format!(
                                "must be above zero and at most {}",
                                HumanDuration(MAX_REPEATING)
                            ),
                        ));
                    }
                    Window::Repeating {
                        cron: Box::new(cron),
                        zone,
                        duration: duration.as_chrono(),
                    }
                }
                _ => {
                    return Err(SpecError::new(
                        format!("blackouts[{i}]"),
                        "give from and to (one window), or cron and duration (a repeating one)",
                    ))
                }
            };
            windows.push(Checked {
                window,
                reason: reason.to_string(),
                cancel_running: spec.cancel_running,
            });
        }
        Ok(Blackouts { windows })
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// The reason of the first window that covers `t`, if one does. A window covers its
    /// start and not its end.
    pub fn covering(&self, t: Instant) -> Option<&str> {
        self.windows
            .iter()
            .find(|checked| checked.window.opening(t).is_some())
            .map(|checked| checked.reason.as_str())
    }

    /// The reason of the first window with `cancel_running` that is open at `now` and opened
    /// after `started_at`: a run started then, still running, is to stop.
    pub fn stopping(&self, started_at: Instant, now: Instant) -> Option<&str> {
        self.windows
            .iter()
            .filter(|checked| checked.cancel_running)
            .find(|checked| {
                checked
                    .window
                    .opening(now)
                    .is_some_and(|open| open > started_at)
            })
            .map(|checked| checked.reason.as_str())
    }

    /// Whether a window stops running runs when it opens.
    pub fn stops_running(&self) -> bool {
        self.windows.iter().any(|checked| checked.cancel_running)
    }
}

impl Window {
    /// When the opening of the window that covers `t` was, if one does.
    fn opening(&self, t: Instant) -> Option<Instant> {
        match self {
            Window::Once { from, to } => (*from <= t && t < *to).then_some(*from),
            Window::Repeating {
                cron,
                zone,
                duration,
            } => {
                // The first opening after `t - duration` covers `t` if it is not after it.
                let since = t - *duration;
                cron.next_after(since, *zone).filter(|open| *open <= t)
            }
        }
    }
}

/// Whether a run of a job, started by `trigger` at `started_at` and running at `now`, is to
/// stop, and why (the run's error once it ends cancelled): a window of its job's or of its
/// namespace's with `cancel_running` opened after it started and is open now. Windows cover a
/// schedule's instants, so only runs of those (`schedule`, `backfill`) are stopped; a run
/// started by hand, by an event or by an upstream goes on, as windows never skip those.
pub fn stops(
    trigger: Trigger,
    started_at: Instant,
    now: Instant,
    job: &Blackouts,
    namespace: Option<&Blackouts>,
) -> Option<String> {
    if !matches!(trigger, Trigger::Schedule | Trigger::Backfill) {
        return None;
    }
    let reason = job
        .stopping(started_at, now)
        .or_else(|| namespace.and_then(|n| n.stopping(started_at, now)))?;
    Some(format!("cancelled by a blackout window: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Instant {
        s.parse().unwrap()
    }

    fn once(from: &str, to: &str, reason: &str) -> BlackoutSpec {
        BlackoutSpec {
            from: Some(t(from)),
            to: Some(t(to)),
            cron: None,
            timezone: None,
            duration: None,
            reason: reason.into(),
            cancel_running: false,
        }
    }

    fn repeating(cron: &str, zone: Option<&str>, duration: &str, reason: &str) -> BlackoutSpec {
        BlackoutSpec {
            from: None,
            to: None,
            cron: Some(cron.into()),
            timezone: zone.map(String::from),
            duration: Some(duration.parse().unwrap()),
            reason: reason.into(),
            cancel_running: false,
        }
    }

    #[test]
    fn a_window_covers_its_start_and_not_its_end() {
        let b = Blackouts::compile(&[once(
            "2026-12-20T00:00:00Z",
            "2027-01-04T00:00:00Z",
            "Change freeze",
        )])
        .unwrap();
        assert_eq!(b.covering(t("2026-12-19T23:59:59Z")), None);
        assert_eq!(b.covering(t("2026-12-20T00:00:00Z")), Some("Change freeze"));
        assert_eq!(b.covering(t("2027-01-03T23:59:59Z")), Some("Change freeze"));
        assert_eq!(b.covering(t("2027-01-04T00:00:00Z")), None);
    }

    #[test]
    fn a_repeating_window_opens_at_each_cron_instant_in_its_zone() {
        // Saturdays 22:00 to Sunday 02:00, London time: 21:00 UTC in summer.
        let b = Blackouts::compile(&[repeating(
            "0 22 * * SAT",
            Some("Europe/London"),
            "4h",
            "Weekly maintenance",
        )])
        .unwrap();
        assert_eq!(b.covering(t("2026-07-04T20:59:59Z")), None);
        assert_eq!(
            b.covering(t("2026-07-04T21:00:00Z")),
            Some("Weekly maintenance")
        );
        assert_eq!(
            b.covering(t("2026-07-05T00:59:59Z")),
            Some("Weekly maintenance")
        );
        assert_eq!(b.covering(t("2026-07-05T01:00:00Z")), None);
        // Winter: 22:00 GMT.
        assert_eq!(
            b.covering(t("2026-12-05T22:30:00Z")),
            Some("Weekly maintenance")
        );
        assert_eq!(b.covering(t("2026-12-05T21:30:00Z")), None);
    }

    #[test]
    fn bad_windows_name_their_field() {
        let field = |spec: BlackoutSpec| Blackouts::compile(&[spec]).unwrap_err().field;
        assert_eq!(
            field(once("2026-12-20T00:00:00Z", "2026-12-19T00:00:00Z", "x")),
            "blackouts[0].to"
        );
        assert_eq!(
            field(once("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z", " ")),
            "blackouts[0].reason"
        );
        assert_eq!(
            field(repeating("0 22 * * SAT", None, "32d", "x")),
            "blackouts[0].duration"
        );
        assert_eq!(
            field(repeating("not cron", None, "1h", "x")),
            "blackouts[0].cron"
        );
        assert_eq!(
            field(repeating("0 22 * * SAT", Some("Mars/Base"), "1h", "x")),
            "blackouts[0].timezone"
        );
        let mut both = once("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z", "x");
        both.cron = Some("0 22 * * SAT".into());
        assert_eq!(field(both), "blackouts[0]");
        let many = vec![once("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z", "x"); 51];
        assert_eq!(Blackouts::compile(&many).unwrap_err().field, "blackouts");
    }

    #[test]
    fn a_cancelling_window_stops_the_runs_that_started_before_it_opened() {
        let mut freeze = once("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z", "Freeze");
        freeze.cancel_running = true;
        let mut weekly = repeating("0 22 * * SAT", None, "4h", "Weekly maintenance");
        weekly.cancel_running = true;
        let job = Blackouts::compile(&[freeze]).unwrap();
        let ns = Blackouts::compile(&[weekly]).unwrap();
        let (before, open) = (t("2026-12-19T23:00:00Z"), t("2026-12-20T00:00:05Z"));
        assert!(job.stops_running());
        assert_eq!(
            stops(Trigger::Schedule, before, open, &job, None).as_deref(),
            Some("cancelled by a blackout window: Freeze")
        );
        assert_eq!(
            stops(Trigger::Backfill, before, open, &job, None).as_deref(),
            Some("cancelled by a blackout window: Freeze")
        );
        // Started inside the window (a run held in the queue): it goes on.
        assert_eq!(stops(Trigger::Schedule, open, open, &job, None), None);
        // Not yet open, or closed again: nothing to stop.
        assert_eq!(stops(Trigger::Schedule, before, before, &job, None), None);
        let after = t("2026-12-21T00:00:00Z");
        assert_eq!(stops(Trigger::Schedule, before, after, &job, None), None);
        // Runs that windows never skip go on.
        for trigger in [Trigger::Manual, Trigger::Event, Trigger::Dependency] {
            assert_eq!(stops(trigger, before, open, &job, None), None);
        }
        // The namespace's repeating window, the Saturday 22:00 opening.
        let none = Blackouts::default();
        let saturday = t("2026-12-05T22:00:01Z");
        assert_eq!(
            stops(
                Trigger::Schedule,
                t("2026-12-05T21:59:00Z"),
                saturday,
                &none,
                Some(&ns)
            )
            .as_deref(),
            Some("cancelled by a blackout window: Weekly maintenance")
        );
        assert_eq!(
            stops(
                Trigger::Schedule,
                t("2026-12-05T22:00:00Z"),
                saturday,
                &none,
                Some(&ns)
            ),
            None,
            "started as it opened"
        );
    }

    #[test]
    fn a_window_without_cancel_running_stops_nothing() {
        let quiet = Blackouts::compile(&[once(
            "2026-12-20T00:00:00Z",
            "2026-12-21T00:00:00Z",
            "Freeze",
        )])
        .unwrap();
        assert!(!quiet.stops_running());
        let (before, open) = (t("2026-12-19T23:00:00Z"), t("2026-12-20T00:00:05Z"));
        assert_eq!(quiet.covering(open), Some("Freeze"));
        assert_eq!(
            stops(Trigger::Schedule, before, open, &quiet, Some(&quiet)),
            None
        );
    }
}

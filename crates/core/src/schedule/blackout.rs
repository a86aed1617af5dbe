//! Blackout windows: stretches of time in which a job's instants do not run, one-off
//! (`from`, `to`) or repeating (a `cron` start and a `duration`), each with the reason its runs
//! are recorded `skipped (blackout)` with.
//!
//! Pure: a window says whether it covers an instant. Which windows a job has is its
//! definition's; applying them to the instants a schedule names is the schedule's.

use super::cron::CronExpr;
use crate::duration::HumanDuration;
use crate::error::SpecError;
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

/// A job's windows, checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Blackouts {
    windows: Vec<(Window, String)>,
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
            windows.push((window, reason.to_string()));
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
            .find(|(window, _)| match window {
                Window::Once { from, to } => *from <= t && t < *to,
                Window::Repeating {
                    cron,
                    zone,
                    duration,
                } => {
                    // The first opening after `t - duration` covers `t` if it is not after it.
                    let since = t - *duration;
                    cron.next_after(since, *zone).is_some_and(|open| open <= t)
                }
            })
            .map(|(_, reason)| reason.as_str())
    }
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
}

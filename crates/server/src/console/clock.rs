//! How a visitor reads instants: in the display zone they chose (UTC unless they chose
//! otherwise, kept in a cookie of their own beside the session) and relative to now ("3 min
//! ago"), with the exact instant on hover. The zone is a preference, never a permission: a
//! page shows the same instants whatever it is.
//!
//! Everything here is a plain function of the instant, the zone and now; it reads no request.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use maud::{html, Markup};
use sked_core::Instant;

/// The cookie that holds the display zone.
pub const COOKIE: &str = "sked_zone";
/// Longest cookie value taken (a zone's name is at most 32 bytes in the tz database).
const MAX_VALUE: usize = 80;

/// Where a visitor reads instants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Zone {
    #[default]
    Utc,
    /// The browser's own zone, as its script reported it when the visitor chose it.
    Browser(Tz),
    /// A zone the visitor named.
    Named(Tz),
    /// Each job's instants in its schedule's zone; instants of no job in UTC.
    Job,
}

impl Zone {
    /// The zone a cookie's value names; `None` for anything else (the visitor then reads UTC).
    pub fn parse(value: &str) -> Option<Zone> {
        if value.len() > MAX_VALUE {
            return None;
        }
        match value.split_once(':') {
            None if value == "utc" => Some(Zone::Utc),
            None if value == "job" => Some(Zone::Job),
            Some(("browser", name)) => name.parse().ok().map(Zone::Browser),
            Some(("zone", name)) => name.parse().ok().map(Zone::Named),
            _ => None,
        }
    }

    /// The cookie value that [`Zone::parse`] reads back as this zone.
    pub fn value(&self) -> String {
        match self {
            Zone::Utc => "utc".into(),
            Zone::Job => "job".into(),
            Zone::Browser(tz) => format!("browser:{}", tz.name()),
            Zone::Named(tz) => format!("zone:{}", tz.name()),
        }
    }

    /// What the header says of it.
    pub fn label(&self) -> String {
        match self {
            Zone::Utc => "UTC".into(),
            Zone::Job => "each job's zone".into(),
            Zone::Browser(tz) | Zone::Named(tz) => tz.name().into(),
        }
    }

    /// The zone an instant is shown in; `job` is the zone of the job it belongs to, if any.
    fn resolve(&self, job: Option<&str>) -> Tz {
        match self {
            Zone::Utc => Tz::UTC,
            Zone::Browser(tz) | Zone::Named(tz) => *tz,
            Zone::Job => job.and_then(|name| name.parse().ok()).unwrap_or(Tz::UTC),
        }
    }
}

/// The visitor's zone and the instant their page is made at.
#[derive(Debug, Clone)]
pub struct Clock {
    pub zone: Zone,
    now: Instant,
}

impl Clock {
    pub fn new(zone: Zone, now: Instant) -> Clock {
        Clock { zone, now }
    }

    /// The zone instants of no one job read in.
    pub fn tz(&self) -> Tz {
        self.zone.resolve(None)
    }

    /// The zone instants of a job whose schedule reads in `job_zone` read in.
    pub fn tz_of(&self, job_zone: Option<&str>) -> Tz {
        self.zone.resolve(job_zone)
    }

    /// An instant as how long ago (or from now) it is, the exact instant in the visitor's zone
    /// on hover; machine-readable too.
    pub fn when(&self, t: Option<Instant>) -> Markup {
        self.when_of(t, None)
    }

    /// Like [`Clock::when`], for an instant of a job whose schedule reads in `job_zone`.
    pub fn when_of(&self, t: Option<Instant>, job_zone: Option<&str>) -> Markup {
        match t {
            Some(t) => html! {
                time datetime=(t.to_rfc3339()) title=(absolute(t, self.zone.resolve(job_zone))) {
                    (relative(t, self.now))
                }
            },
            None => html! { span.none { "—" } },
        }
    }

    /// An instant written out in the visitor's zone, how long ago on hover: for instants read
    /// as dates (a schedule's next instants, a run's own instant).
    pub fn exact(&self, t: Option<Instant>, job_zone: Option<&str>) -> Markup {
        match t {
            Some(t) => html! {
                time datetime=(t.to_rfc3339()) title=(relative(t, self.now)) {
                    (absolute(t, self.zone.resolve(job_zone)))
                }
            },
            None => html! { span.none { "—" } },
        }
    }

    /// The instant a form's `datetime-local` input names (`2026-11-30T14:05`, seconds
    /// optional), read in the visitor's zone (UTC for "each job's zone"). A wall time the
    /// zone skips (a spring-forward gap) is refused; one it repeats is its earlier instant.
    pub fn parse_local(&self, text: &str) -> Result<Instant, String> {
        let text = text.trim();
        let naive = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
            .iter()
            .find_map(|pattern| chrono::NaiveDateTime::parse_from_str(text, pattern).ok())
            .ok_or_else(|| format!("{text:?} is not a date and time such as 2026-11-30T14:05"))?;
        let tz = self.zone.resolve(None);
        tz.from_local_datetime(&naive)
            .earliest()
            .map(|t| t.with_timezone(&Utc))
            .ok_or_else(|| {
                format!(
                    "{text} does not exist in {} (the clocks skip it)",
                    tz.name()
                )
            })
    }
}

/// `t` in `tz`, to the second, with the zone's abbreviation (`2026-03-29 03:30:00 CEST`).
pub fn absolute(t: Instant, tz: Tz) -> String {
    let local: DateTime<Tz> = tz.from_utc_datetime(&t.naive_utc());
    local.format("%Y-%m-%d %H:%M:%S %Z").to_string()
}

/// How far `t` is from `now`, shortly: `just now`, `42 s ago`, `3 min ago`, `in 2 h`, `5 d ago`.
pub fn relative(t: Instant, now: DateTime<Utc>) -> String {
    let seconds = (now - t).num_seconds();
    let ahead = seconds < 0;
    let s = seconds.unsigned_abs();
    if s < 5 {
        return "just now".into();
    }
    let amount = match s {
        0..=89 => format!("{s} s"),
        90..=5_399 => format!("{} min", (s + 30) / 60),
        5_400..=129_599 => format!("{} h", (s + 1_800) / 3_600),
        129_600..=5_183_999 => format!("{} d", (s + 43_200) / 86_400),
        _ => format!("{} mo", (s + 1_296_000) / 2_592_000),
    };
    if ahead {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn a_cookie_names_a_zone_or_nothing() {
        assert_eq!(Zone::parse("utc"), Some(Zone::Utc));
        assert_eq!(Zone::parse("job"), Some(Zone::Job));
        assert_eq!(
            Zone::parse("browser:Europe/Paris"),
            Some(Zone::Browser(Tz::Europe__Paris))
        );
        assert_eq!(
            Zone::parse("zone:America/New_York"),
            Some(Zone::Named(Tz::America__New_York))
        );
        for bad in [
            "",
            "UTC",
            "zone:Mars/Olympus",
            "browser:",
            "zone",
            &"x".repeat(200),
        ] {
            assert_eq!(Zone::parse(bad), None, "{bad:?}");
        }
        for zone in [Zone::Utc, Zone::Job, Zone::Named(Tz::Asia__Kolkata)] {
            assert_eq!(Zone::parse(&zone.value()), Some(zone));
        }
    }

    #[test]
    fn relative_times_read_in_their_unit() {
        let now = Utc::now();
        let ago = |s: i64| relative(now - Duration::seconds(s), now);
        assert_eq!(ago(2), "just now");
        assert_eq!(ago(42), "42 s ago");
        assert_eq!(ago(180), "3 min ago");
        assert_eq!(ago(7_200), "2 h ago");
        assert_eq!(ago(5 * 86_400), "5 d ago");
        assert_eq!(ago(-125), "in 2 min");
        assert_eq!(ago(120 * 86_400), "4 mo ago");
    }

    #[test]
    fn an_instant_reads_in_the_chosen_zone_and_in_its_jobs_zone() {
        let t: Instant = "2026-07-01T12:00:00Z".parse().unwrap();
        assert_eq!(absolute(t, Tz::UTC), "2026-07-01 12:00:00 UTC");
        assert_eq!(absolute(t, Tz::Europe__Paris), "2026-07-01 14:00:00 CEST");
        let job = Clock::new(Zone::Job, t);
        let shown = job.exact(Some(t), Some("Asia/Tokyo")).into_string();
        assert!(shown.contains("2026-07-01 21:00:00 JST"), "{shown}");
        // A job without a zone, or with one the tz database lacks, reads in UTC.
        let shown = job.exact(Some(t), Some("Nowhere/Else")).into_string();
        assert!(shown.contains("12:00:00 UTC"), "{shown}");
        let paris = Clock::new(Zone::Browser(Tz::Europe__Paris), t);
        assert_eq!(paris.parse_local("2026-07-01T14:00"), Ok(t));
        assert!(
            paris.parse_local("2026-03-29T02:30").is_err(),
            "in the spring gap"
        );
        assert!(paris.parse_local("yesterday").is_err());
        assert_eq!(
            Clock::new(Zone::Job, t).parse_local("2026-07-01T12:00:00"),
            Ok(t)
        );
        let named = Clock::new(Zone::Named(Tz::America__New_York), t);
        let shown = named.when(Some(t - Duration::minutes(3))).into_string();
        assert!(shown.contains(">3 min ago<"), "{shown}");
        assert!(
            shown.contains("title=\"2026-07-01 07:57:00 EDT\""),
            "{shown}"
        );
    }
}

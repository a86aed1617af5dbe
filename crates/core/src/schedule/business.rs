//! Schedules that meet a calendar: the business-day forms (`business_day`,
//! `every_business_days`), and what a calendar does to the instants of any other form
//! (`on_holiday`: remove them, or move them to a business day).
//!
//! An instant a schedule names (its nominal instant) that falls on a business day runs as it is.
//! One on a closed day is removed (recorded `skipped (calendar)` with the reason), or moved to
//! the next or previous business day at the same local time. A business day takes a moved run
//! only when the schedule names no instant of its own that day, and only one: of the instants
//! of one closed stretch moving to it, the one nearest to it moves and the others are removed.
//! So a daily job never runs twice on a business day, and a monthly one still runs once a
//! month.
//!
//! Each instant's outcome has one moment it falls due: a run's instant, or, for a removed
//! instant, its own. Those moments are strictly increasing along the schedule's nominal
//! instants, which is what lets the firing loop walk them with one instant as its cursor.

use super::cron;
use crate::calendar::Calendar;
use crate::run::SkipReason;
use crate::Instant;
use chrono::{Datelike, Days, Duration, NaiveDate, NaiveTime, TimeZone};
use serde::{Deserialize, Serialize};

/// What a calendar does to an instant on a closed day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnHoliday {
    /// Recorded `skipped (calendar)`.
    #[default]
    Skip,
    /// Runs on the next business day, at the same local time.
    NextBusinessDay,
    /// Runs on the previous business day, at the same local time.
    PreviousBusinessDay,
}

string_enum!(OnHoliday {
    Skip => "skip",
    NextBusinessDay => "next_business_day",
    PreviousBusinessDay => "previous_business_day",
});

/// `business_day: {nth, at}`: the nth business day of each month (negative counts from the
/// end: -1 is the last), at a local time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusinessDaySpec {
    pub nth: i32,
    /// `HH:MM` or `HH:MM:SS` in the calendar's zone; midnight when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// `every_business_days: N`, or `{every: N, at}`: every Nth business day, counted from the
/// schedule's anchor date (the day it was set when absent), at a local time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EveryBusinessDaysSpec {
    Days(u32),
    At {
        every: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<String>,
    },
}

/// A number, or an object with exactly `every` and `at`: serde's untagged enums would also take
/// an array for the object, and unknown fields in it.
impl<'de> Deserialize<'de> for EveryBusinessDaysSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct At {
            every: u32,
            #[serde(default)]
            at: Option<String>,
        }
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Number(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(EveryBusinessDaysSpec::Days)
                .ok_or_else(|| D::Error::custom("must be a whole number of business days")),
            object @ serde_json::Value::Object(_) => serde_json::from_value::<At>(object)
                .map(|a| EveryBusinessDaysSpec::At {
                    every: a.every,
                    at: a.at,
                })
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "expected a number of business days, or {\"every\": N, \"at\": \"HH:MM\"}",
            )),
        }
    }
}

impl EveryBusinessDaysSpec {
    pub fn every(&self) -> u32 {
        match self {
            EveryBusinessDaysSpec::Days(n) | EveryBusinessDaysSpec::At { every: n, .. } => *n,
        }
    }

    pub fn at(&self) -> Option<&str> {
        match self {
            EveryBusinessDaysSpec::Days(_) => None,
            EveryBusinessDaysSpec::At { at, .. } => at.as_deref(),
        }
    }
}

/// The largest `business_day.nth`: no month has more than 23 weekdays.
pub const MAX_NTH: i32 = 23;
/// The largest `every_business_days`: about a quarter.
pub const MAX_EVERY_BUSINESS_DAYS: u32 = 66;
/// How many months a `business_day` schedule looks ahead for a month with its nth day.
const MONTHS_AHEAD: u32 = 120;

/// A local time of day as written: `HH:MM` or `HH:MM:SS`.
pub fn parse_time(text: &str) -> Result<NaiveTime, String> {
    NaiveTime::parse_from_str(text, "%H:%M:%S")
        .or_else(|_| NaiveTime::parse_from_str(text, "%H:%M"))
        .map_err(|_| format!("{text:?} is not a time of day: write HH:MM or HH:MM:SS"))
}

/// The instant of local `date` at `time` in the calendar's zone (a time in a gap runs at the
/// gap's end, a repeated one at its first pass, as cron does).
fn at_local(cal: &Calendar, date: NaiveDate, time: NaiveTime) -> Option<Instant> {
    cron::local_to_utc(date.and_time(time), cal.zone())
}

/// The local time of day of `t` in the calendar's zone.
fn local_time(cal: &Calendar, t: Instant) -> NaiveTime {
    t.with_timezone(&cal.zone()).time()
}

/// The first business-day-`nth` instant strictly after `floor`.
pub(super) fn nth_business_day_after(
    cal: &Calendar,
    nth: i32,
    time: NaiveTime,
    floor: Instant,
) -> Option<Instant> {
    let start = cal.local_date(floor);
    let (mut year, mut month) = (start.year(), start.month());
    for _ in 0..MONTHS_AHEAD {
        if let Some(day) = cal.nth_business_day(year, month, nth) {
            if let Some(t) = at_local(cal, day, time).filter(|t| *t > floor) {
                return Some(t);
            }
        }
        (year, month) = if month == 12 {
            (year + 1, 1)
        } else {
            (year, month + 1)
        };
    }
    None
}

/// The first instant strictly after `floor` of every `n`th business day counted from `anchor`
/// (the anchor's own date, when a business day, is number 0).
pub(super) fn every_business_days_after(
    cal: &Calendar,
    n: u32,
    anchor: NaiveDate,
    time: NaiveTime,
    floor: Instant,
) -> Option<Instant> {
    let n = u64::from(n.max(1));
    let from = cal.local_date(floor).max(anchor);
    let mut index = cal.business_days_between(anchor, from);
    let horizon = crate::calendar::SEARCH_DAYS * n;
    let mut day = from;
    for _ in 0..=horizon {
        if cal.is_business_day(day) {
            if index.is_multiple_of(n) {
                if let Some(t) = at_local(cal, day, time).filter(|t| *t > floor) {
                    return Some(t);
                }
            }
            index += 1;
        }
        day = day.succ_opt()?;
    }
    None
}

/// What became of one nominal instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// When it falls due: its run's instant, or, when removed, its own.
    pub due: Instant,
    /// The instant the schedule named, when its run was moved to another day.
    pub nominal_for: Option<Instant>,
    /// Why it does not run, when it does not.
    pub removed: Option<Removed>,
}

/// What removed an instant (it is recorded skipped for this reason) and why, in words: a
/// holiday's label, a weekend, a day that has its run, a blackout window's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub by: SkipReason,
    pub why: String,
}

impl Occurrence {
    pub fn runs(due: Instant) -> Occurrence {
        Occurrence {
            due,
            nominal_for: None,
            removed: None,
        }
    }
}

/// The schedule's nominal instants, as the calendar logic reads them: `next(t)` is the first
/// strictly after `t` (bounds applied, counts aside).
pub(super) trait Nominal {
    fn next(&self, after: Instant) -> Option<Instant>;
}

/// The start of local `date` as an instant (its first instant, past any gap).
fn start_of(cal: &Calendar, date: NaiveDate) -> Option<Instant> {
    match cal.zone().from_local_datetime(&date.and_hms_opt(0, 0, 0)?) {
        chrono::LocalResult::Single(t) => Some(t.with_timezone(&chrono::Utc)),
        chrono::LocalResult::Ambiguous(a, b) => Some(a.min(b).with_timezone(&chrono::Utc)),
        chrono::LocalResult::None => at_local(cal, date, NaiveTime::MIN),
    }
}

/// The closed days around `date` (which is closed): the first and last of its stretch.
fn stretch(cal: &Calendar, date: NaiveDate) -> (NaiveDate, NaiveDate) {
    let limit = crate::calendar::SEARCH_DAYS;
    let mut first = date;
    for _ in 0..limit {
        match first.pred_opt() {
            Some(p) if !cal.is_business_day(p) => first = p,
            _ => break,
        }
    }
    let mut last = date;
    for _ in 0..limit {
        match last.succ_opt() {
            Some(s) if !cal.is_business_day(s) => last = s,
            _ => break,
        }
    }
    (first, last)
}

/// Whether the schedule names an instant on local `date`.
fn names_a_day(cal: &Calendar, nominal: &dyn Nominal, date: NaiveDate) -> bool {
    let (Some(start), Some(end)) = (
        start_of(cal, date),
        date.succ_opt().and_then(|d| start_of(cal, d)),
    ) else {
        return false;
    };
    nominal
        .next(start - Duration::microseconds(1))
        .is_some_and(|t| t < end)
}

/// The first nominal instant in `[from, to)`.
fn first_in(nominal: &dyn Nominal, from: Instant, to: Instant) -> Option<Instant> {
    nominal
        .next(from - Duration::microseconds(1))
        .filter(|t| *t < to)
}

/// The last nominal instant in `[from, to)`, found by bisection over `next`: a few dozen calls
/// however dense the schedule.
fn last_in(nominal: &dyn Nominal, from: Instant, to: Instant) -> Option<Instant> {
    let mut lo = from - Duration::microseconds(1);
    first_in(nominal, from, to)?;
    // Invariant: some nominal instant lies in (lo, to); none lies in (hi, to).
    let mut hi = to;
    while (hi - lo) > Duration::microseconds(1) {
        let mid = lo + (hi - lo) / 2;
        if nominal.next(mid).is_some_and(|t| t < to) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    nominal.next(lo).filter(|t| *t < to)
}

/// The outcome of nominal instant `t` under `cal` and `on_holiday`.
pub(super) fn outcome(
    cal: &Calendar,
    on_holiday: OnHoliday,
    nominal: &dyn Nominal,
    t: Instant,
) -> Occurrence {
    let date = cal.local_date(t);
    let Err(closed) = cal.check(date) else {
        return Occurrence::runs(t);
    };
    let removed = |why: String| Occurrence {
        due: t,
        nominal_for: None,
        removed: Some(Removed {
            by: SkipReason::Calendar,
            why,
        }),
    };
    let forward = match on_holiday {
        OnHoliday::Skip => return removed(closed.to_string()),
        OnHoliday::NextBusinessDay => true,
        OnHoliday::PreviousBusinessDay => false,
    };
    let (first, last) = stretch(cal, date);
    let target = if forward {
        cal.next_business_day(last)
    } else {
        cal.previous_business_day(first)
    };
    let Some(target) = target else {
        return removed(format!(
            "{closed}; no business day within {} days",
            crate::calendar::SEARCH_DAYS
        ));
    };
    if names_a_day(cal, nominal, target) {
        return removed(format!("{closed}; {target} has its own run"));
    }
    // Of the stretch's instants, the one nearest the target moves.
    let (Some(from), Some(to)) = (
        start_of(cal, first),
        last.succ_opt().and_then(|d| start_of(cal, d)),
    ) else {
        return removed(closed.to_string());
    };
    let nearest = if forward {
        last_in(nominal, from, to)
    } else {
        first_in(nominal, from, to)
    };
    if nearest != Some(t) {
        return removed(format!(
            "{closed}; another run of this stretch moved to {target}"
        ));
    }
    match at_local(cal, target, local_time(cal, t)) {
        Some(due) => Occurrence {
            due,
            nominal_for: Some(t),
            removed: None,
        },
        None => removed(closed.to_string()),
    }
}

/// The first outcome that falls due strictly after `after`, of the nominal instants from
/// `first_nominal` (the first one after `after`) on, or of one before it that moved past it.
pub(super) fn next_due(
    cal: &Calendar,
    on_holiday: OnHoliday,
    nominal: &dyn Nominal,
    after: Instant,
    first_nominal: Option<Instant>,
) -> Option<Instant> {
    match on_holiday {
        OnHoliday::Skip => first_nominal,
        OnHoliday::PreviousBusinessDay => {
            // Outcomes fall due at or before their instants: walk on past those already due.
            // Under one calendar only the first instant of a closed stretch falls due before
            // `after` (on the business day before the stretch), so one step is the most taken;
            // the walk ends in any case, as a due lies at most a stretch before its instant.
            let mut t = first_nominal?;
            loop {
                let due = outcome(cal, on_holiday, nominal, t).due;
                if due > after {
                    return Some(due);
                }
                t = nominal.next(t)?;
            }
        }
        OnHoliday::NextBusinessDay => {
            let ahead = first_nominal.map(|t| outcome(cal, on_holiday, nominal, t).due);
            // An instant at or before `after` may have moved to a business day past it: the
            // last one of the closed stretch at or just before `after`'s day.
            let day = cal.local_date(after);
            let closed_day = if cal.is_business_day(day) {
                day.pred_opt().filter(|d| !cal.is_business_day(*d))
            } else {
                Some(day)
            };
            let behind = closed_day.and_then(|d| {
                let (first, last) = stretch(cal, d);
                let from = start_of(cal, first)?;
                let to = last.succ_opt().and_then(|d| start_of(cal, d))?;
                let t = last_in(nominal, from, to)?;
                (t <= after)
                    .then(|| outcome(cal, on_holiday, nominal, t))
                    .filter(|o| o.removed.is_none() && o.due > after)
                    .map(|o| o.due)
            });
            match (ahead, behind) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
    }
}

/// What falls due at `due`: a nominal instant of the schedule runs or is removed there, or a
/// moved run lands there (its nominal instant found again from the calendar).
pub(super) fn occurrence_at(
    cal: &Calendar,
    on_holiday: OnHoliday,
    nominal: &dyn Nominal,
    due: Instant,
) -> Occurrence {
    if nominal.next(due - Duration::microseconds(1)) == Some(due) {
        let o = outcome(cal, on_holiday, nominal, due);
        if o.due == due {
            return o;
        }
        // The calendar changed since this instant was set to fall due: it moves on, and is
        // recorded here as moved.
        return Occurrence {
            due,
            nominal_for: None,
            removed: Some(Removed {
                by: SkipReason::Calendar,
                why: format!("moved to {}", o.due.format("%Y-%m-%d %H:%M:%S UTC")),
            }),
        };
    }
    let date = cal.local_date(due);
    let neighbour = match on_holiday {
        OnHoliday::Skip => None,
        OnHoliday::NextBusinessDay => date.checked_sub_days(Days::new(1)),
        OnHoliday::PreviousBusinessDay => date.checked_add_days(Days::new(1)),
    };
    let moved_from = neighbour
        .filter(|d| !cal.is_business_day(*d))
        .and_then(|d| {
            let (first, last) = stretch(cal, d);
            let from = start_of(cal, first)?;
            let to = last.succ_opt().and_then(|d| start_of(cal, d))?;
            match on_holiday {
                OnHoliday::NextBusinessDay => last_in(nominal, from, to),
                _ => first_in(nominal, from, to),
            }
        })
        .filter(|t| outcome(cal, on_holiday, nominal, *t).due == due);
    Occurrence {
        due,
        nominal_for: moved_from,
        removed: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_business_days_reads_a_number_or_an_exact_object() {
        let read = |v: serde_json::Value| serde_json::from_value::<EveryBusinessDaysSpec>(v);
        assert_eq!(
            read(serde_json::json!(2)).unwrap(),
            EveryBusinessDaysSpec::Days(2)
        );
        assert_eq!(
            read(serde_json::json!({"every": 3, "at": "06:30"})).unwrap(),
            EveryBusinessDaysSpec::At {
                every: 3,
                at: Some("06:30".into())
            }
        );
        assert!(read(serde_json::json!([3])).is_err());
        assert!(read(serde_json::json!({"every": 3, "zzz": 1})).is_err());
        assert!(read(serde_json::json!(-1)).is_err());
        assert!(read(serde_json::json!("2")).is_err());
    }

    #[test]
    fn times_of_day_read_with_or_without_seconds() {
        assert_eq!(
            parse_time("06:30").unwrap(),
            NaiveTime::from_hms_opt(6, 30, 0).unwrap()
        );
        assert_eq!(
            parse_time("23:59:59").unwrap(),
            NaiveTime::from_hms_opt(23, 59, 59).unwrap()
        );
        assert!(parse_time("25:00").is_err());
        assert!(parse_time("6.30").is_err());
    }
}

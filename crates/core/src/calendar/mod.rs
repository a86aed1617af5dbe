//! Business days: a namespace's named calendars of working weekdays and holidays, as users
//! write them ([`CalendarSpec`]), and resolved with the calendars they include or except into a
//! [`Calendar`] that says whether a date is a business day and finds the business days around
//! it.
//!
//! Pure date math. A calendar judges dates; the one place an instant meets it is
//! [`Calendar::local_date`], in the calendar's own zone. Reading calendars from the store, and
//! which schedules name them, belong to the server.

pub mod ical;

use crate::error::SpecError;
use crate::Instant;
use chrono::{Datelike, Days, NaiveDate, Weekday};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Holiday entries one calendar may hold (a range counts once).
pub const MAX_HOLIDAYS: usize = 5_000;
/// The longest holiday range, in days.
pub const MAX_RANGE_DAYS: u64 = 366;
/// The longest holiday label, in bytes.
pub const MAX_LABEL_BYTES: usize = 200;
/// Calendars one calendar may name in `include` and `except` together.
pub const MAX_REFERENCES: usize = 16;
/// How deep `include` and `except` may nest.
pub const MAX_DEPTH: usize = 8;
/// How far the business days around a date are looked for. A calendar closed for longer has
/// no business day there: schedules record the instants it removes, and nothing moves.
pub const SEARCH_DAYS: u64 = 400;

/// A calendar as the API takes it (`PUT /api/v1/calendars/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarSpec {
    /// The IANA zone whose dates the calendar names; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The working weekdays (`mon` … `sun`); Monday to Friday when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekdays: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holidays: Vec<Holiday>,
    /// Calendars whose holidays are holidays here too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Calendars whose holidays are not holidays here, even when another rule makes them so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One holiday: a day (`date`) or an inclusive range (`from`, `to`), with what it is called.
/// A `yearly` holiday falls on the same month and day every year from its date on (29 February
/// only in leap years).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holiday {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<NaiveDate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<NaiveDate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<NaiveDate>,
    pub label: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yearly: bool,
}

impl Holiday {
    /// The first and last day it covers (in its first year, for a yearly one).
    fn span(&self) -> (NaiveDate, NaiveDate) {
        match (self.date, self.from, self.to) {
            (Some(d), _, _) => (d, d),
            (None, Some(f), Some(t)) => (f, t),
            // Refused by validation; an empty span covers nothing.
            _ => (NaiveDate::MAX, NaiveDate::MIN),
        }
    }
}

impl CalendarSpec {
    /// Checks the calendar on its own (its references are checked by [`Calendar::resolve`]).
    pub fn validate(&self) -> Result<(), SpecError> {
        self.zone()?;
        self.weekday_mask()?;
        if let Some(d) = &self.description {
            if d.len() > 1000 {
                return Err(SpecError::new("description", "must be at most 1000 bytes"));
            }
        }
        if self.holidays.len() > MAX_HOLIDAYS {
            return Err(SpecError::new(
                "holidays",
                format!("at most {MAX_HOLIDAYS} entries"),
            ));
        }
        for (i, h) in self.holidays.iter().enumerate() {
            let field = format!("holidays[{i}]");
            if h.label.trim().is_empty() || h.label.len() > MAX_LABEL_BYTES {
                return Err(SpecError::new(
                    format!("{field}.label"),
                    format!("must be 1 to {MAX_LABEL_BYTES} bytes"),
                ));
            }
            if h.label.chars().any(char::is_control) {
                return Err(SpecError::new(
                    format!("{field}.label"),
                    "must not hold control characters",
                ));
            }
            match (h.date, h.from, h.to) {
                (Some(_), None, None) => {}
                (None, Some(from), Some(to)) => {
                    if to < from {
                        return Err(SpecError::new(
                            format!("{field}.to"),
                            "must not be before from",
                        ));
                    }
                    let days = (to - from).num_days().unsigned_abs() + 1;
                    if days > MAX_RANGE_DAYS {
                        return Err(SpecError::new(
                            format!("{field}.to"),
                            format!("a range covers at most {MAX_RANGE_DAYS} days"),
                        ));
                    }
                    if h.yearly {
                        return Err(SpecError::new(
                            format!("{field}.yearly"),
                            "applies to a single date, not a range",
                        ));
                    }
                }
                _ => return Err(SpecError::new(field, "give either date, or from and to")),
            }
        }
        let references = self.include.len() + self.except.len();
        if references > MAX_REFERENCES {
            return Err(SpecError::new(
                "include",
                format!("include and except name at most {MAX_REFERENCES} calendars together"),
            ));
        }
        for (field, names) in [("include", &self.include), ("except", &self.except)] {
            for (i, name) in names.iter().enumerate() {
                crate::job::validate_name(&format!("{field}[{i}]"), name)?;
            }
        }
        Ok(())
    }

    fn zone(&self) -> Result<Tz, SpecError> {
        match &self.timezone {
            None => Ok(Tz::UTC),
            Some(name) => name.parse::<Tz>().map_err(|_| {
                SpecError::new(
                    "timezone",
                    format!("{name:?} is not an IANA time zone such as Europe/London"),
                )
            }),
        }
    }

    fn weekday_mask(&self) -> Result<u8, SpecError> {
        let Some(days) = &self.weekdays else {
            return Ok(MON_TO_FRI);
        };
        let mut mask = 0u8;
        for (i, day) in days.iter().enumerate() {
            let weekday = day.parse::<Weekday>().map_err(|_| {
                SpecError::new(
                    format!("weekdays[{i}]"),
                    format!("{day:?} is not a weekday: use mon, tue, wed, thu, fri, sat or sun"),
                )
            })?;
            mask |= bit(weekday);
        }
        Ok(mask)
    }
}

/// A stored calendar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalendarRecord {
    pub namespace: String,
    pub name: String,
    pub spec: CalendarSpec,
    /// 1 when created, one more with each change.
    pub version: u32,
    pub created_at: Instant,
    pub updated_at: Instant,
}

/// What holds a calendar in use: a job whose schedule names it, or a calendar that includes
/// or excepts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarUsers {
    pub jobs: Vec<String>,
    pub calendars: Vec<String>,
}

impl CalendarUsers {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.calendars.is_empty()
    }
}

/// Calendars one namespace may hold.
pub const MAX_CALENDARS_PER_NAMESPACE: usize = 1_000;

const MON_TO_FRI: u8 = 0b0001_1111;

fn bit(day: Weekday) -> u8 {
    1 << day.num_days_from_monday()
}

/// A calendar resolved with the calendars it names: what schedules consult.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    name: String,
    zone: Tz,
    /// Working weekdays, bit 0 for Monday.
    weekdays: u8,
    /// Holidays on one date, by date (ranges expanded).
    dates: BTreeMap<NaiveDate, Arc<str>>,
    /// Yearly holidays by (month, day), with the first year they fall.
    yearly: HashMap<(u32, u32), (i32, Arc<str>)>,
    include: Vec<Arc<Calendar>>,
    except: Vec<Arc<Calendar>>,
}

/// Why a date is not a business day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Not one of the calendar's working weekdays.
    Weekend(Weekday),
    /// A holiday, by its label.
    Holiday(Arc<str>),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Weekend(day) => write!(f, "not a working day ({day})"),
            Closed::Holiday(label) => write!(f, "holiday: {label}"),
        }
    }
}

impl Calendar {
    /// Resolves calendar `name` of a namespace, reading the specs it names through `lookup`.
    /// A name `lookup` does not know, a cycle of references or nesting deeper than
    /// [`MAX_DEPTH`] is refused, naming the field.
    pub fn resolve(
        name: &str,
        lookup: &dyn Fn(&str) -> Option<CalendarSpec>,
    ) -> Result<Calendar, SpecError> {
        let spec = lookup(name).ok_or_else(|| {
            SpecError::new("calendar", format!("there is no calendar named {name:?}"))
        })?;
        Self::resolve_spec(name, &spec, lookup)
    }

    /// Resolves `spec` as calendar `name` (one not stored yet, such as one being written).
    pub fn resolve_spec(
        name: &str,
        spec: &CalendarSpec,
        lookup: &dyn Fn(&str) -> Option<CalendarSpec>,
    ) -> Result<Calendar, SpecError> {
        let mut path = vec![name.to_string()];
        Self::resolve_at(name, spec, lookup, &mut path)
    }

    fn resolve_at(
        name: &str,
        spec: &CalendarSpec,
        lookup: &dyn Fn(&str) -> Option<CalendarSpec>,
        path: &mut Vec<String>,
    ) -> Result<Calendar, SpecError> {
        spec.validate()?;
        let mut dates = BTreeMap::new();
        let mut yearly = HashMap::new();
        for h in &spec.holidays {
            let label: Arc<str> = Arc::from(h.label.as_str());
            let (from, to) = h.span();
            if h.yearly {
                yearly.insert((from.month(), from.day()), (from.year(), label));
                continue;
            }
            let mut day = from;
            while day <= to {
                dates.entry(day).or_insert_with(|| label.clone());
                match day.succ_opt() {
                    Some(next) => day = next,
                    None => break,
                }
            }
        }
        let mut referenced =
            |field: &str, names: &[String]| -> Result<Vec<Arc<Calendar>>, SpecError> {
                let mut out = Vec::with_capacity(names.len());
                for (i, other) in names.iter().enumerate() {
                    let field = format!("{field}[{i}]");
                    if path.iter().any(|p| p == other) {
                        let cycle = format!("{} -> {other}", path.join(" -> "));
                        return Err(SpecError::new(
                            field,
                            format!("calendars may not include or except themselves: {cycle}"),
                        ));
                    }
                    if path.len() >= MAX_DEPTH {
                        return Err(SpecError::new(
                            field,
                            format!("include and except nest at most {MAX_DEPTH} calendars deep"),
                        ));
                    }
                    let spec = lookup(other).ok_or_else(|| {
                        SpecError::new(
                            field.clone(),
                            format!("there is no calendar named {other:?}"),
                        )
                    })?;
                    path.push(other.clone());
                    let resolved = Self::resolve_at(other, &spec, lookup, path)
                        .map_err(|e| SpecError::new(field.clone(), e.to_string()))?;
                    path.pop();
                    out.push(Arc::new(resolved));
                }
                Ok(out)
            };
        let include = referenced("include", &spec.include)?;
        let except = referenced("except", &spec.except)?;
        Ok(Calendar {
            name: name.to_string(),
            zone: spec.zone()?,
            weekdays: spec.weekday_mask()?,
            dates,
            yearly,
            include,
            except,
        })
    }

    /// The calendar schedules use when they name none: Monday to Friday in `zone`, no
    /// holidays.
    pub fn weekdays_in(zone: Tz) -> Calendar {
        Calendar {
            name: String::new(),
            zone,
            weekdays: MON_TO_FRI,
            dates: BTreeMap::new(),
            yearly: HashMap::new(),
            include: Vec::new(),
            except: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The names of every calendar this one is resolved from, itself included.
    pub fn names(&self) -> Vec<&str> {
        let mut out = vec![self.name.as_str()];
        for c in self.include.iter().chain(&self.except) {
            out.extend(c.names());
        }
        out
    }

    /// The date of `t` in the calendar's zone.
    pub fn local_date(&self, t: Instant) -> NaiveDate {
        t.with_timezone(&self.zone).date_naive()
    }

    /// The label of the holiday on `date`, if it is one (weekdays aside).
    pub fn holiday(&self, date: NaiveDate) -> Option<Arc<str>> {
        if self.except.iter().any(|c| c.holiday(date).is_some()) {
            return None;
        }
        if let Some(label) = self.dates.get(&date) {
            return Some(label.clone());
        }
        if let Some((first, label)) = self.yearly.get(&(date.month(), date.day())) {
            if date.year() >= *first {
                return Some(label.clone());
            }
        }
        self.include.iter().find_map(|c| c.holiday(date))
    }

    /// `Ok` when `date` is a business day, else why not.
    pub fn check(&self, date: NaiveDate) -> Result<(), Closed> {
        if let Some(label) = self.holiday(date) {
            return Err(Closed::Holiday(label));
        }
        if self.weekdays & bit(date.weekday()) == 0 {
            return Err(Closed::Weekend(date.weekday()));
        }
        Ok(())
    }

    pub fn is_business_day(&self, date: NaiveDate) -> bool {
        self.check(date).is_ok()
    }

    /// The first business day after `date`, within [`SEARCH_DAYS`].
    pub fn next_business_day(&self, date: NaiveDate) -> Option<NaiveDate> {
        (1..=SEARCH_DAYS)
            .filter_map(|n| date.checked_add_days(Days::new(n)))
            .find(|d| self.is_business_day(*d))
    }

    /// The last business day before `date`, within [`SEARCH_DAYS`].
    pub fn previous_business_day(&self, date: NaiveDate) -> Option<NaiveDate> {
        (1..=SEARCH_DAYS)
            .filter_map(|n| date.checked_sub_days(Days::new(n)))
            .find(|d| self.is_business_day(*d))
    }

    /// The `nth` business day of `year`-`month`: 1 is the first, -1 the last. `None` when the
    /// month has fewer.
    pub fn nth_business_day(&self, year: i32, month: u32, nth: i32) -> Option<NaiveDate> {
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        let days = first.iter_days().take_while(|d| d.month() == month);
        let business: Vec<NaiveDate> = days.filter(|d| self.is_business_day(*d)).collect();
        let index = if nth > 0 {
            usize::try_from(nth - 1).ok()?
        } else {
            business.len().checked_sub(usize::try_from(-nth).ok()?)?
        };
        business.get(index).copied()
    }

    /// Business days in `[from, to)`.
    pub fn business_days_between(&self, from: NaiveDate, to: NaiveDate) -> u64 {
        from.iter_days()
            .take_while(|d| *d < to)
            .filter(|d| self.is_business_day(*d))
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    fn holiday(date: &str, label: &str) -> Holiday {
        Holiday {
            date: Some(d(date)),
            from: None,
            to: None,
            label: label.into(),
            yearly: false,
        }
    }

    fn specs(list: &[(&str, CalendarSpec)]) -> impl Fn(&str) -> Option<CalendarSpec> {
        let map: HashMap<String, CalendarSpec> = list
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn plain() -> CalendarSpec {
        CalendarSpec {
            timezone: None,
            weekdays: None,
            holidays: vec![],
            include: vec![],
            except: vec![],
            description: None,
        }
    }

    #[test]
    fn weekends_and_holidays_are_closed_with_their_reason() {
        let spec = CalendarSpec {
            holidays: vec![holiday("2026-12-25", "Christmas Day")],
            ..plain()
        };
        let cal = Calendar::resolve_spec("uk", &spec, &specs(&[])).unwrap();
        assert!(cal.is_business_day(d("2026-12-24")));
        assert_eq!(
            cal.check(d("2026-12-25")).unwrap_err().to_string(),
            "holiday: Christmas Day"
        );
        assert_eq!(
            cal.check(d("2026-12-26")).unwrap_err(),
            Closed::Weekend(Weekday::Sat)
        );
        assert_eq!(
            cal.next_business_day(d("2026-12-24")),
            Some(d("2026-12-28"))
        );
        assert_eq!(
            cal.previous_business_day(d("2026-12-28")),
            Some(d("2026-12-24"))
        );
    }

    #[test]
    fn include_adds_holidays_and_except_removes_them() {
        let bank = CalendarSpec {
            holidays: vec![
                holiday("2026-12-25", "Christmas Day"),
                holiday("2026-12-28", "Boxing Day (substitute)"),
            ],
            ..plain()
        };
        let open_boxing = CalendarSpec {
            holidays: vec![holiday("2026-12-28", "open")],
            ..plain()
        };
        let trading = CalendarSpec {
            include: vec!["bank".into()],
            except: vec!["open".into()],
            ..plain()
        };
        let lookup = specs(&[("bank", bank), ("open", open_boxing)]);
        let cal = Calendar::resolve_spec("trading", &trading, &lookup).unwrap();
        assert!(!cal.is_business_day(d("2026-12-25")));
        assert!(cal.is_business_day(d("2026-12-28")));
        assert_eq!(cal.names(), ["trading", "bank", "open"]);
    }

    #[test]
    fn cycles_unknown_names_and_bad_entries_name_their_field() {
        let a = CalendarSpec {
            include: vec!["b".into()],
            ..plain()
        };
        let b = CalendarSpec {
            include: vec!["a".into()],
            ..plain()
        };
        let lookup = specs(&[("a", a.clone()), ("b", b)]);
        let err = Calendar::resolve_spec("a", &a, &lookup).unwrap_err();
        assert_eq!(err.field, "include[0]");
        assert!(err.message.contains("a -> b -> a"), "{}", err.message);
        let unknown = CalendarSpec {
            except: vec!["nope".into()],
            ..plain()
        };
        assert_eq!(
            Calendar::resolve_spec("x", &unknown, &lookup)
                .unwrap_err()
                .field,
            "except[0]"
        );
        let backwards = CalendarSpec {
            holidays: vec![Holiday {
                date: None,
                from: Some(d("2026-08-10")),
                to: Some(d("2026-08-01")),
                label: "closed".into(),
                yearly: false,
            }],
            ..plain()
        };
        assert_eq!(backwards.validate().unwrap_err().field, "holidays[0].to");
        let weekday = CalendarSpec {
            weekdays: Some(vec!["mon".into(), "funday".into()]),
            ..plain()
        };
        assert_eq!(weekday.validate().unwrap_err().field, "weekdays[1]");
        let zone = CalendarSpec {
            timezone: Some("Mars/Olympus".into()),
            ..plain()
        };
        assert_eq!(zone.validate().unwrap_err().field, "timezone");
    }

    #[test]
    fn yearly_holidays_repeat_from_their_first_year_and_leap_days_only_in_leap_years() {
        let spec = CalendarSpec {
            weekdays: Some(
                ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
                    .map(String::from)
                    .to_vec(),
            ),
            holidays: vec![
                Holiday {
                    yearly: true,
                    ..holiday("2020-12-25", "Christmas Day")
                },
                Holiday {
                    yearly: true,
                    ..holiday("2024-02-29", "Leap day")
                },
            ],
            ..plain()
        };
        let cal = Calendar::resolve_spec("c", &spec, &specs(&[])).unwrap();
        assert!(cal.is_business_day(d("2019-12-25")));
        assert!(!cal.is_business_day(d("2031-12-25")));
        assert!(!cal.is_business_day(d("2028-02-29")));
        assert!(cal.is_business_day(d("2027-02-28")));
        assert!(cal.is_business_day(d("2027-03-01")));
    }

    #[test]
    fn nth_business_day_counts_from_either_end() {
        let cal = Calendar::weekdays_in(Tz::UTC);
        // March 2026 starts on a Sunday and ends on a Tuesday.
        assert_eq!(cal.nth_business_day(2026, 3, 1), Some(d("2026-03-02")));
        assert_eq!(cal.nth_business_day(2026, 3, 3), Some(d("2026-03-04")));
        assert_eq!(cal.nth_business_day(2026, 3, -1), Some(d("2026-03-31")));
        assert_eq!(cal.nth_business_day(2026, 3, -3), Some(d("2026-03-27")));
        assert_eq!(cal.nth_business_day(2026, 3, 23), None);
        assert_eq!(cal.nth_business_day(2026, 3, 22), Some(d("2026-03-31")));
    }
}

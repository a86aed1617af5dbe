//! Holidays from an iCalendar text (RFC 5545), such as a national bank-holiday `.ics` feed:
//! [`holidays_from_ics`] turns its all-day events into the [`Holiday`] entries a
//! [`CalendarSpec`](super::CalendarSpec) holds, and counts the timed events it leaves out.
//!
//! Text in, holidays out: no IO. Fetching a feed, and storing the calendar it fills, are the
//! server's. Recurrence is limited to what holiday feeds use, a yearly repeat on the event's own
//! date; anything else is refused rather than guessed.

use super::{Holiday, MAX_HOLIDAYS, MAX_LABEL_BYTES, MAX_RANGE_DAYS};
use crate::error::SpecError;
use chrono::{Datelike, Days, NaiveDate};
use icalendar::parser::{read_components, unfold, Component, Property};
use std::collections::{HashMap, HashSet};

/// The largest iCalendar text accepted, in bytes.
pub const MAX_ICS_BYTES: usize = 2 * 1024 * 1024;
/// How far a recurring event is expanded: never past this many years after its first date.
pub const MAX_RECURRENCE_YEARS: u32 = 50;
/// How deep components may nest (VCALENDAR, VEVENT, VALARM is 3). The parser recurses, so
/// deeper text is refused before it is parsed.
const MAX_NESTING: usize = 8;
/// The label of an event without a SUMMARY.
const DEFAULT_LABEL: &str = "holiday";
/// The field every refusal names.
const FIELD: &str = "ics";

/// What an iCalendar text yields.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Imported {
    /// The holidays, in the order of the events they come from.
    pub holidays: Vec<Holiday>,
    /// Events with a time of day, left out: holidays are whole days.
    pub skipped_timed: usize,
}

/// Reads the all-day events (VEVENT) of an iCalendar text as holidays.
///
/// - An event's label is its SUMMARY, trimmed, line breaks and tabs turned into spaces and other
///   control characters removed, cut to [`MAX_LABEL_BYTES`]; `holiday` when it has none.
/// - DTEND is exclusive: a one-day event is a `date`, a longer one a `from`/`to` range of at most
///   [`MAX_RANGE_DAYS`] days. Without DTEND, a DURATION in days or weeks counts, else one day.
/// - `RRULE:FREQ=YEARLY` (with at most INTERVAL=1, WKST, BYMONTH and BYMONTHDAY naming the
///   event's own date) on a one-day event without UNTIL, COUNT, EXDATE or moved occurrences is
///   a `yearly` holiday; otherwise its occurrences, bounded by UNTIL, COUNT and
///   [`MAX_RECURRENCE_YEARS`], are listed one by one. Date-valued RDATEs add occurrences,
///   EXDATEs remove them, and so does a RECURRENCE-ID on another event with the same UID (that
///   event stands for the occurrence it moves, unless its STATUS is CANCELLED).
/// - Holidays repeating an earlier one (same date, same range, or a yearly one on the same
///   month and day) are dropped: the first label stays.
///
/// Refused, naming the field `ics`: text over [`MAX_ICS_BYTES`], text that is not iCalendar,
/// an all-day event without a valid date, an event longer than [`MAX_RANGE_DAYS`] days, another
/// RRULE (named with the event's SUMMARY), and more than [`MAX_HOLIDAYS`] holidays.
pub fn holidays_from_ics(text: &str) -> Result<Imported, SpecError> {
    if text.len() > MAX_ICS_BYTES {
        return Err(refuse(format!(
            "the text is {} bytes; at most {MAX_ICS_BYTES} bytes are accepted",
            text.len()
        )));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let unfolded = unfold(text);
    let unfolded = unfolded.trim();
    check_outline(unfolded)?;
    let roots = read_components(unfolded).map_err(|e| {
        let at = match error_line(&e) {
            Some(line) => format!(" near line {line} (folded lines joined)"),
            None => String::new(),
        };
        refuse(format!(
            "not a valid iCalendar text: it cannot be read{at}; each BEGIN needs its END, and \
             each other line is NAME:VALUE"
        ))
    })?;
    let vevents: Vec<&Component<'_>> = roots
        .iter()
        .filter(|root| root.name.as_str().eq_ignore_ascii_case("VCALENDAR"))
        .flat_map(|root| root.components.iter())
        .filter(|c| c.name.as_str().eq_ignore_ascii_case("VEVENT"))
        .collect();

    let mut skipped_timed = 0;
    let mut events = Vec::new();
    // Occurrences that another event of the same UID stands for, by UID.
    let mut moved: HashMap<&str, HashSet<NaiveDate>> = HashMap::new();
    for vevent in vevents {
        let label = label(vevent);
        let Some(dtstart) = prop(vevent, "DTSTART") else {
            return Err(refuse(format!("the event {label:?} has no DTSTART")));
        };
        let uid = prop(vevent, "UID").map(|p| p.val.as_str().trim());
        let recurrence_id = prop(vevent, "RECURRENCE-ID");
        if let (Some(uid), Some(rid)) = (uid, recurrence_id) {
            if let Some(date) = date_part(rid.val.as_str()) {
                moved.entry(uid).or_default().insert(date);
            }
        }
        if prop(vevent, "STATUS")
            .is_some_and(|s| s.val.as_str().trim().eq_ignore_ascii_case("CANCELLED"))
        {
            continue;
        }
        let Some(start) = day_of(dtstart) else {
            skipped_timed += 1;
            continue;
        };
        let start = start.ok_or_else(|| {
            refuse(format!(
                "the event {label:?} starts on {:?}, which is not a date (YYYYMMDD)",
                dtstart.val.as_str()
            ))
        })?;
        let event = Event::read(vevent, label, start)?;
        events.push((event, uid.filter(|_| recurrence_id.is_none())));
    }

    let mut out = Holidays::default();
    let none = HashSet::new();
    for (event, uid) in &events {
        let moved = uid.and_then(|u| moved.get(u)).unwrap_or(&none);
        event.emit(moved, &mut out)?;
    }
    Ok(Imported {
        holidays: out.list,
        skipped_timed,
    })
}

/// One all-day event, read.
struct Event {
    label: String,
    start: NaiveDate,
    /// Days it covers (DTEND - DTSTART), at least 1.
    days: u64,
    rule: Option<Rule>,
    /// RDATE dates.
    extra: Vec<NaiveDate>,
    /// EXDATE dates.
    excluded: HashSet<NaiveDate>,
}

/// A yearly RRULE on the event's own date.
struct Rule {
    until: Option<NaiveDate>,
    count: Option<u32>,
}

impl Event {
    fn read(vevent: &Component<'_>, label: String, start: NaiveDate) -> Result<Event, SpecError> {
        let name = |label: &str| format!("the event {label:?} on {start}");
        let end = match (prop(vevent, "DTEND"), prop(vevent, "DURATION")) {
            (Some(dtend), _) => match day_of(dtend) {
                Some(Some(end)) => end,
                _ => {
                    return Err(refuse(format!(
                        "{} ends on {:?}: an all-day event's DTEND is a date (YYYYMMDD)",
                        name(&label),
                        dtend.val.as_str()
                    )))
                }
            },
            (None, Some(duration)) => {
                let days = duration_days(duration.val.as_str()).ok_or_else(|| {
                    refuse(format!(
                        "{} lasts {:?}: an all-day event's DURATION is whole days or weeks \
                         (P1D, P2W)",
                        name(&label),
                        duration.val.as_str()
                    ))
                })?;
                start
                    .checked_add_days(Days::new(days))
                    .ok_or_else(|| refuse(format!("{} lasts too long", name(&label))))?
            }
            (None, None) => start,
        };
        if end < start {
            return Err(refuse(format!(
                "{} ends on {end}, before it starts",
                name(&label)
            )));
        }
        // An end on the start date itself is read as one day, as calendar programs show it.
        let days = (end - start).num_days().unsigned_abs().max(1);
        if days > MAX_RANGE_DAYS {
            return Err(refuse(format!(
                "{} lasts {days} days; a holiday range covers at most {MAX_RANGE_DAYS} days",
                name(&label)
            )));
        }
        let rule = match prop(vevent, "RRULE") {
            Some(rrule) => Some(Rule::read(rrule.val.as_str(), start, &label)?),
            None => None,
        };
        let mut extra = Vec::new();
        let mut excluded = HashSet::new();
        for p in &vevent.properties {
            let is = |n: &str| p.name.as_str().eq_ignore_ascii_case(n);
            if !is("RDATE") && !is("EXDATE") {
                continue;
            }
            for value in p.val.as_str().split(',').filter(|v| !v.trim().is_empty()) {
                let date = date_part(value).ok_or_else(|| {
                    refuse(format!(
                        "{} has {} {value:?}, which is not a date (YYYYMMDD)",
                        name(&label),
                        p.name.as_str().to_ascii_uppercase()
                    ))
                })?;
                if is("RDATE") {
                    extra.push(date);
                } else {
                    excluded.insert(date);
                }
            }
        }
        Ok(Event {
            label,
            start,
            days,
            rule,
            extra,
            excluded,
        })
    }

    /// Adds the event's holidays to `out`, leaving out the `moved` occurrences.
    fn emit(&self, moved: &HashSet<NaiveDate>, out: &mut Holidays) -> Result<(), SpecError> {
        let open_ended = self
            .rule
            .as_ref()
            .is_some_and(|r| r.until.is_none() && r.count.is_none());
        let gone = |d: &NaiveDate| self.excluded.contains(d) || moved.contains(d);
        if open_ended && self.days == 1 && self.excluded.is_empty() && moved.is_empty() {
            out.push(
                Key::Yearly(self.start.month(), self.start.day()),
                Holiday {
                    date: Some(self.start),
                    from: None,
                    to: None,
                    label: self.label.clone(),
                    yearly: true,
                },
            )?;
        } else {
            for date in self.occurrences().into_iter().filter(|d| !gone(d)) {
                self.push(date, out)?;
            }
        }
        for date in self.extra.iter().filter(|d| !gone(d)) {
            self.push(*date, out)?;
        }
        Ok(())
    }

    /// The event's first days, from its RRULE or its DTSTART alone.
    fn occurrences(&self) -> Vec<NaiveDate> {
        let Some(rule) = &self.rule else {
            return vec![self.start];
        };
        let mut out = Vec::new();
        for years in 0..=MAX_RECURRENCE_YEARS {
            if rule
                .count
                .is_some_and(|count| out.len() as u64 >= u64::from(count))
            {
                break;
            }
            let Some(year) = i32::try_from(years)
                .ok()
                .and_then(|y| self.start.year().checked_add(y))
            else {
                break;
            };
            // 29 February recurs in leap years only.
            let Some(date) = NaiveDate::from_ymd_opt(year, self.start.month(), self.start.day())
            else {
                continue;
            };
            // DTSTART is always the first occurrence, whatever UNTIL says.
            if years > 0 && rule.until.is_some_and(|until| date > until) {
                break;
            }
            out.push(date);
        }
        out
    }

    fn push(&self, first: NaiveDate, out: &mut Holidays) -> Result<(), SpecError> {
        let label = self.label.clone();
        if self.days == 1 {
            return out.push(
                Key::Date(first),
                Holiday {
                    date: Some(first),
                    from: None,
                    to: None,
                    label,
                    yearly: false,
                },
            );
        }
        let Some(last) = first.checked_add_days(Days::new(self.days - 1)) else {
            return Err(refuse(format!(
                "the event {:?} on {first} ends past the last date there is",
                self.label
            )));
        };
        out.push(
            Key::Range(first, last),
            Holiday {
                date: None,
                from: Some(first),
                to: Some(last),
                label,
                yearly: false,
            },
        )
    }
}

impl Rule {
    fn read(value: &str, start: NaiveDate, label: &str) -> Result<Rule, SpecError> {
        let unsupported = || {
            refuse(format!(
                "the event {label:?} repeats by RRULE {value:?}, which is not supported: only \
                 FREQ=YEARLY on the event's own date (with INTERVAL=1, UNTIL or COUNT) is"
            ))
        };
        let invalid = |why: &str| {
            refuse(format!(
                "the event {label:?} has RRULE {value:?}, which is not valid: {why}"
            ))
        };
        let mut yearly = false;
        let mut until = None;
        let mut count = None;
        for part in value.trim().split(';').filter(|p| !p.is_empty()) {
            let Some((key, v)) = part.split_once('=') else {
                return Err(invalid(&format!("{part:?} is not NAME=VALUE")));
            };
            let v = v.trim();
            let is_number = |n: u32| v.parse::<u32>() == Ok(n);
            match key.trim().to_ascii_uppercase().as_str() {
                "FREQ" if v.eq_ignore_ascii_case("YEARLY") => yearly = true,
                "INTERVAL" if is_number(1) => {}
                "BYMONTH" if is_number(start.month()) => {}
                "BYMONTHDAY" if is_number(start.day()) => {}
                // The week's first day matters to weekly rules only.
                "WKST" => {}
                "UNTIL" => {
                    until = Some(
                        date_part(v).ok_or_else(|| invalid("UNTIL is not a date (YYYYMMDD)"))?,
                    )
                }
                "COUNT" => match v.parse::<u32>() {
                    Ok(n) if n > 0 => count = Some(n),
                    _ => return Err(invalid("COUNT is not a positive number")),
                },
                _ => return Err(unsupported()),
            }
        }
        if !yearly {
            return Err(unsupported());
        }
        if until.is_some() && count.is_some() {
            return Err(invalid("UNTIL and COUNT exclude each other"));
        }
        Ok(Rule { until, count })
    }
}

/// What tells two holidays apart, to drop repeats.
#[derive(PartialEq, Eq, Hash)]
enum Key {
    Date(NaiveDate),
    Range(NaiveDate, NaiveDate),
    /// Month and day: a calendar keeps one yearly holiday per day of the year.
    Yearly(u32, u32),
}

#[derive(Default)]
struct Holidays {
    list: Vec<Holiday>,
    seen: HashSet<Key>,
}

impl Holidays {
    fn push(&mut self, key: Key, holiday: Holiday) -> Result<(), SpecError> {
        if !self.seen.insert(key) {
            return Ok(());
        }
        if self.list.len() >= MAX_HOLIDAYS {
            return Err(refuse(format!(
                "the events make more than {MAX_HOLIDAYS} holidays (recurring ones counted \
                 once a year); a calendar holds at most {MAX_HOLIDAYS}"
            )));
        }
        self.list.push(holiday);
        Ok(())
    }
}

fn refuse(message: impl Into<String>) -> SpecError {
    SpecError::new(FIELD, message)
}

/// Refuses text that does not open with BEGIN:VCALENDAR, or nests deeper than [`MAX_NESTING`].
fn check_outline(text: &str) -> Result<(), SpecError> {
    let starts = |line: &str, prefix: &str| {
        line.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    };
    let first = text.lines().next().unwrap_or("").trim();
    if !first.eq_ignore_ascii_case("BEGIN:VCALENDAR") {
        return Err(refuse(
            "not an iCalendar text: it must begin with BEGIN:VCALENDAR",
        ));
    }
    let mut depth = 0usize;
    for line in text.lines() {
        if starts(line, "BEGIN:") {
            depth += 1;
            if depth > MAX_NESTING {
                return Err(refuse(format!(
                    "not a usable iCalendar text: components nest more than {MAX_NESTING} deep"
                )));
            }
        } else if starts(line, "END:") {
            depth = depth.saturating_sub(1);
        }
    }
    Ok(())
}

fn prop<'c, 'i>(component: &'c Component<'i>, name: &str) -> Option<&'c Property<'i>> {
    component
        .properties
        .iter()
        .find(|p| p.name.as_str().eq_ignore_ascii_case(name))
}

fn param<'p>(property: &'p Property<'_>, key: &str) -> Option<&'p str> {
    property
        .params
        .iter()
        .find(|p| p.key.as_str().eq_ignore_ascii_case(key))
        .and_then(|p| p.val.as_ref())
        .map(|v| v.as_str())
}

/// The day of a DTSTART or DTEND: `None` when it has a time of day, `Some(None)` when it is
/// meant as a date but is not one.
fn day_of(property: &Property<'_>) -> Option<Option<NaiveDate>> {
    let value = property.val.as_str().trim();
    let is_date = match param(property, "VALUE") {
        Some(kind) => kind.eq_ignore_ascii_case("DATE"),
        None => !value.contains(['T', 't']),
    };
    is_date.then(|| date(value))
}

/// A DATE value, `YYYYMMDD`.
fn date(value: &str) -> Option<NaiveDate> {
    if value.len() != 8 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::parse_from_str(value, "%Y%m%d").ok()
}

/// The date of a DATE or DATE-TIME value (`YYYYMMDD` or `YYYYMMDDTHHMMSS[Z]`).
fn date_part(value: &str) -> Option<NaiveDate> {
    let value = value.trim();
    match value.split_once(['T', 't']) {
        Some((day, _)) => date(day),
        None => date(value),
    }
}

/// Days in a DURATION of whole days or weeks (`P2D`, `P1W`, `P1DT0H0M0S`).
fn duration_days(value: &str) -> Option<u64> {
    let value = value.trim();
    let value = value.strip_prefix('+').unwrap_or(value);
    let value = value.strip_prefix(['P', 'p'])?;
    let value = match value.split_once(['T', 't']) {
        Some((days, time)) if time.chars().all(|c| c == '0' || "HMShms".contains(c)) => days,
        Some(_) => return None,
        None => value,
    };
    let (number, unit) = value.split_at(value.len().checked_sub(1)?);
    let number: u64 = number.parse().ok()?;
    match unit {
        "D" | "d" => Some(number),
        "W" | "w" => number.checked_mul(7),
        _ => None,
    }
}

/// The event's label: its SUMMARY, cleaned, or [`DEFAULT_LABEL`].
fn label(vevent: &Component<'_>) -> String {
    let raw = prop(vevent, "SUMMARY").map_or("", |p| p.val.as_str());
    let clean: String = raw
        .chars()
        .filter_map(|c| match c {
            c if c.is_control() => c.is_whitespace().then_some(' '),
            c => Some(c),
        })
        .collect();
    let label = cut_to(clean.trim(), MAX_LABEL_BYTES).trim_end();
    if label.is_empty() {
        DEFAULT_LABEL.to_string()
    } else {
        label.to_string()
    }
}

/// The line the parser's complaint (`0: at line 3, in Tag: ...`) points at.
fn error_line(error: &str) -> Option<u64> {
    let rest = &error[error.find("at line ")? + "at line ".len()..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

/// The longest start of `text` of at most `max` bytes that ends on a char boundary.
fn cut_to(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::super::CalendarSpec;
    use super::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    fn day(date: &str, label: &str) -> Holiday {
        Holiday {
            date: Some(d(date)),
            from: None,
            to: None,
            label: label.into(),
            yearly: false,
        }
    }

    fn yearly(date: &str, label: &str) -> Holiday {
        Holiday {
            yearly: true,
            ..day(date, label)
        }
    }

    fn range(from: &str, to: &str, label: &str) -> Holiday {
        Holiday {
            date: None,
            from: Some(d(from)),
            to: Some(d(to)),
            label: label.into(),
            yearly: false,
        }
    }

    /// A calendar of `events` (lines joined with CRLF).
    fn feed(events: &[&[&str]]) -> String {
        let mut lines = vec!["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN"];
        for event in events {
            lines.push("BEGIN:VEVENT");
            lines.extend_from_slice(event);
            lines.push("END:VEVENT");
        }
        lines.push("END:VCALENDAR");
        lines.join("\r\n") + "\r\n"
    }

    fn refusal(text: &str) -> String {
        let err = holidays_from_ics(text).unwrap_err();
        assert_eq!(err.field, "ics", "{err}");
        err.message
    }

    fn holidays(holidays: Vec<Holiday>) -> CalendarSpec {
        CalendarSpec {
            timezone: Some("Europe/London".into()),
            weekdays: None,
            holidays,
            include: vec![],
            except: vec![],
            description: None,
        }
    }

    const UK: &str = "BEGIN:VCALENDAR\r\n\
        VERSION:2.0\r\n\
        METHOD:PUBLISH\r\n\
        PRODID:-//uk.gov/bank-holidays//EN\r\n\
        BEGIN:VEVENT\r\n\
        DTEND;VALUE=DATE:20250102\r\n\
        DTSTART;VALUE=DATE:20250101\r\n\
        SUMMARY:New Year’s Day\r\n\
        UID:ca6af7456b0088abad9a69f9f620f5ac-0@gov.uk\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTEND;VALUE=DATE:20250419\r\n\
        DTSTART;VALUE=DATE:20250418\r\n\
        SUMMARY:Good\r\n  Friday\r\n\
        UID:ca6af7456b0088abad9a69f9f620f5ac-1@gov.uk\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTSTART:20250505\r\n\
        SUMMARY:Early May ba\r\n nk holiday\r\n\
        UID:ca6af7456b0088abad9a69f9f620f5ac-2@gov.uk\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTSTART:20250601T090000Z\r\n\
        DTEND:20250601T100000Z\r\n\
        SUMMARY:Office drinks\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTSTART;VALUE=DATE:20251225\r\n\
        DTEND;VALUE=DATE:20251227\r\n\
        SUMMARY:Christmas Day\\, Boxing Day\r\n\
        UID:ca6af7456b0088abad9a69f9f620f5ac-3@gov.uk\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTSTART;VALUE=DATE:20250101\r\n\
        SUMMARY:New Year again\r\n\
        END:VEVENT\r\n\
        BEGIN:VEVENT\r\n\
        DTSTART;VALUE=DATE:20251231\r\n\
        END:VEVENT\r\n\
        END:VCALENDAR\r\n";

    #[test]
    fn uk_bank_holidays_feed_gives_days_and_ranges_and_counts_the_timed_event() {
        let imported = holidays_from_ics(UK).unwrap();
        assert_eq!(
            imported.holidays,
            vec![
                day("2025-01-01", "New Year’s Day"),
                // A folded line loses its line break and the one space after it, no more.
                day("2025-04-18", "Good Friday"),
                day("2025-05-05", "Early May bank holiday"),
                range("2025-12-25", "2025-12-26", "Christmas Day, Boxing Day"),
                day("2025-12-31", "holiday"),
            ]
        );
        assert_eq!(imported.skipped_timed, 1);
        holidays(imported.holidays).validate().unwrap();
    }

    #[test]
    fn lf_line_endings_and_a_byte_order_mark_read_the_same() {
        let lf = format!("\u{feff}{}", UK.replace("\r\n", "\n"));
        assert_eq!(
            holidays_from_ics(&lf).unwrap(),
            holidays_from_ics(UK).unwrap()
        );
    }

    #[test]
    fn an_open_yearly_rrule_is_a_yearly_holiday() {
        let text = feed(&[
            &[
                "DTSTART;VALUE=DATE:20201225",
                "DTEND;VALUE=DATE:20201226",
                "RRULE:FREQ=YEARLY",
                "SUMMARY:Christmas Day",
            ],
            &[
                "DTSTART;VALUE=DATE:20210101",
                "RRULE:FREQ=YEARLY;INTERVAL=1;BYMONTH=1;BYMONTHDAY=1",
                "SUMMARY:New Year's Day",
            ],
            // The same day of the year again: a calendar keeps the first.
            &[
                "DTSTART;VALUE=DATE:20221225",
                "RRULE:FREQ=YEARLY",
                "SUMMARY:Xmas",
            ],
        ]);
        let imported = holidays_from_ics(&text).unwrap();
        assert_eq!(
            imported.holidays,
            vec![
                yearly("2020-12-25", "Christmas Day"),
                yearly("2021-01-01", "New Year's Day"),
            ]
        );
        assert_eq!(imported.skipped_timed, 0);
        holidays(imported.holidays).validate().unwrap();
    }

    #[test]
    fn a_count_bounded_rrule_is_expanded_without_its_exdates() {
        let text = feed(&[&[
            "DTSTART;VALUE=DATE:20240527",
            "RRULE:FREQ=YEARLY;COUNT=4",
            "EXDATE;VALUE=DATE:20250527,20270527",
            "SUMMARY:Founders' Day",
        ]]);
        assert_eq!(
            holidays_from_ics(&text).unwrap().holidays,
            vec![
                day("2024-05-27", "Founders' Day"),
                day("2026-05-27", "Founders' Day"),
            ]
        );
    }

    #[test]
    fn until_and_the_fifty_year_bound_end_an_expansion() {
        let until = feed(&[&[
            "DTSTART;VALUE=DATE:20250704",
            "RRULE:FREQ=YEARLY;UNTIL=20270704T000000Z",
            "SUMMARY:Independence Day",
        ]]);
        assert_eq!(
            holidays_from_ics(&until).unwrap().holidays,
            vec![
                day("2025-07-04", "Independence Day"),
                day("2026-07-04", "Independence Day"),
                day("2027-07-04", "Independence Day"),
            ]
        );
        // An EXDATE is more than a yearly holiday can say: listed, 50 years on at most.
        let open = feed(&[&[
            "DTSTART;VALUE=DATE:20250704",
            "RRULE:FREQ=YEARLY",
            "EXDATE;VALUE=DATE:20260704",
            "SUMMARY:Independence Day",
        ]]);
        let listed = holidays_from_ics(&open).unwrap().holidays;
        assert_eq!(listed.len(), 50);
        assert_eq!(listed[0], day("2025-07-04", "Independence Day"));
        assert_eq!(listed[1], day("2027-07-04", "Independence Day"));
        assert_eq!(listed[49], day("2075-07-04", "Independence Day"));
    }

    #[test]
    fn a_leap_day_recurs_in_leap_years_and_a_long_event_recurs_as_ranges() {
        let text = feed(&[
            &[
                "DTSTART;VALUE=DATE:20240229",
                "RRULE:FREQ=YEARLY;COUNT=2",
                "SUMMARY:Leap day",
            ],
            &[
                "DTSTART;VALUE=DATE:20250801",
                "DURATION:P1W",
                "RRULE:FREQ=YEARLY;COUNT=2",
                "SUMMARY:Summer shutdown",
            ],
        ]);
        assert_eq!(
            holidays_from_ics(&text).unwrap().holidays,
            vec![
                day("2024-02-29", "Leap day"),
                day("2028-02-29", "Leap day"),
                range("2025-08-01", "2025-08-07", "Summer shutdown"),
                range("2026-08-01", "2026-08-07", "Summer shutdown"),
            ]
        );
    }

    #[test]
    fn a_moved_occurrence_replaces_the_one_it_moves() {
        let text = feed(&[
            &[
                "UID:coronation",
                "DTSTART;VALUE=DATE:20230508",
                "RRULE:FREQ=YEARLY;COUNT=3",
                "SUMMARY:Spring day",
            ],
            &[
                "UID:coronation",
                "RECURRENCE-ID;VALUE=DATE:20240508",
                "DTSTART;VALUE=DATE:20240510",
                "SUMMARY:Spring day (moved)",
            ],
            &[
                "UID:coronation",
                "RECURRENCE-ID;VALUE=DATE:20250508",
                "DTSTART;VALUE=DATE:20250508",
                "STATUS:CANCELLED",
                "SUMMARY:Spring day",
            ],
        ]);
        assert_eq!(
            holidays_from_ics(&text).unwrap().holidays,
            vec![
                day("2023-05-08", "Spring day"),
                day("2024-05-10", "Spring day (moved)"),
            ]
        );
    }

    #[test]
    fn another_rrule_is_refused_naming_the_event() {
        let text = feed(&[&[
            "DTSTART;VALUE=DATE:20251127",
            "RRULE:FREQ=YEARLY;BYMONTH=11;BYDAY=4TH",
            "SUMMARY:Thanksgiving",
        ]]);
        assert_eq!(
            refusal(&text),
            "the event \"Thanksgiving\" repeats by RRULE \"FREQ=YEARLY;BYMONTH=11;BYDAY=4TH\", \
             which is not supported: only FREQ=YEARLY on the event's own date (with INTERVAL=1, \
             UNTIL or COUNT) is"
        );
        let monthly = feed(&[&[
            "DTSTART;VALUE=DATE:20250101",
            "RRULE:FREQ=MONTHLY",
            "SUMMARY:Month start",
        ]]);
        assert!(refusal(&monthly).starts_with("the event \"Month start\" repeats by RRULE"));
        let every_other = feed(&[&[
            "DTSTART;VALUE=DATE:20250101",
            "RRULE:FREQ=YEARLY;INTERVAL=2",
            "SUMMARY:Biennial",
        ]]);
        assert!(refusal(&every_other).starts_with("the event \"Biennial\" repeats by RRULE"));
    }

    #[test]
    fn text_that_is_not_icalendar_is_refused() {
        assert_eq!(
            refusal("Christmas Day, 2025-12-25\n"),
            "not an iCalendar text: it must begin with BEGIN:VCALENDAR"
        );
        assert_eq!(
            refusal(""),
            "not an iCalendar text: it must begin with BEGIN:VCALENDAR"
        );
        assert_eq!(
            refusal("BEGIN:VCARD\r\nFN:Ada\r\nEND:VCARD\r\n"),
            "not an iCalendar text: it must begin with BEGIN:VCALENDAR"
        );
        let unclosed = "BEGIN:VCALENDAR\r\nBEGIN:VEVENT\r\nDTSTART:20250101\r\n";
        assert_eq!(
            refusal(unclosed),
            "not a valid iCalendar text: it cannot be read near line 2 (folded lines joined); \
             each BEGIN needs its END, and each other line is NAME:VALUE"
        );
        let trailing = "BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\nChristmas\r\n";
        assert!(refusal(trailing)
            .starts_with("not a valid iCalendar text: it cannot be read near line 3"));
        let deep = format!(
            "BEGIN:VCALENDAR\r\n{}{}END:VCALENDAR\r\n",
            "BEGIN:X\r\n".repeat(20),
            "END:X\r\n".repeat(20)
        );
        assert_eq!(
            refusal(&deep),
            "not a usable iCalendar text: components nest more than 8 deep"
        );
    }

    #[test]
    fn oversize_text_is_refused() {
        let event = "BEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20250101\r\nEND:VEVENT\r\n";
        let mut text = String::from("BEGIN:VCALENDAR\r\n");
        while text.len() <= MAX_ICS_BYTES {
            text.push_str(event);
        }
        text.push_str("END:VCALENDAR\r\n");
        assert_eq!(
            refusal(&text),
            format!(
                "the text is {} bytes; at most 2097152 bytes are accepted",
                text.len()
            )
        );
    }

    #[test]
    fn a_400_day_event_is_refused_naming_it() {
        let text = feed(&[&[
            "DTSTART;VALUE=DATE:20250101",
            "DTEND;VALUE=DATE:20260205",
            "SUMMARY:Sabbatical",
        ]]);
        assert_eq!(
            refusal(&text),
            "the event \"Sabbatical\" on 2025-01-01 lasts 400 days; a holiday range covers at \
             most 366 days"
        );
        // 366 days is the longest range.
        let year = feed(&[&[
            "DTSTART;VALUE=DATE:20240101",
            "DTEND;VALUE=DATE:20250101",
            "SUMMARY:Leap year off",
        ]]);
        assert_eq!(
            holidays_from_ics(&year).unwrap().holidays,
            vec![range("2024-01-01", "2024-12-31", "Leap year off")]
        );
    }

    #[test]
    fn bad_dates_are_refused_naming_the_event() {
        let start = feed(&[&["DTSTART;VALUE=DATE:20251332", "SUMMARY:Nowhen"]]);
        assert_eq!(
            refusal(&start),
            "the event \"Nowhen\" starts on \"20251332\", which is not a date (YYYYMMDD)"
        );
        let backwards = feed(&[&[
            "DTSTART;VALUE=DATE:20250110",
            "DTEND;VALUE=DATE:20250101",
            "SUMMARY:Backwards",
        ]]);
        assert_eq!(
            refusal(&backwards),
            "the event \"Backwards\" on 2025-01-10 ends on 2025-01-01, before it starts"
        );
        let no_start = feed(&[&["SUMMARY:Someday"]]);
        assert_eq!(refusal(&no_start), "the event \"Someday\" has no DTSTART");
    }

    #[test]
    fn labels_are_trimmed_cleaned_and_cut_on_a_char_boundary() {
        let long = format!("SUMMARY: {}", "é".repeat(150));
        let text = feed(&[
            &["DTSTART;VALUE=DATE:20250101", &long],
            &[
                "DTSTART;VALUE=DATE:20250102",
                "SUMMARY:  Bank\\nholiday\u{7}  ",
            ],
            &["DTSTART;VALUE=DATE:20250103", "SUMMARY:   "],
        ]);
        let imported = holidays_from_ics(&text).unwrap();
        assert_eq!(
            imported.holidays,
            vec![
                day("2025-01-01", &"é".repeat(100)),
                day("2025-01-02", "Bank holiday"),
                day("2025-01-03", "holiday"),
            ]
        );
        assert_eq!(imported.holidays[0].label.len(), MAX_LABEL_BYTES);
        holidays(imported.holidays).validate().unwrap();
    }

    #[test]
    fn more_holidays_than_a_calendar_holds_are_refused() {
        let events: Vec<Vec<String>> = (0..101)
            .map(|i| {
                let date = d("2025-01-01") + Days::new(i);
                vec![
                    format!("DTSTART;VALUE=DATE:{}", date.format("%Y%m%d")),
                    "RRULE:FREQ=YEARLY;COUNT=50".to_string(),
                ]
            })
            .collect();
        let refs: Vec<Vec<&str>> = events
            .iter()
            .map(|e| e.iter().map(String::as_str).collect())
            .collect();
        let slices: Vec<&[&str]> = refs.iter().map(Vec::as_slice).collect();
        assert_eq!(
            refusal(&feed(&slices)),
            "the events make more than 5000 holidays (recurring ones counted once a year); a \
             calendar holds at most 5000"
        );
        // 100 such events make exactly 5000.
        assert_eq!(
            holidays_from_ics(&feed(&slices[..100]))
                .unwrap()
                .holidays
                .len(),
            MAX_HOLIDAYS
        );
    }
}

//! systemd's calendar events (`systemd.time(7)`, "CALENDAR EVENTS") read into the sets of
//! values they match, and written as sked cron text with its time zone, or refused with the
//! reason when cron cannot hold the same instants.
//!
//! Also owns the one place where the two differ by design: a local time that a
//! spring-forward gap skips. systemd (as `systemd-analyze calendar` computes it) does not fire
//! it that day; sked's DST contract (`sked_core::schedule::cron`) fires it once at the end of
//! the gap. [`CalendarEvent::dst_difference`] finds whether an expression meets that case.
//! A repeated (fall-back) local time fires once, at its first occurrence, in both.
//! Pure: no IO, no clock.

use chrono::{Datelike, NaiveDate, NaiveDateTime, Offset, TimeZone, Timelike};
use chrono_tz::Tz;

/// The years both systemd and sked's cron can name.
const MIN_YEAR: u32 = 1970;
const MAX_YEAR: u32 = 2199;
/// systemd counts `~` days up to the 28th-last (every month has them).
const MAX_FROM_END: u32 = 28;
/// The years searched for spring-forward gaps a translation meets.
const DST_SCAN_YEARS: (i32, i32) = (2000, 2199);

const WEEKDAYS: [&str; 7] = [
    "sunday",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
];
const CRON_WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The day-of-month component: counted from the 1st (`-`), or from the last day (`~`, where
/// 1 is the last day, 2 the day before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Days {
    FromStart(u32),
    FromEnd(u32),
}

/// A calendar event as the sets of values it matches; each mask has bit `v` for value `v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CalendarEvent {
    /// Bits 0-6, Sunday = 0 (cron's numbering).
    weekdays: u8,
    /// `None`: any year.
    years: Option<Vec<u32>>,
    /// Bits 1-12.
    months: u16,
    days: Days,
    /// Bits 0-23.
    hours: u32,
    /// Bits 0-59.
    minutes: u64,
    /// Bits 0-59.
    seconds: u64,
    /// The zone suffix, as written and as read; `None`: the machine's local zone.
    zone: Option<(String, Tz)>,
}

/// sked's form of an event: `schedule.cron` and `schedule.timezone`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CronForm {
    pub cron: String,
    pub timezone: Option<String>,
}

const ALL_WEEKDAYS: u8 = 0x7f;
const ALL_MONTHS: u16 = 0x1ffe;
const ALL_DAYS: u32 = 0xffff_fffe;

/// The shorthands and the normalized forms systemd gives them.
fn shorthand(text: &str) -> Option<&'static str> {
    Some(match text.to_ascii_lowercase().as_str() {
        "minutely" => "*-*-* *:*:00",
        "hourly" => "*-*-* *:00:00",
        "daily" => "*-*-* 00:00:00",
        "monthly" => "*-*-01 00:00:00",
        "weekly" => "Mon *-*-* 00:00:00",
        "yearly" | "annually" => "*-01-01 00:00:00",
        "quarterly" => "*-01,04,07,10-01 00:00:00",
        "semiannually" | "semi-annually" => "*-01,07-01 00:00:00",
        _ => return None,
    })
}

impl CalendarEvent {
    /// Reads an `OnCalendar=` value. The error names the part systemd's syntax does not
    /// allow, or that this reader does not take (said so).
    pub fn parse(text: &str) -> Result<CalendarEvent, String> {
        let mut tokens: Vec<&str> = text.split_whitespace().collect();
        if tokens.is_empty() {
            return Err("the calendar event is empty".to_string());
        }
        let mut zone = None;
        if tokens.len() > 1 {
            if let Some(last) = tokens.last() {
                if let Ok(tz) = last.parse::<Tz>() {
                    zone = Some((last.to_string(), tz));
                    tokens.pop();
                }
            }
        }
        let expanded;
        if let [only] = tokens.as_slice() {
            if let Some(normal) = shorthand(only) {
                expanded = normal;
                tokens = expanded.split_whitespace().collect();
            }
        }
        let mut event = CalendarEvent {
            weekdays: ALL_WEEKDAYS,
            years: None,
            months: ALL_MONTHS,
            days: Days::FromStart(ALL_DAYS),
            hours: 1,
            minutes: 1,
            seconds: 1,
            zone,
        };
        let mut rest = tokens.as_slice();
        if let [first, more @ ..] = rest {
            if first.starts_with(|c: char| c.is_ascii_alphabetic()) {
                event.weekdays = weekdays(first)?;
                rest = more;
            }
        }
        if let [first, more @ ..] = rest {
            if !first.contains(':') {
                event.date(first)?;
                rest = more;
            }
        }
        if let [first, more @ ..] = rest {
            event.time(first)?;
            rest = more;
        }
        if let [extra, ..] = rest {
            return Err(format!(
                "{extra:?} is not understood: systemd reads [weekdays] [date] [time] [zone]"
            ));
        }
        Ok(event)
    }

    /// `[YEAR-]MONTH-DAY` or `[YEAR-]MONTH~DAY`.
    fn date(&mut self, text: &str) -> Result<(), String> {
        let (front, day, from_end) = match text.split_once('~') {
            Some((front, day)) => (front, day, true),
            None => match text.rsplit_once('-') {
                Some((front, day)) => (front, day, false),
                None => {
                    return Err(format!(
                        "{text:?} is not a date such as *-*-01 or 2025-06-30"
                    ))
                }
            },
        };
        let (year, month) = match front.split_once('-') {
            Some((year, month)) => (Some(year), month),
            None => (None, front),
        };
        if let Some(year) = year {
            if year != "*" {
                let mut years = values(year, "year", 0, 9999)?
                    .into_iter()
                    .map(|y| match y {
                        0..=69 => y + 2000,
                        70..=99 => y + 1900,
                        _ => y,
                    })
                    .collect::<Vec<_>>();
                years.sort_unstable();
                years.dedup();
                if let Some(y) = years.iter().find(|y| !(MIN_YEAR..=MAX_YEAR).contains(*y)) {
                    return Err(format!("year {y} is outside {MIN_YEAR}-{MAX_YEAR}"));
                }
                self.years = Some(years);
            }
        }
        self.months = mask(values(month, "month", 1, 12)?) as u16;
        self.days = if from_end {
            Days::FromEnd(mask(from_end_values(day)?) as u32)
        } else {
            Days::FromStart(mask(values(day, "day", 1, 31)?) as u32)
        };
        Ok(())
    }

    /// `HOUR:MINUTE[:SECOND]`.
    fn time(&mut self, text: &str) -> Result<(), String> {
        let parts: Vec<&str> = text.split(':').collect();
        let (hour, minute, second) = match parts.as_slice() {
            [h, m] => (*h, *m, "00"),
            [h, m, s] => (*h, *m, *s),
            _ => return Err(format!("{text:?} is not a time such as 09:00 or *:0/15")),
        };
        self.hours = mask(values(hour, "hour", 0, 23)?) as u32;
        self.minutes = mask(values(minute, "minute", 0, 59)?);
        self.seconds = mask(values(&whole_seconds(second)?, "second", 0, 59)?);
        Ok(())
    }

    /// sked's cron for the same instants in the same zone, or why cron cannot say it.
    pub fn to_cron(&self) -> Result<CronForm, String> {
        let (dom, dow) = self.day_fields()?;
        let mut fields = Vec::new();
        let with_seconds = self.seconds != 1 || self.years.is_some();
        if with_seconds {
            fields.push(render(self.seconds, 0, 59));
        }
        fields.push(render(self.minutes, 0, 59));
        fields.push(render(u64::from(self.hours), 0, 23));
        fields.push(dom);
        fields.push(render(u64::from(self.months), 1, 12));
        fields.push(dow);
        if let Some(years) = &self.years {
            fields.push(render_list(years.iter().map(|y| y.to_string()), years));
        }
        Ok(CronForm {
            cron: fields.join(" "),
            timezone: self.zone.as_ref().map(|(name, _)| name.clone()),
        })
    }

    /// The day-of-month and day-of-week fields. systemd matches a day when both the weekday
    /// and the date match; cron (Vixie) does that only when one of the two is `*`, and
    /// otherwise matches either. So when both are restricted, the days must be whole weeks
    /// of the month (days 1-7 are the first such weekday, `MON#1`; the last seven days hold
    /// the last one, `MONL`), or cron cannot say it.
    fn day_fields(&self) -> Result<(String, String), String> {
        let weekdays_any = self.weekdays == ALL_WEEKDAYS;
        let dow = || render_weekdays(self.weekdays);
        match self.days {
            Days::FromStart(ALL_DAYS) => Ok(("*".to_string(), dow())),
            Days::FromStart(days) if weekdays_any => {
                Ok((render(u64::from(days), 1, 31), "*".to_string()))
            }
            Days::FromEnd(positions) if weekdays_any => {
                let items = (1..=MAX_FROM_END)
                    .rev()
                    .filter(|p| positions & (1 << p) != 0)
                    .map(|p| match p {
                        1 => "L".to_string(),
                        p => format!("L-{}", p - 1),
                    });
                Ok((items.collect::<Vec<_>>().join(","), "*".to_string()))
            }
            Days::FromStart(days) => {
                const WEEKS: [(u32, u32); 5] = [(1, 7), (8, 14), (15, 21), (22, 28), (29, 31)];
                let block =
                    |(lo, hi): (u32, u32)| (((1u64 << (hi + 1)) - 1) & !((1u64 << lo) - 1)) as u32;
                let mut weeks = Vec::new();
                for (n, week) in WEEKS.iter().enumerate() {
                    let bits = block(*week);
                    if days & bits == bits {
                        weeks.push(n + 1);
                    } else if days & bits != 0 {
                        return Err(format!(
                            "the weekdays hold only on some days of the month ({}): cron \
                             matches a weekday or a day of the month, not both, unless the days \
                             are whole weeks (1..7, 8..14, 15..21, 22..28, 29..31)",
                            render(u64::from(days), 1, 31)
                        ));
                    }
                }
                let items = weekday_list(self.weekdays).flat_map(|w| {
                    weeks
                        .iter()
                        .map(move |n| format!("{}#{n}", CRON_WEEKDAYS[w as usize]))
                });
                Ok(("*".to_string(), items.collect::<Vec<_>>().join(",")))
            }
            Days::FromEnd(positions) => {
                let last_week = (1..=7).fold(0u32, |m, p| m | 1 << p);
                if positions != last_week {
                    return Err(
                        "the weekdays hold only on some of the last days of the month: cron \
                         can name the last such weekday (the last seven days, ~1..7), not a \
                         part of them"
                            .to_string(),
                    );
                }
                let items =
                    weekday_list(self.weekdays).map(|w| format!("{}L", CRON_WEEKDAYS[w as usize]));
                Ok(("*".to_string(), items.collect::<Vec<_>>().join(",")))
            }
        }
    }

    /// Whether the event names the local date-time (seconds resolution).
    pub fn matches(&self, at: NaiveDateTime) -> bool {
        self.matches_date(at.date())
            && self.hours & (1 << at.hour()) != 0
            && self.minutes & (1 << at.minute()) != 0
            && self.seconds & (1 << at.second()) != 0
    }

    fn matches_date(&self, date: NaiveDate) -> bool {
        let weekday = date.weekday().num_days_from_sunday();
        let year_ok = self.years.as_ref().is_none_or(|years| {
            u32::try_from(date.year()).is_ok_and(|y| years.binary_search(&y).is_ok())
        });
        let day_ok = match self.days {
            Days::FromStart(days) => days & (1 << date.day()) != 0,
            Days::FromEnd(positions) => {
                let position = days_in_month(date) - date.day() + 1;
                positions & (1 << position) != 0
            }
        };
        year_ok
            && self.weekdays & (1 << weekday) != 0
            && self.months & (1 << date.month()) != 0
            && day_ok
    }

    /// When the event names a local time that a spring-forward gap of its zone skips (and
    /// not the wall time the gap ends at, which both fire at anyway): what systemd and sked
    /// then do differently, with the first such day and how many there are in
    /// [`DST_SCAN_YEARS`]. `None` when the two fire at the same instants.
    pub fn dst_difference(&self) -> Option<String> {
        let (name, tz) = self.zone.as_ref()?;
        let mut hits = gaps(*tz).filter(|(start, end)| {
            !self.matches(*end) && {
                let mut at = *start;
                let mut hit = false;
                while at < *end && !hit {
                    hit = self.matches(at);
                    at += chrono::Duration::seconds(1);
                }
                hit
            }
        });
        let (start, end) = hits.next()?;
        let more = hits.count();
        Some(format!(
            "DST: in {name}, local times from {} to {} do not exist on the day clocks spring \
             forward (first {}{}); systemd does not fire a time this timer names there that \
             day, sked fires it once at {}, the end of the gap",
            start.format("%H:%M:%S"),
            end.format("%H:%M:%S"),
            start.format("%Y-%m-%d"),
            match more {
                0 => String::new(),
                n => format!(", and {n} more such days up to {}", DST_SCAN_YEARS.1),
            },
            end.format("%H:%M:%S"),
        ))
    }
}

/// The spring-forward gaps of `tz` in [`DST_SCAN_YEARS`], as local `[start, end)` wall times.
fn gaps(tz: Tz) -> impl Iterator<Item = (NaiveDateTime, NaiveDateTime)> {
    let offset = move |at: NaiveDateTime| -> i64 {
        i64::from(tz.offset_from_utc_datetime(&at).fix().local_minus_utc())
    };
    let first = NaiveDate::from_ymd_opt(DST_SCAN_YEARS.0, 1, 1);
    let last = NaiveDate::from_ymd_opt(DST_SCAN_YEARS.1, 12, 31);
    let days = first.zip(last).into_iter().flat_map(|(first, last)| {
        first
            .iter_days()
            .take_while(move |d| *d <= last)
            .map(|d| d.and_time(chrono::NaiveTime::MIN))
    });
    // Offsets change at most once a day: a day whose next midnight has a larger offset holds
    // one gap, found to the second by bisection.
    days.filter_map(move |midnight| {
        let next = midnight + chrono::Duration::days(1);
        let (before, after) = (offset(midnight), offset(next));
        if after <= before {
            return None;
        }
        let (mut lo, mut hi) = (midnight, next);
        while hi - lo > chrono::Duration::seconds(1) {
            let mid = lo + (hi - lo) / 2;
            if offset(mid) == before {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some((
            hi + chrono::Duration::seconds(before),
            hi + chrono::Duration::seconds(after),
        ))
    })
}

fn days_in_month(date: NaiveDate) -> u32 {
    let (y, m) = (date.year(), date.month());
    let next = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    };
    next.and_then(|n| n.pred_opt()).map_or(31, |d| d.day())
}

/// A weekday list: names (`Mon`, `Monday`, any case), lists `,` and ranges `..` (or `-`),
/// not wrapping past Sunday.
fn weekdays(text: &str) -> Result<u8, String> {
    let day = |name: &str| -> Result<u32, String> {
        let lower = name.to_ascii_lowercase();
        WEEKDAYS
            .iter()
            .position(|full| *full == lower || (lower.len() == 3 && full.starts_with(&lower)))
            .map(|i| i as u32)
            .ok_or_else(|| format!("{name:?} is not a weekday such as Mon or Monday"))
    };
    // Counted from Monday, as systemd orders a range.
    let from_monday = |d: u32| (d + 6) % 7;
    let mut bits = 0u8;
    for item in text.split(',') {
        let range = item.split_once("..").or_else(|| item.split_once('-'));
        match range {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                if from_monday(a) > from_monday(b) {
                    return Err(format!(
                        "weekday range {item:?} runs backwards (systemd's weeks start on Monday)"
                    ));
                }
                for d in from_monday(a)..=from_monday(b) {
                    bits |= 1 << ((d + 1) % 7);
                }
            }
            None => bits |= 1 << day(item)?,
        }
    }
    Ok(bits)
}

/// A second as written (`10`, `10.000`, `0/15`); cron counts whole seconds, so a fraction is
/// refused.
fn whole_seconds(text: &str) -> Result<String, String> {
    let mut out = String::new();
    for piece in text.split_inclusive([',', '/']) {
        let (number, sep) = match piece.strip_suffix([',', '/']) {
            Some(number) => (number, &piece[number.len()..]),
            None => (piece, ""),
        };
        let mut ends = Vec::new();
        for end in number.split("..") {
            match end.split_once('.') {
                Some((whole, fraction)) if fraction.chars().all(|c| c == '0') => ends.push(whole),
                Some(_) => {
                    return Err(format!(
                        "second {text:?} has a fraction of a second: cron counts whole seconds"
                    ))
                }
                None => ends.push(end),
            }
        }
        out.push_str(&ends.join(".."));
        out.push_str(sep);
    }
    Ok(out)
}

/// The values of one component: a list of `*`, `V`, `V..W`, `V/R` (V, V+R, ... up to the
/// field's end) and `V..W/R`. Years are taken as written (two-digit years are the caller's).
fn values(text: &str, field: &str, min: u32, max: u32) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let (range, repeat) = match item.split_once('/') {
            Some((range, repeat)) => (range, Some(repeat)),
            None => (item, None),
        };
        if range == "*" {
            if repeat.is_some() {
                return Err(format!(
                    "{field} {item:?}: systemd takes a repetition after a value (0/15), not *"
                ));
            }
            out.extend(min..=max);
            continue;
        }
        let number = |t: &str| -> Result<u32, String> {
            t.parse::<u32>()
                .ok()
                .filter(|v| (min..=max).contains(v))
                .ok_or_else(|| format!("{field} {t:?} is not a number {min}-{max}"))
        };
        let (lo, hi) = match range.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    return Err(format!("{field} range {range:?} runs backwards"));
                }
                (a, b)
            }
            None => {
                let v = number(range)?;
                (v, if repeat.is_some() { max } else { v })
            }
        };
        let step = match repeat {
            None => 1,
            Some(r) => r
                .parse::<u32>()
                .ok()
                .filter(|r| (1..=max.max(1)).contains(r))
                .ok_or_else(|| {
                    format!("{field} repetition {item:?} is not a whole number 1-{max}")
                })?,
        };
        out.extend((lo..=hi).step_by(step as usize));
    }
    Ok(out)
}

/// The `~` day positions: `~A` (the A-th last day), `~A..B`, `~A/R` and `~A..B/R` (from the
/// B-th last day towards the end in steps of R, as systemd counts them).
fn from_end_values(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let (range, repeat) = match item.split_once('/') {
            Some((range, repeat)) => (range, Some(repeat)),
            None => (item, None),
        };
        let number = |t: &str| -> Result<u32, String> {
            t.parse::<u32>()
                .ok()
                .filter(|v| (1..=MAX_FROM_END).contains(v))
                .ok_or_else(|| {
                    format!("day ~{t} is not a day 1-{MAX_FROM_END} counted from the month's end")
                })
        };
        let (lo, hi) = match range.split_once("..") {
            Some((a, b)) => (number(a)?, number(b)?),
            None if repeat.is_some() => (1, number(range)?),
            None => {
                let v = number(range)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(format!("day range ~{range} runs backwards"));
        }
        let step = match repeat {
            None => 1,
            Some(r) => r
                .parse::<u32>()
                .ok()
                .filter(|r| *r >= 1)
                .ok_or_else(|| format!("day repetition ~{item} is not a whole number"))?,
        };
        let mut p = hi;
        while p >= lo {
            out.push(p);
            match p.checked_sub(step) {
                Some(next) => p = next,
                None => break,
            }
        }
    }
    Ok(out)
}

fn mask(values: Vec<u32>) -> u64 {
    values.into_iter().fold(0, |m, v| m | 1 << v)
}

fn weekday_list(bits: u8) -> impl Iterator<Item = u32> {
    // Monday first, as people read a week.
    [1, 2, 3, 4, 5, 6, 0]
        .into_iter()
        .filter(move |d| bits & (1 << d) != 0)
}

fn render_weekdays(bits: u8) -> String {
    if bits == ALL_WEEKDAYS {
        return "*".to_string();
    }
    let days: Vec<u32> = weekday_list(bits).collect();
    // Runs in Monday-first order; Sunday is 0 in cron, so a run ending on Sunday is split.
    let mut items = Vec::new();
    let mut i = 0;
    while i < days.len() {
        let mut j = i;
        while j + 1 < days.len() && days[j + 1] == days[j] + 1 {
            j += 1;
        }
        let (a, b) = (
            CRON_WEEKDAYS[days[i] as usize],
            CRON_WEEKDAYS[days[j] as usize],
        );
        items.push(match j - i {
            0 => a.to_string(),
            1 => format!("{a},{b}"),
            _ => format!("{a}-{b}"),
        });
        i = j + 1;
    }
    items.join(",")
}

/// A numeric field: `*` when it holds every value, `A/R` or `*/R` for a repetition that runs
/// to the field's end, else a list of values and ranges.
fn render(bits: u64, min: u32, max: u32) -> String {
    let set: Vec<u32> = (min..=max).filter(|v| bits & (1 << v) != 0).collect();
    if set.len() as u32 == max - min + 1 {
        return "*".to_string();
    }
    if set.len() >= 3 {
        let step = set[1] - set[0];
        let regular = set.windows(2).all(|w| w[1] - w[0] == step);
        if step > 1 && regular && set[set.len() - 1] + step > max {
            return if set[0] == min {
                format!("*/{step}")
            } else {
                format!("{}/{step}", set[0])
            };
        }
    }
    render_list(set.iter().map(|v| v.to_string()), &set)
}

/// Values as a comma list, runs of three or more consecutive values as `a-b`.
fn render_list(texts: impl Iterator<Item = String>, values: &[u32]) -> String {
    let texts: Vec<String> = texts.collect();
    let mut items = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let mut j = i;
        while j + 1 < values.len() && values[j + 1] == values[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            items.push(format!("{}-{}", texts[i], texts[j]));
        } else {
            items.extend(texts[i..=j].iter().cloned());
        }
        i = j + 1;
    }
    items.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(text: &str) -> String {
        let form = CalendarEvent::parse(text)
            .and_then(|e| e.to_cron())
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        match form.timezone {
            Some(tz) => format!("{} [{tz}]", form.cron),
            None => form.cron,
        }
    }

    fn refused(text: &str) -> String {
        match CalendarEvent::parse(text).and_then(|e| e.to_cron()) {
            Ok(form) => panic!("{text} translated to {form:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn weekdays_dates_times_and_zones() {
        assert_eq!(cron("Mon..Fri *-*-* 09:00"), "0 9 * * MON-FRI");
        assert_eq!(cron("*-*-01 00:00:00"), "0 0 1 * *");
        assert_eq!(cron("*:0/15"), "*/15 * * * *");
        assert_eq!(cron("Sat,Sun 10:30"), "30 10 * * SAT,SUN");
        assert_eq!(
            cron("*-*-* 02:00:00 Europe/Berlin"),
            "0 2 * * * [Europe/Berlin]"
        );
        assert_eq!(cron("Mon,Wed..Fri 8:00 UTC"), "0 8 * * MON,WED-FRI [UTC]");
        assert_eq!(cron("monday-wednesday"), "0 0 * * MON-WED");
        assert_eq!(cron("Sun,Mon 1:00"), "0 1 * * MON,SUN");
        assert_eq!(cron("*-*-* 8..18/3:00"), "0 8,11,14,17 * * *");
        assert_eq!(cron("*-*-1..7/2 0/2:05"), "5 */2 1,3,5,7 * *");
        assert_eq!(cron("*:*:0/10"), "*/10 * * * * *");
        assert_eq!(cron("*:*:10.000"), "10 * * * * *");
        assert_eq!(cron("01-15"), "0 0 15 1 *");
        assert_eq!(cron("2025-06-30 12:00"), "0 0 12 30 6 * 2025");
        assert_eq!(cron("25,27..29-01-01"), "0 0 0 1 1 * 2025,2027-2029");
    }

    #[test]
    fn shorthands_are_systemds_not_crons() {
        assert_eq!(cron("minutely"), "* * * * *");
        assert_eq!(cron("hourly"), "0 * * * *");
        assert_eq!(cron("daily"), "0 0 * * *");
        // systemd's week starts on Monday; cron's @weekly is Sunday.
        assert_eq!(cron("weekly"), "0 0 * * MON");
        assert_eq!(cron("monthly"), "0 0 1 * *");
        assert_eq!(cron("yearly"), "0 0 1 1 *");
        assert_eq!(cron("annually"), "0 0 1 1 *");
        assert_eq!(cron("quarterly"), "0 0 1 */3 *");
        assert_eq!(cron("semiannually"), "0 0 1 1,7 *");
        assert_eq!(cron("daily Europe/Berlin"), "0 0 * * * [Europe/Berlin]");
    }

    #[test]
    fn weekday_and_date_together_need_whole_weeks() {
        assert_eq!(cron("Mon *-*-1..7 12:00"), "0 12 * * MON#1");
        assert_eq!(cron("Sat,Sun *-*-8..21"), "0 0 * * SAT#2,SAT#3,SUN#2,SUN#3");
        assert_eq!(cron("Fri *-*-29..31"), "0 0 * * FRI#5");
        assert_eq!(cron("Fri *-*~1..7 18:00"), "0 18 * * FRIL");
        assert!(refused("Fri *-*-13").contains("whole weeks"));
        assert!(refused("Mon *-*~1..3").contains("last such weekday"));
    }

    #[test]
    fn days_from_the_end_of_the_month() {
        assert_eq!(cron("*-*~01"), "0 0 L * *");
        assert_eq!(cron("*-02~03 06:00"), "0 6 L-2 2 *");
        assert_eq!(cron("*-*~1..3"), "0 0 L-2,L-1,L * *");
        assert_eq!(cron("*-*~7/2"), "0 0 L-6,L-4,L-2,L * *");
        assert_eq!(cron("*-*~3..9/2"), "0 0 L-8,L-6,L-4,L-2 * *");
    }

    #[test]
    fn what_systemd_or_cron_cannot_take_is_refused_with_the_part() {
        assert!(refused("*:*:0.5/1.5").contains("fraction"));
        assert!(refused("Sat..Mon").contains("backwards"));
        assert!(refused("*-*-*/2").contains("repetition"));
        assert!(refused("*-*-* 24:00").contains("hour"));
        assert!(refused("2300-01-01").contains("outside"));
        assert!(refused("*-*~29").contains("month's end"));
        assert!(refused("Funday").contains("weekday"));
        assert!(refused("*-*-* 12:00 Mars/Olympus").contains("not understood"));
        assert!(refused("").contains("empty"));
    }

    #[test]
    fn the_translation_matches_the_same_local_times() {
        let event = CalendarEvent::parse("Mon *-*-1..7 12:00").unwrap();
        let at = |y, m, d, h| {
            NaiveDate::from_ymd_opt(y, m, d)
                .unwrap()
                .and_hms_opt(h, 0, 0)
                .unwrap()
        };
        assert!(event.matches(at(2025, 1, 6, 12)));
        assert!(!event.matches(at(2025, 1, 13, 12)));
        assert!(!event.matches(at(2025, 1, 6, 11)));
        let last = CalendarEvent::parse("*-*~02").unwrap();
        assert!(last.matches(at(2024, 2, 28, 0)));
        assert!(last.matches(at(2025, 2, 27, 0)));
    }

    #[test]
    fn a_time_in_the_spring_forward_gap_is_the_difference_reported() {
        let gap = CalendarEvent::parse("*-*-* 02:30 Europe/Berlin").unwrap();
        let said = gap.dst_difference().unwrap();
        assert!(said.contains("02:00:00 to 03:00:00"), "{said}");
        assert!(said.contains("2000-03-26"), "{said}");
        // 02:00-02:45 collapse onto 03:00, which both fire at: no difference.
        let quarter = CalendarEvent::parse("*:0/15 Europe/Berlin").unwrap();
        assert_eq!(quarter.dst_difference(), None);
        assert_eq!(
            CalendarEvent::parse("*-*-* 12:00 Europe/Berlin")
                .unwrap()
                .dst_difference(),
            None
        );
        assert_eq!(
            CalendarEvent::parse("*-*-* 02:30 UTC")
                .unwrap()
                .dst_difference(),
            None
        );
        // Only in months where clocks do not change: no difference.
        assert_eq!(
            CalendarEvent::parse("*-01-* 02:30 Europe/Berlin")
                .unwrap()
                .dst_difference(),
            None
        );
    }
}

//! ISO 8601 repeating intervals (`R2/2026-01-01T00:00:00Z/PT5M`, as seed 003 uses them): parsing
//! and the instants they produce. Pure math in UTC: no IO, no clock.
//!
//! `R<n>` is n repetitions after the first instant, so n + 1 instants in all; `R` alone repeats
//! forever. Instant k is `start + k × period`, computed from the start every time, so that months
//! clamp to short months without drifting (Jan 31 + P1M steps: Jan 31, Feb 28, Mar 31, ...).

#[cfg(test)]
mod tests;

use super::MIN_EVERY;
use crate::Instant;
use chrono::{DateTime, Duration, FixedOffset, Months, NaiveDateTime, Utc};

const NANOS_PER_SEC: i64 = 1_000_000_000;
/// The mean Gregorian month, to guess how many periods fit before an instant.
const MEAN_MONTH_NANOS: i128 = 2_629_746 * NANOS_PER_SEC as i128;
const EXAMPLE: &str = "R/2026-01-01T00:00:00Z/PT5M";

/// A parsed repeating interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatingInterval {
    source: String,
    /// Repetitions after the first instant; `None` repeats forever.
    repetitions: Option<u64>,
    start: Instant,
    period: Period,
}

/// A period: calendar months (years are 12 of them) then a fixed length. Days are 24 hours,
/// since the arithmetic is in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Period {
    months: u32,
    nanos: i64,
}

impl RepeatingInterval {
    /// Parses `R<n>/<start>/<duration>` or `R<n>/<start>/<end>`. The start (and end) need a `Z` or
    /// a UTC offset; extended (`2026-01-01T00:00:00Z`) and basic (`20260101T000000Z`) formats.
    pub fn parse(text: &str) -> Result<RepeatingInterval, String> {
        let trimmed = text.trim();
        let parts: Vec<&str> = trimmed.split('/').collect();
        let [count, start, last] = parts[..] else {
            return Err(format!(
                "expected R<n>/<start>/<duration> in three parts separated by /, such as {EXAMPLE}"
            ));
        };
        let repetitions = repetitions(count)?;
        if start.starts_with(['P', 'p']) {
            return Err(format!(
                "the <duration>/<end> form is not supported; give the start first, such as {EXAMPLE}"
            ));
        }
        let start = date_time(start, "start")?;
        let period = if last.starts_with(['P', 'p']) {
            duration(last)?
        } else {
            let end = date_time(last, "end")?;
            if end <= start {
                return Err(format!("end {last} must be after the start"));
            }
            let nanos = (end - start)
                .num_nanoseconds()
                .ok_or_else(|| format!("end {last} is too far after the start; use a duration"))?;
            Period { months: 0, nanos }
        };
        if period.months == 0 {
            let min = MIN_EVERY.as_nanos() as i64;
            if period.nanos == 0 {
                return Err(format!(
                    "duration {last} is zero; the period must be positive"
                ));
            }
            if period.nanos < min {
                return Err(format!(
                    "period {last} is shorter than the minimum of {}",
                    humantime::format_duration(MIN_EVERY)
                ));
            }
        }
        // The ledger keeps instants to the microsecond: every instant of the series must be one.
        if start.timestamp_subsec_nanos() % 1000 != 0 || period.nanos % 1000 != 0 {
            return Err("the start and period must not be finer than a microsecond".to_string());
        }
        Ok(RepeatingInterval {
            source: trimmed.to_string(),
            repetitions,
            start,
            period,
        })
    }

    /// The period when it has a fixed length (no months or years in it).
    pub fn fixed_period(&self) -> Option<std::time::Duration> {
        (self.period.months == 0)
            .then(|| u64::try_from(self.period.nanos).ok())
            .flatten()
            .map(std::time::Duration::from_nanos)
    }

    /// The text as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The first instant `start + k × period` (k in 0..=n) strictly after `after`; `None` once
    /// the repetitions are used up. The index comes from the time alone, not from `_fired`, so
    /// a schedule set in the middle of the series owes exactly the instants still ahead.
    pub fn next_after(&self, after: Instant, _fired: u64) -> Option<Instant> {
        let k = if after < self.start {
            0
        } else {
            self.first_index_after(after)?
        };
        if self.repetitions.is_some_and(|n| k > n) {
            return None;
        }
        self.instant(k)
    }

    /// Instant k, or `None` when it is beyond what a date can hold.
    fn instant(&self, k: u64) -> Option<Instant> {
        let months = u32::try_from(k.checked_mul(u64::from(self.period.months))?).ok()?;
        let shifted = self.start.checked_add_months(Months::new(months))?;
        let nanos = i128::from(k) * i128::from(self.period.nanos);
        let secs = i64::try_from(nanos.div_euclid(i128::from(NANOS_PER_SEC))).ok()?;
        let rest = nanos.rem_euclid(i128::from(NANOS_PER_SEC)) as i64;
        let offset = Duration::try_seconds(secs)?.checked_add(&Duration::nanoseconds(rest))?;
        shifted.checked_add_signed(offset)
    }

    /// The smallest k with instant k strictly after `after`, for `after >= start`: by division
    /// for fixed periods, by an estimate corrected a step or two for calendar ones.
    fn first_index_after(&self, after: Instant) -> Option<u64> {
        let elapsed = nanos_since_epoch(after) - nanos_since_epoch(self.start);
        let per = i128::from(self.period.months) * MEAN_MONTH_NANOS + i128::from(self.period.nanos);
        let mut k = u64::try_from(elapsed / per).ok()?;
        if self.period.months == 0 {
            return k.checked_add(1);
        }
        // An instant out of range counts as later than anything.
        let beyond = |k: u64| self.instant(k).filter(|t| *t <= after).is_none();
        // The estimate is off by a few days at most, well under one period of a month or more.
        for _ in 0..64 {
            if k > 0 && beyond(k - 1) {
                k -= 1;
            } else if !beyond(k) {
                k += 1;
            } else {
                return Some(k);
            }
        }
        None
    }
}

fn nanos_since_epoch(t: Instant) -> i128 {
    i128::from(t.timestamp()) * i128::from(NANOS_PER_SEC) + i128::from(t.timestamp_subsec_nanos())
}

fn repetitions(text: &str) -> Result<Option<u64>, String> {
    let Some(n) = text.strip_prefix(['R', 'r']) else {
        return Err(format!(
            "{text:?} should be R<n> (n repetitions after the first) or R (forever), \
             such as {EXAMPLE}; for a single instant use `at`"
        ));
    };
    if n.is_empty() {
        return Ok(None);
    }
    if !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "repetition count {n:?} in {text:?} is not a whole number; write R for forever"
        ));
    }
    n.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("repetition count {n} is too large; write R for forever"))
}

/// A date-time with `Z` or an offset, in extended or basic format, fractions of a second allowed.
fn date_time(text: &str, what: &str) -> Result<Instant, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let Some(t_at) = text.find(['T', 't']) else {
        return Err(format!(
            "{what} {text:?} needs a date and a time with a UTC offset, such as 2026-01-01T00:00:00Z"
        ));
    };
    let zone_at = text[t_at..]
        .find(['Z', 'z', '+', '-'])
        .map(|i| t_at + i)
        .ok_or_else(|| {
            format!("{what} {text:?} has no UTC offset; add Z or an offset such as +02:00")
        })?;
    let (local, zone) = text.split_at(zone_at);
    let offset = offset(zone).ok_or_else(|| {
        format!("{what} {text:?}: offset {zone:?} should be Z, +hh:mm, +hhmm or +hh")
    })?;
    let formats = [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y%m%dT%H%M%S%.f",
        "%Y%m%dT%H%M",
    ];
    let local = formats
        .iter()
        .find_map(|f| {
            NaiveDateTime::parse_from_str(&local.replace('t', "T").replace(',', "."), f).ok()
        })
        .ok_or_else(|| {
            format!(
                "{what} {text:?} is not a valid date-time; write it as 2026-01-01T00:00:00Z \
                 or 20260101T000000Z"
            )
        })?;
    local
        .and_local_timezone(offset)
        .single()
        .map(|t| t.with_timezone(&Utc))
        .ok_or_else(|| format!("{what} {text:?} is out of range"))
}

fn offset(zone: &str) -> Option<FixedOffset> {
    if zone.eq_ignore_ascii_case("z") {
        return FixedOffset::east_opt(0);
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits: String = zone[1..].chars().filter(|c| *c != ':').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) || zone[1..].matches(':').count() > 1 {
        return None;
    }
    let (h, m) = match digits.len() {
        2 => (digits.parse::<i32>().ok()?, 0),
        4 => (
            digits[..2].parse::<i32>().ok()?,
            digits[2..].parse::<i32>().ok()?,
        ),
        _ => return None,
    };
    if h > 23 || m > 59 {
        return None;
    }
    FixedOffset::east_opt(sign * (h * 3600 + m * 60))
}

/// `PnYnMnWnDTnHnMnS`: components in that order, each at most once, a fraction (`.` or `,`)
/// only on the hours, minutes or seconds that end the duration.
fn duration(text: &str) -> Result<Period, String> {
    let bad = |why: String| format!("duration {text:?}: {why}");
    let body = &text[1..];
    let (date, time) = match body.split_once(['T', 't']) {
        Some((date, time)) => (date, Some(time)),
        None => (body, None),
    };
    if date.is_empty() && time.unwrap_or("").is_empty() {
        return Err(bad(
            "no components; write for example PT5M, PT0.5S or P1D".into()
        ));
    }
    let mut period = Period {
        months: 0,
        nanos: 0,
    };
    let mut months: u64 = 0;
    let mut nanos: i128 = 0;
    let mut last_unit = None;
    for (number, unit) in components(date).map_err(&bad)? {
        let rank = "YMWD".find(unit).ok_or_else(|| {
            bad(match unit {
                'H' | 'S' => format!("{unit} belongs after T, as in PT1{unit}"),
                _ => format!("unknown unit {unit:?} before T; use Y, M, W or D"),
            })
        })?;
        check_order(&mut last_unit, rank, unit).map_err(&bad)?;
        let whole = number
            .whole()
            .map_err(|why| bad(format!("{why}; {unit} takes whole numbers")))?;
        match unit {
            'Y' => months = months.saturating_add(whole.saturating_mul(12)),
            'M' => months = months.saturating_add(whole),
            'W' => nanos += i128::from(whole) * 7 * 86_400 * i128::from(NANOS_PER_SEC),
            _ => nanos += i128::from(whole) * 86_400 * i128::from(NANOS_PER_SEC),
        }
    }
    let mut last_unit = None;
    let time_parts = components(time.unwrap_or("")).map_err(&bad)?;
    if time == Some("") {
        return Err(bad("nothing follows T; write for example PT5M".into()));
    }
    let count = time_parts.len();
    for (i, (number, unit)) in time_parts.into_iter().enumerate() {
        let rank = "HMS".find(unit).ok_or_else(|| {
            bad(match unit {
                'Y' | 'W' | 'D' => format!("{unit} belongs before T, as in P1{unit}"),
                _ => format!("unknown unit {unit:?} after T; use H, M or S"),
            })
        })?;
        check_order(&mut last_unit, rank, unit).map_err(&bad)?;
        if number.has_fraction() && i + 1 < count {
            return Err(bad("only the last component may have a fraction".into()));
        }
        let unit_secs = [3600, 60, 1][rank];
        nanos += number.scaled(unit_secs * i128::from(NANOS_PER_SEC));
    }
    period.months = u32::try_from(months).map_err(|_| bad("too many months".into()))?;
    period.nanos = i64::try_from(nanos).map_err(|_| bad("too long".into()))?;
    Ok(period)
}

fn check_order(last: &mut Option<usize>, rank: usize, unit: char) -> Result<(), String> {
    if last.is_some_and(|l| l >= rank) {
        return Err(format!("{unit} is repeated or out of order"));
    }
    *last = Some(rank);
    Ok(())
}

/// A decimal number as written: the whole part and the fraction digits.
struct Number<'a> {
    whole: &'a str,
    fraction: &'a str,
}

impl Number<'_> {
    fn has_fraction(&self) -> bool {
        !self.fraction.is_empty()
    }

    fn whole(&self) -> Result<u64, String> {
        if self.has_fraction() {
            return Err(format!("{}.{} has a fraction", self.whole, self.fraction));
        }
        self.whole
            .parse()
            .map_err(|_| format!("{} is too large", self.whole))
    }

    /// The number times `unit`, truncated to whole units of `unit`'s smallest part.
    fn scaled(&self, unit: i128) -> i128 {
        // The parser limits digits, so these fit.
        let whole = self.whole.parse::<i128>().unwrap_or(0);
        let mut frac = 0i128;
        let mut scale = 1i128;
        for digit in self.fraction.bytes().take(18) {
            frac = frac * 10 + i128::from(digit - b'0');
            scale *= 10;
        }
        whole * unit + frac * unit / scale
    }
}

/// Splits `12Y3M` into (number, unit) pairs.
fn components(text: &str) -> Result<Vec<(Number<'_>, char)>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
            .ok_or_else(|| format!("{rest:?} has no unit letter after the number"))?;
        let (number, tail) = rest.split_at(digits);
        let mut chars = tail.chars();
        let unit = chars.next().map(|c| c.to_ascii_uppercase()).unwrap_or('?');
        rest = chars.as_str();
        if number.is_empty() {
            return Err(format!("{unit} has no number before it"));
        }
        let (whole, fraction) = match number.split_once(['.', ',']) {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits_only(whole) || !(fraction.is_empty() || digits_only(fraction)) {
            return Err(format!("{number}{unit} is not a number followed by a unit"));
        }
        if whole.len() > 18 {
            return Err(format!("{whole} is too large"));
        }
        if number.ends_with(['.', ',']) {
            return Err(format!("{number:?} has nothing after the decimal mark"));
        }
        out.push((Number { whole, fraction }, unit));
    }
    Ok(out)
}

//! Cron expressions: the compiled form of a `schedule.cron` text and the search for the next
//! instant it matches in an IANA time zone, with sked's DST contract.
//!
//! Parsing lives in `cron/parse.rs`; this file owns the representation and the evaluation. Pure
//! math: no IO, no clock.
//!
//! DST contract (DESIGN.md §1): a local time that does not exist (spring-forward gap) fires at the
//! instant the gap ends, so several gap times collapse into one fire; a repeated local time
//! (fall-back) fires once, at its first occurrence. Evaluation walks matching local date-times in
//! order and maps each to UTC (gap → end of the gap, repeated → earliest). That mapping never goes
//! backwards, so the first mapped instant strictly after `after` is the answer.

mod parse;
#[cfg(test)]
mod tests;

use crate::Instant;
use chrono::{
    Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;

/// The first year a cron expression can match.
pub const MIN_YEAR: i32 = 1970;
/// The last year a cron expression can match; the search gives up after it.
pub const MAX_YEAR: i32 = 2199;

/// Bounds the field-skipping search. A valid expression needs a few steps per month at most, so
/// this only stops a search through every month up to [`MAX_YEAR`] for a rarely matching date.
const MAX_SEARCH_STEPS: u32 = 200_000;

/// A parsed cron expression. Each field is a bit set of the values it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    source: String,
    /// Bits 0-59.
    seconds: u64,
    /// Bits 0-59.
    minutes: u64,
    /// Bits 0-23.
    hours: u32,
    /// Bits 1-31, plus the `L`/`W` forms that depend on the month.
    dom: u32,
    dom_special: Vec<DomSpecial>,
    /// Bits 1-12.
    months: u16,
    /// Bits 0-6, Sunday = 0, plus the `L`/`#` forms that depend on the month.
    dow: u8,
    dow_special: Vec<DowSpecial>,
    /// Bit `y - MIN_YEAR` for each year.
    years: [u64; 4],
    /// True when day-of-month is `*` or `?` (Vixie: a field starting with `*` counts as
    /// unrestricted, so `*/2` does too). When both day fields are restricted a day matches if
    /// either matches; otherwise both must.
    dom_any: bool,
    dow_any: bool,
}

/// Day-of-month forms whose day depends on the month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DomSpecial {
    /// `L` (before = 0) or `L-n`.
    Last { before: u32 },
    /// `LW`: the last weekday (Monday-Friday) of the month.
    LastWeekday,
    /// `nW`: the weekday nearest to day n, staying in the month.
    NearestWeekday(u32),
}

/// Day-of-week forms whose day depends on the month. Weekdays count from Sunday = 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DowSpecial {
    /// `5L`: the last such weekday of the month.
    Last(u32),
    /// `5#3`: the n-th such weekday of the month.
    Nth { weekday: u32, n: u32 },
}

impl CronExpr {
    /// Parses 5 fields (`min hour dom month dow`), 6 (leading seconds), 7 (trailing year) or a
    /// macro such as `@daily`. The error names the field and says what is wrong with it.
    pub fn parse(text: &str) -> Result<CronExpr, String> {
        parse::parse(text)
    }

    /// The expression as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The first instant strictly after `after` at which the expression matches in `tz`, under
    /// the DST contract above. `None` when nothing matches up to the end of [`MAX_YEAR`].
    pub fn next_after(&self, after: Instant, tz: Tz) -> Option<Instant> {
        let mut cursor = start_cursor(after, tz)?;
        // The first candidate may map to `after` itself (same second); every later one maps
        // strictly after it, so this loop ends in one or two rounds.
        for _ in 0..64 {
            let local = self.next_local(cursor)?;
            let at = local_to_utc(local, tz)?;
            if at > after {
                return Some(at);
            }
            cursor = local.checked_add_signed(Duration::seconds(1))?;
        }
        None
    }

    /// Whether the local date-time matches every field (sub-second part ignored).
    pub fn matches_local(&self, local: NaiveDateTime) -> bool {
        bit64(self.seconds, local.second())
            && bit64(self.minutes, local.minute())
            && bit64(u64::from(self.hours), local.hour())
            && bit64(u64::from(self.months), local.month())
            && self.year_ok(local.year())
            && bit64(
                u64::from(self.day_mask(local.year(), local.month())),
                local.day(),
            )
    }

    /// The first local date-time at or after `from` (whole seconds) that matches every field.
    fn next_local(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        let (mut year, mut month, mut day) = (from.year(), from.month(), from.day());
        let (mut hour, mut minute, mut second) = (from.hour(), from.minute(), from.second());
        if year < MIN_YEAR {
            (year, month, day, hour, minute, second) = (MIN_YEAR, 1, 1, 0, 0, 0);
        }
        for _ in 0..MAX_SEARCH_STEPS {
            if year > MAX_YEAR {
                return None;
            }
            if !self.year_ok(year) {
                year = self.next_year(year + 1)?;
                (month, day, hour, minute, second) = (1, 1, 0, 0, 0);
            }
            match next_bit(u64::from(self.months), month) {
                None => {
                    year += 1;
                    (month, day, hour, minute, second) = (1, 1, 0, 0, 0);
                    continue;
                }
                Some(m) if m != month => {
                    month = m;
                    (day, hour, minute, second) = (1, 0, 0, 0);
                }
                Some(_) => {}
            }
            match next_bit(u64::from(self.day_mask(year, month)), day) {
                None => {
                    month += 1;
                    (day, hour, minute, second) = (1, 0, 0, 0);
                    continue;
                }
                Some(d) if d != day => {
                    day = d;
                    (hour, minute, second) = (0, 0, 0);
                }
                Some(_) => {}
            }
            match next_bit(u64::from(self.hours), hour) {
                None => {
                    day += 1;
                    (hour, minute, second) = (0, 0, 0);
                    continue;
                }
                Some(h) if h != hour => {
                    hour = h;
                    (minute, second) = (0, 0);
                }
                Some(_) => {}
            }
            match next_bit(self.minutes, minute) {
                None => {
                    hour += 1;
                    (minute, second) = (0, 0);
                    continue;
                }
                Some(m) if m != minute => {
                    minute = m;
                    second = 0;
                }
                Some(_) => {}
            }
            match next_bit(self.seconds, second) {
                None => {
                    minute += 1;
                    second = 0;
                    continue;
                }
                Some(s) => second = s,
            }
            return NaiveDate::from_ymd_opt(year, month, day)?.and_hms_opt(hour, minute, second);
        }
        None
    }

    fn year_ok(&self, year: i32) -> bool {
        if !(MIN_YEAR..=MAX_YEAR).contains(&year) {
            return false;
        }
        let i = (year - MIN_YEAR) as usize;
        self.years[i / 64] & (1 << (i % 64)) != 0
    }

    fn next_year(&self, from: i32) -> Option<i32> {
        (from.max(MIN_YEAR)..=MAX_YEAR).find(|y| self.year_ok(*y))
    }

    /// Bit d set for each day d of the month that matches both day fields (Vixie rule).
    fn day_mask(&self, year: i32, month: u32) -> u32 {
        let Some(first) = NaiveDate::from_ymd_opt(year, month, 1) else {
            return 0;
        };
        let last = days_in_month(year, month);
        let all = ((1u64 << (last + 1)) - 2) as u32;
        let first_weekday = first.weekday().num_days_from_sunday();
        let dom = self.dom_mask(last, first_weekday) & all;
        let dow = if self.dow == 0x7f && self.dow_special.is_empty() {
            all
        } else {
            self.dow_mask(last, first_weekday)
        };
        if self.dom_any || self.dow_any {
            dom & dow
        } else {
            dom | dow
        }
    }

    fn dom_mask(&self, last: u32, first_weekday: u32) -> u32 {
        let weekday = |d: u32| (first_weekday + d - 1) % 7;
        let mut mask = self.dom;
        for special in &self.dom_special {
            let day = match *special {
                DomSpecial::Last { before } => last.checked_sub(before).filter(|d| *d >= 1),
                DomSpecial::LastWeekday => Some(match weekday(last) {
                    6 => last - 1,
                    0 => last - 2,
                    _ => last,
                }),
                DomSpecial::NearestWeekday(n) if n <= last => Some(match weekday(n) {
                    6 if n == 1 => 3,
                    6 => n - 1,
                    0 if n == last => n - 2,
                    0 => n + 1,
                    _ => n,
                }),
                DomSpecial::NearestWeekday(_) => None,
            };
            if let Some(d) = day {
                mask |= 1 << d;
            }
        }
        mask
    }

    fn dow_mask(&self, last: u32, first_weekday: u32) -> u32 {
        let mut mask = 0u32;
        for d in 1..=last {
            let weekday = (first_weekday + d - 1) % 7;
            let hit = self.dow & (1 << weekday) != 0
                || self.dow_special.iter().any(|special| match *special {
                    DowSpecial::Last(w) => w == weekday && d + 7 > last,
                    DowSpecial::Nth { weekday: w, n } => w == weekday && (d - 1) / 7 + 1 == n,
                });
            if hit {
                mask |= 1 << d;
            }
        }
        mask
    }
}

fn bit64(mask: u64, value: u32) -> bool {
    value < 64 && mask & (1 << value) != 0
}

/// The smallest set bit at or above `from`.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = mask >> from;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if NaiveDate::from_ymd_opt(year, 2, 29).is_some() => 29,
        2 => 28,
        _ => 31,
    }
}

/// Where the local search starts: the wall-clock second of `after`. When `after` lies in the
/// second pass of a repeated hour, every wall time left in that hour already fired on the first
/// pass, so the search starts where the repetition ends.
fn start_cursor(after: Instant, tz: Tz) -> Option<NaiveDateTime> {
    let local = after.with_timezone(&tz);
    let wall = local.naive_local().with_nanosecond(0)?;
    if let LocalResult::Ambiguous(a, b) = tz.from_local_datetime(&wall) {
        let (early, late) = if a <= b { (a, b) } else { (b, a) };
        let offset = local.offset().fix();
        if offset == late.offset().fix() && offset != early.offset().fix() {
            return first_local_where(wall, tz, |r| !matches!(r, LocalResult::Ambiguous(..)));
        }
    }
    Some(wall)
}

/// The UTC instant a matching local time fires at: itself when it exists once, its first
/// occurrence when repeated, the end of the gap when skipped.
pub(crate) fn local_to_utc(local: NaiveDateTime, tz: Tz) -> Option<Instant> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(a, b) => Some(a.min(b).with_timezone(&Utc)),
        LocalResult::None => {
            let end = first_local_where(local, tz, |r| !matches!(r, LocalResult::None))?;
            match tz.from_local_datetime(&end) {
                LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
                LocalResult::Ambiguous(a, b) => Some(a.min(b).with_timezone(&Utc)),
                LocalResult::None => None,
            }
        }
    }
}

/// The first whole-second local time after `from` for which `done` holds, given that it does not
/// hold at `from` and the stretch where it does not is one DST transition (minutes to a day).
/// Doubling then bisecting costs a few dozen zone lookups; transitions fall on whole seconds.
fn first_local_where(
    from: NaiveDateTime,
    tz: Tz,
    done: impl Fn(LocalResult<chrono::DateTime<Tz>>) -> bool,
) -> Option<NaiveDateTime> {
    let holds = |secs: i64| -> Option<bool> {
        let t = from.checked_add_signed(Duration::seconds(secs))?;
        Some(done(tz.from_local_datetime(&t)))
    };
    let (mut lo, mut hi) = (0i64, 1i64);
    while !holds(hi)? {
        lo = hi;
        hi *= 2;
        if hi > 8 * 86_400 {
            return None;
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    from.checked_add_signed(Duration::seconds(hi))
}

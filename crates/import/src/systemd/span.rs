//! systemd's time spans (`systemd.time(7)`, "PARSING TIME SPANS"): `5min`, `1h 30min`,
//! `2d`, `1.5h`, a bare number in seconds, `infinity`. Read into a [`Duration`] that sked's
//! `HumanDuration` then writes its own way; nothing here knows sked's syntax.

use std::time::Duration;

/// A time span as systemd reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Span {
    Finite(Duration),
    Infinity,
}

/// Nanoseconds per unit; `M` (month) and `y` (year) are systemd's averages, 30.44 and
/// 365.25 days. Units are case-sensitive (`M` is a month, `m` a minute).
const UNITS: &[(&str, u128)] = &[
    ("usec", 1_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("msec", 1_000_000),
    ("ms", 1_000_000),
    ("seconds", 1_000_000_000),
    ("second", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("s", 1_000_000_000),
    ("minutes", 60_000_000_000),
    ("minute", 60_000_000_000),
    ("min", 60_000_000_000),
    ("m", 60_000_000_000),
    ("hours", 3_600_000_000_000),
    ("hour", 3_600_000_000_000),
    ("hr", 3_600_000_000_000),
    ("h", 3_600_000_000_000),
    ("days", 86_400_000_000_000),
    ("day", 86_400_000_000_000),
    ("d", 86_400_000_000_000),
    ("weeks", 604_800_000_000_000),
    ("week", 604_800_000_000_000),
    ("w", 604_800_000_000_000),
    ("months", 2_629_800_000_000_000),
    ("month", 2_629_800_000_000_000),
    ("M", 2_629_800_000_000_000),
    ("years", 31_557_600_000_000_000),
    ("year", 31_557_600_000_000_000),
    ("y", 31_557_600_000_000_000),
];

/// Parses a span; the error says what is wrong, for the report.
pub(super) fn parse(text: &str) -> Result<Span, String> {
    let text = text.trim();
    if text == "infinity" {
        return Ok(Span::Infinity);
    }
    if text.is_empty() {
        return Err("the time span is empty".to_string());
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(format!(
                "{text:?} is not a time span such as 5min or 1h 30min"
            ));
        }
        let after = after.trim_start();
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let per = if unit.is_empty() {
            1_000_000_000
        } else {
            UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .map(|(_, per)| *per)
                .ok_or_else(|| format!("{unit:?} in {text:?} is not a systemd time unit"))?
        };
        total = total
            .checked_add(scaled(number, per).ok_or_else(|| format!("{text:?} is not a number"))?)
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| format!("{text:?} is too long"))?;
    Ok(Span::Finite(Duration::new(
        secs,
        (total % 1_000_000_000) as u32,
    )))
}

/// `number` (digits with at most one `.`) times `per` nanoseconds, cut to the nanosecond.
fn scaled(number: &str, per: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(per)?;
    let mut unit = per;
    for digit in fraction.chars() {
        unit /= 10;
        value = value.checked_add(u128::from(digit.to_digit(10)?) * unit)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(text: &str) -> u64 {
        match parse(text).unwrap() {
            Span::Finite(d) => d.as_secs(),
            Span::Infinity => u64::MAX,
        }
    }

    #[test]
    fn reads_systemd_time_spans() {
        assert_eq!(secs("5min"), 300);
        assert_eq!(secs("1h 30min"), 5400);
        assert_eq!(secs("1h30m"), 5400);
        assert_eq!(secs("2d"), 172_800);
        assert_eq!(secs("90"), 90);
        assert_eq!(secs("1.5h"), 5400);
        assert_eq!(secs("1 week"), 604_800);
        assert_eq!(secs("1M"), 2_629_800);
        assert_eq!(secs("1y"), 31_557_600);
        assert_eq!(secs("infinity"), u64::MAX);
        assert_eq!(
            parse("250ms").unwrap(),
            Span::Finite(Duration::from_millis(250))
        );
    }

    #[test]
    fn refuses_what_is_not_a_span() {
        assert!(parse("").is_err());
        assert!(parse("soon").unwrap_err().contains("not a time span"));
        assert!(parse("5 fortnights")
            .unwrap_err()
            .contains("not a systemd time unit"));
        assert!(parse("1..2s").is_err());
    }
}

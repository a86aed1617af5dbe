//! Cron text to [`CronExpr`]: fields, lists, ranges, steps, names, `L`/`W`/`#` and macros, with
//! errors that name the field and the fix. No IO.

use super::{CronExpr, DomSpecial, DowSpecial, MAX_YEAR, MIN_YEAR};
use chrono::NaiveDate;

/// What one field accepts.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    /// What `*` covers (day-of-week stops at 6: 7 is only another spelling of Sunday).
    star_max: u32,
    /// Names for min, min+1, ... (three letters, any case).
    names: &'static [&'static str],
}

const MONTH_NAMES: &[&str] = &[
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

const SECOND: Field = Field::plain("second", 0, 59);
const MINUTE: Field = Field::plain("minute", 0, 59);
const HOUR: Field = Field::plain("hour", 0, 23);
const DOM: Field = Field::plain("day-of-month", 1, 31);
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    star_max: 12,
    names: MONTH_NAMES,
};
const DOW: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    star_max: 6,
    names: DAY_NAMES,
};
const YEAR: Field = Field::plain("year", MIN_YEAR as u32, MAX_YEAR as u32);

impl Field {
    const fn plain(name: &'static str, min: u32, max: u32) -> Field {
        Field {
            name,
            min,
            max,
            star_max: max,
            names: &[],
        }
    }

    /// `5`, or a name such as `MON`.
    fn value(&self, text: &str) -> Result<u32, String> {
        if text.is_empty() {
            return Err("a number is missing".to_string());
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            let value = text
                .parse::<u32>()
                .ok()
                .filter(|v| (self.min..=self.max).contains(v));
            return value
                .ok_or_else(|| format!("{text} is out of range {}-{}", self.min, self.max));
        }
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            return Ok(self.min + i as u32);
        }
        Err(match self.names {
            [] => format!("{text:?} is not a number {}-{}", self.min, self.max),
            names => format!(
                "{text:?} is not a number {}-{} or a name {}-{}",
                self.min,
                self.max,
                names[0],
                names[names.len() - 1]
            ),
        })
    }

    /// One list item without `L`/`W`/`#`: `*`, `a`, `a-b`, each with an optional `/step`.
    fn item(&self, item: &str) -> Result<Vec<u32>, String> {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(self.step(step)?)),
            None => (item, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (self.min, self.star_max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (lo, hi) = (self.value(a)?, self.value(b)?);
            if lo > hi {
                return Err(format!(
                    "range {range} runs backwards; write it as {a}-{},{}-{b}",
                    self.star_max, self.min
                ));
            }
            (lo, hi)
        } else {
            let v = self.value(range)?;
            // `a/n` means from a to the end of the field in steps of n.
            (
                v,
                if step.is_some() {
                    self.star_max.max(v)
                } else {
                    v
                },
            )
        };
        Ok((lo..=hi).step_by(step.unwrap_or(1) as usize).collect())
    }

    fn step(&self, text: &str) -> Result<u32, String> {
        let span = self.star_max - self.min + 1;
        match text.parse::<u32>() {
            Ok(0) => Err("step /0 must be at least 1".to_string()),
            Ok(n) if n <= span => Ok(n),
            Ok(n) => Err(format!(
                "step /{n} is larger than the range {}-{}",
                self.min, self.star_max
            )),
            Err(_) => Err(format!("step /{text} is not a whole number")),
        }
    }

    fn error(&self, text: &str, problem: impl std::fmt::Display) -> String {
        format!("{} field {text:?}: {problem}", self.name)
    }

    /// A plain field (no `L`/`W`/`#`) as a bit set.
    fn bits(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut values = Vec::new();
        for item in text.split(',') {
            if item.starts_with('?') {
                return Err(self.error(
                    text,
                    "? is only allowed in the day-of-month and day-of-week fields",
                ));
            }
            values.extend(self.item(item).map_err(|p| self.error(text, p))?);
        }
        Ok(values)
    }
}

fn mask64(values: &[u32]) -> u64 {
    values.iter().fold(0, |m, v| m | (1u64 << v))
}

const MACROS: &str = "@yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly";

fn expand_macro(name: &str) -> Result<&'static str, String> {
    match name.to_ascii_lowercase().as_str() {
        "yearly" | "annually" => Ok("0 0 1 1 *"),
        "monthly" => Ok("0 0 1 * *"),
        "weekly" => Ok("0 0 * * 0"),
        "daily" | "midnight" => Ok("0 0 * * *"),
        "hourly" => Ok("0 * * * *"),
        "reboot" => Err(
            "@reboot is not supported: sked schedules by time, not by machine start; \
             trigger the job through the API instead"
                .to_string(),
        ),
        _ => Err(format!("unknown macro @{name}; use one of {MACROS}")),
    }
}

pub(super) fn parse(text: &str) -> Result<CronExpr, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(
            "cron expression is empty; write 5 fields such as \"*/5 * * * *\" \
                    or a macro such as @daily"
                .to_string(),
        );
    }
    let body = match trimmed.strip_prefix('@') {
        Some(name) => expand_macro(name)?,
        None => trimmed,
    };
    let f: Vec<&str> = body.split_whitespace().collect();
    let [sec, min, hour, dom, month, dow, year] = match f.len() {
        5 => ["0", f[0], f[1], f[2], f[3], f[4], "*"],
        6 => [f[0], f[1], f[2], f[3], f[4], f[5], "*"],
        7 => [f[0], f[1], f[2], f[3], f[4], f[5], f[6]],
        n => {
            return Err(format!(
                "expected 5, 6 or 7 fields (minute hour day-of-month month day-of-week, \
                 optionally with seconds first and year last), found {n}"
            ))
        }
    };
    let (dom_bits, dom_special) = day_of_month(dom)?;
    let (dow_bits, dow_special) = day_of_week(dow)?;
    let mut years = [0u64; 4];
    for y in YEAR.bits(year)? {
        let i = (y - YEAR.min) as usize;
        years[i / 64] |= 1 << (i % 64);
    }
    let unrestricted = |t: &str| t == "?" || t.starts_with('*');
    let expr = CronExpr {
        source: trimmed.to_string(),
        seconds: mask64(&SECOND.bits(sec)?),
        minutes: mask64(&MINUTE.bits(min)?),
        hours: mask64(&HOUR.bits(hour)?) as u32,
        dom: dom_bits,
        dom_special,
        months: mask64(&MONTH.bits(month)?) as u16,
        dow: dow_bits,
        dow_special,
        years,
        dom_any: unrestricted(dom),
        dow_any: unrestricted(dow),
    };
    check_possible(&expr, [dom, month, dow, year])?;
    Ok(expr)
}

fn day_of_month(text: &str) -> Result<(u32, Vec<DomSpecial>), String> {
    let mut bits = 0u32;
    let mut special = Vec::new();
    for item in text.split(',') {
        let upper = item.to_ascii_uppercase();
        let parsed = if upper == "L" {
            DomSpecial::Last { before: 0 }
        } else if upper == "LW" {
            DomSpecial::LastWeekday
        } else if let Some(n) = upper.strip_prefix("L-") {
            if n.ends_with('W') {
                return Err(DOM.error(
                    text,
                    format!(
                        "{item:?}: L-nW is not in the grammar; day-of-month takes L, L-n, LW \
                         or nW (e.g. L-3 or 15W)"
                    ),
                ));
            }
            match n.parse::<u32>() {
                Ok(before) if before <= 30 => DomSpecial::Last { before },
                _ => {
                    return Err(DOM.error(
                        text,
                        format!("in {item}, the days before the last day must be 0-30"),
                    ))
                }
            }
        } else if let Some(n) = upper.strip_suffix('W') {
            let day = DOM
                .value(n)
                .map_err(|p| DOM.error(text, format!("in {item}, {p}")))?;
            DomSpecial::NearestWeekday(day)
        } else if upper.contains('L') || upper.contains('#') {
            return Err(DOM.error(
                text,
                format!("{item:?} is not understood; day-of-month takes L, L-3, LW or 15W"),
            ));
        } else {
            for d in DOM.item(item).map_err(|p| DOM.error(text, p))? {
                bits |= 1 << d;
            }
            continue;
        };
        special.push(parsed);
    }
    Ok((bits, special))
}

fn day_of_week(text: &str) -> Result<(u8, Vec<DowSpecial>), String> {
    let weekday = |t: &str, item: &str| {
        DOW.value(t)
            .map(|w| w % 7)
            .map_err(|p| DOW.error(text, format!("in {item}, {p}")))
    };
    let mut bits = 0u8;
    let mut special = Vec::new();
    for item in text.split(',') {
        let upper = item.to_ascii_uppercase();
        if let Some((w, n)) = upper.split_once('#') {
            let weekday = weekday(w, item)?;
            match n.parse::<u32>() {
                Ok(n @ 1..=5) => special.push(DowSpecial::Nth { weekday, n }),
                _ => {
                    return Err(DOW.error(
                        text,
                        format!("in {item}, the week after # must be 1-5 (5#3 = third Friday)"),
                    ))
                }
            }
        } else if upper == "L" {
            return Err(DOW.error(
                text,
                "L needs a weekday in day-of-week (5L = last Friday); \
                 for the last day of the month put L in day-of-month",
            ));
        } else if let Some(w) = upper.strip_suffix('L') {
            special.push(DowSpecial::Last(weekday(w, item)?));
        } else {
            for d in DOW.item(item).map_err(|p| DOW.error(text, p))? {
                bits |= 1 << (d % 7);
            }
        }
    }
    Ok((bits, special))
}

/// Rejects expressions that can never fire, with the reason when it is a day the months lack.
fn check_possible(expr: &CronExpr, [dom, month, dow, year]: [&str; 4]) -> Result<(), String> {
    let start = NaiveDate::from_ymd_opt(MIN_YEAR, 1, 1).and_then(|d| d.and_hms_opt(0, 0, 0));
    if start.and_then(|s| expr.next_local(s)).is_some() {
        return Ok(());
    }
    if year == "*" && expr.dow_any && expr.dom_special.is_empty() && expr.dom != 0 {
        let first_day = expr.dom.trailing_zeros();
        return Err(format!(
            "day-of-month field {dom:?}: day {first_day} never occurs in month {month:?}, \
             so the expression never fires"
        ));
    }
    Err(format!(
        "the expression never fires: no date between {MIN_YEAR} and {MAX_YEAR} has \
         day-of-month {dom:?}, month {month:?}, day-of-week {dow:?} and year {year:?}"
    ))
}

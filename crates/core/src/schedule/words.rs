//! A schedule in words, for people: "every day at 02:30 Europe/London", "every 5m", "once at
//! 2026-12-01 09:00:00 UTC", "after extract" (a job that runs after its upstreams). Common cron shapes are spelled out; any other expression is shown
//! as written, with its zone. Pure: no clock, no IO.

use super::{OnHoliday, ScheduleKind, ScheduleSpec};

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// A job's schedule in words: its schedule's, or, for a job without one that waits for
/// upstream jobs, "after extract" (it runs after each of their runs).
pub fn describe_job(schedule: Option<&ScheduleSpec>, upstreams: &[String]) -> String {
    match (schedule, upstreams) {
        (None, [first, rest @ ..]) if !first.is_empty() => {
            let mut words = format!("after {first}");
            for name in rest {
                words.push_str(", ");
                words.push_str(name);
            }
            words
        }
        _ => describe(schedule),
    }
}

/// `schedule` in words; a job without one runs only when triggered.
pub fn describe(schedule: Option<&ScheduleSpec>) -> String {
    let Some(s) = schedule else {
        return "only when triggered".into();
    };
    let words = kind_in_words(s);
    match (&s.calendar, s.on_holiday.unwrap_or_default()) {
        (None, _) => words,
        (Some(_), _) if s.business_day.is_some() || s.every_business_days.is_some() => words,
        (Some(cal), OnHoliday::Skip) => format!("{words}, business days only (calendar {cal})"),
        (Some(cal), OnHoliday::NextBusinessDay) => {
            format!("{words}, or the next business day (calendar {cal})")
        }
        (Some(cal), OnHoliday::PreviousBusinessDay) => {
            format!("{words}, or the previous business day (calendar {cal})")
        }
    }
}

/// "3rd", "last", "2nd to last".
fn ordinal(nth: i32) -> String {
    let n = nth.unsigned_abs();
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    match nth {
        -1 => "last".into(),
        n if n < 0 => format!("{}{suffix} to last", n.unsigned_abs()),
        _ => format!("{n}{suffix}"),
    }
}

/// The schedule's own kind in words, its calendar aside.
fn kind_in_words(s: &ScheduleSpec) -> String {
    let zone = || match &s.calendar {
        Some(cal) => format!("(calendar {cal})"),
        None => format!(
            "{}, Monday to Friday",
            s.timezone.as_deref().unwrap_or("UTC")
        ),
    };
    if let Some(day) = &s.business_day {
        let at = day.at.as_deref().unwrap_or("00:00");
        return format!(
            "{} business day of the month at {at} {}",
            ordinal(day.nth),
            zone()
        );
    }
    if let Some(every) = &s.every_business_days {
        let at = every.at().unwrap_or("00:00");
        let days = match every.every() {
            1 => "every business day".to_string(),
            n => format!("every {n} business days"),
        };
        return format!("{days} at {at} {}", zone());
    }
    match (ScheduleKind::of(Some(s)), s) {
        (
            ScheduleKind::Cron,
            ScheduleSpec {
                cron: Some(cron), ..
            },
        ) => {
            let zone = s.timezone.as_deref().unwrap_or("UTC");
            match cron_in_words(cron) {
                Some(words) => format!("{words} {zone}"),
                None => format!("cron {cron} {zone}"),
            }
        }
        (
            ScheduleKind::Every,
            ScheduleSpec {
                every: Some(every), ..
            },
        ) => format!("every {every}"),
        (
            ScheduleKind::Iso8601,
            ScheduleSpec {
                iso8601: Some(interval),
                ..
            },
        ) => {
            format!("repeating {interval}")
        }
        (ScheduleKind::At, ScheduleSpec { at: Some(at), .. }) => {
            format!("once at {}", at.format("%Y-%m-%d %H:%M:%S UTC"))
        }
        (
            ScheduleKind::Event,
            ScheduleSpec {
                event: Some(key), ..
            },
        ) => {
            format!("on each event {key}")
        }
        _ => "only when triggered".into(),
    }
}

/// "every minute", "every 5 minutes".
fn every(step: u32, unit: &str) -> String {
    if step == 1 {
        format!("every {unit}")
    } else {
        format!("every {step} {unit}s")
    }
}

/// A plain number within `0..=max`.
fn number(field: &str, max: u32) -> Option<u32> {
    field.parse().ok().filter(|n| *n <= max)
}

/// The common shapes of a six-field (seconds first) or five-field expression, or `None`.
fn cron_in_words(expr: &str) -> Option<String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let (second, rest) = match fields.len() {
        6 => (fields[0], &fields[1..]),
        5 => ("0", &fields[..]),
        _ => return None,
    };
    let [minute, hour, dom, month, dow] = [rest[0], rest[1], rest[2], rest[3], rest[4]];
    let any = |f: &str| f == "*" || f == "?";
    if !any(month) {
        return None;
    }
    if [minute, hour, dom, dow].iter().all(|f| any(f)) {
        if second == "*" {
            return Some("every second".into());
        }
        if let Some(step) = second.strip_prefix("*/").and_then(|s| number(s, 59)) {
            return Some(every(step, "second"));
        }
    }
    let second = number(second, 59)?;
    let at_second = |words: String| {
        if second == 0 {
            words
        } else {
            format!("{words} and {second}s")
        }
    };
    if [hour, dom, dow].iter().all(|f| any(f)) {
        if minute == "*" {
            return Some(at_second("every minute".into()));
        }
        if let Some(step) = minute.strip_prefix("*/").and_then(|s| number(s, 59)) {
            return Some(at_second(every(step, "minute")));
        }
        let minute = number(minute, 59)?;
        return Some(at_second(format!("every hour at :{minute:02}")));
    }
    let minute = number(minute, 59)?;
    if any(dom) && any(dow) {
        if let Some(step) = hour.strip_prefix("*/").and_then(|s| number(s, 23)) {
            return Some(at_second(format!(
                "{} at :{minute:02}",
                every(step, "hour")
            )));
        }
    }
    let hour = number(hour, 23)?;
    let time = at_second(format!("{hour:02}:{minute:02}"));
    match (any(dom), any(dow)) {
        (true, true) => Some(format!("every day at {time}")),
        (true, false) => {
            let day = match dow {
                "1-5" | "MON-FRI" => "weekday".to_string(),
                "0,6" | "6,0" | "SAT,SUN" => "weekend day".to_string(),
                d => WEEKDAYS[number(d, 7)? as usize % 7].to_string(),
            };
            Some(format!("every {day} at {time}"))
        }
        (false, true) => {
            let day = number(dom, 31).filter(|d| *d >= 1)?;
            Some(format!("on day {day} of every month at {time}"))
        }
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expr: &str, zone: Option<&str>) -> String {
        describe(Some(&ScheduleSpec {
            cron: Some(expr.into()),
            timezone: zone.map(str::to_string),
            ..ScheduleSpec::default()
        }))
    }

    #[test]
    fn common_cron_shapes_read_as_sentences() {
        assert_eq!(
            cron("0 30 2 * * *", Some("Europe/London")),
            "every day at 02:30 Europe/London"
        );
        assert_eq!(cron("30 2 * * *", None), "every day at 02:30 UTC");
        assert_eq!(cron("0 * * * * *", None), "every minute UTC");
        assert_eq!(cron("* * * * * *", None), "every second UTC");
        assert_eq!(cron("*/2 * * * * *", None), "every 2 seconds UTC");
        assert_eq!(cron("0 */5 * * * *", None), "every 5 minutes UTC");
        assert_eq!(cron("0 */1 * * * *", None), "every minute UTC");
        assert_eq!(cron("*/1 * * * * *", None), "every second UTC");
        assert_eq!(cron("0 0 */1 * * *", None), "every hour at :00 UTC");
        assert_eq!(cron("0 15 * * * *", None), "every hour at :15 UTC");
        assert_eq!(cron("0 0 */6 * * *", None), "every 6 hours at :00 UTC");
        assert_eq!(cron("0 0 9 * * 1-5", None), "every weekday at 09:00 UTC");
        assert_eq!(cron("0 0 9 * * 1", None), "every Monday at 09:00 UTC");
        assert_eq!(cron("0 0 9 * * 7", None), "every Sunday at 09:00 UTC");
        assert_eq!(
            cron("0 0 4 1 * *", None),
            "on day 1 of every month at 04:00 UTC"
        );
        assert_eq!(cron("10 0 4 * * *", None), "every day at 04:00 and 10s UTC");
    }

    #[test]
    fn other_expressions_are_shown_as_written() {
        assert_eq!(cron("0 0 4 L * *", None), "cron 0 0 4 L * * UTC");
        assert_eq!(cron("0 0 4 * 1 *", None), "cron 0 0 4 * 1 * UTC");
        assert_eq!(cron("0 0 4 1 * 1", None), "cron 0 0 4 1 * 1 UTC");
        assert_eq!(cron("0 1,2 4 * * *", None), "cron 0 1,2 4 * * * UTC");
        assert_eq!(cron("@daily", None), "cron @daily UTC");
    }

    #[test]
    fn a_job_without_a_schedule_runs_after_its_upstreams() {
        let after = |names: &[&str]| {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            describe_job(None, &names)
        };
        assert_eq!(after(&["extract"]), "after extract");
        assert_eq!(after(&["extract", "prices"]), "after extract, prices");
        assert_eq!(after(&[]), "only when triggered");
        let every = ScheduleSpec {
            every: Some("5m".parse().unwrap()),
            ..ScheduleSpec::default()
        };
        // A schedule of its own comes first: the dependencies only hold its runs back.
        assert_eq!(
            describe_job(Some(&every), &["extract".to_string()]),
            "every 5m"
        );
    }

    #[test]
    fn other_kinds() {
        assert_eq!(describe(None), "only when triggered");
        let every = ScheduleSpec {
            every: Some("5m".parse().unwrap()),
            ..ScheduleSpec::default()
        };
        assert_eq!(describe(Some(&every)), "every 5m");
        let event = ScheduleSpec {
            event: Some("orders.loaded".into()),
            ..ScheduleSpec::default()
        };
        assert_eq!(describe(Some(&event)), "on each event orders.loaded");
        let at = ScheduleSpec {
            at: Some("2026-12-01T09:00:00Z".parse().unwrap()),
            ..ScheduleSpec::default()
        };
        assert_eq!(describe(Some(&at)), "once at 2026-12-01 09:00:00 UTC");
    }

    #[test]
    fn business_days_and_calendars_read_as_sentences() {
        let read = |v: serde_json::Value| {
            describe(Some(&serde_json::from_value::<ScheduleSpec>(v).unwrap()))
        };
        assert_eq!(
            read(serde_json::json!({"business_day": {"nth": -1, "at": "18:00"}, "calendar": "ny"})),
            "last business day of the month at 18:00 (calendar ny)"
        );
        assert_eq!(
            read(serde_json::json!({"business_day": {"nth": 3}})),
            "3rd business day of the month at 00:00 UTC, Monday to Friday"
        );
        assert_eq!(
            read(serde_json::json!({"every_business_days": 2, "calendar": "uk"})),
            "every 2 business days at 00:00 (calendar uk)"
        );
        assert_eq!(
            read(
                serde_json::json!({"cron": "0 6 1 * *", "timezone": "Europe/London",
                                    "calendar": "uk", "on_holiday": "next_business_day"})
            ),
            "on day 1 of every month at 06:00 Europe/London, or the next business day (calendar uk)"
        );
        assert_eq!(ordinal(-2), "2nd to last");
        assert_eq!(ordinal(11), "11th");
        assert_eq!(ordinal(22), "22nd");
    }
}

//! `sked import celery-beat`: a Celery beat schedule translated into jobs with a Celery target,
//! so the same unmodified workers run the same tasks, published by sked instead of beat.
//!
//! Two sources: the JSON `contrib/celery-beat-export.py` prints from an app's `beat_schedule`
//! ([`import_json`]), and the rows of django-celery-beat's tables ([`import_django_rows`]),
//! which the binary reads. Each entry keeps its name (made a valid job name; the original is in
//! the description), its task, args, kwargs and the options the target carries.
//!
//! Schedules, with Celery's own semantics (`celery/schedules.py`, 5.x):
//! - `crontab`: the fields are read as Celery's `crontab_parser` reads them (names of months
//!   and weekdays anywhere, ranges that wrap, `*/n` and `a-b/n`, Sunday = 0 and no 7), into
//!   sets. Celery runs on a day only when it matches *both* day fields, whatever they are;
//!   sked's cron (Vixie's rule) matches either when both are restricted. So a restricted pair
//!   is written with `#` (weekday n of the month: days 1-7 and Monday are `1#1`) when the
//!   day-of-month is whole weeks of the month, and reported otherwise. The zone is the app's
//!   (`timezone`, else UTC) or the django crontab's. Around a change of clocks Celery's beat
//!   maps a skipped local time with the offset before the change (a 01:30 that does not exist
//!   runs at 02:30) where sked runs it when the gap ends; where the instants part, the entry is
//!   reported ([`celery_dst_difference`], a model of Celery's stepping checked against Celery
//!   itself in the `sked` package's tests).
//! - an interval (`timedelta` or seconds): `every`. `relative=True` rounds to the clock and is
//!   reported, as is a solar schedule (sked has no sunrise).
//! - django's clocked schedule: `at`; `one_off`: `max_runs: 1`; a disabled task: `paused`.
//!
//! This module reads text or rows given to it; it must not touch a database, files, a broker
//! or the clock (but for the default moment changes of clocks are looked for from).

use crate::crontab::slug;
use crate::dst;
use crate::{text_of, Import, ImportError, ImportedJob};
use chrono::{Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::{json, Map, Value};
use sked_core::schedule::cron::CronExpr;
use sked_core::Instant;
use std::collections::{BTreeSet, HashSet};

/// The `format` the export script writes.
pub const EXPORT_FORMAT: &str = "sked-celery-beat-export/1";

/// How to translate.
#[derive(Debug, Clone)]
pub struct Options {
    /// The sked broker connection (`--broker NAME=URL`) the tasks are published through.
    pub connection: String,
    /// The moment from which changes of clocks are compared (now when `None`).
    pub as_of: Option<Instant>,
}

/// Translates the export script's JSON; each task is published through `connection`.
pub fn import_json(text: &str, connection: &str) -> Result<Import, ImportError> {
    import_json_with(
        text,
        &Options {
            connection: connection.to_string(),
            as_of: None,
        },
    )
}

/// [`import_json`] with every option.
pub fn import_json_with(text: &str, options: &Options) -> Result<Import, ImportError> {
    let text = text_of(text.as_bytes())?;
    let doc: Value = serde_json::from_str(text).map_err(|e| ImportError::Syntax {
        line: e.line().max(1),
        message: format!("not the JSON of celery-beat-export.py: {e}"),
    })?;
    let syntax = |message: &str| ImportError::Syntax {
        line: 1,
        message: message.to_string(),
    };
    let Some(top) = doc.as_object() else {
        return Err(syntax(
            "expected an object with \"entries\" (the output of celery-beat-export.py)",
        ));
    };
    match top.get("format").and_then(Value::as_str) {
        Some(EXPORT_FORMAT) | None => {}
        Some(other) => {
            return Err(syntax(&format!(
                "format {other:?} is not {EXPORT_FORMAT:?}, which this sked reads"
            )))
        }
    }
    let Some(entries) = top.get("entries").and_then(Value::as_array) else {
        return Err(syntax("no \"entries\" list"));
    };
    let app_zone = match top.get("timezone") {
        None | Some(Value::Null) => AppZone::Utc {
            host_local: top.get("enable_utc") == Some(&Value::Bool(false)),
        },
        Some(Value::String(name)) => match name.parse::<Tz>() {
            Ok(tz) => AppZone::Zone(tz),
            Err(_) => AppZone::Invalid(name.clone()),
        },
        Some(_) => return Err(syntax("\"timezone\" is not a string")),
    };
    let lines = entry_lines(text, entries);
    let mut clocks = dst::Clocks::new(options.as_of.unwrap_or_else(dst::now));
    let mut import = Import::default();
    let mut names = HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let line = lines.get(i).copied().unwrap_or(0);
        let mut source = match entry_of_json(entry, i + 1) {
            Ok(source) => source,
            Err((label, why)) => {
                import.skip(line, &label, why);
                continue;
            }
        };
        if let (Schedule::Crontab { zone, .. }, AppZone::Zone(tz)) =
            (&mut source.schedule, &app_zone)
        {
            *zone = Some(*tz);
        }
        if let Schedule::Crontab { .. } = source.schedule {
            match &app_zone {
                AppZone::Invalid(name) => {
                    import.skip(
                        line,
                        &source.label,
                        format!("the app's timezone {name:?} is not an IANA time zone"),
                    );
                    continue;
                }
                AppZone::Utc { host_local: true } => source.comments.push(
                    "the app has enable_utc = False and no timezone: Celery read this crontab \
                     in the host's zone; it is read here in UTC (set schedule.timezone)"
                        .to_string(),
                ),
                _ => {}
            }
        }
        translate(&mut import, &mut names, source, line, options, &mut clocks);
    }
    Ok(import)
}

/// The app's zone as the export gave it.
enum AppZone {
    Zone(Tz),
    /// None given: UTC, or the host's zone under `enable_utc = False`.
    Utc {
        host_local: bool,
    },
    Invalid(String),
}

/// The line each entry starts on, when the text is laid out as the export script writes it
/// (one entry a line); otherwise as many as could be matched, in order.
fn entry_lines(text: &str, entries: &[Value]) -> Vec<usize> {
    let mut found = Vec::with_capacity(entries.len());
    let mut next = entries.iter();
    let mut wanted = next.next();
    for (i, raw) in text.lines().enumerate() {
        let Some(entry) = wanted else { break };
        let line = raw.trim().trim_end_matches(',');
        if !line.starts_with('{') {
            continue;
        }
        if serde_json::from_str::<Value>(line).ok().as_ref() == Some(entry) {
            found.push(i + 1);
            wanted = next.next();
        }
    }
    found
}

/// A Celery schedule.
#[derive(Debug, Clone)]
enum Schedule {
    /// The five fields as Celery's sets, their original text, and the zone (the app's or the
    /// django crontab's; UTC when `None`).
    Crontab {
        sets: Box<Fields>,
        original: [String; 5],
        zone: Option<Tz>,
    },
    Interval {
        seconds: f64,
        relative: bool,
    },
    Solar(String),
    /// Django's clocked schedule: one instant.
    Clocked(Instant),
}

/// A crontab's sets, in Celery's field order: minute, hour, day_of_week, day_of_month,
/// month_of_year.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub minute: BTreeSet<u32>,
    pub hour: BTreeSet<u32>,
    pub day_of_week: BTreeSet<u32>,
    pub day_of_month: BTreeSet<u32>,
    pub month_of_year: BTreeSet<u32>,
}

/// One entry, from either source, before translation.
struct Source {
    /// How the entry is named in reports: `entry N "name"` or `periodic task "name"`.
    label: String,
    name: String,
    task: String,
    args: Vec<Value>,
    kwargs: Map<String, Value>,
    queue: Option<String>,
    exchange: Option<String>,
    routing_key: Option<String>,
    priority: Option<i64>,
    /// Seconds after the instant, as Celery's relative `expires`.
    expires: Option<f64>,
    /// Options that are not carried, by name.
    dropped: Vec<String>,
    schedule: Schedule,
    enabled: bool,
    one_off: bool,
    description: Option<String>,
    comments: Vec<String>,
}

fn entry_of_json(entry: &Value, number: usize) -> Result<Source, (String, String)> {
    let name = entry
        .get("name")
        .map(|n| n.as_str().map_or_else(|| n.to_string(), str::to_string))
        .unwrap_or_default();
    let label = format!("entry {number} {name:?}");
    let fail = |why: String| (label.clone(), why);
    if let Some(error) = entry.get("error").and_then(Value::as_str) {
        return Err(fail(format!("the export could not read it: {error}")));
    }
    let task = entry
        .get("task")
        .and_then(Value::as_str)
        .ok_or_else(|| fail("it names no task".to_string()))?
        .to_string();
    let args = match entry.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(fail("args is not a list".to_string())),
    };
    let kwargs = match entry.get("kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(k)) => k.clone(),
        Some(_) => return Err(fail("kwargs is not a dict".to_string())),
    };
    let options = entry.get("options").cloned().unwrap_or(Value::Null);
    let text = |key: &str| -> Result<Option<String>, (String, String)> {
        match options.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(fail(format!("options.{key} is not a name: {other}"))),
        }
    };
    let (queue, exchange, routing_key) = (text("queue")?, text("exchange")?, text("routing_key")?);
    let priority = match options.get("priority") {
        None | Some(Value::Null) => None,
        Some(p) => Some(
            p.as_i64()
                .ok_or_else(|| fail(format!("options.priority {p} is not a whole number")))?,
        ),
    };
    let mut dropped: Vec<String> = options
        .get("others")
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .map(|v| v.as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default();
    let expires = match options.get("expires") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(_) => {
            dropped.push("expires (an absolute time)".to_string());
            None
        }
    };
    let schedule = schedule_of_json(entry.get("schedule").unwrap_or(&Value::Null)).map_err(fail)?;
    Ok(Source {
        label,
        name,
        task,
        args,
        kwargs,
        queue,
        exchange,
        routing_key,
        priority,
        expires,
        dropped,
        schedule,
        enabled: true,
        one_off: false,
        description: None,
        comments: Vec::new(),
    })
}

fn schedule_of_json(schedule: &Value) -> Result<Schedule, String> {
    let kind = schedule.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "crontab" => {
            let field = |key: &str| -> Result<String, String> {
                match schedule.get(key) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(Value::Number(n)) => Ok(n.to_string()),
                    _ => Err(format!("its crontab has no {key}")),
                }
            };
            let original = [
                field("minute")?,
                field("hour")?,
                field("day_of_week")?,
                field("day_of_month")?,
                field("month_of_year")?,
            ];
            // Celery's own expansion, when the export carries it, is the truth; the text is
            // read only when it does not.
            let sets = match schedule.get("expanded") {
                Some(expanded) => Box::new(expanded_sets(expanded)?),
                None => Box::new(parse_crontab(&original)?),
            };
            Ok(Schedule::Crontab {
                sets,
                original,
                zone: None,
            })
        }
        "interval" => {
            let seconds = schedule
                .get("seconds")
                .and_then(Value::as_f64)
                .ok_or("its interval has no seconds")?;
            let relative = schedule.get("relative") == Some(&Value::Bool(true));
            Ok(Schedule::Interval { seconds, relative })
        }
        "solar" => Ok(Schedule::Solar(format!(
            "solar({}, {}, {})",
            schedule.get("event").unwrap_or(&Value::Null),
            schedule.get("lat").unwrap_or(&Value::Null),
            schedule.get("lon").unwrap_or(&Value::Null)
        ))),
        "" => Err("it has no schedule".to_string()),
        other => Err(format!(
            "its schedule is a {:?} ({}), which sked does not know",
            other,
            schedule.get("class").unwrap_or(&Value::Null)
        )),
    }
}

fn expanded_sets(expanded: &Value) -> Result<Fields, String> {
    let set = |key: &str, min: u32, max: u32| -> Result<BTreeSet<u32>, String> {
        let values = expanded
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("its crontab's expanded {key} is missing"))?;
        values
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .filter(|v| (min..=max).contains(v))
                    .ok_or_else(|| format!("its crontab's {key} holds {v}, not {min}-{max}"))
            })
            .collect()
    };
    let fields = Fields {
        minute: set("minute", 0, 59)?,
        hour: set("hour", 0, 23)?,
        day_of_week: set("day_of_week", 0, 6)?,
        day_of_month: set("day_of_month", 1, 31)?,
        month_of_year: set("month_of_year", 1, 12)?,
    };
    check_nonempty(&fields)?;
    Ok(fields)
}

fn check_nonempty(fields: &Fields) -> Result<(), String> {
    for (name, set) in [
        ("minute", &fields.minute),
        ("hour", &fields.hour),
        ("day_of_week", &fields.day_of_week),
        ("day_of_month", &fields.day_of_month),
        ("month_of_year", &fields.month_of_year),
    ] {
        if set.is_empty() {
            return Err(format!("its crontab's {name} is empty: it never runs"));
        }
    }
    Ok(())
}

/// Celery's `crontab(minute, hour, day_of_week, day_of_month, month_of_year)` fields read as
/// its `crontab_parser` reads them.
pub fn parse_crontab(original: &[String; 5]) -> Result<Fields, String> {
    let read = |i: usize, name: &str, max: u32, min: u32| {
        parse_field(&original[i], max, min)
            .map_err(|why| format!("crontab {name} {:?}: {why}", original[i]))
    };
    let fields = Fields {
        minute: read(0, "minute", 60, 0)?,
        hour: read(1, "hour", 24, 0)?,
        day_of_week: read(2, "day_of_week", 7, 0)?,
        day_of_month: read(3, "day_of_month", 31, 1)?,
        month_of_year: read(4, "month_of_year", 12, 1)?,
    };
    check_nonempty(&fields)?;
    Ok(fields)
}

/// One field: `crontab_parser(max_, min_).parse(spec)`. Values run `min..min+max`; ranges
/// wrap past the end; `*/n` and `a-b/n` take every n-th of the expanded list. What Celery's
/// regular expressions would accept only by ignoring trailing text is refused here.
fn parse_field(spec: &str, max: u32, min: u32) -> Result<BTreeSet<u32>, String> {
    let top = min + max - 1;
    let number = |s: &str| -> Result<u32, String> {
        let value = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse::<u32>().map_err(|_| format!("{s} is too large"))?
        } else if s.len() >= 3 && s.chars().all(|c| c.is_ascii_alphabetic()) {
            // Celery tries a month name, then a weekday, by the first three letters.
            let key = s[..3].to_ascii_lowercase();
            const MONTHS: [&str; 12] = [
                "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
            ];
            const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
            if let Some(i) = MONTHS.iter().position(|m| *m == key) {
                i as u32 + 1
            } else if let Some(i) = DAYS.iter().position(|d| *d == key) {
                i as u32
            } else {
                return Err(format!("{s:?} is not a number, a month or a weekday"));
            }
        } else {
            return Err(format!("{s:?} is not a number, a month or a weekday"));
        };
        if value > top {
            return Err(format!("{value} is above {top}"));
        }
        if value < min {
            return Err(format!("{value} is below {min}"));
        }
        Ok(value)
    };
    let range = |from: &str, to: &str| -> Result<Vec<u32>, String> {
        let (a, b) = (number(from)?, number(to)?);
        Ok(if b < a {
            (a..=top).chain(min..=b).collect()
        } else {
            (a..=b).collect()
        })
    };
    let step = |s: &str| -> Result<usize, String> {
        match s.parse::<usize>() {
            Ok(0) => Err("a step of 0".to_string()),
            Ok(n) if s.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(format!("step {s:?} is not a whole number")),
        }
    };
    let mut out = BTreeSet::new();
    for part in spec.split(',') {
        if part.is_empty() {
            return Err("an empty item".to_string());
        }
        let (body, by) = match part.split_once('/') {
            Some((body, by)) => (body, Some(step(by)?)),
            None => (part, None),
        };
        let values: Vec<u32> = if body == "*" {
            (min..=top).collect()
        } else if let Some((from, to)) = body.split_once('-') {
            range(from, to)?
        } else if by.is_some() {
            return Err(format!(
                "{part:?}: Celery takes a step only after * or a range"
            ));
        } else {
            vec![number(body)?]
        };
        out.extend(values.into_iter().step_by(by.unwrap_or(1)));
    }
    Ok(out)
}

/// The sked cron expression whose days and times are Celery's, or why there is none.
pub fn cron_of(fields: &Fields) -> Result<String, String> {
    let full = |set: &BTreeSet<u32>, min: u32, max: u32| set.len() as u32 == max - min + 1;
    let minute = list(&fields.minute, 0, 59);
    let hour = list(&fields.hour, 0, 23);
    let month = list(&fields.month_of_year, 1, 12);
    let any_dom = full(&fields.day_of_month, 1, 31);
    let any_dow = full(&fields.day_of_week, 0, 6);
    let (dom, dow) = match (any_dom, any_dow) {
        (true, _) => ("*".to_string(), list(&fields.day_of_week, 0, 6)),
        (false, true) => (list(&fields.day_of_month, 1, 31), "*".to_string()),
        (false, false) => ("*".to_string(), nth_weekdays(fields)?),
    };
    Ok(format!("{minute} {hour} {dom} {month} {dow}"))
}

/// Both day fields restricted, as weekdays of weeks of the month (`1#1,1#3`): possible when
/// the day-of-month set is whole weeks (1-7, 8-14, 15-21, 22-28, 29-31).
fn nth_weekdays(fields: &Fields) -> Result<String, String> {
    let mut weeks = Vec::new();
    for n in 1..=5u32 {
        let days: BTreeSet<u32> = (7 * (n - 1) + 1..=(7 * n).min(31)).collect();
        let inside = days.intersection(&fields.day_of_month).count();
        if inside == days.len() {
            weeks.push(n);
        } else if inside > 0 {
            return Err(format!(
                "Celery runs it on days matching both day_of_month and day_of_week; sked's cron \
                 matches either when both are set, and can say both only for whole weeks of \
                 the month (days 1-7 and Monday = 1#1), which day_of_month {} is not",
                list(&fields.day_of_month, 1, 31)
            ));
        }
    }
    let items: Vec<String> = fields
        .day_of_week
        .iter()
        .flat_map(|w| weeks.iter().map(move |n| format!("{w}#{n}")))
        .collect();
    Ok(items.join(","))
}

/// A set as cron text: `*` when full, `*/n` or `a-b/n` when evenly stepped from the start,
/// else a list of values and ranges.
fn list(set: &BTreeSet<u32>, min: u32, max: u32) -> String {
    let values: Vec<u32> = set.iter().copied().collect();
    if values.len() as u32 == max - min + 1 {
        return "*".to_string();
    }
    if values.len() >= 3 {
        let step = values[1] - values[0];
        let even = values.windows(2).all(|w| w[1] - w[0] == step);
        // Stepped to the end of the field, so that cron's `a/n` reading gives this set.
        if even && step > 1 && values[values.len() - 1] + step > max {
            return if values[0] == min {
                format!("*/{step}")
            } else {
                format!("{}-{max}/{step}", values[0])
            };
        }
    }
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let mut j = i;
        while j + 1 < values.len() && values[j + 1] == values[j] + 1 {
            j += 1;
        }
        parts.push(if j > i + 1 {
            format!("{}-{}", values[i], values[j])
        } else if j == i + 1 {
            format!("{},{}", values[i], values[j])
        } else {
            values[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

fn translate(
    import: &mut Import,
    names: &mut HashSet<String>,
    source: Source,
    line: usize,
    options: &Options,
    clocks: &mut dst::Clocks,
) {
    let label = source.label.clone();
    let mut comments = source.comments.clone();
    let mut schedule = Map::new();
    let mut dst_check: Option<(CronExpr, Tz)> = None;
    match &source.schedule {
        Schedule::Crontab {
            sets,
            original,
            zone,
        } => {
            let expr = match cron_of(sets) {
                Ok(expr) => expr,
                Err(why) => {
                    import.skip(line, &label, why);
                    return;
                }
            };
            let tz = zone.unwrap_or(chrono_tz::UTC);
            comments.push(format!(
                "Celery: crontab(minute={:?}, hour={:?}, day_of_week={:?}, day_of_month={:?}, \
                 month_of_year={:?})",
                original[0], original[1], original[2], original[3], original[4]
            ));
            if let Ok(parsed) = CronExpr::parse(&expr) {
                dst_check = Some((parsed, tz));
            }
            schedule.insert("cron".into(), json!(expr));
            schedule.insert("timezone".into(), json!(tz.name()));
        }
        Schedule::Interval { seconds, relative } => {
            if *relative {
                import.skip(
                    line,
                    &label,
                    "relative=True rounds each run to the clock in the app's zone; write it as \
                     a cron schedule",
                );
                return;
            }
            let millis = (seconds * 1000.0).round();
            if !millis.is_finite() || !(1.0..=1e15).contains(&millis) {
                import.skip(line, &label, format!("an interval of {seconds} seconds"));
                return;
            }
            let millis = millis as u64;
            let every = if millis.is_multiple_of(1000) {
                format!("{}s", millis / 1000)
            } else {
                format!("{millis}ms")
            };
            schedule.insert("every".into(), json!(every));
            comments.push(
                "Celery counted this interval from beat's start and then from each run's send \
                 time; sked keeps a fixed grid from when the job is applied"
                    .to_string(),
            );
        }
        Schedule::Solar(what) => {
            import.skip(
                line,
                &label,
                format!("{what}: sked has no sunrise or sunset schedule"),
            );
            return;
        }
        Schedule::Clocked(at) => {
            schedule.insert(
                "at".into(),
                json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            );
        }
    }
    if source.one_off && !matches!(source.schedule, Schedule::Clocked(_)) {
        schedule.insert("max_runs".into(), json!(1));
        comments.push("one_off: it runs once, then no more".to_string());
    }
    let mut target = Map::new();
    target.insert("connection".into(), json!(options.connection));
    target.insert("task".into(), json!(source.task));
    if !source.args.is_empty() {
        target.insert("args".into(), json!(source.args));
    }
    if !source.kwargs.is_empty() {
        target.insert("kwargs".into(), Value::Object(source.kwargs.clone()));
    }
    for (key, value) in [
        ("queue", &source.queue),
        ("exchange", &source.exchange),
        ("routing_key", &source.routing_key),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            target.insert(key.into(), json!(v));
        }
    }
    let mut differences = Vec::new();
    if let Some(p) = source.priority {
        match u8::try_from(p) {
            Ok(p) => {
                target.insert("priority".into(), json!(p));
            }
            Err(_) => differences.push(format!("its priority {p} is not 0-255: left out")),
        }
    }
    if let Some(expires) = source.expires {
        let millis = (expires * 1000.0).round();
        if (1.0..=7.0 * 86_400_000.0).contains(&millis) {
            let millis = millis as u64;
            let text = if millis.is_multiple_of(1000) {
                format!("{}s", millis / 1000)
            } else {
                format!("{millis}ms")
            };
            target.insert("expires".into(), json!(text));
        } else {
            differences.push(format!(
                "its expires of {expires} seconds is outside sked's 1ms to 7 days: left out"
            ));
        }
    }
    if !source.dropped.is_empty() {
        differences.push(format!(
            "options not carried by sked's Celery target: {}",
            source.dropped.join(", ")
        ));
    }
    let name = unique_name(names, &source.name, &label);
    let mut description = format!("Celery beat entry {:?}", source.name);
    if let Some(d) = source
        .description
        .as_deref()
        .filter(|d| !d.trim().is_empty())
    {
        description.push_str(": ");
        description.push_str(d.trim());
    }
    let mut job = Map::new();
    job.insert("name".into(), json!(name));
    job.insert("description".into(), json!(description));
    job.insert("schedule".into(), Value::Object(schedule));
    job.insert("target".into(), json!({ "celery": target }));
    if !source.enabled {
        job.insert("paused".into(), json!(true));
        comments.push("disabled in django-celery-beat: imported paused".to_string());
    }
    let kept = import.push_job(
        ImportedJob {
            job: Value::Object(job),
            comments,
            line,
        },
        &label,
    );
    if !kept {
        return;
    }
    for why in differences {
        import.differ(line, &label, why);
    }
    if let Some((expr, tz)) = dst_check {
        if let Some(why) = difference_around(&expr, tz, clocks.of(tz)) {
            import.differ(line, &label, why);
        }
    }
}

fn unique_name(taken: &mut HashSet<String>, name: &str, label: &str) -> String {
    let base = slug(name).unwrap_or_else(|| {
        slug(&format!("celery-{label}")).unwrap_or_else(|| "celery-entry".to_string())
    });
    let mut candidate = base.clone();
    let mut n = 1;
    while taken.contains(&candidate) {
        n += 1;
        candidate = format!("{base}-{n}");
    }
    taken.insert(candidate.clone());
    candidate
}

/// The next instant Celery's beat runs a crontab after the run at `after`, as its
/// `remaining_estimate` computes it: the next local wall time (naive, in `tz`) that matches,
/// strictly after `after`'s own local time, turned into an instant with `fold=0`: a repeated
/// time is its first pass, a skipped one takes the offset from before the change.
pub fn celery_next(expr: &CronExpr, tz: Tz, after: Instant) -> Option<Instant> {
    let mut local = after.with_timezone(&tz).naive_local();
    for _ in 0..4 {
        let next = expr
            .next_after(Utc.from_utc_datetime(&local), chrono_tz::UTC)?
            .naive_utc();
        let at = fold0(next, tz)?;
        if at > after {
            return Some(at);
        }
        local = next;
    }
    None
}

/// A local wall time as Python's `datetime(..., tzinfo=zone, fold=0)` means it.
fn fold0(local: NaiveDateTime, tz: Tz) -> Option<Instant> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        LocalResult::None => {
            // The offset in force a day before: the one before the change.
            let before = tz
                .offset_from_utc_datetime(&(local - Duration::days(1)))
                .fix();
            Some(Utc.from_utc_datetime(
                &(local - Duration::seconds(i64::from(before.local_minus_utc()))),
            ))
        }
    }
}

/// The first change of clocks after `from` around which Celery's instants of `expr` in `tz`
/// ([`celery_next`]) and sked's part, said as a reason; `None` when they never do.
pub fn celery_dst_difference(expr: &CronExpr, tz: Tz, from: Instant) -> Option<String> {
    difference_around(expr, tz, &dst::changes(tz, from))
}

/// [`celery_dst_difference`] around `changes`.
fn difference_around(expr: &CronExpr, tz: Tz, changes: &[dst::Change]) -> Option<String> {
    for change in changes {
        // The stretch of instants a change can touch, with a margin either side.
        let offset = tz
            .offset_from_utc_datetime(&(change.start - Duration::days(1)))
            .fix();
        let start_utc = Utc.from_utc_datetime(
            &(change.start - Duration::seconds(i64::from(offset.local_minus_utc()))),
        );
        let lo = start_utc - Duration::hours(3);
        let hi = start_utc + change.length + Duration::hours(3);
        let (mut c, mut s) = (lo, lo);
        for _ in 0..2000 {
            let celery = celery_next(expr, tz, c);
            let sked = expr.next_after(s, tz);
            match (celery, sked) {
                (Some(a), Some(b)) if a == b => {
                    if a > hi {
                        break;
                    }
                    c = a;
                    s = b;
                }
                (None, None) => break,
                (a, b) => {
                    let show = |t: Option<Instant>| {
                        t.map_or_else(
                            || "never".to_string(),
                            |t| {
                                format!(
                                    "{} ({})",
                                    t.with_timezone(&tz).format("%Y-%m-%d %H:%M %Z"),
                                    t.format("%H:%MZ")
                                )
                            },
                        )
                    };
                    let what = if change.gap {
                        format!(
                            "clocks skip {} to {} on {}",
                            change.start.time(),
                            (change.start + change.length).time(),
                            change.start.date()
                        )
                    } else {
                        format!(
                            "clocks go back from {} to {} on {}",
                            (change.start + change.length).time(),
                            change.start.time(),
                            change.start.date()
                        )
                    };
                    return Some(format!(
                        "in {tz}, {what}: Celery's beat runs this entry next at {} (a skipped \
                         time takes the offset from before the change), sked at {} (a skipped \
                         time runs when the gap ends)",
                        show(a),
                        show(b)
                    ));
                }
            }
        }
    }
    None
}

/// A row of django-celery-beat's `django_celery_beat_periodictask`, with its schedule's row
/// joined in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DjangoBeatTask {
    pub id: i64,
    pub name: String,
    pub task: String,
    /// JSON text of a list.
    pub args: String,
    /// JSON text of a dict.
    pub kwargs: String,
    pub queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub priority: Option<i64>,
    /// An absolute expiry (`expires`).
    pub expires: Option<Instant>,
    /// A relative one (`expire_seconds`).
    pub expire_seconds: Option<i64>,
    pub enabled: bool,
    pub one_off: bool,
    pub start_time: Option<Instant>,
    pub description: Option<String>,
    pub crontab: Option<DjangoCrontab>,
    pub interval: Option<DjangoInterval>,
    pub solar: Option<DjangoSolar>,
    /// `django_celery_beat_clockedschedule.clocked_time`.
    pub clocked: Option<Instant>,
}

/// `django_celery_beat_crontabschedule`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DjangoCrontab {
    pub minute: String,
    pub hour: String,
    pub day_of_week: String,
    pub day_of_month: String,
    pub month_of_year: String,
    pub timezone: String,
}

/// `django_celery_beat_intervalschedule`: `every` `period`s (days, hours, minutes, seconds,
/// microseconds).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DjangoInterval {
    pub every: i64,
    pub period: String,
}

/// `django_celery_beat_solarschedule`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DjangoSolar {
    pub event: String,
    pub latitude: String,
    pub longitude: String,
}

/// Translates django-celery-beat's periodic tasks; each task is published through
/// `connection`.
pub fn import_django_rows(rows: &[DjangoBeatTask], connection: &str) -> Import {
    import_django_rows_with(
        rows,
        &Options {
            connection: connection.to_string(),
            as_of: None,
        },
    )
}

/// [`import_django_rows`] with every option.
pub fn import_django_rows_with(rows: &[DjangoBeatTask], options: &Options) -> Import {
    let mut clocks = dst::Clocks::new(options.as_of.unwrap_or_else(dst::now));
    let mut import = Import::default();
    let mut names = HashSet::new();
    for row in rows {
        let label = format!("periodic task {} {:?}", row.id, row.name);
        match django_source(row, &label) {
            Ok(source) => translate(&mut import, &mut names, source, 0, options, &mut clocks),
            Err(why) => import.skip(0, &label, why),
        }
    }
    import
}

fn django_source(row: &DjangoBeatTask, label: &str) -> Result<Source, String> {
    let args = match serde_json::from_str::<Value>(if row.args.trim().is_empty() {
        "[]"
    } else {
        &row.args
    }) {
        Ok(Value::Array(a)) => a,
        Ok(_) => return Err("its args are not a JSON list".to_string()),
        Err(e) => return Err(format!("its args are not JSON: {e}")),
    };
    let kwargs = match serde_json::from_str::<Value>(if row.kwargs.trim().is_empty() {
        "{}"
    } else {
        &row.kwargs
    }) {
        Ok(Value::Object(k)) => k,
        Ok(_) => return Err("its kwargs are not a JSON object".to_string()),
        Err(e) => return Err(format!("its kwargs are not JSON: {e}")),
    };
    let set = [
        row.crontab.is_some(),
        row.interval.is_some(),
        row.solar.is_some(),
        row.clocked.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set != 1 {
        return Err(format!(
            "it has {set} schedules; django-celery-beat needs exactly one"
        ));
    }
    let mut comments = Vec::new();
    let schedule = if let Some(c) = &row.crontab {
        let original = [
            c.minute.clone(),
            c.hour.clone(),
            c.day_of_week.clone(),
            c.day_of_month.clone(),
            c.month_of_year.clone(),
        ];
        let zone = if c.timezone.trim().is_empty() {
            None
        } else {
            Some(c.timezone.parse::<Tz>().map_err(|_| {
                format!(
                    "its crontab's timezone {:?} is not an IANA time zone",
                    c.timezone
                )
            })?)
        };
        Schedule::Crontab {
            sets: Box::new(parse_crontab(&original)?),
            original,
            zone,
        }
    } else if let Some(i) = &row.interval {
        let unit = match i.period.as_str() {
            "days" => 86_400.0,
            "hours" => 3_600.0,
            "minutes" => 60.0,
            "seconds" => 1.0,
            "microseconds" => 1e-6,
            other => {
                return Err(format!(
                    "its interval's period {other:?} is not one django-celery-beat has"
                ))
            }
        };
        Schedule::Interval {
            seconds: i.every as f64 * unit,
            relative: false,
        }
    } else if let Some(s) = &row.solar {
        Schedule::Solar(format!(
            "solar({}, {}, {})",
            s.event, s.latitude, s.longitude
        ))
    } else if let Some(at) = row.clocked {
        Schedule::Clocked(at)
    } else {
        return Err("it has no schedule".to_string());
    };
    let mut dropped = Vec::new();
    if row.expires.is_some() {
        dropped.push("expires (an absolute time)".to_string());
    }
    if let Some(start) = row.start_time {
        comments.push(format!(
            "django-celery-beat started it at {}; set schedule.start to keep that",
            start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    Ok(Source {
        label: label.to_string(),
        name: row.name.clone(),
        task: row.task.clone(),
        args,
        kwargs,
        queue: row.queue.clone(),
        exchange: row.exchange.clone(),
        routing_key: row.routing_key.clone(),
        priority: row.priority,
        expires: row.expire_seconds.map(|s| s as f64),
        dropped,
        schedule,
        enabled: row.enabled,
        one_off: row.one_off,
        description: row.description.clone(),
        comments,
    })
}

#[cfg(test)]
mod tests;

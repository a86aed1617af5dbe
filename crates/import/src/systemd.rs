//! `sked import systemd-timer`: a `.timer` unit and the `.service` it activates, translated
//! into sked jobs.
//!
//! Owns the meaning of the timer's and the service's settings for sked: which become the
//! job's schedule, jitter, misfire and overlap policies, its shell target (command, user,
//! directory, environment, limits) and timeout, and which are reported because sked cannot
//! hold them exactly. The unit file syntax is `unit_file`'s, calendar events are
//! `calendar`'s, time spans `span`'s, command lines and specifiers `exec`'s. Must not touch
//! files, the clock or the machine: the binary reads the units and writes the output, and
//! what depends on the machine (its local time zone, `%h`) is reported, never guessed.
//!
//! Without the service's text the command is unknown: no job is written, and the report says
//! to import again with the `.service` file.

mod calendar;
mod exec;
mod span;
mod unit_file;

use crate::{text_of, Import, ImportError, ImportedJob};
use calendar::CalendarEvent;
use exec::{ExecLine, UnitName};
use serde_json::{json, Map, Value};
use sked_core::duration::HumanDuration;
use sked_core::limits::{ByteSize, Cpus, Limits};
use span::Span;
use std::collections::BTreeMap;
use std::time::Duration;
use unit_file::{Assignment, UnitFile};

/// The service timer `unit` activates when it names none: the timer's name with `.service`.
fn default_service(unit: &str) -> String {
    let stem = unit.strip_suffix(".timer").unwrap_or(unit);
    format!("{stem}.service")
}

/// The name of the service the timer `timer` (unit name `unit`) activates: its last non-empty
/// `Unit=`, or the timer's name with `.service`; for finding the service's file.
pub fn service_of(timer: &str, unit: &str) -> Result<String, ImportError> {
    text_of(timer.as_bytes())?;
    let parsed = unit_file::parse(timer).map_err(|e| in_file(e, unit))?;
    Ok(parsed
        .assignments
        .iter()
        .rev()
        .find(|a| a.section == "Timer" && a.key == "Unit" && !a.value.trim().is_empty())
        .map(|a| a.value.trim().to_string())
        .unwrap_or_else(|| default_service(unit)))
}

/// Translates the timer `timer` (its unit name `unit`, such as `backup.timer`) and the text of
/// the service it activates. The error is for input that is not a unit file (too large, not
/// text, a line that is not unit syntax); everything else that cannot be translated is in the
/// import's `untranslated`, with its line.
pub fn import(timer: &str, service: Option<&str>, unit: &str) -> Result<Import, ImportError> {
    import_in(timer, service, unit, None)
}

/// [`import`], reading an `OnCalendar=` that names no zone in `machine_zone` (the zone of the
/// machine the timer ran on, as `timedatectl` shows it), as systemd did, rather than in UTC.
pub fn import_in(
    timer: &str,
    service: Option<&str>,
    unit: &str,
    machine_zone: Option<chrono_tz::Tz>,
) -> Result<Import, ImportError> {
    text_of(timer.as_bytes())?;
    if let Some(service) = service {
        text_of(service.as_bytes())?;
    }
    let timer_unit = unit_file::parse(timer).map_err(|e| in_file(e, unit))?;
    let mut out = Import::default();
    let timer = read_timer(&timer_unit, unit, &mut out);
    let service_name = timer.unit.clone().unwrap_or_else(|| default_service(unit));
    let service = match service {
        Some(text) => {
            let parsed = unit_file::parse(text).map_err(|e| in_file(e, &service_name))?;
            Some(read_service(&parsed, &service_name, &mut out))
        }
        None => None,
    };
    let schedules = schedules(&timer, unit, machine_zone, &mut out);
    let Some(service) = service else {
        out.skip(
            timer.unit_line,
            &service_name,
            format!(
                "the text of {service_name} was not given, so the command the timer runs is \
                 unknown and no job is written: import again with the .service file"
            ),
        );
        return Ok(out);
    };
    let Some(target) = service.target.clone() else {
        return Ok(out);
    };
    let name = job_name(unit);
    // Numbered by the timer's OnCalendar= lines, so a name says which line it came from even
    // when an earlier line was not translated.
    let count = timer.on_calendar.len().max(1);
    for planned in schedules {
        let mut job = Map::new();
        let job_name = if count > 1 {
            format!("{name}-{}", planned.number)
        } else {
            name.clone()
        };
        job.insert("name".into(), json!(job_name));
        if let Some(description) = service.description.as_ref().or(timer.description.as_ref()) {
            job.insert("description".into(), json!(description));
        }
        let mut schedule = planned.schedule;
        let mut comments = vec![format!("from {unit} ({}) and {service_name}", planned.text)];
        if count > 1 {
            comments.push(format!(
                "one of {count} jobs for the {count} triggers of {unit}: systemd fires at \
                 their union, sked runs each as its own job (an instant two of them share runs \
                 in each)"
            ));
        }
        comments.extend(planned.comments);
        if let Some((jitter, note)) = &timer.jitter {
            if planned.period.is_none_or(|p| *jitter <= p) {
                schedule.insert("jitter".into(), json!(HumanDuration(*jitter).to_string()));
                comments.push(note.clone());
            } else {
                out.skip(
                    timer.jitter_line,
                    &format!("{unit}: RandomizedDelaySec="),
                    "sked's jitter is at most the period of an every schedule; left out",
                );
            }
        }
        comments.extend(timer.comments.iter().cloned());
        comments.extend(service.comments.iter().cloned());
        job.insert("schedule".into(), Value::Object(schedule));
        job.insert("target".into(), target.clone());
        if let Some(timeout) = service.timeout {
            job.insert("timeout".into(), json!(HumanDuration(timeout).to_string()));
        }
        job.insert("misfire".into(), json!({"policy": planned.misfire}));
        // An elapse while the service still runs starts nothing in systemd.
        job.insert("overlap".into(), json!("skip"));
        out.push_job(
            ImportedJob {
                job: Value::Object(job),
                comments,
                line: planned.line,
            },
            &format!("{unit}: {}", planned.text),
        );
    }
    Ok(out)
}

/// A syntax error names the unit file it is in.
fn in_file(error: ImportError, file: &str) -> ImportError {
    match error {
        ImportError::Syntax { line, message } => ImportError::Syntax {
            line,
            message: format!("{file}: {message}"),
        },
        other => other,
    }
}

/// The job's name: the timer's name without `.timer`, with what sked's names do not take
/// (`@`, `\`) as `-`.
fn job_name(unit: &str) -> String {
    let stem = unit.strip_suffix(".timer").unwrap_or(unit);
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_start_matches('.');
    if name.is_empty() {
        "systemd-timer".to_string()
    } else {
        name.to_string()
    }
}

/// What the `[Timer]` (and its `[Unit]`) say, after systemd's rules for repeats and resets.
#[derive(Default)]
struct Timer {
    description: Option<String>,
    on_calendar: Vec<Assignment>,
    on_unit_active: Vec<Assignment>,
    /// Boot- and start-relative triggers, `OnUnitInactiveSec=`: reported.
    relative: Vec<Assignment>,
    persistent: bool,
    jitter: Option<(Duration, String)>,
    jitter_line: usize,
    comments: Vec<String>,
    unit: Option<String>,
    unit_line: usize,
}

fn read_timer(unit: &UnitFile, name: &str, out: &mut Import) -> Timer {
    let mut timer = Timer::default();
    let mut last: BTreeMap<&str, &Assignment> = BTreeMap::new();
    for a in &unit.assignments {
        let list = |l: &mut Vec<Assignment>| {
            if a.value.is_empty() {
                l.clear();
            } else {
                l.push(a.clone());
            }
        };
        match (a.section.as_str(), a.key.as_str()) {
            ("Timer", "OnCalendar") => list(&mut timer.on_calendar),
            ("Timer", "OnUnitActiveSec") => list(&mut timer.on_unit_active),
            ("Timer", "OnBootSec" | "OnStartupSec" | "OnActiveSec" | "OnUnitInactiveSec") => {
                if a.value.is_empty() {
                    timer.relative.retain(|r| r.key != a.key);
                } else {
                    timer.relative.push(a.clone());
                }
            }
            (
                "Timer",
                "RandomizedDelaySec" | "FixedRandomDelay" | "Persistent" | "AccuracySec"
                | "WakeSystem" | "Unit" | "RemainAfterElapse" | "OnClockChange"
                | "OnTimezoneChange",
            )
            | ("Unit", "Description") => {
                last.insert(a.key.as_str(), a);
            }
            ("Install", _) => {}
            _ => report_unknown(out, name, a),
        }
    }
    for a in last.values().filter(|a| !a.value.is_empty()) {
        let text = format!("{name}: {}", a.text());
        match a.key.as_str() {
            "Description" => timer.description = Some(a.value.clone()),
            "Unit" => {
                timer.unit = Some(a.value.clone());
                timer.unit_line = a.line;
            }
            "Persistent" => match boolean(&a.value) {
                Some(p) => timer.persistent = p,
                None => out.skip(
                    a.line,
                    &text,
                    "not a boolean; systemd's default (false) applies",
                ),
            },
            "RandomizedDelaySec" => match span::parse(&a.value) {
                Ok(Span::Finite(d)) if d.is_zero() => {}
                Ok(Span::Finite(d)) if d <= sked_core::schedule::MAX_JITTER => {
                    timer.jitter_line = a.line;
                    timer.jitter = Some((
                        d,
                        "RandomizedDelaySec= is schedule.jitter: systemd draws a new random \
                         delay each time, sked a fixed spread per job and instant in [0, jitter)"
                            .to_string(),
                    ));
                }
                Ok(_) => out.skip(
                    a.line,
                    &text,
                    format!(
                        "sked's jitter is at most {}; left out",
                        HumanDuration(sked_core::schedule::MAX_JITTER)
                    ),
                ),
                Err(e) => out.skip(a.line, &text, e),
            },
            "FixedRandomDelay" => {
                if boolean(&a.value) == Some(true) {
                    timer.comments.push(
                        "FixedRandomDelay=true: systemd kept one delay for every elapse; sked's \
                         offset is fixed per job and instant, so it differs from one instant to \
                         the next"
                            .to_string(),
                    );
                }
            }
            "AccuracySec" => timer.comments.push(format!(
                "AccuracySec={}: systemd may elapse up to that late to wake up less often; \
                 sked fires at the instant",
                a.value
            )),
            "WakeSystem" => {
                if boolean(&a.value) == Some(true) {
                    out.skip(
                        a.line,
                        &text,
                        "sked does not wake a suspended machine; its server and workers must be \
                         running at the instant",
                    );
                }
            }
            "RemainAfterElapse" => {}
            _ => out.skip(
                a.line,
                &text,
                "sked fires on time, not on clock or time zone changes",
            ),
        }
    }
    timer
}

/// One schedule a timer becomes: one per `OnCalendar=` line, or the `OnUnitActiveSec=` grid.
struct Planned {
    schedule: Map<String, Value>,
    /// The period of an `every` schedule (jitter must not exceed it).
    period: Option<Duration>,
    misfire: &'static str,
    comments: Vec<String>,
    line: usize,
    text: String,
    /// 1-based among the timer's triggers.
    number: usize,
}

fn schedules(
    timer: &Timer,
    name: &str,
    machine_zone: Option<chrono_tz::Tz>,
    out: &mut Import,
) -> Vec<Planned> {
    let mut planned = Vec::new();
    let misfire = if timer.persistent { "run_once" } else { "skip" };
    let persistent_note = if timer.persistent {
        "Persistent=true is misfire run_once: an instant missed while sked was down runs once \
         when it is back"
    } else {
        "Persistent=false (systemd's default) is misfire skip: an instant missed while sked was \
         down is recorded as skipped"
    };
    for (i, a) in timer.on_calendar.iter().enumerate() {
        let text = format!("{name}: {}", a.text());
        let event = match CalendarEvent::parse(&a.value) {
            Ok(event) => event,
            Err(e) => {
                out.skip(a.line, &text, format!("calendar event not translated: {e}"));
                continue;
            }
        };
        // A machine zone given is what systemd read a zoneless event in: the same event with
        // that zone's suffix, so the daylight saving check below sees it too.
        let event = match (event.to_cron(), machine_zone) {
            (Ok(form), Some(zone)) if form.timezone.is_none() => {
                CalendarEvent::parse(&format!("{} {}", a.value.trim(), zone.name()))
                    .unwrap_or(event)
            }
            _ => event,
        };
        let form = match event.to_cron() {
            Ok(form) => form,
            Err(e) => {
                out.skip(
                    a.line,
                    &text,
                    format!("cron cannot hold these instants: {e}"),
                );
                continue;
            }
        };
        let mut schedule = Map::new();
        schedule.insert("cron".into(), json!(form.cron));
        let mut comments = vec![persistent_note.to_string()];
        match &form.timezone {
            Some(zone) => {
                schedule.insert("timezone".into(), json!(zone));
            }
            None => {
                let why = "no time zone: systemd reads it in the machine's local zone, sked in \
                           UTC unless schedule.timezone names that zone (timedatectl shows it)";
                comments.push(format!("CHECK: {why}"));
                out.skip(a.line, &text, why);
            }
        }
        if let Some(difference) = event.dst_difference() {
            comments.push(difference.clone());
            out.skip(a.line, &text, difference);
        }
        planned.push(Planned {
            schedule,
            period: None,
            misfire,
            comments,
            line: a.line,
            text: a.text(),
            number: i + 1,
        });
    }
    match timer.on_unit_active.as_slice() {
        [] => {}
        [a] if timer.on_calendar.is_empty() => {
            let text = format!("{name}: {}", a.text());
            match span::parse(&a.value) {
                Ok(Span::Finite(period)) => {
                    let mut schedule = Map::new();
                    schedule.insert("every".into(), json!(HumanDuration(period).to_string()));
                    planned.push(Planned {
                        schedule,
                        period: Some(period),
                        misfire: "skip",
                        comments: vec![
                            "OnUnitActiveSec= is schedule.every: systemd counts from the \
                             service's last start (a late start moves every later one), sked's \
                             every is a fixed grid from when the job is applied"
                                .to_string(),
                        ],
                        line: a.line,
                        text: a.text(),
                        number: 1,
                    });
                }
                Ok(Span::Infinity) => out.skip(a.line, &text, "infinity never elapses"),
                Err(e) => out.skip(a.line, &text, e),
            }
        }
        several => {
            for a in several {
                out.skip(
                    a.line,
                    &format!("{name}: {}", a.text()),
                    "OnUnitActiveSec= counts from the service's last start, which the timer's \
                     other triggers also move: sked has no schedule that does that; a single \
                     OnUnitActiveSec= without OnCalendar= is translated to every",
                );
            }
        }
    }
    for a in &timer.relative {
        let reason = if a.key == "OnUnitInactiveSec" {
            "counts from when the service last finished: sked's schedules count from the clock, \
             not from a run's end"
        } else {
            "counts from the machine's boot, systemd's start or the timer's activation: sked's \
             schedules are not relative to a machine"
        };
        out.skip(a.line, &format!("{name}: {}", a.text()), reason);
    }
    if planned.is_empty()
        && timer.on_calendar.is_empty()
        && timer.on_unit_active.is_empty()
        && timer.relative.is_empty()
    {
        out.skip(
            0,
            name,
            "the timer has no OnCalendar=, OnUnitActiveSec= or other On...= setting: systemd \
             refuses to start it, and there is no schedule to translate",
        );
    }
    planned
}

/// What the `.service` says, as parts of a job.
#[derive(Default)]
struct Service {
    description: Option<String>,
    /// The shell target; `None` when the service has no command sked can run.
    target: Option<Value>,
    timeout: Option<Duration>,
    comments: Vec<String>,
}

fn read_service(unit: &UnitFile, name: &str, out: &mut Import) -> Service {
    let unit_name = UnitName::parse(name);
    let mut service = Service::default();
    let mut lists: BTreeMap<&str, Vec<&Assignment>> = BTreeMap::new();
    let mut last: BTreeMap<&str, &Assignment> = BTreeMap::new();
    for a in &unit.assignments {
        match (a.section.as_str(), a.key.as_str()) {
            ("Service", "ExecStart" | "ExecStartPre" | "ExecStartPost" | "Environment") => {
                let list = lists.entry(a.key.as_str()).or_default();
                if a.value.is_empty() {
                    list.clear();
                } else {
                    list.push(a);
                }
            }
            (
                "Service",
                "Type" | "User" | "Group" | "WorkingDirectory" | "TimeoutStartSec"
                | "RuntimeMaxSec" | "TimeoutSec" | "MemoryMax" | "MemoryLimit" | "CPUQuota"
                | "TasksMax",
            )
            | ("Unit", "Description") => {
                last.insert(a.key.as_str(), a);
            }
            ("Install", _) => {}
            _ => report_unknown(out, name, a),
        }
    }
    let get = |key: &str| last.get(key).filter(|a| !a.value.is_empty()).copied();
    let text = |a: &Assignment| format!("{name}: {}", a.text());
    let mut checks = Vec::new();
    let mut expand = |a: &Assignment, value: &str, out: &mut Import| -> String {
        expand_specifiers(a, value, &unit_name, name, out, &mut checks)
    };
    service.description = get("Description").map(|a| a.value.clone());
    let kind = get("Type").map_or("simple", |a| a.value.as_str());
    if let Some(a) = get("Type") {
        if !matches!(kind, "simple" | "exec" | "oneshot" | "idle") {
            out.skip(
                a.line,
                &text(a),
                "a service that forks or notifies is a daemon: sked's run ends when the command \
                 exits, which is not when systemd considered it done",
            );
        }
    }

    // The command: ExecStartPre=, ExecStart= and ExecStartPost= in order, each only after
    // the previous succeeded, as systemd runs them.
    let mut lines: Vec<ExecLine> = Vec::new();
    let mut command_ok = true;
    let starts = lists.get("ExecStart").cloned().unwrap_or_default();
    if starts.len() > 1 && kind != "oneshot" {
        for a in &starts[1..] {
            out.skip(
                a.line,
                &text(a),
                "systemd takes several ExecStart= only for Type=oneshot and refuses this \
                 service; only the first is translated",
            );
        }
    }
    let starts: Vec<&Assignment> = if kind == "oneshot" {
        starts
    } else {
        starts.into_iter().take(1).collect()
    };
    let pre = lists.get("ExecStartPre").cloned().unwrap_or_default();
    let post = lists.get("ExecStartPost").cloned().unwrap_or_default();
    for a in pre.iter().chain(&starts).chain(&post) {
        let value = expand(a, &a.value, out);
        match exec::parse_exec(&value) {
            Ok(line) => {
                if let Some(argv0) = &line.argv0 {
                    out.skip(
                        a.line,
                        &text(a),
                        format!(
                            "@ gave the program argv[0] {argv0:?}; the shell gives it its path"
                        ),
                    );
                }
                if line.privileged {
                    out.skip(
                        a.line,
                        &text(a),
                        "+ and ! ran the command with privileges the service's other settings \
                         deny; sked runs it like the others, as run_as",
                    );
                }
                lines.push(line);
            }
            Err(e) => {
                command_ok = false;
                out.skip(a.line, &text(a), format!("command not translated: {e}"));
            }
        }
    }
    if starts.is_empty() {
        out.skip(
            0,
            name,
            "the service has no ExecStart=: there is no command to run, so no job is written",
        );
        return service;
    }
    if !command_ok {
        // A chain with a missing link would run something else than systemd does.
        return service;
    }
    if lines.len() > 1 {
        service.comments.push(format!(
            "the {} command lines of {name} (ExecStartPre=, ExecStart=, ExecStartPost=) run \
             one after the other, each only if the previous succeeded: joined with &&",
            lines.len()
        ));
    }
    if lines.iter().any(|l| l.ignore_failure) {
        service.comments.push(
            "a command line with the - prefix has its failure ignored: written with || true"
                .to_string(),
        );
    }
    let mut shell = Map::new();
    shell.insert("command".into(), json!(exec::chain(&lines)));

    let mut env = Map::new();
    for a in lists.get("Environment").cloned().unwrap_or_default() {
        let value = expand(a, &a.value, out);
        match exec::parse_environment(&value) {
            Ok(pairs) => {
                for (k, v) in pairs {
                    env.insert(k, json!(v));
                }
            }
            Err(e) => out.skip(a.line, &text(a), e),
        }
    }
    if !env.is_empty() {
        shell.insert("env".into(), Value::Object(env));
    }

    if let Some(a) = get("WorkingDirectory") {
        let value = expand(a, &a.value, out);
        let (dir, optional) = match value.strip_prefix('-') {
            Some(dir) => (dir.to_string(), true),
            None => (value, false),
        };
        if dir.starts_with('~') {
            out.skip(
                a.line,
                &text(a),
                "~ is the home of the service's user, which only the machine knows; left out",
            );
        } else {
            if optional {
                service.comments.push(
                    "WorkingDirectory=- ran in / when the directory was missing; sked fails the \
                     attempt instead"
                        .to_string(),
                );
            }
            shell.insert("cwd".into(), json!(dir));
        }
    }

    match (get("User"), get("Group")) {
        (Some(user), group) if matches!(user.value.as_str(), "root" | "0") => {
            out.skip(
                user.line,
                &text(user),
                "sked does not run jobs as root: run_as is left out, so the job runs as the \
                 worker's own user",
            );
            if let Some(group) = group {
                out.skip(group.line, &text(group), "run_as is left out (User=root)");
            }
        }
        (Some(user), group) => {
            let mut run_as = Map::new();
            run_as.insert("user".into(), json!(expand(user, &user.value, out)));
            if let Some(group) = group {
                run_as.insert("group".into(), json!(expand(group, &group.value, out)));
            }
            shell.insert("run_as".into(), Value::Object(run_as));
        }
        (None, Some(group)) => out.skip(
            group.line,
            &text(group),
            "a group without a user ran as root: sked's run_as needs a user; left out",
        ),
        (None, None) => {}
    }

    let limits = read_limits(&get, &text, out);
    if !limits.is_empty() {
        if let Ok(value) = serde_json::to_value(limits) {
            shell.insert("limits".into(), value);
        }
    }

    service.timeout = read_timeout(kind, &get, &text, out);
    service.target = Some(json!({ "shell": shell }));
    service.comments.extend(checks);
    service
}

/// Expands the name specifiers of `value`; the others are reported, noted in `checks` and
/// stay as written.
fn expand_specifiers(
    a: &Assignment,
    value: &str,
    unit: &UnitName,
    file: &str,
    out: &mut Import,
    checks: &mut Vec<String>,
) -> String {
    let (expanded, unknown) = exec::expand_specifiers(value, unit);
    for spec in unknown {
        out.skip(
            a.line,
            &format!("{file}: {}", a.text()),
            format!(
                "the specifier {spec} depends on the machine or its user: left as written, \
                 replace it before applying"
            ),
        );
        checks.push(format!("CHECK: {spec} in {}= is left as written", a.key));
    }
    expanded
}

/// `MemoryMax=`, `CPUQuota=` and `TasksMax=` within sked's bounds; the others reported.
fn read_limits<'a>(
    get: &impl Fn(&str) -> Option<&'a Assignment>,
    text: &impl Fn(&Assignment) -> String,
    out: &mut Import,
) -> Limits {
    let mut limits = Limits::default();
    let memory = get("MemoryMax").or_else(|| get("MemoryLimit"));
    if let Some(a) = memory.filter(|a| a.value != "infinity") {
        match a.value.parse::<ByteSize>() {
            Ok(size) => {
                let one = Limits {
                    memory: Some(size),
                    ..Limits::default()
                };
                match one.validate("limits") {
                    Ok(()) => limits.memory = Some(size),
                    Err(e) => out.skip(a.line, &text(a), format!("sked refuses it: {e}")),
                }
            }
            Err(_) => out.skip(
                a.line,
                &text(a),
                "sked's memory limit is a size (512M, 1G); a share of the machine's memory is \
                 not one",
            ),
        }
    }
    if let Some(a) = get("CPUQuota") {
        let percent = a
            .value
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<f64>().ok())
            .filter(|p| p.is_finite() && *p > 0.0);
        match percent {
            Some(p) => {
                let cpus = Cpus((p * 10.0).round() as u32);
                let one = Limits {
                    cpus: Some(cpus),
                    ..Limits::default()
                };
                match one.validate("limits") {
                    Ok(()) => limits.cpus = Some(cpus),
                    Err(e) => out.skip(a.line, &text(a), format!("sked refuses it: {e}")),
                }
            }
            None => out.skip(a.line, &text(a), "not a percentage such as 50%"),
        }
    }
    if let Some(a) = get("TasksMax").filter(|a| a.value != "infinity") {
        match a.value.parse::<u32>() {
            Ok(pids) => {
                let one = Limits {
                    pids: Some(pids),
                    ..Limits::default()
                };
                match one.validate("limits") {
                    Ok(()) => limits.pids = Some(pids),
                    Err(e) => out.skip(a.line, &text(a), format!("sked refuses it: {e}")),
                }
            }
            Err(_) => out.skip(
                a.line,
                &text(a),
                "sked's pids limit is a number; a share of the machine's limit is not one",
            ),
        }
    }
    limits
}

/// The job's timeout: `TimeoutStartSec=` for a oneshot (its start lasts until the command
/// exits), `RuntimeMaxSec=` for the others; `TimeoutSec=` sets the start timeout too.
fn read_timeout<'a>(
    kind: &str,
    get: &impl Fn(&str) -> Option<&'a Assignment>,
    text: &impl Fn(&Assignment) -> String,
    out: &mut Import,
) -> Option<Duration> {
    let start = get("TimeoutStartSec").or_else(|| get("TimeoutSec"));
    let runtime = get("RuntimeMaxSec");
    let (used, unused) = if kind == "oneshot" {
        (start, runtime)
    } else {
        (runtime, None)
    };
    if let Some(a) = unused {
        out.skip(
            a.line,
            &text(a),
            "RuntimeMaxSec= has no effect on a Type=oneshot service; TimeoutStartSec= bounds it",
        );
    }
    let a = used?;
    match span::parse(&a.value) {
        Ok(Span::Infinity) => None,
        Ok(Span::Finite(d)) if d.is_zero() => None,
        Ok(Span::Finite(d)) if d <= sked_core::job::MAX_TIMEOUT => Some(d),
        Ok(Span::Finite(_)) => {
            out.skip(
                a.line,
                &text(a),
                format!(
                    "sked's timeout is at most {}; left out, so the job has none",
                    HumanDuration(sked_core::job::MAX_TIMEOUT)
                ),
            );
            None
        }
        Err(e) => {
            out.skip(a.line, &text(a), e);
            None
        }
    }
}

fn report_unknown(out: &mut Import, file: &str, a: &Assignment) {
    let reason = match a.key.as_str() {
        "EnvironmentFile" => {
            "the file is read on the machine at each start: copy its variables into the job's \
             env (or a namespace secret) yourself"
        }
        "ExecStop" | "ExecStopPost" | "ExecReload" | "ExecCondition" => {
            "sked runs the start commands only"
        }
        _ => "has no translation in sked; the job runs without it",
    };
    out.skip(
        a.line,
        &format!("{file}: [{}] {}", a.section, a.text()),
        reason,
    );
}

/// systemd's booleans.
fn boolean(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

//! `sked import crontab`: a user crontab (`crontab -l`) or a system crontab (`/etc/crontab`,
//! `/etc/cron.d/*`, whose entries name the user after the five time fields) translated into
//! shell jobs.
//!
//! What it translates: the five time fields and the `@daily`-style names (sked's cron reads
//! both as Vixie cron does, including the rule that a day matches either day field when both
//! are restricted), `CRON_TZ=`/`TZ=` (the zone of the entries below it, checked against the
//! IANA database), environment lines (into each following job's `target.shell.env`),
//! `MAILTO=` (a `notify` email rule for failures, sent through the server's relay), `SHELL=`,
//! `%` in commands (the text after the first unescaped `%` is the command's standard input,
//! given to it by a here-document), and a system crontab's user (`run_as`). `@reboot` has no
//! instant and is reported. Each job is named after its command.
//!
//! Whether a file is a system crontab is the caller's to say ([`Format`]) or, when it does
//! not, [`detect_format`]'s guess. This module reads text only; it must not touch files, the
//! clock (but for [`import`]'s default moment) or the server.

use crate::dst::{self, Source};
use crate::{text_of, Import, ImportError, ImportedJob};
use chrono_tz::Tz;
use serde_json::{json, Map, Value};
use sked_core::job::validate_name;
use sked_core::schedule::cron::CronExpr;
use sked_core::Instant;
use std::collections::{BTreeMap, HashSet};

/// Which kind of crontab a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `crontab -l`'s: five time fields (or `@name`), then the command.
    User,
    /// `/etc/crontab`'s and `/etc/cron.d`'s: the time fields, the user, then the command.
    System,
}

/// How to read a crontab.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The kind of file; [`detect_format`] guesses when `None`.
    pub format: Option<Format>,
    /// The zone of entries no `CRON_TZ=` line governs: cron used the host's own zone. UTC
    /// when `None`, and each such job says so.
    pub timezone: Option<Tz>,
    /// The moment from which changes of clocks are compared (now when `None`).
    pub as_of: Option<Instant>,
}

/// Translates a crontab, its kind guessed ([`detect_format`]), its zone-less entries in UTC.
pub fn import(text: &str) -> Result<Import, ImportError> {
    import_with(text, &Options::default())
}

/// The macros cron knows besides `@reboot`.
const MACROS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

/// A line of a crontab, classified.
enum Line<'a> {
    Blank,
    Comment(&'a str),
    Env(String, String),
    Entry(&'a str),
}

fn classify(raw: &str) -> Line<'_> {
    let line = raw.trim();
    if line.is_empty() {
        return Line::Blank;
    }
    if let Some(comment) = line.strip_prefix('#') {
        return Line::Comment(comment.strip_prefix(' ').unwrap_or(comment));
    }
    // An entry starts with a time field or a macro; anything else with `=` is an environment
    // setting, as cron's own reader decides (`load_env` before `load_entry`).
    let first = line.as_bytes()[0];
    if first == b'@' || first == b'*' || first.is_ascii_digit() {
        return Line::Entry(line);
    }
    match env_setting(line) {
        Some((name, value)) => Line::Env(name, value),
        None => Line::Entry(line),
    }
}

/// `NAME = value`, the value unquoted when it is quoted whole (as cron reads it).
fn env_setting(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once('=')?;
    let name = unquote(name.trim());
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return None;
    }
    Some((name.to_string(), unquote(value.trim()).to_string()))
}

fn unquote(text: &str) -> &str {
    for q in ['"', '\''] {
        if text.len() >= 2 && text.starts_with(q) && text.ends_with(q) {
            return &text[1..text.len() - 1];
        }
    }
    text
}

/// The first `n` whitespace-separated fields of `line` and the rest of it, as written.
fn split_fields(line: &str, n: usize) -> Option<(Vec<&str>, &str)> {
    let mut fields = Vec::with_capacity(n);
    let mut rest = line.trim_start();
    for _ in 0..n {
        let end = rest.find(char::is_whitespace)?;
        fields.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    Some((fields, rest))
}

/// How many time fields an entry has: 1 for a macro, else 5.
fn time_field_count(entry: &str) -> usize {
    if entry.starts_with('@') {
        1
    } else {
        5
    }
}

/// Guesses the kind of a crontab: a system one when every entry has a field after its time
/// fields and before a command, that field looks like a user name, and at least one entry
/// names `root` there. A user crontab whose commands all start with such a word and one with
/// `root` is misread: the caller's [`Options::format`] settles it.
pub fn detect_format(text: &str) -> Format {
    let mut entries = 0;
    let mut root = false;
    for raw in text.lines() {
        let Line::Entry(entry) = classify(raw) else {
            continue;
        };
        if entry.starts_with("@reboot") {
            continue;
        }
        entries += 1;
        let Some((fields, rest)) = split_fields(entry, time_field_count(entry) + 1) else {
            return Format::User;
        };
        let user = fields[fields.len() - 1];
        if rest.is_empty() || !looks_like_user(user) {
            return Format::User;
        }
        root |= user == "root";
    }
    if entries > 0 && root {
        Format::System
    } else {
        Format::User
    }
}

fn looks_like_user(word: &str) -> bool {
    word.len() <= 32
        && word.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.'))
}

/// The zone of the entries below a `CRON_TZ=` line.
#[derive(Clone)]
enum Zone {
    /// No `CRON_TZ=`: the caller's zone, or UTC.
    Default,
    Valid(Tz),
    /// Not an IANA zone: the entries it governs are not translated.
    Invalid {
        name: String,
        line: usize,
    },
}

/// Where `MAILTO=` stands for the entries below it.
#[derive(Clone)]
enum Mail {
    /// Not set: cron mailed the crontab's owner on the host.
    Owner,
    /// `MAILTO=""`: no mail.
    Off,
    To(Vec<String>),
}

/// The settings that govern the entries below them.
struct State {
    env: BTreeMap<String, String>,
    zone: Zone,
    mail: Mail,
    shell: Option<String>,
}

/// Translates a crontab as `options` say.
pub fn import_with(text: &str, options: &Options) -> Result<Import, ImportError> {
    let text = text_of(text.as_bytes())?;
    let format = options.format.unwrap_or_else(|| detect_format(text));
    let mut clocks = dst::Clocks::new(options.as_of.unwrap_or_else(dst::now));
    let mut import = Import::default();
    let mut names = Names::default();
    let mut comments: Vec<String> = Vec::new();
    let mut state = State {
        env: BTreeMap::new(),
        zone: Zone::Default,
        mail: Mail::Owner,
        shell: None,
    };
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        match classify(raw) {
            Line::Blank => comments.clear(),
            Line::Comment(c) => comments.push(c.to_string()),
            Line::Env(name, value) => {
                setting(&mut state, name, value, line);
            }
            Line::Entry(entry) => {
                let above = std::mem::take(&mut comments);
                entry_job(
                    &mut import,
                    &mut names,
                    &state,
                    entry,
                    line,
                    above,
                    format,
                    options.timezone,
                    &mut clocks,
                )?;
            }
        }
    }
    Ok(import)
}

fn setting(state: &mut State, name: String, value: String, line: usize) {
    match name.as_str() {
        "CRON_TZ" | "TZ" => {
            state.zone = match value.parse::<Tz>() {
                Ok(tz) => Zone::Valid(tz),
                Err(_) => Zone::Invalid {
                    name: value.clone(),
                    line,
                },
            };
            // cron hands `TZ` to the command too; `CRON_TZ` is cron's alone.
            if name == "TZ" {
                state.env.insert(name, value);
            }
        }
        "MAILTO" => {
            let to: Vec<String> = value
                .split([',', ' '])
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect();
            state.mail = if to.is_empty() {
                Mail::Off
            } else {
                Mail::To(to)
            };
        }
        "SHELL" => state.shell = Some(value),
        _ => {
            state.env.insert(name, value);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn entry_job(
    import: &mut Import,
    names: &mut Names,
    state: &State,
    entry: &str,
    line: usize,
    mut comments: Vec<String>,
    format: Format,
    default_zone: Option<Tz>,
    clocks: &mut dst::Clocks,
) -> Result<(), ImportError> {
    let syntax = |message: String| ImportError::Syntax { line, message };
    if entry.split_whitespace().next() == Some("@reboot") {
        import.skip(
            line,
            entry,
            "@reboot runs when the host starts; sked schedules by time, not by a machine's start",
        );
        return Ok(());
    }
    let time_fields = time_field_count(entry);
    let user_fields = usize::from(format == Format::System);
    let Some((fields, command)) = split_fields(entry, time_fields + user_fields) else {
        return Err(syntax(format!(
            "expected {} then a command: {entry:?}",
            match (time_fields, format) {
                (1, Format::User) => "a @name",
                (1, Format::System) => "a @name, a user",
                (_, Format::User) => "five time fields",
                (_, Format::System) => "five time fields, a user",
            }
        )));
    };
    if command.is_empty() {
        return Err(syntax(format!("the entry has no command: {entry:?}")));
    }
    let schedule_text = fields[..time_fields].join(" ");
    if time_fields == 1 && !MACROS.contains(&schedule_text.as_str()) {
        return Err(syntax(format!(
            "{schedule_text:?} is not a cron name (@reboot, {})",
            MACROS.join(", ")
        )));
    }
    let expr =
        CronExpr::parse(&schedule_text).map_err(|e| syntax(format!("{schedule_text:?}: {e}")))?;
    let tz = match &state.zone {
        Zone::Invalid { name, line: at } => {
            import.skip(
                line,
                entry,
                format!("its zone {name:?} (line {at}) is not an IANA time zone"),
            );
            return Ok(());
        }
        Zone::Valid(tz) => Some(*tz),
        Zone::Default => {
            if default_zone.is_none() {
                comments.push(
                    "cron ran this in the host's time zone; it is read here in UTC \
                     (`sked import --timezone ZONE` reads it in another)"
                        .to_string(),
                );
            }
            default_zone
        }
    };
    let (command, stdin) = split_percent(command);
    let mut schedule = Map::new();
    schedule.insert("cron".into(), json!(schedule_text));
    if let Some(tz) = tz {
        schedule.insert("timezone".into(), json!(tz.name()));
    }
    let mut shell = Map::new();
    let script = match &stdin {
        Some(input) => with_stdin(&command, input),
        None => command.clone(),
    };
    match state.shell.as_deref() {
        None | Some("/bin/sh") | Some("sh") => {
            shell.insert("command".into(), json!(script));
        }
        Some(program) => {
            // sked runs a command without args through /bin/sh; another shell is the program.
            shell.insert("command".into(), json!(program));
            shell.insert("args".into(), json!(["-c", script]));
        }
    }
    if !state.env.is_empty() {
        shell.insert("env".into(), json!(state.env));
    }
    if format == Format::System {
        let user = fields[time_fields];
        if user == "root" || user == "0" {
            comments.push(
                "cron ran this as root; sked runs it as the worker's own user (run_as may not \
                 be root)"
                    .to_string(),
            );
        } else {
            shell.insert("run_as".into(), json!({ "user": user }));
        }
    }
    let mut job = Map::new();
    let name = names.take(&command, line);
    job.insert("name".into(), json!(name));
    job.insert("schedule".into(), Value::Object(schedule));
    job.insert("target".into(), json!({ "shell": shell }));
    match &state.mail {
        Mail::Owner => {}
        Mail::Off => {
            job.insert("notify".into(), json!([]));
        }
        Mail::To(to) => {
            if let Some(local) = to.iter().find(|a| !a.contains('@')) {
                comments.push(format!(
                    "cron mailed this entry's output to {local:?} on the host; sked emails \
                     addresses (local@domain) only: add a notify rule"
                ));
            } else {
                job.insert(
                    "notify".into(),
                    json!([{ "on": ["failed", "timed_out"], "email": { "to": to } }]),
                );
                comments.push(
                    "MAILTO: cron mailed any output; sked emails failures and timeouts, \
                     through the server's SMTP relay (`sked server --smtp-url`)"
                        .to_string(),
                );
            }
        }
    }
    let kept = import.push_job(
        ImportedJob {
            job: Value::Object(job),
            comments,
            line,
        },
        entry,
    );
    if kept {
        if let Some(tz) = tz {
            if let Some(why) = clocks.difference(&expr, &schedule_text, tz, Source::Vixie) {
                if let Some(job) = import.jobs.last_mut() {
                    job.comments.push(format!("differs from cron: {why}"));
                }
                import.differ(line, entry, why);
            }
        }
    }
    Ok(())
}

/// A command and its standard input, split as cron does: the first `%` not escaped by `\`
/// ends the command; in what follows, each `%` is a new line; `\%` is a `%` in both.
fn split_percent(command: &str) -> (String, Option<String>) {
    let mut head = String::new();
    let mut input: Option<String> = None;
    let push = |head: &mut String, input: &mut Option<String>, c: char| match input {
        Some(text) => text.push(c),
        None => head.push(c),
    };
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'%') => {
                chars.next();
                push(&mut head, &mut input, '%');
            }
            '%' => match input.as_mut() {
                Some(text) => text.push('\n'),
                None => input = Some(String::new()),
            },
            c => push(&mut head, &mut input, c),
        }
    }
    (head.trim_end().to_string(), input)
}

/// `command` with `input` as its standard input: a here-document that the shell does not
/// expand (its delimiter is quoted), around a group so that every command of the line reads
/// it, as they all read cron's pipe.
fn with_stdin(command: &str, input: &str) -> String {
    let mut delimiter = "SKED_STDIN".to_string();
    let mut n = 1;
    while input.lines().any(|l| l == delimiter) {
        n += 1;
        delimiter = format!("SKED_STDIN_{n}");
    }
    format!("{{ {command}\n}} <<'{delimiter}'\n{input}\n{delimiter}")
}

/// Job names handed out in one import: each derived from its command, unique (a second
/// `backup.sh` is `backup.sh-2`), so the same file always gives the same names.
#[derive(Default)]
struct Names {
    taken: HashSet<String>,
}

impl Names {
    fn take(&mut self, command: &str, line: usize) -> String {
        let base = name_of(command).unwrap_or_else(|| format!("cron-line-{line}"));
        let mut candidate = base.clone();
        let mut n = 1;
        while self.taken.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        self.taken.insert(candidate.clone());
        candidate
    }
}

/// A name from a command: its program and first argument that is not an option, each the
/// last part of its path, in lower case, with what a name cannot hold as `-`.
pub(crate) fn name_of(command: &str) -> Option<String> {
    let mut words = command
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
        // `VAR=value cmd`, `cd DIR && cmd`, `exec cmd`: the command is what follows.
        .filter(|w| !w.contains('='))
        .collect::<Vec<_>>();
    if words.first() == Some(&"cd") {
        if let Some(at) = words.iter().position(|w| *w == "&&" || *w == ";") {
            words.drain(..=at);
        }
    }
    while matches!(words.first(), Some(&"exec") | Some(&"nice") | Some(&"sudo")) {
        words.remove(0);
    }
    let picked: Vec<&str> = words
        .iter()
        .take_while(|w| !matches!(**w, "&&" | "||" | ";" | "|" | ">" | ">>" | "2>&1"))
        .enumerate()
        .filter(|(i, w)| *i == 0 || !w.starts_with('-'))
        .map(|(_, w)| w.rsplit('/').find(|p| !p.is_empty()).unwrap_or(w))
        .take(2)
        .collect();
    slug(&picked.join("-"))
}

/// `text` as a job name: lower case, `[a-z0-9._-]` only, at most 60 bytes, or `None`.
pub(crate) fn slug(text: &str) -> Option<String> {
    let mut out = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            c
        } else {
            '-'
        };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    let mut out: String = out.chars().take(60).collect();
    while out.ends_with(['-', '.']) || out.starts_with('.') {
        if out.ends_with(['-', '.']) {
            out.pop();
        } else {
            out.remove(0);
        }
    }
    (validate_name("name", &out).is_ok()).then_some(out)
}

#[cfg(test)]
mod tests;

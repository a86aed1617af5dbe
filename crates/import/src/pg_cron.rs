//! `sked import pg-cron`: the rows of pg_cron's `cron.job` table translated into shell jobs
//! that run `psql`.
//!
//! sked has no SQL target, so each job is a shell target running
//! `psql -X -v ON_ERROR_STOP=1 -c "$PG_CRON_COMMAND"`: the SQL travels in the target's
//! environment, never inside the shell text, so no quoting of it can go wrong; the database
//! and the role come from the row (`PGDATABASE`, `PGUSER`); where the server is and how to
//! authenticate (`PGHOST`, `PGPORT`, `PGPASSFILE` or a `PGPASSWORD` from a secret) is the
//! worker's environment's, which the operator sets: no password is ever written.
//!
//! Schedules, as pg_cron 1.4 to 1.6 read them (`src/entry.c`, `src/job_metadata.c`): five
//! Vixie cron fields (sked's cron reads them with the same day rule), `$` for the last day of
//! the month (sked's `L`), `@hourly`-style names, and `N seconds` (1-59, an `every`). pg_cron
//! runs in `cron.timezone` (GMT unless set), checking each minute of UTC: a local time a
//! change of clocks skips never runs and a repeated one runs twice, which sked does not do,
//! so that is reported. `cron.match_dom_and_dow` (both day fields must match) cannot be
//! written as one sked cron expression when both are restricted, so such a row is reported.
//!
//! This module reads rows given to it; it must not touch a database, files or the clock (but
//! for the default moment changes of clocks are looked for from).

use crate::crontab::slug;
use crate::dst::{self, Source};
use crate::{Import, ImportedJob};
use chrono_tz::Tz;
use serde_json::{json, Map, Value};
use sked_core::schedule::cron::CronExpr;
use sked_core::Instant;
use std::collections::HashSet;

/// One row of `cron.job`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PgCronJob {
    pub jobid: i64,
    /// `cron.schedule(job_name, ...)`'s name; absent for an unnamed job (and before 1.3).
    pub jobname: Option<String>,
    pub schedule: String,
    pub command: String,
    pub database: String,
    pub username: String,
    /// Where pg_cron connected to run it, as seen from the database server.
    pub nodename: String,
    pub nodeport: i32,
    pub active: bool,
}

/// The server settings the rows are read under.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `cron.timezone`; GMT (pg_cron's default, and before 1.5 its only zone) when `None`.
    pub timezone: Option<Tz>,
    /// `cron.match_dom_and_dow`: a day must match both day fields even when both are
    /// restricted (off by default, and absent before it was added).
    pub match_dom_and_dow: bool,
    /// The moment from which changes of clocks are compared (now when `None`).
    pub as_of: Option<Instant>,
}

/// The environment variable the SQL is passed to `psql` in.
pub const SQL_VARIABLE: &str = "PG_CRON_COMMAND";

/// The shell text each job runs: the SQL is expanded by the shell from the environment as
/// one argument, never parsed as shell text.
pub const PSQL_COMMAND: &str = "exec psql -X -q -v ON_ERROR_STOP=1 -c \"$PG_CRON_COMMAND\"";

/// Translates rows of `cron.job` read under pg_cron's defaults (GMT).
pub fn import_rows(rows: &[PgCronJob]) -> Import {
    import_rows_with(rows, &Options::default())
}

/// Translates rows of `cron.job` read under `options`.
pub fn import_rows_with(rows: &[PgCronJob], options: &Options) -> Import {
    let mut clocks = dst::Clocks::new(options.as_of.unwrap_or_else(dst::now));
    let mut import = Import::default();
    let mut taken = HashSet::new();
    for row in rows {
        row_job(&mut import, &mut taken, row, options, &mut clocks);
    }
    import
}

/// What a pg_cron schedule is in sked's terms.
enum Translated {
    /// A cron expression (sked's spelling) and the fields as pg_cron read them.
    Cron { expr: String, fields: String },
    /// `N seconds`.
    Seconds(u32),
}

fn row_job(
    import: &mut Import,
    taken: &mut HashSet<String>,
    row: &PgCronJob,
    options: &Options,
    clocks: &mut dst::Clocks,
) {
    let text = format!("jobid {}: {} | {}", row.jobid, row.schedule, row.command);
    let mut comments = Vec::new();
    let translated = match schedule(&row.schedule) {
        Ok(t) => t,
        Err(why) => {
            import.skip(0, &text, why);
            return;
        }
    };
    if row.command.trim().is_empty() {
        import.skip(0, &text, "the job has no command");
        return;
    }
    if row.command.contains('\0') {
        import.skip(0, &text, "the command holds a NUL byte");
        return;
    }
    let tz = options.timezone.unwrap_or(chrono_tz::UTC);
    let mut sched = Map::new();
    let mut overlap = "buffer_all";
    match &translated {
        Translated::Cron { expr, fields } => {
            if options.match_dom_and_dow && both_days_restricted(fields) {
                import.skip(
                    0,
                    &text,
                    "cron.match_dom_and_dow is on and both day fields are restricted: pg_cron \
                     ran it on days matching both, sked's cron on days matching either, and \
                     one expression cannot say both; write it as a day-of-week with # (1#1 = \
                     first Monday) or split it",
                );
                return;
            }
            sched.insert("cron".into(), json!(expr));
            sched.insert("timezone".into(), json!(tz.name()));
        }
        Translated::Seconds(n) => {
            sched.insert("every".into(), json!(format!("{n}s")));
            // pg_cron adds a run only when none is pending: at most one waits.
            overlap = "buffer_one";
            comments.push(format!(
                "pg_cron ran this every {n} seconds from its own start; sked's grid starts \
                 when the job is applied"
            ));
        }
    }
    let name = unique_name(taken, row);
    let mut description = format!("pg_cron job {}", row.jobid);
    if let Some(jobname) = row.jobname.as_deref().filter(|n| !n.is_empty()) {
        description.push_str(&format!(" ({jobname:?})"));
    }
    description.push_str(&format!(
        " in database {:?} as {:?}",
        row.database, row.username
    ));
    let mut env = Map::new();
    env.insert(SQL_VARIABLE.into(), json!(row.command));
    env.insert("PGDATABASE".into(), json!(row.database));
    env.insert("PGUSER".into(), json!(row.username));
    comments.push(format!(
        "pg_cron connected to {}:{} from the database server; the worker reaches it through \
         PGHOST and PGPORT, and authenticates through PGPASSFILE (or ~/.pgpass) or a \
         PGPASSWORD secret, which its environment must set",
        row.nodename, row.nodeport
    ));
    let mut job = Map::new();
    job.insert("name".into(), json!(name));
    job.insert("description".into(), json!(description));
    job.insert("schedule".into(), Value::Object(sched));
    job.insert(
        "target".into(),
        json!({"shell": {"command": PSQL_COMMAND, "env": env}}),
    );
    job.insert("overlap".into(), json!(overlap));
    if !row.active {
        job.insert("paused".into(), json!(true));
        comments.push("inactive in pg_cron (active = false): imported paused".to_string());
    }
    let kept = import.push_job(
        ImportedJob {
            job: Value::Object(job),
            comments,
            line: 0,
        },
        &text,
    );
    if !kept {
        return;
    }
    if let Translated::Cron { expr, fields } = &translated {
        if fields.starts_with("@yearly") || fields.starts_with("@annually") {
            // pg_cron's @yearly sets its month from FIRST_MINUTE (0), out of the month
            // range, so no month matches.
            import.differ(
                0,
                &text,
                "pg_cron's @yearly/@annually matches no month, so pg_cron never ran it; sked \
                 runs it at 00:00 on 1 January",
            );
        }
        if let Ok(parsed) = CronExpr::parse(expr) {
            if let Some(why) = clocks.difference(&parsed, expr, tz, Source::PgCron) {
                import.differ(0, &text, why);
            }
        }
    }
}

/// The job's name: its pg_cron name made a sked name, else `pg-cron-JOBID`; unique.
fn unique_name(taken: &mut HashSet<String>, row: &PgCronJob) -> String {
    let base = row
        .jobname
        .as_deref()
        .and_then(slug)
        .unwrap_or_else(|| format!("pg-cron-{}", row.jobid.unsigned_abs()));
    let mut candidate = base.clone();
    let mut n = 1;
    while taken.contains(&candidate) {
        n += 1;
        candidate = format!("{base}-{n}");
    }
    taken.insert(candidate.clone());
    candidate
}

/// Whether neither day field starts with `*` (Vixie's test for an unrestricted field).
fn both_days_restricted(fields: &str) -> bool {
    let parts: Vec<&str> = fields.split_whitespace().collect();
    parts.len() == 5 && !parts[2].starts_with('*') && !parts[4].starts_with('*')
}

/// pg_cron's schedule text as sked's cron or interval, or why it is not translated.
fn schedule(text: &str) -> Result<Translated, String> {
    let trimmed = text.trim();
    if let Some(n) = seconds(trimmed) {
        return if (1..60).contains(&n) {
            Ok(Translated::Seconds(n))
        } else {
            Err(format!(
                "{trimmed:?}: pg_cron takes 1 to 59 seconds, so it never ran this"
            ))
        };
    }
    if let Some(name) = trimmed.strip_prefix('@') {
        // pg_cron compares the name case-sensitively.
        let name = name.split_whitespace().next().unwrap_or_default();
        return match name {
            "reboot" | "restart" => Err(
                "@reboot runs when pg_cron starts; sked schedules by time, not by a \
                 server's start"
                    .to_string(),
            ),
            "yearly" | "annually" | "monthly" | "weekly" | "daily" | "midnight" | "hourly" => {
                Ok(Translated::Cron {
                    expr: format!("@{name}"),
                    fields: format!("@{name}"),
                })
            }
            _ => Err(format!(
                "@{name} is not a name pg_cron knows, so it never ran this"
            )),
        };
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "{trimmed:?}: pg_cron reads five fields (minute hour day-of-month month \
             day-of-week) or 'N seconds'; found {}",
            fields.len()
        ));
    }
    const NAMES: [&str; 2] = ["minute", "hour"];
    for (i, field) in fields.iter().enumerate() {
        let label = match i {
            0 | 1 => NAMES[i],
            2 => "day-of-month",
            3 => "month",
            _ => "day-of-week",
        };
        if i == 2 && *field == "$" {
            continue;
        }
        check_vixie_field(field, i >= 3).map_err(|why| {
            format!("{label} field {field:?}: {why}; pg_cron refuses it, so it never ran")
        })?;
    }
    let mut sked_fields = fields.clone();
    if sked_fields[2] == "$" {
        sked_fields[2] = "L";
    }
    let expr = sked_fields.join(" ");
    CronExpr::parse(&expr).map_err(|e| format!("{trimmed:?}: {e}"))?;
    Ok(Translated::Cron {
        expr,
        fields: fields.join(" "),
    })
}

/// `N seconds` / `N second` as pg_cron's `sscanf(" %u secon%c%c %c")` reads it.
fn seconds(text: &str) -> Option<u32> {
    let lower = text.to_ascii_lowercase();
    let digits = lower.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let rest = lower[digits..].trim_start();
    let rest = rest
        .strip_prefix("seconds")
        .or_else(|| rest.strip_prefix("second"))?;
    if !rest.trim().is_empty() {
        return None;
    }
    // A number too large for u32 is refused as out of range below.
    Some(lower[..digits].parse::<u32>().unwrap_or(u32::MAX))
}

/// A field as Vixie cron's `get_list` accepts it: items `*`, `n`, `n-m`, each of the last
/// two with `/step` only after a range or `*`, names (three letters) only where `names`.
fn check_vixie_field(field: &str, names: bool) -> Result<(), String> {
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        if let Some(step) = step {
            if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{item:?} has no whole-number step"));
            }
            if range != "*" && !range.contains('-') {
                return Err(format!(
                    "{item:?}: a step needs a range or * before it (as 0-59/{step})"
                ));
            }
        }
        if range == "*" {
            continue;
        }
        let ends: Vec<&str> = range.splitn(2, '-').collect();
        for end in ends {
            let number = !end.is_empty() && end.bytes().all(|b| b.is_ascii_digit());
            let name = names && end.len() == 3 && end.bytes().all(|b| b.is_ascii_alphabetic());
            if !number && !name {
                return Err(format!("{end:?} in {item:?} is not a number or a name"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

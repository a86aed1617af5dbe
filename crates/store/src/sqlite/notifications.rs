//! Notifications in SQLite: recorded when a run ends (from `dependencies::settle`, which every
//! ending passes through) and by the scan for late runs, claimed and reported by the server's
//! notifier, listed, and trimmed by retention. Which events a run raises, and what becomes of a
//! notification after a send, is `sked_core::notify`'s.

use super::rows::{self, micros, RUN_COLUMNS};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{self, Ended, NewNotification};
use crate::{NotificationQuery, Page, Result, SendReport};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, OptionalExtension, Transaction};
use sked_core::notify::{self, NotificationRecord, NotifyEvent, NotifyRule};
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use sked_core::Instant;
use std::collections::hash_map::{Entry, HashMap};
use std::collections::BTreeMap;
use std::time::Duration;

const COLUMNS: &str = "id, namespace, job, run_id, event, rule, channel, message, state, sends, \
     last_error, created_at, next_send_at, sent_at, claim";

fn notification(row: &rusqlite::Row<'_>) -> Result<NotificationRecord> {
    let record = shared::notification(
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        &row.get::<_, String>(4)?,
        row.get(5)?,
        &row.get::<_, String>(6)?,
        &row.get::<_, String>(7)?,
        &row.get::<_, String>(8)?,
    )?;
    Ok(NotificationRecord {
        sends: row.get(9)?,
        last_error: row.get(10)?,
        created_at: rows::instant(row.get(11)?)?,
        next_send_at: rows::instant(row.get(12)?)?,
        sent_at: rows::opt_instant(row.get(13)?)?,
        claim: row.get(14)?,
        ..record
    })
}

/// The rules a job's runs go by: its own, or its namespace's when it gives none.
pub(super) fn rules_of(
    tx: &Transaction<'_>,
    namespace: &str,
    job: &str,
) -> Result<Vec<NotifyRule>> {
    let found: Option<(Option<String>, Option<String>)> = tx
        .prepare_cached(
            "SELECT j.notify, n.notify FROM jobs j LEFT JOIN namespaces n ON n.name = j.namespace \
             WHERE j.namespace = ?1 AND j.name = ?2",
        )?
        .query_row(params![namespace, job], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (job_rules, namespace_rules) = found.unwrap_or_default();
    Ok(shared::effective_rules(
        job_rules.as_deref(),
        namespace_rules.as_deref(),
        format_args!("job {namespace}/{job}"),
    ))
}

/// Records what the runs in `ended` raise under their jobs' rules.
pub(super) fn record_ended(tx: &Transaction<'_>, ended: &[Ended], now: Instant) -> Result<()> {
    let mut rules: HashMap<(&str, &str), Vec<NotifyRule>> = HashMap::new();
    for run in ended {
        let key = (run.namespace.as_str(), run.job.as_str());
        let job_rules = match rules.entry(key) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => slot.insert(rules_of(tx, &run.namespace, &run.job)?),
        };
        if job_rules.is_empty() {
            continue;
        }
        let Some(record) = ended_run(tx, run)? else {
            continue;
        };
        let previous = if notify::needs_previous(job_rules, record.state) {
            previous_outcome(tx, &record)?
        } else {
            None
        };
        let mut notices = BTreeMap::new();
        for rule in notify::needs_last_notice(job_rules, record.state, previous) {
            if let Some(at) = last_failure_notice(tx, &record, rule)? {
                notices.insert(rule, at);
            }
        }
        for new in shared::raised_notifications(job_rules, &record, previous, &notices, now)? {
            insert(tx, &record, &new, now)?;
        }
    }
    Ok(())
}

/// The run that just ended.
fn ended_run(tx: &Transaction<'_>, run: &Ended) -> Result<Option<RunRecord>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![run.run_id])?;
    found.next()?.map(rows::run).transpose()
}

/// How the job's run before `run` ended, among succeeded, failed and timed out (of the same
/// shard, for a sharded job: each shard recovers on its own).
fn previous_outcome(tx: &Transaction<'_>, run: &RunRecord) -> Result<Option<RunState>> {
    let state: Option<String> = tx
        .prepare_cached(
            "SELECT state FROM runs WHERE namespace = ?1 AND job = ?2 AND scheduled_for < ?3 \
             AND state IN ('succeeded', 'failed', 'timed_out') AND shard = ?4 \
             ORDER BY scheduled_for DESC, id DESC LIMIT 1",
        )?
        .query_row(
            params![
                run.namespace,
                run.job,
                micros(run.scheduled_for),
                run.shard.map_or(0, |s| s.index)
            ],
            |r| r.get(0),
        )
        .optional()?;
    state.as_deref().map(rows::run_state).transpose()
}

/// When rule `rule` of `run`'s job last told of a failure of the job (`failed`, `timed_out`).
fn last_failure_notice(
    tx: &Transaction<'_>,
    run: &RunRecord,
    rule: usize,
) -> Result<Option<Instant>> {
    let at: Option<i64> = tx
        .prepare_cached(
            "SELECT max(created_at) FROM notifications WHERE namespace = ?1 AND job = ?2 \
             AND rule = ?3 AND event IN ('failed', 'timed_out')",
        )?
        .query_row(params![run.namespace, run.job, rule as i64], |r| r.get(0))?;
    at.map(rows::instant).transpose()
}

/// Stores a notification unless this run already raised this event under this rule; whether
/// it is new.
pub(super) fn insert(
    tx: &Transaction<'_>,
    run: &RunRecord,
    new: &NewNotification,
    now: Instant,
) -> Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO notifications (namespace, job, run_id, event, rule, channel, message, \
             state, sends, created_at, next_send_at, claim) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', 0, ?8, ?8, 0) \
             ON CONFLICT (run_id, event, rule) DO NOTHING",
        )?
        .execute(params![
            run.namespace,
            run.job,
            run.id,
            new.event,
            new.rule,
            new.channel,
            new.message,
            micros(now),
        ])?;
    Ok(inserted == 1)
}

/// Each job with a `late` rule: its id, its own rules and its namespace's. As on PostgreSQL,
/// jobs that follow their namespace's rules are read only for the namespaces that have a
/// `late` rule, through the jobs' `(namespace, name)` key, never by scanning every job.
fn late_jobs(tx: &Transaction<'_>) -> Result<Vec<shared::LateJob>> {
    let mut jobs = tx
        .prepare_cached(
            "SELECT j.id, j.notify, n.notify FROM jobs j \
             LEFT JOIN namespaces n ON n.name = j.namespace WHERE j.notify_late = 1",
        )?
        .query_map([], |r| {
            Ok(shared::LateJob {
                job_id: r.get(0)?,
                job_rules: r.get(1)?,
                namespace_rules: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let namespaces: Vec<(String, Option<String>)> = tx
        .prepare_cached("SELECT name, notify FROM namespaces WHERE notify_late = 1")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut followers =
        tx.prepare_cached("SELECT id FROM jobs WHERE namespace = ?1 AND notify IS NULL")?;
    for (name, rules) in namespaces {
        let ids = followers
            .query_map([&name], |r| r.get::<_, i64>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        jobs.extend(ids.into_iter().map(|job_id| shared::LateJob {
            job_id,
            job_rules: None,
            namespace_rules: rules.clone(),
        }));
    }
    Ok(jobs)
}

pub fn record_late(tx: &Transaction<'_>, now: Instant) -> Result<u64> {
    let mut recorded = 0;
    for job in late_jobs(tx)? {
        let job_id = job.job_id;
        let rules = job.rules();
        let Some(earliest) = notify::earliest_late_after(&rules) else {
            continue;
        };
        let due = now - chrono::Duration::from_std(earliest).unwrap_or_default();
        // Only runs of the job's active index past its earliest delay; the rules judge each.
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE job_id = ?1 \
             AND state IN ('waiting', 'queued', 'running') AND scheduled_for < ?2"
        );
        let mut stmt = tx.prepare_cached(&sql)?;
        let mut found = stmt.query(params![job_id, micros(due)])?;
        while let Some(row) = found.next()? {
            let run = rows::run(row)?;
            for (i, rule) in rules.iter().enumerate() {
                if notify::is_late(rule, run.scheduled_for, run.started_at.unwrap_or(now)) {
                    let new = shared::new_notification(&rules, i, NotifyEvent::Late, &run, now)?;
                    recorded += u64::from(insert(tx, &run, &new, now)?);
                }
            }
        }
    }
    Ok(recorded)
}

pub fn claim(
    tx: &Transaction<'_>,
    now: Instant,
    lease: Duration,
    limit: u32,
) -> Result<Vec<NotificationRecord>> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or_default();
    let sql = format!(
        "UPDATE notifications SET next_send_at = ?2, claim = claim + 1 WHERE id IN \
         (SELECT id FROM notifications WHERE state = 'pending' AND next_send_at <= ?1 \
          ORDER BY next_send_at, id LIMIT ?3) \
         RETURNING {COLUMNS}"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![micros(now), micros(until), limit])?;
    let mut claimed = Vec::new();
    while let Some(row) = found.next()? {
        claimed.push(notification(row)?);
    }
    claimed.sort_by_key(|n| (n.created_at, n.id));
    Ok(claimed)
}

pub fn finish(tx: &Transaction<'_>, reports: &[SendReport], now: Instant) -> Result<()> {
    for report in reports {
        let sends: Option<u32> = tx
            .prepare_cached(
                "SELECT sends FROM notifications WHERE id = ?1 AND claim = ?2 AND state = 'pending'",
            )?
            .query_row(params![report.id, report.claim], |r| r.get(0))
            .optional()?;
        let Some(sends) = sends else {
            continue;
        };
        let (state, sends, next, error) = notify::after_send(sends, &report.outcome, now);
        let sent_at = (state == notify::NotificationState::Sent).then_some(micros(now));
        tx.prepare_cached(
            "UPDATE notifications SET state = ?2, sends = ?3, next_send_at = ?4, \
             last_error = ?5, sent_at = ?6 WHERE id = ?1",
        )?
        .execute(params![
            report.id,
            state.as_str(),
            sends,
            micros(next),
            error,
            sent_at
        ])?;
    }
    Ok(())
}

pub fn list(tx: &Transaction<'_>, query: &NotificationQuery) -> Result<Page<NotificationRecord>> {
    let limit = page_size(query.limit);
    let mut sql = format!("SELECT {COLUMNS} FROM notifications WHERE namespace = ?");
    let mut values: Vec<Value> = vec![Value::Text(query.namespace.clone())];
    if let Some(job) = &query.job {
        sql.push_str(" AND job = ?");
        values.push(Value::Text(job.clone()));
    }
    if let Some(state) = query.state {
        sql.push_str(" AND state = ?");
        values.push(Value::Text(state.as_str().to_string()));
    }
    if let Some(raw) = &query.cursor {
        sql.push_str(" AND id < ?");
        values.push(Value::Integer(Cursor::decode(raw)?.id));
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT {}", limit + 1));
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params_from_iter(values))?;
    let mut items = Vec::new();
    while let Some(row) = found.next()? {
        items.push(notification(row)?);
    }
    Ok(cursor::page(items, limit, cursor::after_notification))
}

pub fn delete_before(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications \
             WHERE created_at < ?1 AND state != 'pending' LIMIT ?2)",
        )?
        .execute(params![micros(before), limit])?;
    Ok(deleted as u64)
}

//! Notifications in PostgreSQL, as `sqlite/notify.rs` keeps them: recorded when a run ends
//! (from `dependencies::settle`) and by the scan for late runs, claimed with `SKIP LOCKED` so
//! that two nodes never hold one, reported, listed and trimmed. Inserting a notification locks
//! only its own row, so recording stands outside the lock order of `mod.rs`.

use super::rows::{self, micros, RUN_COLUMNS};
use super::{PgResult, Tx};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::{self, Ended, NewNotification};
use crate::{NotificationQuery, Page, SendReport};
use sked_core::notify::{self, NotificationRecord, NotifyEvent, NotifyRule};
use sked_core::records::RunRecord;
use sked_core::run::RunState;
use sked_core::Instant;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

const COLUMNS: &str = "id, namespace, job, run_id, event, rule, channel, message, state, sends, \
     last_error, created_at, next_send_at, sent_at, claim";

fn notification(row: &Row) -> PgResult<NotificationRecord> {
    let record = shared::notification(
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
        i64::from(row.try_get::<_, i32>(5)?),
        row.try_get(6)?,
        row.try_get(7)?,
        row.try_get(8)?,
    )?;
    Ok(NotificationRecord {
        sends: rows::count("sends", row.try_get::<_, i32>(9)?)?,
        last_error: row.try_get(10)?,
        created_at: rows::instant(row.try_get(11)?)?,
        next_send_at: rows::instant(row.try_get(12)?)?,
        sent_at: rows::opt_instant(row.try_get(13)?)?,
        claim: row.try_get(14)?,
        ..record
    })
}

/// The rules of those of `ended`'s jobs that have any (their own, or their namespace's), in
/// one statement for the batch.
pub(super) async fn rules_of(
    tx: &Tx<'_>,
    ended: &[Ended],
) -> PgResult<HashMap<(String, String), Vec<NotifyRule>>> {
    let jobs: HashSet<(&str, &str)> = ended
        .iter()
        .map(|r| (r.namespace.as_str(), r.job.as_str()))
        .collect();
    let (namespaces, names): (Vec<&str>, Vec<&str>) = jobs.into_iter().unzip();
    let stmt = tx
        .prepare_cached(
            "SELECT j.namespace, j.name, j.notify, n.notify FROM jobs j \
             JOIN unnest($1::text[], $2::text[]) AS e(namespace, name) \
               ON j.namespace = e.namespace AND j.name = e.name \
             LEFT JOIN namespaces n ON n.name = j.namespace \
             WHERE j.notify IS NOT NULL OR n.notify IS NOT NULL",
        )
        .await?;
    let mut rules = HashMap::new();
    for row in tx.query(&stmt, &[&namespaces, &names]).await? {
        let (namespace_name, job_name): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let job: Option<&str> = row.try_get(2)?;
        let namespace: Option<&str> = row.try_get(3)?;
        let whose = format_args!("job {namespace_name}/{job_name}");
        let found = shared::effective_rules(job, namespace, whose);
        rules.insert((namespace_name, job_name), found);
    }
    Ok(rules)
}

/// Records what the runs in `ended` raise under their jobs' rules.
pub(super) async fn record_ended(tx: &Tx<'_>, ended: &[Ended], now: Instant) -> PgResult<()> {
    if ended.is_empty() {
        return Ok(());
    }
    let rules = rules_of(tx, ended).await?;
    if rules.is_empty() {
        return Ok(());
    }
    for run in ended {
        let key = (run.namespace.clone(), run.job.clone());
        let Some(job_rules) = rules.get(&key).filter(|r| !r.is_empty()) else {
            continue;
        };
        let Some(record) = ended_run(tx, run).await? else {
            continue;
        };
        let previous = if notify::needs_previous(job_rules, record.state) {
            previous_outcome(tx, &record).await?
        } else {
            None
        };
        let mut notices = BTreeMap::new();
        for rule in notify::needs_last_notice(job_rules, record.state, previous) {
            if let Some(at) = last_failure_notice(tx, &record, rule).await? {
                notices.insert(rule, at);
            }
        }
        for new in shared::raised_notifications(job_rules, &record, previous, &notices, now)? {
            insert(tx, &record, &new, now).await?;
        }
    }
    Ok(())
}

/// The run that just ended.
async fn ended_run(tx: &Tx<'_>, run: &Ended) -> PgResult<Option<RunRecord>> {
    let stmt = tx
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
        .await?;
    let found = tx.query_opt(&stmt, &[&run.run_id]).await?;
    found.as_ref().map(rows::run).transpose()
}

/// How the job's run before `run` ended, among succeeded, failed and timed out (of the same
/// shard, for a sharded job: each shard recovers on its own).
async fn previous_outcome(tx: &Tx<'_>, run: &RunRecord) -> PgResult<Option<RunState>> {
    let stmt = tx
        .prepare_cached(
            "SELECT state FROM runs WHERE namespace = $1 AND job = $2 AND scheduled_for < $3 \
             AND state IN ('succeeded', 'failed', 'timed_out') AND shard = $4 \
             ORDER BY scheduled_for DESC, id DESC LIMIT 1",
        )
        .await?;
    let shard = i32::from(run.shard.map_or(0, |s| s.index));
    let found = tx
        .query_opt(
            &stmt,
            &[&run.namespace, &run.job, &micros(run.scheduled_for), &shard],
        )
        .await?;
    match found {
        Some(row) => Ok(Some(rows::run_state(row.try_get(0)?)?)),
        None => Ok(None),
    }
}

/// When rule `rule` of `run`'s job last told of a failure of the job (`failed`, `timed_out`).
async fn last_failure_notice(
    tx: &Tx<'_>,
    run: &RunRecord,
    rule: usize,
) -> PgResult<Option<Instant>> {
    let stmt = tx
        .prepare_cached(
            "SELECT max(created_at) FROM notifications WHERE namespace = $1 AND job = $2 \
             AND rule = $3 AND event IN ('failed', 'timed_out')",
        )
        .await?;
    let rule = i32::try_from(rule).unwrap_or(i32::MAX);
    let row = tx
        .query_one(&stmt, &[&run.namespace, &run.job, &rule])
        .await?;
    Ok(row
        .try_get::<_, Option<i64>>(0)?
        .map(rows::instant)
        .transpose()?)
}

/// Stores a notification unless this run already raised this event under this rule; whether
/// it is new.
pub(super) async fn insert(
    tx: &Tx<'_>,
    run: &RunRecord,
    new: &NewNotification,
    now: Instant,
) -> PgResult<bool> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO notifications (namespace, job, run_id, event, rule, channel, message, \
             state, sends, created_at, next_send_at, claim) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', 0, $8, $8, 0) \
             ON CONFLICT (run_id, event, rule) DO NOTHING",
        )
        .await?;
    let rule = rows::int("rule", new.rule as u32)?;
    let inserted = tx
        .execute(
            &stmt,
            &[
                &run.namespace,
                &run.job,
                &run.id,
                &new.event,
                &rule,
                &new.channel,
                &new.message,
                &micros(now),
            ],
        )
        .await?;
    Ok(inserted == 1)
}

/// Each job with a `late` rule: its id, its own rules and its namespace's.
///
/// Jobs with rules of their own come through the small `jobs_notify_late` index; jobs that
/// follow their namespace's rules are read only for the namespaces that have a `late` rule,
/// usually none. Asked as one statement, the planner could not know how few namespaces that
/// is and scanned every job each pass: with 5,000 jobs firing every second (their table much
/// rewritten), about a tenth of a core.
async fn late_jobs(tx: &Tx<'_>) -> PgResult<Vec<shared::LateJob>> {
    let own = tx
        .prepare_cached(
            "SELECT j.id, j.notify, n.notify FROM jobs j \
             LEFT JOIN namespaces n ON n.name = j.namespace WHERE j.notify_late",
        )
        .await?;
    let mut jobs = Vec::new();
    for row in tx.query(&own, &[]).await? {
        jobs.push(shared::LateJob {
            job_id: row.try_get(0)?,
            job_rules: row.try_get(1)?,
            namespace_rules: row.try_get(2)?,
        });
    }
    let namespaces = tx
        .prepare_cached("SELECT name, notify FROM namespaces WHERE notify_late")
        .await?;
    let followers = tx
        .prepare_cached("SELECT id FROM jobs WHERE namespace = $1 AND notify IS NULL")
        .await?;
    for namespace in tx.query(&namespaces, &[]).await? {
        let (name, rules): (&str, Option<String>) = (namespace.try_get(0)?, namespace.try_get(1)?);
        for row in tx.query(&followers, &[&name]).await? {
            jobs.push(shared::LateJob {
                job_id: row.try_get(0)?,
                job_rules: None,
                namespace_rules: rules.clone(),
            });
        }
    }
    Ok(jobs)
}

pub async fn record_late(tx: &Tx<'_>, now: Instant) -> PgResult<u64> {
    let jobs = late_jobs(tx).await?;
    let runs = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE job_id = $1 \
             AND state IN ('waiting', 'queued', 'running') AND scheduled_for < $2"
        ))
        .await?;
    let mut recorded = 0;
    for job in jobs {
        let job_id = job.job_id;
        let rules = job.rules();
        let Some(earliest) = notify::earliest_late_after(&rules) else {
            continue;
        };
        let due = now - chrono::Duration::from_std(earliest).unwrap_or_default();
        for row in tx.query(&runs, &[&job_id, &micros(due)]).await? {
            let run = rows::run(&row)?;
            for (i, rule) in rules.iter().enumerate() {
                if notify::is_late(rule, run.scheduled_for, run.started_at.unwrap_or(now)) {
                    let new = shared::new_notification(&rules, i, NotifyEvent::Late, &run, now)?;
                    recorded += u64::from(insert(tx, &run, &new, now).await?);
                }
            }
        }
    }
    Ok(recorded)
}

pub async fn claim(
    tx: &Tx<'_>,
    now: Instant,
    lease: Duration,
    limit: u32,
) -> PgResult<Vec<NotificationRecord>> {
    let until = now + chrono::Duration::from_std(lease).unwrap_or_default();
    let stmt = tx
        .prepare_cached(&format!(
            "UPDATE notifications SET next_send_at = $2, claim = claim + 1 WHERE id IN \
             (SELECT id FROM notifications WHERE state = 'pending' AND next_send_at <= $1 \
              ORDER BY next_send_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING {COLUMNS}"
        ))
        .await?;
    let limit = i64::from(limit);
    let mut claimed = tx
        .query(&stmt, &[&micros(now), &micros(until), &limit])
        .await?
        .iter()
        .map(notification)
        .collect::<PgResult<Vec<_>>>()?;
    claimed.sort_by_key(|n| (n.created_at, n.id));
    Ok(claimed)
}

pub async fn finish(tx: &Tx<'_>, reports: &[SendReport], now: Instant) -> PgResult<()> {
    let find = tx
        .prepare_cached(
            "SELECT sends FROM notifications WHERE id = $1 AND claim = $2 AND state = 'pending' \
             FOR UPDATE",
        )
        .await?;
    let update = tx
        .prepare_cached(
            "UPDATE notifications SET state = $2, sends = $3, next_send_at = $4, \
             last_error = $5, sent_at = $6 WHERE id = $1",
        )
        .await?;
    for report in reports {
        let Some(row) = tx.query_opt(&find, &[&report.id, &report.claim]).await? else {
            continue;
        };
        let sends = rows::count("sends", row.try_get::<_, i32>(0)?)?;
        let (state, sends, next, error) = notify::after_send(sends, &report.outcome, now);
        let sent_at = (state == notify::NotificationState::Sent).then_some(micros(now));
        tx.execute(
            &update,
            &[
                &report.id,
                &state.as_str(),
                &rows::int("sends", sends)?,
                &micros(next),
                &error,
                &sent_at,
            ],
        )
        .await?;
    }
    Ok(())
}

pub async fn list(tx: &Tx<'_>, query: &NotificationQuery) -> PgResult<Page<NotificationRecord>> {
    let limit = page_size(query.limit);
    let mut sql = format!("SELECT {COLUMNS} FROM notifications WHERE namespace = $1");
    let mut values: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(query.namespace.clone())];
    if let Some(job) = &query.job {
        values.push(Box::new(job.clone()));
        sql.push_str(&format!(" AND job = ${}", values.len()));
    }
    if let Some(state) = query.state {
        values.push(Box::new(state.as_str()));
        sql.push_str(&format!(" AND state = ${}", values.len()));
    }
    if let Some(raw) = &query.cursor {
        values.push(Box::new(Cursor::decode(raw)?.id));
        sql.push_str(&format!(" AND id < ${}", values.len()));
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT {}", limit + 1));
    let args: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect();
    let items = tx
        .query(&sql, &args)
        .await?
        .iter()
        .map(notification)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(cursor::page(items, limit, cursor::after_notification))
}

pub async fn delete_before(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let stmt = tx
        .prepare_cached(
            "DELETE FROM notifications WHERE id IN (SELECT id FROM notifications \
             WHERE created_at < $1 AND state != 'pending' LIMIT $2)",
        )
        .await?;
    Ok(tx
        .execute(&stmt, &[&micros(before), &i64::from(limit)])
        .await?)
}

//! Events in the store: recording one once per `(namespace, key, id)` at an instant no other
//! event of its namespace has, the subscriptions a definition makes (which jobs a key starts,
//! which wait for it), and reading and pruning them. What an event moves — the runs it starts
//! or releases — is `dependencies::settle`'s, in the same transaction.

use super::dependencies::settle_admitting;
use super::rows::{self, micros};
use crate::{EventQuery, PostedEvent, Result};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::dependency;
use sked_core::event::EventSpec;
use sked_core::job::ValidJob;
use sked_core::records::EventRecord;
use sked_core::Instant;

const COLUMNS: &str =
    "namespace, key, event_id, payload, occurred_at, emitted_by_run, trace_parent";

fn event(row: &rusqlite::Row<'_>) -> Result<EventRecord> {
    Ok(EventRecord {
        namespace: row.get(0)?,
        key: row.get(1)?,
        id: row.get(2)?,
        payload: crate::shared::event_payload(&row.get::<_, String>(3)?)?,
        occurred_at: rows::instant(row.get(4)?)?,
        emitted_by_run: row.get(5)?,
        trace_parent: row.get(6)?,
    })
}

/// Keeps the job's subscriptions in step with its definition: the key its schedule names
/// (role `schedule`) and the keys its `depends_on` waits for (role `wait`); and the key it
/// emits, on the job's row.
pub(super) fn put_subscriptions(
    tx: &Transaction<'_>,
    namespace: &str,
    job: &ValidJob,
) -> Result<()> {
    remove_subscriptions(tx, namespace, &job.name)?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO event_subscriptions (namespace, key, job, role) VALUES (?1, ?2, ?3, ?4)",
    )?;
    if let Some(key) = job.spec.triggering_event() {
        insert.execute(params![namespace, key, job.name, "schedule"])?;
    }
    for key in dependency::awaited_events(&job.spec.depends_on) {
        insert.execute(params![namespace, key, job.name, "wait"])?;
    }
    Ok(())
}

/// Forgets a deleted job's subscriptions.
pub(super) fn remove_subscriptions(tx: &Transaction<'_>, namespace: &str, job: &str) -> Result<()> {
    tx.prepare_cached("DELETE FROM event_subscriptions WHERE namespace = ?1 AND job = ?2")?
        .execute(params![namespace, job])?;
    Ok(())
}

/// Records `spec` in `namespace` unless it is recorded already; returns the event and whether
/// it is new. A new event's instant is now, or just after its namespace's latest event.
pub(super) fn record(
    tx: &Transaction<'_>,
    namespace: &str,
    spec: &EventSpec,
    emitted_by_run: Option<i64>,
    now: Instant,
) -> Result<(EventRecord, bool)> {
    let existing = tx
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM events WHERE namespace = ?1 AND key = ?2 AND event_id = ?3"
        ))?
        .query_row(params![namespace, spec.key, spec.id], |r| Ok(event(r)))
        .optional()?;
    if let Some(found) = existing {
        return Ok((found?, false));
    }
    let latest: Option<i64> = tx
        .prepare_cached("SELECT max(occurred_at) FROM events WHERE namespace = ?1")?
        .query_row(params![namespace], |r| r.get(0))?;
    let occurred_at = sked_core::event::next_instant(micros(now), latest);
    let payload = crate::shared::to_json("event payload", &spec.payload)?;
    // An emitted event's runs join the emitting run's trace, as children of its root.
    let insert = format!(
        "INSERT INTO events (namespace, key, event_id, payload, occurred_at, emitted_by_run, \
                             trace_parent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, \
                 coalesce(?7, (SELECT {} FROM runs u WHERE u.id = ?6))) \
         RETURNING trace_parent",
        super::traces::JOINED_UNDER
    );
    let trace_parent: Option<String> = tx.prepare_cached(&insert)?.query_row(
        params![
            namespace,
            spec.key,
            spec.id,
            payload,
            occurred_at,
            emitted_by_run,
            spec.trace_parent
        ],
        |r| r.get(0),
    )?;
    let record = EventRecord {
        namespace: namespace.to_string(),
        key: spec.key.clone(),
        id: spec.id.clone(),
        payload: spec.payload.clone(),
        occurred_at: rows::instant(occurred_at)?,
        emitted_by_run,
        trace_parent,
    };
    Ok((record, true))
}

/// Records a posted event and settles what it starts and releases.
pub(super) fn post(
    tx: &Transaction<'_>,
    namespace: &str,
    spec: &EventSpec,
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> Result<PostedEvent> {
    let (event, created) = record(tx, namespace, spec, None, now)?;
    if !created {
        return Ok(crate::shared::posted_before(event));
    }
    let settled = settle_admitting(tx, Vec::new(), vec![event.clone()], backlog, now)?;
    Ok(PostedEvent {
        event,
        created,
        started: settled.started,
        queued: settled.queued,
        cancel_requested: settled.cancel_requested,
        flowed: settled.flowed,
    })
}

pub(super) fn list(tx: &Transaction<'_>, query: &EventQuery) -> Result<Vec<EventRecord>> {
    let before = query.before.map_or(i64::MAX, micros);
    let mut found = Vec::new();
    let mut push = |rows: &mut rusqlite::Rows<'_>| -> Result<()> {
        while let Some(row) = rows.next()? {
            found.push(event(row)?);
        }
        Ok(())
    };
    match &query.key {
        Some(key) => {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM events WHERE namespace = ?1 AND key = ?2 \
                 AND occurred_at < ?3 ORDER BY occurred_at DESC LIMIT ?4"
            ))?;
            push(&mut stmt.query(params![query.namespace, key, before, query.limit])?)?;
        }
        None => {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM events WHERE namespace = ?1 AND occurred_at < ?2 \
                 ORDER BY occurred_at DESC LIMIT ?3"
            ))?;
            push(&mut stmt.query(params![query.namespace, before, query.limit])?)?;
        }
    }
    Ok(found)
}

pub(super) fn delete_before(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM events WHERE id IN \
             (SELECT id FROM events WHERE occurred_at < ?1 ORDER BY occurred_at LIMIT ?2)",
        )?
        .execute(params![micros(before), limit])?;
    Ok(deleted as u64)
}

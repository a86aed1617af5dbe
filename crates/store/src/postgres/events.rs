//! Events in the store, as `sqlite::events` keeps them: recorded once per
//! `(namespace, key, id)` at an instant no other event of the namespace has (an advisory lock
//! per namespace orders new events), the subscriptions a definition makes, reads and pruning.
//! What an event moves is `dependencies::settle`'s, in the same transaction.

use super::dependencies::{lock_subscribers, settle_admitting};
use super::rows::{self, micros};
use super::{PgResult, Tx};
use crate::{EventQuery, PostedEvent};
use sked_core::dependency;
use sked_core::event::EventSpec;
use sked_core::job::ValidJob;
use sked_core::records::EventRecord;
use sked_core::Instant;
use tokio_postgres::Row;

const COLUMNS: &str =
    "namespace, key, event_id, payload, occurred_at, emitted_by_run, trace_parent";

fn event(row: &Row) -> PgResult<EventRecord> {
    Ok(EventRecord {
        namespace: row.try_get(0)?,
        key: row.try_get(1)?,
        id: row.try_get(2)?,
        payload: crate::shared::event_payload(row.try_get(3)?)?,
        occurred_at: rows::instant(row.try_get(4)?)?,
        emitted_by_run: row.try_get(5)?,
        trace_parent: row.try_get(6)?,
    })
}

/// Keeps the job's subscriptions in step with its definition (`sqlite::events`).
pub(super) async fn put_subscriptions(
    tx: &Tx<'_>,
    namespace: &str,
    job: &ValidJob,
) -> PgResult<()> {
    remove_subscriptions(tx, namespace, &job.name).await?;
    let stmt = tx
        .prepare_cached(
            "INSERT INTO event_subscriptions (namespace, key, job, role) VALUES ($1, $2, $3, $4)",
        )
        .await?;
    if let Some(key) = job.spec.triggering_event() {
        tx.execute(&stmt, &[&namespace, &key, &job.name, &"schedule"])
            .await?;
    }
    for key in dependency::awaited_events(&job.spec.depends_on) {
        tx.execute(&stmt, &[&namespace, &key, &job.name, &"wait"])
            .await?;
    }
    Ok(())
}

/// Forgets a deleted job's subscriptions.
pub(super) async fn remove_subscriptions(tx: &Tx<'_>, namespace: &str, job: &str) -> PgResult<()> {
    let stmt = tx
        .prepare_cached("DELETE FROM event_subscriptions WHERE namespace = $1 AND job = $2")
        .await?;
    tx.execute(&stmt, &[&namespace, &job]).await?;
    Ok(())
}

/// Records `spec` in `namespace` unless it is recorded already; returns the event and whether
/// it is new.
pub(super) async fn record(
    tx: &Tx<'_>,
    namespace: &str,
    spec: &EventSpec,
    emitted_by_run: Option<i64>,
    now: Instant,
) -> PgResult<(EventRecord, bool)> {
    let find = tx
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM events WHERE namespace = $1 AND key = $2 AND event_id = $3"
        ))
        .await?;
    let args: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&namespace, &spec.key, &spec.id];
    if let Some(row) = tx.query_opt(&find, &args).await? {
        return Ok((event(&row)?, false));
    }
    super::namespaces::lock_events(tx, namespace).await?;
    // A post of the same event may have committed while this one waited for the lock.
    if let Some(row) = tx.query_opt(&find, &args).await? {
        return Ok((event(&row)?, false));
    }
    let stmt = tx
        .prepare_cached("SELECT max(occurred_at) FROM events WHERE namespace = $1")
        .await?;
    let latest: Option<i64> = tx.query_one(&stmt, &[&namespace]).await?.try_get(0)?;
    let occurred_at = sked_core::event::next_instant(micros(now), latest);
    let payload = crate::shared::to_json("event payload", &spec.payload)?;
    // An emitted event's runs join the emitting run's trace, as children of its root.
    let insert = format!(
        "INSERT INTO events (namespace, key, event_id, payload, occurred_at, emitted_by_run, \
                             trace_parent) \
         VALUES ($1, $2, $3, $4, $5, $6, \
                 coalesce($7, (SELECT {} FROM runs u WHERE u.id = $6))) \
         RETURNING trace_parent",
        super::traces::JOINED_UNDER
    );
    let stmt = tx.prepare_cached(&insert).await?;
    let trace_parent: Option<String> = tx
        .query_one(
            &stmt,
            &[
                &namespace,
                &spec.key,
                &spec.id,
                &payload,
                &occurred_at,
                &emitted_by_run,
                &spec.trace_parent,
            ],
        )
        .await?
        .try_get(0)?;
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

/// Records a posted event and settles what it starts and releases. The jobs the key concerns
/// are locked first, so a fire of one of them and the event are serialised.
pub(super) async fn post(
    tx: &Tx<'_>,
    namespace: &str,
    spec: &EventSpec,
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> PgResult<PostedEvent> {
    lock_subscribers(tx, namespace, &spec.key).await?;
    let (event, created) = record(tx, namespace, spec, None, now).await?;
    if !created {
        return Ok(crate::shared::posted_before(event));
    }
    let settled = settle_admitting(tx, Vec::new(), vec![event.clone()], backlog, now).await?;
    Ok(PostedEvent {
        event,
        created,
        started: settled.started,
        queued: settled.queued,
        cancel_requested: settled.cancel_requested,
        flowed: settled.flowed,
    })
}

pub(super) async fn list(tx: &Tx<'_>, query: &EventQuery) -> PgResult<Vec<EventRecord>> {
    let before = query.before.map_or(i64::MAX, micros);
    let limit = i64::from(query.limit);
    let rows = match &query.key {
        Some(key) => {
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM events WHERE namespace = $1 AND key = $2 \
                     AND occurred_at < $3 ORDER BY occurred_at DESC LIMIT $4"
                ))
                .await?;
            tx.query(&stmt, &[&query.namespace, key, &before, &limit])
                .await?
        }
        None => {
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM events WHERE namespace = $1 AND occurred_at < $2 \
                     ORDER BY occurred_at DESC LIMIT $3"
                ))
                .await?;
            tx.query(&stmt, &[&query.namespace, &before, &limit])
                .await?
        }
    };
    rows.iter().map(event).collect()
}

pub(super) async fn delete_before(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let stmt = tx
        .prepare_cached(
            "DELETE FROM events WHERE id IN \
             (SELECT id FROM events WHERE occurred_at < $1 ORDER BY occurred_at LIMIT $2)",
        )
        .await?;
    Ok(tx
        .execute(&stmt, &[&micros(before), &i64::from(limit)])
        .await?)
}

//! A namespace's calendars (`CalendarStore`) on PostgreSQL.
//!
//! Owns the `calendars` table. Reads `jobs` only to find the jobs whose schedule names a
//! calendar (`schedule.calendar` inside their JSON definition), and never writes them: what a
//! schedule does with a calendar, and resolving one with those it includes or excepts, belong
//! to the core and the server. The audit entries of a change are appended in its transaction.
//!
//! Every write to a namespace's calendars holds a transaction-level advisory lock on the
//! namespace ([`lock`]), so two creates cannot both count one calendar under the cap, and a
//! delete's check of the calendars that name it holds until it commits. It is taken first in
//! these transactions and no row is locked while waiting for it, so it stands outside the row
//! lock order of `mod.rs`. `Store::apply` writes its calendars before its jobs for this. A job written meanwhile to name the calendar is not held back by
//! it: the server checks the calendar a schedule names when the job is written.

use super::rows::{count, instant, micros};
use super::{PgResult, PgStore, Tx, TRIES};
use crate::shared::to_json;
use crate::{observe_write, Audit, CalendarDeletion, PutOutcome, Result, StoreError};
use sked_core::calendar::{
    CalendarRecord, CalendarSpec, CalendarUsers, MAX_CALENDARS_PER_NAMESPACE,
};
use sked_core::namespace::NamespaceRefusal;
use sked_core::Instant;
use tokio_postgres::{IsolationLevel, Row};

const COLUMNS: &str = "namespace, name, spec, version, created_at, updated_at";

fn calendar(row: &Row) -> PgResult<CalendarRecord> {
    Ok(CalendarRecord {
        namespace: row.try_get(0)?,
        name: row.try_get(1)?,
        spec: crate::shared::calendar_spec(row.try_get(2)?)?,
        version: count("calendar version", row.try_get::<_, i32>(3)?)?,
        created_at: instant(row.try_get(4)?)?,
        updated_at: instant(row.try_get(5)?)?,
    })
}

/// Takes namespace `namespace`'s calendars lock until the transaction ends.
async fn lock(tx: &Tx<'_>, namespace: &str) -> PgResult<()> {
    let stmt = tx
        .prepare_cached(
            "SELECT pg_advisory_xact_lock(hashtextextended('sked.namespace-calendars/' || $1, 0))",
        )
        .await?;
    tx.execute(&stmt, &[&namespace]).await?;
    Ok(())
}

pub async fn get(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<Option<CalendarRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM calendars WHERE namespace = $1 AND name = $2");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&namespace, &name])
        .await?
        .as_ref()
        .map(calendar)
        .transpose()
}

pub async fn list(tx: &Tx<'_>, namespace: &str) -> PgResult<Vec<CalendarRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM calendars WHERE namespace = $1 ORDER BY name");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query(&stmt, &[&namespace])
        .await?
        .iter()
        .map(calendar)
        .collect()
}

pub async fn put(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    spec: &CalendarSpec,
    now: Instant,
) -> PgResult<(PutOutcome, CalendarRecord)> {
    lock(tx, namespace).await?;
    let before = get(tx, namespace, name).await?;
    let text = to_json("a calendar", spec)?;
    let sql = match &before {
        Some(old) if old.spec == *spec => return Ok((PutOutcome::Unchanged, old.clone())),
        Some(_) => format!(
            "UPDATE calendars SET spec = $3, version = version + 1, updated_at = $4 \
             WHERE namespace = $1 AND name = $2 RETURNING {COLUMNS}"
        ),
        None => {
            let stmt = tx
                .prepare_cached("SELECT count(*) FROM calendars WHERE namespace = $1")
                .await?;
            let held: i64 = tx.query_one(&stmt, &[&namespace]).await?.try_get(0)?;
            if usize::try_from(held).unwrap_or(usize::MAX) >= MAX_CALENDARS_PER_NAMESPACE {
                return Err(StoreError::from(NamespaceRefusal::TooManyCalendars {
                    namespace: namespace.to_string(),
                    max: MAX_CALENDARS_PER_NAMESPACE as u64,
                })
                .into());
            }
            format!(
                "INSERT INTO calendars (namespace, name, spec, version, created_at, updated_at) \
                 VALUES ($1, $2, $3, 1, $4, $4) RETURNING {COLUMNS}"
            )
        }
    };
    let stmt = tx.prepare_cached(&sql).await?;
    let row = tx
        .query_one(&stmt, &[&namespace, &name, &text, &micros(now)])
        .await?;
    let outcome = if before.is_some() {
        PutOutcome::Updated
    } else {
        PutOutcome::Created
    };
    Ok((outcome, calendar(&row)?))
}

pub async fn users(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<CalendarUsers> {
    let jobs = tx
        .prepare_cached(
            "SELECT name FROM jobs WHERE namespace = $1 \
             AND spec::jsonb -> 'schedule' ->> 'calendar' = $2 ORDER BY name",
        )
        .await?;
    let calendars = tx
        .prepare_cached(
            "SELECT name FROM calendars WHERE namespace = $1 \
             AND (coalesce(spec::jsonb -> 'include', '[]'::jsonb) ? $2 \
               OR coalesce(spec::jsonb -> 'except', '[]'::jsonb) ? $2) \
             ORDER BY name",
        )
        .await?;
    let names = |rows: Vec<Row>| -> PgResult<Vec<String>> {
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    };
    Ok(CalendarUsers {
        jobs: names(tx.query(&jobs, &[&namespace, &name]).await?)?,
        calendars: names(tx.query(&calendars, &[&namespace, &name]).await?)?,
    })
}

pub async fn delete(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    force: bool,
) -> PgResult<CalendarDeletion> {
    lock(tx, namespace).await?;
    if get(tx, namespace, name).await?.is_none() {
        return Ok(CalendarDeletion::Missing);
    }
    let users = users(tx, namespace, name).await?;
    if !users.is_empty() && !force {
        return Ok(CalendarDeletion::InUse(users));
    }
    let sql =
        format!("DELETE FROM calendars WHERE namespace = $1 AND name = $2 RETURNING {COLUMNS}");
    let stmt = tx.prepare_cached(&sql).await?;
    match tx.query_opt(&stmt, &[&namespace, &name]).await? {
        Some(row) => Ok(CalendarDeletion::Deleted(calendar(&row)?, users)),
        None => Ok(CalendarDeletion::Missing),
    }
}

#[async_trait::async_trait]
impl crate::CalendarStore for PgStore {
    async fn put_calendar(
        &self,
        namespace: &str,
        name: &str,
        spec: &CalendarSpec,
        now: Instant,
        audit: Audit<(PutOutcome, CalendarRecord)>,
    ) -> Result<(PutOutcome, CalendarRecord)> {
        let audit = audit.of_changes();
        transact!(self, write, |tx| {
            let outcome = put(&tx, namespace, name, spec, now).await?;
            // An unchanged definition wrote nothing, so there is nothing to account for.
            super::audit::append_for(&tx, &audit, &outcome).await?;
            if outcome.0 != PutOutcome::Unchanged {
                self.channel
                    .notify(&tx, super::notify::Kind::ScheduleRulesChanged, &[0])
                    .await?;
            }
            outcome
        })
    }

    async fn get_calendar(&self, namespace: &str, name: &str) -> Result<Option<CalendarRecord>> {
        transact!(self, read, |tx| get(&tx, namespace, name).await?)
    }

    async fn list_calendars(&self, namespace: &str) -> Result<Vec<CalendarRecord>> {
        transact!(self, read, |tx| list(&tx, namespace).await?)
    }

    async fn calendar_users(&self, namespace: &str, name: &str) -> Result<CalendarUsers> {
        transact!(self, read, |tx| users(&tx, namespace, name).await?)
    }

    async fn delete_calendar(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        audit: Audit<CalendarDeletion>,
    ) -> Result<CalendarDeletion> {
        transact!(self, write, |tx| {
            let outcome = delete(&tx, namespace, name, force).await?;
            super::audit::append_for(&tx, &audit, &outcome).await?;
            if matches!(outcome, CalendarDeletion::Deleted(..)) {
                self.channel
                    .notify(&tx, super::notify::Kind::ScheduleRulesChanged, &[0])
                    .await?;
            }
            outcome
        })
    }
}

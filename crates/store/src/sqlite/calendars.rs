//! A namespace's calendars (`CalendarStore`) on SQLite.
//!
//! Owns the `calendars` table. Reads `jobs` only to find the jobs whose schedule names a
//! calendar (`schedule.calendar` inside their JSON definition), and never writes them: what a
//! schedule does with a calendar, and resolving one with those it includes or excepts, belong
//! to the core and the server. Audit entries are appended by the caller, in the same
//! transaction (`SqliteStore::write_audited`).

use super::rows::{instant, micros};
use crate::shared::to_json;
use crate::{CalendarDeletion, PutOutcome, Result, StoreError};
use rusqlite::{params, Row, Transaction};
use sked_core::calendar::{
    CalendarRecord, CalendarSpec, CalendarUsers, MAX_CALENDARS_PER_NAMESPACE,
};
use sked_core::namespace::NamespaceRefusal;
use sked_core::Instant;

const COLUMNS: &str = "namespace, name, spec, version, created_at, updated_at";

fn calendar(row: &Row<'_>) -> Result<CalendarRecord> {
    Ok(CalendarRecord {
        namespace: row.get(0)?,
        name: row.get(1)?,
        spec: crate::shared::calendar_spec(&row.get::<_, String>(2)?)?,
        version: row.get(3)?,
        created_at: instant(row.get(4)?)?,
        updated_at: instant(row.get(5)?)?,
    })
}

pub fn get(tx: &Transaction<'_>, namespace: &str, name: &str) -> Result<Option<CalendarRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM calendars WHERE namespace = ?1 AND name = ?2");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![namespace, name])?;
    found.next()?.map(calendar).transpose()
}

pub fn list(tx: &Transaction<'_>, namespace: &str) -> Result<Vec<CalendarRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM calendars WHERE namespace = ?1 ORDER BY name");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![namespace])?;
    let mut calendars = Vec::new();
    while let Some(row) = found.next()? {
        calendars.push(calendar(row)?);
    }
    Ok(calendars)
}

pub fn put(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    spec: &CalendarSpec,
    now: Instant,
) -> Result<(PutOutcome, CalendarRecord)> {
    let before = get(tx, namespace, name)?;
    let text = to_json("a calendar", spec)?;
    let sql = match &before {
        Some(old) if old.spec == *spec => return Ok((PutOutcome::Unchanged, old.clone())),
        Some(_) => format!(
            "UPDATE calendars SET spec = ?3, version = version + 1, updated_at = ?4 \
             WHERE namespace = ?1 AND name = ?2 RETURNING {COLUMNS}"
        ),
        None => {
            let held: i64 = tx.query_row(
                "SELECT count(*) FROM calendars WHERE namespace = ?1",
                params![namespace],
                |r| r.get(0),
            )?;
            if usize::try_from(held).unwrap_or(usize::MAX) >= MAX_CALENDARS_PER_NAMESPACE {
                return Err(StoreError::Refused(NamespaceRefusal::TooManyCalendars {
                    namespace: namespace.to_string(),
                    max: MAX_CALENDARS_PER_NAMESPACE as u64,
                }));
            }
            format!(
                "INSERT INTO calendars (namespace, name, spec, version, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, 1, ?4, ?4) RETURNING {COLUMNS}"
            )
        }
    };
    let record = tx.query_row(&sql, params![namespace, name, text, micros(now)], |row| {
        Ok(calendar(row))
    })??;
    let outcome = if before.is_some() {
        PutOutcome::Updated
    } else {
        PutOutcome::Created
    };
    Ok((outcome, record))
}

pub fn users(tx: &Transaction<'_>, namespace: &str, name: &str) -> Result<CalendarUsers> {
    let names = |sql: &str| -> Result<Vec<String>> {
        let mut stmt = tx.prepare_cached(sql)?;
        let found = stmt.query_map(params![namespace, name], |r| r.get(0))?;
        Ok(found.collect::<rusqlite::Result<_>>()?)
    };
    Ok(CalendarUsers {
        jobs: names(
            "SELECT name FROM jobs WHERE namespace = ?1 \
             AND json_extract(spec, '$.schedule.calendar') = ?2 ORDER BY name",
        )?,
        calendars: names(
            "SELECT c.name FROM calendars c WHERE c.namespace = ?1 \
             AND (EXISTS (SELECT 1 FROM json_each(c.spec, '$.include') WHERE value = ?2) \
               OR EXISTS (SELECT 1 FROM json_each(c.spec, '$.except') WHERE value = ?2)) \
             ORDER BY c.name",
        )?,
    })
}

pub fn delete(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    force: bool,
) -> Result<CalendarDeletion> {
    if get(tx, namespace, name)?.is_none() {
        return Ok(CalendarDeletion::Missing);
    }
    let users = users(tx, namespace, name)?;
    if !users.is_empty() && !force {
        return Ok(CalendarDeletion::InUse(users));
    }
    let sql =
        format!("DELETE FROM calendars WHERE namespace = ?1 AND name = ?2 RETURNING {COLUMNS}");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![namespace, name])?;
    match found.next()?.map(calendar).transpose()? {
        Some(record) => Ok(CalendarDeletion::Deleted(record, users)),
        None => Ok(CalendarDeletion::Missing),
    }
}

#[async_trait::async_trait]
impl crate::CalendarStore for super::SqliteStore {
    async fn put_calendar(
        &self,
        namespace: &str,
        name: &str,
        spec: &CalendarSpec,
        now: Instant,
        audit: crate::Audit<(PutOutcome, CalendarRecord)>,
    ) -> Result<(PutOutcome, CalendarRecord)> {
        let (namespace, name, spec) = (namespace.to_string(), name.to_string(), spec.clone());
        // An unchanged definition wrote nothing, so there is nothing to account for.
        self.write_audited(audit.of_changes(), move |tx| {
            put(tx, &namespace, &name, &spec, now)
        })
        .await
    }

    async fn get_calendar(&self, namespace: &str, name: &str) -> Result<Option<CalendarRecord>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| get(tx, &namespace, &name)).await
    }

    async fn list_calendars(&self, namespace: &str) -> Result<Vec<CalendarRecord>> {
        let namespace = namespace.to_string();
        self.read(move |tx| list(tx, &namespace)).await
    }

    async fn calendar_users(&self, namespace: &str, name: &str) -> Result<CalendarUsers> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| users(tx, &namespace, &name)).await
    }

    async fn delete_calendar(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        audit: crate::Audit<CalendarDeletion>,
    ) -> Result<CalendarDeletion> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| delete(tx, &namespace, &name, force))
            .await
    }
}

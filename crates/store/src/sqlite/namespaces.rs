//! Namespace settings and namespace secrets.
//!
//! Owns the `namespaces` and `secrets` tables. Reads `jobs` only to count a namespace's jobs and
//! find its shell jobs, for the rules of `sked_core::namespace`, which `jobs::put` and
//! [`put`] apply inside their transactions, and to list the namespaces that hold jobs. Secrets
//! arrive sealed; this module never sees a value in clear.

use super::rows::{instant, micros};
use crate::shared::{namespace_spec, shell_jobs, to_json, SHELL_TARGET_PATTERN};
use crate::{Result, SecretName, StoreError};
use rusqlite::{params, OptionalExtension, Row, Transaction};
use sked_core::namespace::{
    admit_job, admit_settings, NamespaceRecord, NamespaceRefusal, NamespaceSpec, SecretRecord,
    MAX_CONFIGURED_NAMESPACES, MAX_SECRETS_PER_NAMESPACE,
};
use sked_core::{Instant, TargetSpec};
use std::collections::BTreeMap;

const NAMESPACE_COLUMNS: &str = "name, spec, created_at, updated_at";

fn namespace(row: &Row<'_>) -> Result<NamespaceRecord> {
    Ok(NamespaceRecord {
        name: row.get(0)?,
        spec: namespace_spec(&row.get::<_, String>(1)?)?,
        created_at: instant(row.get(2)?)?,
        updated_at: instant(row.get(3)?)?,
    })
}

pub fn get(tx: &Transaction<'_>, name: &str) -> Result<Option<NamespaceRecord>> {
    let sql = format!("SELECT {NAMESPACE_COLUMNS} FROM namespaces WHERE name = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![name])?;
    found.next()?.map(namespace).transpose()
}

pub fn list(tx: &Transaction<'_>) -> Result<Vec<NamespaceRecord>> {
    let sql = format!("SELECT {NAMESPACE_COLUMNS} FROM namespaces ORDER BY name");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query([])?;
    let mut namespaces = Vec::new();
    while let Some(row) = found.next()? {
        namespaces.push(namespace(row)?);
    }
    Ok(namespaces)
}

pub fn of_jobs(tx: &Transaction<'_>, limit: u32) -> Result<Vec<String>> {
    let mut stmt = tx.prepare_cached(JOB_NAMESPACES)?;
    let found = stmt.query_map(params![limit], |row| row.get(0))?;
    Ok(found.collect::<rusqlite::Result<_>>()?)
}

/// The distinct namespaces of `jobs`, each found by a seek of the `(namespace, name)` index
/// from the one before (a scan of the index would read every job).
pub const JOB_NAMESPACES: &str = "WITH RECURSIVE found(name) AS ( \
       SELECT MIN(namespace) FROM jobs \
       UNION ALL \
       SELECT (SELECT MIN(namespace) FROM jobs WHERE namespace > found.name) FROM found \
       WHERE found.name IS NOT NULL) \
     SELECT name FROM found WHERE name IS NOT NULL LIMIT ?1";

pub fn put(
    tx: &Transaction<'_>,
    name: &str,
    spec: &NamespaceSpec,
    now: Instant,
) -> Result<(Option<NamespaceRecord>, NamespaceRecord)> {
    let before = get(tx, name)?;
    if before.is_none() {
        let held: i64 = tx.query_row("SELECT count(*) FROM namespaces", [], |r| r.get(0))?;
        if held as u64 >= MAX_CONFIGURED_NAMESPACES {
            return Err(NamespaceRefusal::TooManyNamespaces {
                max: MAX_CONFIGURED_NAMESPACES,
            }
            .into());
        }
    }
    if !spec.allow_shell {
        let mut stmt = tx.prepare_cached(
            "SELECT name, spec FROM jobs WHERE namespace = ?1 AND spec LIKE ?2 ORDER BY name",
        )?;
        let rows = stmt
            .query_map(params![name, SHELL_TARGET_PATTERN], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<Vec<(String, String)>>>()?;
        admit_settings(name, spec, &shell_jobs(rows)?)?;
    }
    let sql = format!(
        "INSERT INTO namespaces (name, spec, created_at, updated_at, notify, notify_late) \
         VALUES (?1, ?2, ?3, ?3, ?4, ?5) \
         ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at, \
         notify = excluded.notify, notify_late = excluded.notify_late \
         RETURNING {NAMESPACE_COLUMNS}"
    );
    let rules = (!spec.notify.is_empty()).then_some(spec.notify.as_slice());
    let (notify, notify_late) = crate::shared::notify_columns(rules)?;
    let after = tx.query_row(
        &sql,
        params![
            name,
            to_json("namespace settings", spec)?,
            micros(now),
            notify,
            notify_late
        ],
        |row| Ok(namespace(row)),
    )??;
    Ok((before, after))
}

pub fn delete(tx: &Transaction<'_>, name: &str) -> Result<Option<NamespaceRecord>> {
    let sql = format!("DELETE FROM namespaces WHERE name = ?1 RETURNING {NAMESPACE_COLUMNS}");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![name])?;
    found.next()?.map(namespace).transpose()
}

/// Refuses a job write that namespace's settings do not allow; `creating` says it adds a job.
pub fn admit(
    tx: &Transaction<'_>,
    namespace: &str,
    target: &TargetSpec,
    creating: bool,
) -> Result<()> {
    let Some(settings) = get(tx, namespace)?.map(|r| r.spec) else {
        return Ok(());
    };
    let held: i64 = match settings.max_jobs {
        Some(_) if creating => tx.query_row(
            "SELECT count(*) FROM jobs WHERE namespace = ?1",
            params![namespace],
            |r| r.get(0),
        )?,
        _ => 0,
    };
    Ok(admit_job(
        namespace,
        &settings,
        target,
        held as u64,
        creating,
    )?)
}

const SECRET_COLUMNS: &str = "namespace, name, created_at, updated_at";

fn secret(row: &Row<'_>) -> Result<SecretRecord> {
    Ok(SecretRecord {
        namespace: row.get(0)?,
        name: row.get(1)?,
        created_at: instant(row.get(2)?)?,
        updated_at: instant(row.get(3)?)?,
    })
}

pub fn put_secret(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    sealed: &str,
    now: Instant,
) -> Result<(bool, SecretRecord)> {
    let exists = tx
        .query_row(
            "SELECT 1 FROM secrets WHERE namespace = ?1 AND name = ?2",
            params![namespace, name],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !exists {
        let held: i64 = tx.query_row(
            "SELECT count(*) FROM secrets WHERE namespace = ?1",
            params![namespace],
            |r| r.get(0),
        )?;
        if held as u64 >= MAX_SECRETS_PER_NAMESPACE {
            return Err(StoreError::Refused(NamespaceRefusal::TooManySecrets {
                namespace: namespace.to_string(),
                max: MAX_SECRETS_PER_NAMESPACE,
            }));
        }
    }
    let sql = format!(
        "INSERT INTO secrets (namespace, name, sealed, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?4) \
         ON CONFLICT (namespace, name) DO UPDATE \
         SET sealed = excluded.sealed, updated_at = excluded.updated_at \
         RETURNING {SECRET_COLUMNS}"
    );
    let record = tx.query_row(&sql, params![namespace, name, sealed, micros(now)], |row| {
        Ok(secret(row))
    })??;
    Ok((!exists, record))
}

pub fn list_secrets(tx: &Transaction<'_>, namespace: &str) -> Result<Vec<SecretRecord>> {
    let sql = format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = ?1 ORDER BY name");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![namespace])?;
    let mut secrets = Vec::new();
    while let Some(row) = found.next()? {
        secrets.push(secret(row)?);
    }
    Ok(secrets)
}

pub fn delete_secret(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
) -> Result<Option<SecretRecord>> {
    let sql = format!(
        "DELETE FROM secrets WHERE namespace = ?1 AND name = ?2 RETURNING {SECRET_COLUMNS}"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![namespace, name])?;
    found.next()?.map(secret).transpose()
}

pub fn sealed(tx: &Transaction<'_>, wanted: &[SecretName]) -> Result<BTreeMap<SecretName, String>> {
    let mut stmt =
        tx.prepare_cached("SELECT sealed FROM secrets WHERE namespace = ?1 AND name = ?2")?;
    let mut found = BTreeMap::new();
    for key in wanted {
        if let Some(value) = stmt
            .query_row(params![key.0, key.1], |r| r.get::<_, String>(0))
            .optional()?
        {
            found.insert(key.clone(), value);
        }
    }
    Ok(found)
}

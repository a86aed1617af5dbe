//! Namespace settings and namespace secrets.
//!
//! Owns the `namespaces` and `secrets` tables. Reads `jobs` only to count a namespace's jobs and
//! find its shell jobs, for the rules of `sked_core::namespace`, which `jobs::put` and [`put`]
//! apply inside their transactions, and to list the namespaces that hold jobs. Secrets arrive
//! sealed; this module never sees a value in clear.
//!
//! A namespace's rules are checked under transaction-level advisory locks on its name
//! ([`lock`]): under READ COMMITTED, row locks alone would let two creates both count one job
//! under the cap, or a shell job commit beside the change that forbids it. A settings change
//! holds the namespace's `Rules` lock exclusively; a job write that could break a rule (a
//! create, a shell target) holds it shared, so job writes do not queue behind each other, only
//! behind a settings change; a create under a job cap also holds `JobCount` exclusively, so
//! creates under a cap count one at a time; a new secret holds `SecretCount` the same way.
//! Advisory locks are outside the row lock order of `mod.rs`: they are taken after the job's
//! row, always in the order `Rules`, then a count, and never held while waiting for a row.

use super::rows::{instant, micros};
use super::{PgResult, Tx};
use crate::shared::{namespace_spec, shell_jobs, to_json, SHELL_TARGET_PATTERN};
use crate::{SecretName, StoreError};
use sked_core::namespace::{
    admit_job, admit_settings, NamespaceRecord, NamespaceRefusal, NamespaceSpec, SecretRecord,
    MAX_CONFIGURED_NAMESPACES, MAX_SECRETS_PER_NAMESPACE,
};
use sked_core::{Instant, TargetSpec};
use std::collections::BTreeMap;
use tokio_postgres::Row;

const NAMESPACE_COLUMNS: &str = "name, spec, created_at, updated_at";

fn namespace(row: &Row) -> PgResult<NamespaceRecord> {
    Ok(NamespaceRecord {
        name: row.try_get(0)?,
        spec: namespace_spec(row.try_get(1)?)?,
        created_at: instant(row.try_get(2)?)?,
        updated_at: instant(row.try_get(3)?)?,
    })
}

/// The advisory locks of one namespace.
#[derive(Clone, Copy)]
enum Lock {
    /// Its settings: exclusive to change them, shared to be judged by them.
    Rules { exclusive: bool },
    /// Its number of jobs, while a create under a cap counts them.
    JobCount,
    /// Its number of secrets, while a new secret counts them.
    SecretCount,
    /// The dependencies between its jobs, while a write checks or changes them.
    Dependencies,
    /// Its latest event's instant, while a new event takes the next one.
    Events,
}

/// Takes namespace `name`'s `kind` lock until the transaction ends.
async fn lock(tx: &Tx<'_>, name: &str, kind: Lock) -> PgResult<()> {
    let (function, key) = match kind {
        Lock::Rules { exclusive: true } => ("pg_advisory_xact_lock", "sked.namespace/"),
        Lock::Rules { exclusive: false } => ("pg_advisory_xact_lock_shared", "sked.namespace/"),
        Lock::JobCount => ("pg_advisory_xact_lock", "sked.namespace-jobs/"),
        Lock::SecretCount => ("pg_advisory_xact_lock", "sked.namespace-secrets/"),
        Lock::Dependencies => ("pg_advisory_xact_lock", "sked.namespace-dependencies/"),
        Lock::Events => ("pg_advisory_xact_lock", "sked.namespace-events/"),
    };
    let sql = format!("SELECT {function}(hashtextextended('{key}' || $1, 0))");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.execute(&stmt, &[&name]).await?;
    Ok(())
}

async fn count(tx: &Tx<'_>, sql: &str, namespace: &str) -> PgResult<u64> {
    let stmt = tx.prepare_cached(sql).await?;
    let held: i64 = tx.query_one(&stmt, &[&namespace]).await?.try_get(0)?;
    Ok(held.max(0) as u64)
}

pub async fn get(tx: &Tx<'_>, name: &str) -> PgResult<Option<NamespaceRecord>> {
    let sql = format!("SELECT {NAMESPACE_COLUMNS} FROM namespaces WHERE name = $1");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&name])
        .await?
        .as_ref()
        .map(namespace)
        .transpose()
}

pub async fn list(tx: &Tx<'_>) -> PgResult<Vec<NamespaceRecord>> {
    let sql = format!("SELECT {NAMESPACE_COLUMNS} FROM namespaces ORDER BY name");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query(&stmt, &[]).await?.iter().map(namespace).collect()
}

/// The distinct namespaces of `jobs`, each found by a seek of the `(namespace, name)` index
/// from the one before (a scan of the index would read every job).
pub async fn of_jobs(tx: &Tx<'_>, limit: u32) -> PgResult<Vec<String>> {
    let stmt = tx
        .prepare_cached(
            "WITH RECURSIVE found(name) AS ( \
               SELECT MIN(namespace) FROM jobs \
               UNION ALL \
               SELECT (SELECT MIN(namespace) FROM jobs WHERE namespace > found.name) \
               FROM found WHERE found.name IS NOT NULL) \
             SELECT name FROM found WHERE name IS NOT NULL LIMIT $1",
        )
        .await?;
    let rows = tx.query(&stmt, &[&i64::from(limit)]).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

pub async fn put(
    tx: &Tx<'_>,
    name: &str,
    spec: &NamespaceSpec,
    now: Instant,
) -> PgResult<(Option<NamespaceRecord>, NamespaceRecord)> {
    lock(tx, name, Lock::Rules { exclusive: true }).await?;
    let before = get(tx, name).await?;
    if before.is_none() {
        let stmt = tx.prepare_cached("SELECT count(*) FROM namespaces").await?;
        let held: i64 = tx.query_one(&stmt, &[]).await?.try_get(0)?;
        if held.max(0) as u64 >= MAX_CONFIGURED_NAMESPACES {
            return Err(StoreError::from(NamespaceRefusal::TooManyNamespaces {
                max: MAX_CONFIGURED_NAMESPACES,
            })
            .into());
        }
    }
    if !spec.allow_shell {
        let stmt = tx
            .prepare_cached(
                "SELECT name, spec FROM jobs WHERE namespace = $1 AND spec LIKE $2 ORDER BY name",
            )
            .await?;
        let rows = tx
            .query(&stmt, &[&name, &SHELL_TARGET_PATTERN])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<PgResult<Vec<(String, String)>>>()?;
        admit_settings(name, spec, &shell_jobs(rows)?).map_err(StoreError::from)?;
    }
    let sql = format!(
        "INSERT INTO namespaces (name, spec, created_at, updated_at, notify, notify_late) \
         VALUES ($1, $2, $3, $3, $4, $5) \
         ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at, \
         notify = excluded.notify, notify_late = excluded.notify_late \
         RETURNING {NAMESPACE_COLUMNS}"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let text = to_json("namespace settings", spec)?;
    let rules = (!spec.notify.is_empty()).then_some(spec.notify.as_slice());
    let (notify, notify_late) = crate::shared::notify_columns(rules)?;
    let row = tx
        .query_one(&stmt, &[&name, &text, &micros(now), &notify, &notify_late])
        .await?;
    Ok((before, namespace(&row)?))
}

pub async fn delete(tx: &Tx<'_>, name: &str) -> PgResult<Option<NamespaceRecord>> {
    let sql = format!("DELETE FROM namespaces WHERE name = $1 RETURNING {NAMESPACE_COLUMNS}");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&name])
        .await?
        .as_ref()
        .map(namespace)
        .transpose()
}

/// Refuses a job write that namespace's settings do not allow; `creating` says it adds a job.
/// Called with the job's row locked.
/// Holds the dependencies between namespace `name`'s jobs still until the transaction ends:
/// two writes cannot close a cycle side by side, nor a job be deleted while a new dependant
/// finds it.
pub async fn lock_dependencies(tx: &Tx<'_>, name: &str) -> PgResult<()> {
    lock(tx, name, Lock::Dependencies).await
}

/// Holds namespace `name`'s event instants until the transaction ends: two new events never
/// take the same one.
pub async fn lock_events(tx: &Tx<'_>, name: &str) -> PgResult<()> {
    lock(tx, name, Lock::Events).await
}

pub async fn admit(
    tx: &Tx<'_>,
    namespace: &str,
    target: &TargetSpec,
    creating: bool,
) -> PgResult<()> {
    // An update of a job without a shell target can break no rule: it takes no lock.
    if !creating && !matches!(target, TargetSpec::Shell(_)) {
        return Ok(());
    }
    lock(tx, namespace, Lock::Rules { exclusive: false }).await?;
    let Some(settings) = get(tx, namespace).await?.map(|r| r.spec) else {
        return Ok(());
    };
    let held = match settings.max_jobs {
        Some(_) if creating => {
            lock(tx, namespace, Lock::JobCount).await?;
            count(
                tx,
                "SELECT count(*) FROM jobs WHERE namespace = $1",
                namespace,
            )
            .await?
        }
        _ => 0,
    };
    admit_job(namespace, &settings, target, held, creating).map_err(StoreError::from)?;
    Ok(())
}

const SECRET_COLUMNS: &str = "namespace, name, created_at, updated_at";

fn secret(row: &Row) -> PgResult<SecretRecord> {
    Ok(SecretRecord {
        namespace: row.try_get(0)?,
        name: row.try_get(1)?,
        created_at: instant(row.try_get(2)?)?,
        updated_at: instant(row.try_get(3)?)?,
    })
}

pub async fn put_secret(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    sealed: &str,
    now: Instant,
) -> PgResult<(bool, SecretRecord)> {
    lock(tx, namespace, Lock::SecretCount).await?;
    let stmt = tx
        .prepare_cached("SELECT 1 FROM secrets WHERE namespace = $1 AND name = $2")
        .await?;
    let exists = tx.query_opt(&stmt, &[&namespace, &name]).await?.is_some();
    if !exists {
        let held = count(
            tx,
            "SELECT count(*) FROM secrets WHERE namespace = $1",
            namespace,
        )
        .await?;
        if held >= MAX_SECRETS_PER_NAMESPACE {
            return Err(StoreError::from(NamespaceRefusal::TooManySecrets {
                namespace: namespace.to_string(),
                max: MAX_SECRETS_PER_NAMESPACE,
            })
            .into());
        }
    }
    let sql = format!(
        "INSERT INTO secrets (namespace, name, sealed, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $4) \
         ON CONFLICT (namespace, name) DO UPDATE \
         SET sealed = excluded.sealed, updated_at = excluded.updated_at \
         RETURNING {SECRET_COLUMNS}"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let row = tx
        .query_one(&stmt, &[&namespace, &name, &sealed, &micros(now)])
        .await?;
    Ok((!exists, secret(&row)?))
}

pub async fn list_secrets(tx: &Tx<'_>, namespace: &str) -> PgResult<Vec<SecretRecord>> {
    let sql = format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE namespace = $1 ORDER BY name");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query(&stmt, &[&namespace])
        .await?
        .iter()
        .map(secret)
        .collect()
}

pub async fn delete_secret(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
) -> PgResult<Option<SecretRecord>> {
    let sql = format!(
        "DELETE FROM secrets WHERE namespace = $1 AND name = $2 RETURNING {SECRET_COLUMNS}"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&namespace, &name])
        .await?
        .as_ref()
        .map(secret)
        .transpose()
}

pub async fn sealed(tx: &Tx<'_>, wanted: &[SecretName]) -> PgResult<BTreeMap<SecretName, String>> {
    let (namespaces, names): (Vec<&str>, Vec<&str>) = wanted
        .iter()
        .map(|(namespace, name)| (namespace.as_str(), name.as_str()))
        .unzip();
    let stmt = tx
        .prepare_cached(
            "SELECT s.namespace, s.name, s.sealed FROM secrets s \
             JOIN unnest($1::text[], $2::text[]) AS w (namespace, name) \
             ON s.namespace = w.namespace AND s.name = w.name",
        )
        .await?;
    let mut found = BTreeMap::new();
    for row in tx.query(&stmt, &[&namespaces, &names]).await? {
        found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
    }
    Ok(found)
}

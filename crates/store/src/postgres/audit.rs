//! The audit trail: entries appended by the server as changes are made (and authentications
//! refused), read newest first, and trimmed oldest first by retention.
//!
//! Owns the `audit` table and nothing else; an entry is never changed once written. What an
//! entry says (the actor, the redacted snapshots) is decided by the server; a change's entries are
//! appended in the change's own transaction (`append_for`). Appends lock
//! nothing another transaction waits for, so they stand outside the lock order of `mod.rs`.

use super::rows::{self, micros, AUDIT_COLUMNS};
use super::{PgResult, Tx};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::to_json;
use crate::{Audit, AuditQuery, Page};
use sked_core::records::{AuditEntry, AuditRecord};
use sked_core::Instant;
use tokio_postgres::types::ToSql;

/// Appends the entries `audit` makes of `outcome`, in the transaction of the change.
pub async fn append_for<T: 'static>(tx: &Tx<'_>, audit: &Audit<T>, outcome: &T) -> PgResult<()> {
    let entries = audit.entries(outcome);
    if entries.is_empty() {
        return Ok(());
    }
    append(tx, &entries).await
}

pub async fn append(tx: &Tx<'_>, entries: &[AuditEntry]) -> PgResult<()> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO audit (at, actor, actor_id, peer, action, namespace, object, before, \
             after) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .await?;
    let snapshot = |value: &Option<serde_json::Value>| {
        value
            .as_ref()
            .map(|v| to_json("an audit snapshot", v))
            .transpose()
    };
    for entry in entries {
        let (before, after) = (snapshot(&entry.before)?, snapshot(&entry.after)?);
        tx.execute(
            &stmt,
            &[
                &micros(entry.at),
                &entry.actor,
                &entry.actor_id,
                &entry.peer,
                &entry.action,
                &entry.namespace,
                &entry.object,
                &before,
                &after,
            ],
        )
        .await?;
    }
    Ok(())
}

pub async fn list(tx: &Tx<'_>, query: &AuditQuery) -> PgResult<Page<AuditRecord>> {
    let limit = page_size(query.limit);
    // Only the filters asked for are written into the statement, so that its plan can use the
    // namespace index when there is one (a `$n IS NULL OR ...` condition would hide it).
    let mut conditions: Vec<String> = Vec::new();
    let mut values: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut bind = |condition: &str, value: Box<dyn ToSql + Sync + Send>| {
        values.push(value);
        conditions.push(condition.replace('?', &format!("${}", values.len())));
    };
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        cursor.micros(raw)?;
        bind("id < ?", Box::new(cursor.id));
    }
    if let Some(visible) = &query.visible {
        // A NULL namespace is in no list: entries without one stay hidden.
        bind("namespace = ANY(?)", Box::new(visible.clone()));
    }
    for (condition, value) in [
        ("namespace = ?", &query.namespace),
        ("object = ?", &query.object),
        ("actor = ?", &query.actor),
    ] {
        if let Some(value) = value {
            bind(condition, Box::new(value.clone()));
        }
    }
    if let Some(since) = query.since {
        bind("at >= ?", Box::new(micros(since)));
    }
    if let Some(until) = query.until {
        bind("at < ?", Box::new(micros(until)));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    values.push(Box::new(i64::from(limit) + 1));
    let sql = format!(
        "SELECT {AUDIT_COLUMNS} FROM audit{filter} ORDER BY id DESC LIMIT ${}",
        values.len()
    );
    let params: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect();
    let stmt = tx.prepare_cached(&sql).await?;
    let items = tx
        .query(&stmt, &params)
        .await?
        .iter()
        .map(rows::audit)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(cursor::page(items, limit, cursor::after_audit))
}

pub async fn delete_before(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let stmt = tx
        .prepare_cached(
            "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < $1 \
             ORDER BY at, id LIMIT $2)",
        )
        .await?;
    Ok(tx
        .execute(&stmt, &[&micros(before), &i64::from(limit)])
        .await?)
}

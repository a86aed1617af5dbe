//! The audit trail: entries appended by the server as changes are made (and authentications
//! refused), read newest first, and trimmed oldest first by retention.
//!
//! Owns the `audit` table and nothing else; an entry is never changed once written. What an
//! entry says (the actor, the redacted snapshots) is decided by the server.

use super::rows::{self, micros, AUDIT_COLUMNS};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::to_json;
use crate::{AuditQuery, Page, Result};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Transaction};
use sked_core::records::{AuditEntry, AuditRecord};
use sked_core::Instant;

pub fn append(tx: &Transaction<'_>, entries: &[AuditEntry]) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO audit (at, actor, actor_id, peer, action, namespace, object, before, after) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for entry in entries {
        let snapshot = |value: &Option<serde_json::Value>| {
            value
                .as_ref()
                .map(|v| to_json("an audit snapshot", v))
                .transpose()
        };
        stmt.execute(params![
            micros(entry.at),
            entry.actor,
            entry.actor_id,
            entry.peer,
            entry.action,
            entry.namespace,
            entry.object,
            snapshot(&entry.before)?,
            snapshot(&entry.after)?,
        ])?;
    }
    Ok(())
}

pub fn list(tx: &Transaction<'_>, query: &AuditQuery) -> Result<Page<AuditRecord>> {
    let limit = page_size(query.limit);
    let (sql, values) = list_statement(query, limit)?;
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params_from_iter(values))?;
    let mut items = Vec::new();
    while let Some(row) = found.next()? {
        items.push(rows::audit(row)?);
    }
    Ok(cursor::page(items, limit, cursor::after_audit))
}

/// The page's statement and its values. Only the filters asked for are written into it, so
/// that SQLite can pick the namespace index when there is one (a `?n IS NULL OR ...`
/// condition would hide it).
fn list_statement(query: &AuditQuery, limit: u32) -> Result<(String, Vec<Value>)> {
    let mut conditions: Vec<&str> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        cursor.micros(raw)?;
        conditions.push("id < ?");
        values.push(cursor.id.into());
    }
    if let Some(visible) = &query.visible {
        // A NULL namespace is in no list: entries without one stay hidden.
        conditions.push("namespace IN (SELECT value FROM json_each(?))");
        values.push(to_json("namespaces", visible)?.into());
    }
    for (condition, value) in [
        ("namespace = ?", &query.namespace),
        ("object = ?", &query.object),
        ("actor = ?", &query.actor),
    ] {
        if let Some(value) = value {
            conditions.push(condition);
            values.push(value.clone().into());
        }
    }
    if let Some(since) = query.since {
        conditions.push("at >= ?");
        values.push(micros(since).into());
    }
    if let Some(until) = query.until {
        conditions.push("at < ?");
        values.push(micros(until).into());
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    values.push((i64::from(limit) + 1).into());
    let sql = format!("SELECT {AUDIT_COLUMNS} FROM audit{filter} ORDER BY id DESC LIMIT ?");
    Ok((sql, values))
}

const DELETE_BEFORE: &str = "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ?1 \
     ORDER BY at, id LIMIT ?2)";

pub fn delete_before(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let deleted = tx
        .prepare_cached(DELETE_BEFORE)?
        .execute(params![micros(before), limit])?;
    Ok(deleted as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(conn: &rusqlite::Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = std::iter::repeat_n(Value::Null, stmt.parameter_count());
        let steps: Vec<String> = stmt
            .query_map(params_from_iter(nulls), |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        steps.join("; ")
    }

    /// A namespace's page reads that namespace's index, newest first, without sorting; the
    /// unfiltered page walks the key backwards; retention reads the oldest through `at`.
    #[test]
    fn listing_and_retention_use_their_indexes() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        let of_namespace = AuditQuery {
            namespace: Some("a".into()),
            cursor: Some("m.10.0".into()),
            ..Default::default()
        };
        let (sql, _) = list_statement(&of_namespace, 10).unwrap();
        let steps = plan(&conn, &sql);
        assert!(steps.contains("INDEX audit_by_namespace"), "{steps}");
        assert!(!steps.contains("TEMP B-TREE"), "{steps}");
        let (sql, _) = list_statement(&AuditQuery::default(), 10).unwrap();
        let steps = plan(&conn, &sql);
        assert!(!steps.contains("TEMP B-TREE"), "{steps}");
        let steps = plan(&conn, DELETE_BEFORE);
        assert!(steps.contains("INDEX audit_by_at"), "{steps}");
    }
}

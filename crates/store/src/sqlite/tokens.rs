//! Tokens: what API callers and workers authenticate with, kept by the hash of their secret
//! (never the secret itself), with the instant each was last used.
//!
//! Owns the `tokens` table and nothing else: revoking a token leaves the workers registered
//! with it and the audit entries naming it as they are. Whether a token is expired, and what
//! its grant allows, is the server's decision (`sked_core::auth`), not the store's.

use super::rows::{self, micros, TOKEN_COLUMNS};
use crate::shared::latest_use;
use crate::{NewToken, Result, StoreError};
use rusqlite::{params, Transaction};
use sked_core::auth::TokenRecord;
use sked_core::Instant;

pub fn create(tx: &Transaction<'_>, token: &NewToken, now: Instant) -> Result<TokenRecord> {
    let grant = &token.grant;
    let (namespaces, labels) = crate::shared::grant_columns(grant)?;
    // A taken name or hash (only ever taken by the same secret) inserts nothing and returns
    // no row, as on PostgreSQL.
    let sql = format!(
        "INSERT INTO tokens (name, role, namespaces, shell, labels, hash, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING \
         RETURNING {TOKEN_COLUMNS}"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![
        token.name,
        grant.role.as_str(),
        namespaces,
        grant.shell,
        labels,
        token.hash,
        micros(now),
        token.expires_at.map(micros),
    ])?;
    match found.next()? {
        Some(row) => rows::token(row),
        None => Err(StoreError::Conflict(format!("token {:?}", token.name))),
    }
}

pub fn by_hash(tx: &Transaction<'_>, hash: &str) -> Result<Option<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![hash])?;
    found.next()?.map(rows::token).transpose()
}

pub fn list(tx: &Transaction<'_>) -> Result<Vec<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY name");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query([])?;
    let mut tokens = Vec::new();
    while let Some(row) = found.next()? {
        tokens.push(rows::token(row)?);
    }
    Ok(tokens)
}

pub fn revoke(tx: &Transaction<'_>, name: &str) -> Result<Option<TokenRecord>> {
    let sql = format!("DELETE FROM tokens WHERE name = ?1 RETURNING {TOKEN_COLUMNS}");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut found = stmt.query(params![name])?;
    found.next()?.map(rows::token).transpose()
}

/// Ends the console sessions of token `id` made at or before `at`; false when there is no
/// such token.
pub fn end_sessions(tx: &Transaction<'_>, id: i64, at: Instant) -> Result<bool> {
    let mut stmt = tx.prepare_cached(
        "UPDATE tokens SET sessions_ended_at = ?2 \
         WHERE id = ?1 AND (sessions_ended_at IS NULL OR sessions_ended_at < ?2)",
    )?;
    stmt.execute(params![id, micros(at)])?;
    let mut known = tx.prepare_cached("SELECT 1 FROM tokens WHERE id = ?1")?;
    Ok(known.exists(params![id])?)
}

pub fn touch(tx: &Transaction<'_>, used: &[(i64, Instant)]) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "UPDATE tokens SET last_used_at = ?2 \
         WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
    )?;
    for (id, at) in latest_use(used) {
        stmt.execute(params![id, micros(at)])?;
    }
    Ok(())
}

//! Tokens: what API callers and workers authenticate with, kept by the hash of their secret
//! (never the secret itself), with the instant each was last used.
//!
//! Owns the `tokens` table and nothing else: revoking a token leaves the workers registered
//! with it and the audit entries naming it as they are. Whether a token is expired, and what
//! its grant allows, is the server's decision (`sked_core::auth`), not the store's.
//!
//! No transaction holds a token's row together with any other table's, so tokens stand outside
//! the lock order of `mod.rs`; among themselves they are locked by ascending id.

use super::rows::{self, micros, TOKEN_COLUMNS};
use super::{PgResult, Tx};
use crate::shared::latest_use;
use crate::{NewToken, StoreError};
use sked_core::auth::TokenRecord;
use sked_core::Instant;

pub async fn create(tx: &Tx<'_>, token: &NewToken, now: Instant) -> PgResult<TokenRecord> {
    let grant = &token.grant;
    let (namespaces, labels) = crate::shared::grant_columns(grant)?;
    // A taken name or hash inserts nothing and returns no row, also when another node's insert
    // commits meanwhile (this one waits for it): two nodes started with one admin token file
    // insert the same token at once, and whichever index PostgreSQL checks first must not
    // decide between a conflict and an error. (A hash is only ever taken by the same secret.)
    let sql = format!(
        "INSERT INTO tokens (name, role, namespaces, shell, labels, hash, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING \
         RETURNING {TOKEN_COLUMNS}"
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let row = tx
        .query_opt(
            &stmt,
            &[
                &token.name,
                &grant.role.as_str(),
                &namespaces,
                &grant.shell,
                &labels,
                &token.hash,
                &micros(now),
                &token.expires_at.map(micros),
            ],
        )
        .await?;
    match row {
        Some(row) => rows::token(&row),
        None => Err(StoreError::Conflict(format!("token {:?}", token.name)).into()),
    }
}

pub async fn by_hash(tx: &Tx<'_>, hash: &str) -> PgResult<Option<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&hash])
        .await?
        .as_ref()
        .map(rows::token)
        .transpose()
}

pub async fn list(tx: &Tx<'_>) -> PgResult<Vec<TokenRecord>> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY name");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query(&stmt, &[])
        .await?
        .iter()
        .map(rows::token)
        .collect()
}

pub async fn revoke(tx: &Tx<'_>, name: &str) -> PgResult<Option<TokenRecord>> {
    let sql = format!("DELETE FROM tokens WHERE name = $1 RETURNING {TOKEN_COLUMNS}");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&name])
        .await?
        .as_ref()
        .map(rows::token)
        .transpose()
}

/// Ends the console sessions of token `id` made at or before `at`; false when there is no
/// such token.
pub async fn end_sessions(tx: &Tx<'_>, id: i64, at: Instant) -> PgResult<bool> {
    let stmt = tx
        .prepare_cached(
            "UPDATE tokens SET sessions_ended_at = GREATEST(coalesce(sessions_ended_at, $2), $2) \
             WHERE id = $1 RETURNING id",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&id, &micros(at)]).await?.is_some())
}

pub async fn touch(tx: &Tx<'_>, used: &[(i64, Instant)]) -> PgResult<()> {
    let stmt = tx
        .prepare_cached(
            "UPDATE tokens SET last_used_at = $2 \
             WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
        )
        .await?;
    // One statement per token, in ascending id order: two nodes touching the same tokens lock
    // them in one order.
    for (id, at) in latest_use(used) {
        tx.execute(&stmt, &[&id, &micros(at)]).await?;
    }
    Ok(())
}

//! Flow control (`FlowStore`, and the keys of a start batch) on SQLite. One writer at a time
//! makes every start batch serial, so reading a key's holders and writing the new ones in the
//! batch's transaction is enough to keep its limit.

use super::rows::micros;
use crate::flow::{
    BatchKeys, FlowClaim, KeyHolder, LimitDeletion, LimitRecord, MAX_HOLDERS_LISTED,
};
use crate::shared::instant;
use crate::{AttemptStart, Result, StoreError};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::flow::{Book, LimitSpec};
use sked_core::Instant;

/// The keys of a start batch: their state before it, and as its admissions leave it.
pub struct BatchGate {
    keys: BatchKeys,
    before: Book,
    pub book: Book,
    /// The concurrency keys the batch's started attempts hold: `[namespace, key, attempt id,
    /// run id, the run's instant, job]`, written together by [`BatchGate::save`].
    holders: Vec<serde_json::Value>,
    /// The latest start of an attempt holding one of the keys and the latest end of one that
    /// held one (`crate::flow::start_instant`).
    floor: Option<i64>,
}

impl BatchGate {
    /// Reads the state of the keys `starts` claim; `None` when no start claims a key. One
    /// statement reads every key of the batch, whatever their number.
    pub fn load(tx: &Transaction<'_>, starts: &[AttemptStart]) -> Result<Option<BatchGate>> {
        let keys = BatchKeys::of(starts.iter().filter_map(|s| s.flow.as_ref()));
        if keys.is_empty() {
            return Ok(None);
        }
        let mut book = Book::default();
        let mut floor = None;
        if !keys.concurrency.is_empty() {
            // The rows of ended attempts stay until a start of their key replaces them
            // (`save`): their ends are part of the floor of this batch's start instant.
            let list = key_list(keys.concurrency.iter())?;
            let mut count = tx.prepare_cached(
                "SELECT h.namespace, h.key, coalesce(sum(a.state = 'running'), 0), \
                 max(CASE WHEN a.state = 'running' THEN h.since ELSE a.finished_at END) \
                 FROM flow_holders h LEFT JOIN attempts a ON a.id = h.attempt_id \
                 WHERE (h.namespace, h.key) IN (SELECT value->>0, value->>1 FROM json_each(?1)) \
                 GROUP BY h.namespace, h.key",
            )?;
            let mut rows = count.query(params![list])?;
            while let Some(row) = rows.next()? {
                book.holding
                    .insert((row.get(0)?, row.get(1)?), row.get::<_, u32>(2)?);
                floor = floor.max(row.get::<_, Option<i64>>(3)?);
            }
        }
        for key in &keys.rate {
            let tat: Option<i64> = tx
                .prepare_cached("SELECT tat FROM flow_rates WHERE namespace = ?1 AND key = ?2")?
                .query_row(params![key.0, key.1], |r| r.get(0))
                .optional()?;
            if let Some(tat) = tat {
                book.tats.insert(key.clone(), tat);
            }
        }
        for limit in &keys.limits {
            if let Some(record) = get(tx, &limit.0, &limit.1)? {
                book.limits.insert(limit.clone(), record.spec);
            }
        }
        Ok(Some(BatchGate {
            keys,
            before: book.clone(),
            book,
            holders: Vec::new(),
            floor,
        }))
    }

    /// The instant the batch's attempts start at (`crate::flow::start_instant`).
    pub fn start_instant(&self, now: Instant) -> Instant {
        crate::flow::start_instant(now, self.floor)
    }

    /// Records that attempt `attempt_id` of run `run_id` holds the concurrency keys of
    /// `claim` (written by [`BatchGate::save`]).
    pub fn hold(&mut self, claim: &FlowClaim, attempt_id: i64, run_id: i64, scheduled_for: i64) {
        for gate in &claim.gates.concurrency {
            self.holders.push(serde_json::json!([
                claim.namespace,
                gate.key,
                attempt_id,
                run_id,
                scheduled_for,
                claim.job
            ]));
        }
    }

    /// Writes the holders of the attempts started at `now`, in place of the rows of their
    /// keys' attempts that ended at or before it, and the rate keys the batch's admissions
    /// moved.
    pub fn save(self, tx: &Transaction<'_>, now: Instant) -> Result<()> {
        if !self.holders.is_empty() {
            let list = serde_json::to_string(&self.holders)
                .map_err(|e| StoreError::Database(e.to_string()))?;
            tx.prepare_cached(
                "DELETE FROM flow_holders WHERE (namespace, key) IN \
                 (SELECT value->>0, value->>1 FROM json_each(?1)) AND NOT EXISTS \
                 (SELECT 1 FROM attempts a WHERE a.id = flow_holders.attempt_id \
                 AND (a.state = 'running' OR a.finished_at > ?2))",
            )?
            .execute(params![list, micros(now)])?;
            tx.prepare_cached(
                "INSERT OR IGNORE INTO flow_holders (namespace, key, attempt_id, run_id, \
                 run_scheduled_for, job, since) SELECT value->>0, value->>1, value->>2, \
                 value->>3, value->>4, value->>5, ?2 FROM json_each(?1)",
            )?
            .execute(params![list, micros(now)])?;
        }
        for (key, tat) in crate::flow::moved_tats(&self.keys, &self.before, &self.book) {
            tx.prepare_cached(
                "INSERT INTO flow_rates (namespace, key, tat) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (namespace, key) DO UPDATE SET tat = excluded.tat",
            )?
            .execute(params![key.0, key.1, tat])?;
        }
        Ok(())
    }
}

/// Keys as a JSON list of `[namespace, key]`, for `json_each`.
fn key_list<'a>(keys: impl Iterator<Item = &'a (String, String)>) -> Result<String> {
    let list: Vec<[&str; 2]> = keys.map(|(n, k)| [n.as_str(), k.as_str()]).collect();
    serde_json::to_string(&list).map_err(|e| StoreError::Database(e.to_string()))
}

fn limit_record(
    namespace: String,
    name: String,
    spec: &str,
    updated_at: i64,
) -> Result<LimitRecord> {
    Ok(LimitRecord {
        namespace,
        name,
        spec: crate::shared::limit_spec(spec)?,
        updated_at: instant(updated_at)?,
    })
}

fn get(tx: &Transaction<'_>, namespace: &str, name: &str) -> Result<Option<LimitRecord>> {
    let row: Option<(String, i64)> = tx
        .prepare_cached(
            "SELECT spec, updated_at FROM flow_limits WHERE namespace = ?1 AND name = ?2",
        )?
        .query_row(params![namespace, name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    row.map(|(spec, at)| limit_record(namespace.into(), name.into(), &spec, at))
        .transpose()
}

fn in_scope(namespaces: Option<&[String]>, namespace: &str) -> bool {
    namespaces.is_none_or(|n| n.iter().any(|x| x == namespace))
}

#[async_trait::async_trait]
impl crate::FlowStore for super::SqliteStore {
    async fn put_limit(
        &self,
        namespace: &str,
        name: &str,
        spec: &LimitSpec,
        now: Instant,
        audit: crate::Audit<bool>,
    ) -> Result<bool> {
        let text = serde_json::to_string(spec).map_err(|e| StoreError::Database(e.to_string()))?;
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| {
            let existed = get(tx, &namespace, &name)?.is_some();
            tx.prepare_cached(
                "INSERT INTO flow_limits (namespace, name, spec, updated_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (namespace, name) \
                 DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at",
            )?
            .execute(params![namespace, name, text, micros(now)])?;
            Ok(!existed)
        })
        .await
    }

    async fn get_limit(&self, namespace: &str, name: &str) -> Result<Option<LimitRecord>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| get(tx, &namespace, &name)).await
    }

    async fn list_limits(&self, namespaces: Option<&[String]>) -> Result<Vec<LimitRecord>> {
        let namespaces = namespaces.map(<[String]>::to_vec);
        self.read(move |tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT namespace, name, spec, updated_at FROM flow_limits \
                 ORDER BY namespace, name",
            )?;
            let mut rows = stmt.query([])?;
            let mut found = Vec::new();
            while let Some(row) = rows.next()? {
                let namespace: String = row.get(0)?;
                if in_scope(namespaces.as_deref(), &namespace) {
                    found.push(limit_record(
                        namespace,
                        row.get(1)?,
                        &row.get::<_, String>(2)?,
                        row.get(3)?,
                    )?);
                }
            }
            Ok(found)
        })
        .await
    }

    async fn delete_limit(
        &self,
        namespace: &str,
        name: &str,
        audit: crate::Audit<LimitDeletion>,
    ) -> Result<LimitDeletion> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| {
            if get(tx, &namespace, &name)?.is_none() {
                return Ok(LimitDeletion::NotFound);
            }
            let mut stmt = tx.prepare_cached("SELECT name, spec FROM jobs WHERE namespace = ?1")?;
            let mut rows = stmt.query(params![namespace])?;
            let mut specs = Vec::new();
            while let Some(row) = rows.next()? {
                specs.push((
                    row.get::<_, String>(0)?,
                    super::rows::spec(&row.get::<_, String>(1)?)?,
                ));
            }
            let users = crate::flow::jobs_using(&name, specs.iter().map(|(n, s)| (n.clone(), s)));
            if !users.is_empty() {
                return Ok(LimitDeletion::InUse(users));
            }
            tx.prepare_cached("DELETE FROM flow_limits WHERE namespace = ?1 AND name = ?2")?
                .execute(params![namespace, name])?;
            Ok(LimitDeletion::Deleted)
        })
        .await
    }

    async fn key_holders(&self, namespaces: Option<&[String]>) -> Result<Vec<KeyHolder>> {
        let namespaces = namespaces.map(<[String]>::to_vec);
        self.read(move |tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT h.namespace, h.key, h.attempt_id, h.run_id, h.job, h.since \
                 FROM flow_holders h JOIN attempts a ON a.id = h.attempt_id \
                 WHERE a.state = 'running' ORDER BY h.namespace, h.key, h.since",
            )?;
            let mut rows = stmt.query([])?;
            let mut found = Vec::new();
            while let Some(row) = rows.next()? {
                let namespace: String = row.get(0)?;
                if !in_scope(namespaces.as_deref(), &namespace) {
                    continue;
                }
                found.push(KeyHolder {
                    namespace,
                    key: row.get(1)?,
                    attempt_id: row.get(2)?,
                    run_id: row.get(3)?,
                    job: row.get(4)?,
                    since: instant(row.get(5)?)?,
                });
                if found.len() >= MAX_HOLDERS_LISTED as usize {
                    break;
                }
            }
            Ok(found)
        })
        .await
    }

    async fn sweep_rate_keys(&self, before: Instant) -> Result<u64> {
        self.write(move |tx| {
            let n = tx
                .prepare_cached("DELETE FROM flow_rates WHERE tat < ?1")?
                .execute(params![micros(before)])?;
            Ok(n as u64)
        })
        .await
    }
}

//! Flow control (`FlowStore`, and the keys of a start batch) on PostgreSQL. Several nodes
//! start runs at once, so a batch first takes a transaction-scoped advisory lock per key, in
//! one sorted order on every node (no two batches wait on each other in a circle), and only
//! then reads the keys' holders: a second node's batch of the same key reads them after the
//! first one's new holders are committed.

use super::rows::micros;
use super::{PgResult, PgStore, Tx, TRIES};
use crate::flow::{
    lock_number, BatchKeys, FlowClaim, KeyHolder, LimitDeletion, LimitRecord, MAX_HOLDERS_LISTED,
};
use crate::shared::instant;
use crate::{observe_write, AttemptStart, Result, StoreError};
use sked_core::flow::{Book, LimitSpec};
use sked_core::Instant;
use tokio_postgres::IsolationLevel;

/// The first key of the advisory locks flow control takes (the second is the key's number);
/// migrations lock under another first key.
const FLOW_LOCK: i32 = 0x666c_6f77; // "flow"

/// The keys of a start batch: their state before it, and as its admissions leave it.
pub struct BatchGate {
    keys: BatchKeys,
    before: Book,
    pub book: Book,
    /// The latest start of an attempt holding one of the keys and the latest end of one that
    /// held one (`crate::flow::start_instant`).
    floor: Option<i64>,
}

impl BatchGate {
    /// Locks the keys `starts` claim and reads their state; `None` when no start claims a key.
    pub async fn load(tx: &Tx<'_>, starts: &[AttemptStart]) -> PgResult<Option<BatchGate>> {
        let keys = BatchKeys::of(starts.iter().filter_map(|s| s.flow.as_ref()));
        if keys.is_empty() {
            return Ok(None);
        }
        let mut locks: Vec<i32> = keys
            .all()
            .into_iter()
            .map(|(namespace, key)| lock_number(namespace, key))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        let stmt = tx
            .prepare_cached(
                "SELECT count(pg_advisory_xact_lock($1, n)) FROM unnest($2::int4[]) AS n",
            )
            .await?;
        tx.query_one(&stmt, &[&FLOW_LOCK, &locks]).await?;
        let mut book = Book::default();
        let mut floor = None;
        if !keys.concurrency.is_empty() {
            let (namespaces, names) = columns(keys.concurrency.iter());
            // An attempt is found by its partition's key too, so only one partition is read.
            // The rows of ended attempts stay until a start of their key replaces them (`save`):
            // their ends are part of the floor of this batch's start instant.
            let count = tx
                .prepare_cached(
                    "SELECT h.namespace, h.key, count(*) FILTER (WHERE a.state = 'running'), \
                     max(CASE WHEN a.state = 'running' THEN h.since ELSE a.finished_at END) \
                     FROM flow_holders h \
                     JOIN unnest($1::text[], $2::text[]) AS k(ns, key) \
                     ON h.namespace = k.ns AND h.key = k.key \
                     LEFT JOIN attempts a ON a.id = h.attempt_id \
                     AND a.run_scheduled_for = h.run_scheduled_for \
                     GROUP BY h.namespace, h.key",
                )
                .await?;
            for row in tx.query(&count, &[&namespaces, &names]).await? {
                let holding: i64 = row.try_get(2)?;
                book.holding.insert(
                    (row.try_get(0)?, row.try_get(1)?),
                    u32::try_from(holding).unwrap_or(u32::MAX),
                );
                floor = floor.max(row.try_get::<_, Option<i64>>(3)?);
            }
        }
        if !keys.rate.is_empty() {
            let (namespaces, names) = columns(keys.rate.iter());
            let read = tx
                .prepare_cached(
                    "SELECT r.namespace, r.key, r.tat FROM flow_rates r \
                     JOIN unnest($1::text[], $2::text[]) AS k(ns, key) \
                     ON r.namespace = k.ns AND r.key = k.key",
                )
                .await?;
            for row in tx.query(&read, &[&namespaces, &names]).await? {
                book.tats
                    .insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
            }
        }
        if !keys.limits.is_empty() {
            let (namespaces, names) = columns(keys.limits.iter());
            let read = tx
                .prepare_cached(
                    "SELECT l.namespace, l.name, l.spec FROM flow_limits l \
                     JOIN unnest($1::text[], $2::text[]) AS k(ns, name) \
                     ON l.namespace = k.ns AND l.name = k.name",
                )
                .await?;
            for row in tx.query(&read, &[&namespaces, &names]).await? {
                let spec = crate::shared::limit_spec(row.try_get(2)?)?;
                book.limits.insert((row.try_get(0)?, row.try_get(1)?), spec);
            }
        }
        Ok(Some(BatchGate {
            keys,
            before: book.clone(),
            book,
            floor,
        }))
    }

    /// The instant the batch's attempts start at (`crate::flow::start_instant`).
    pub fn start_instant(&self, now: Instant) -> Instant {
        crate::flow::start_instant(now, self.floor)
    }

    /// Writes the holders of the started attempts (`(claim, attempt id, run id, the run's
    /// instant)`) and the rate keys the batch moved.
    pub async fn save(
        self,
        tx: &Tx<'_>,
        held: &[(&FlowClaim, i64, i64, i64)],
        now: Instant,
    ) -> PgResult<()> {
        let (mut namespaces, mut names, mut attempts, mut runs, mut instants, mut jobs) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for (claim, attempt_id, run_id, scheduled_for) in held {
            for gate in &claim.gates.concurrency {
                namespaces.push(claim.namespace.as_str());
                names.push(gate.key.as_str());
                attempts.push(*attempt_id);
                runs.push(*run_id);
                instants.push(*scheduled_for);
                jobs.push(claim.job.as_str());
            }
        }
        if !namespaces.is_empty() {
            // The new holders replace the ended holders of their keys whose end is not after
            // their start. One that ended after it (its end committed while this batch ran,
            // each statement seeing the latest commits) stays: its end is the next batch's
            // floor, since the next batch will not count it.
            let sweep = tx
                .prepare_cached(
                    "DELETE FROM flow_holders h USING unnest($1::text[], $2::text[]) AS k(ns, key) \
                     WHERE h.namespace = k.ns AND h.key = k.key AND NOT EXISTS ( \
                         SELECT 1 FROM attempts a WHERE a.id = h.attempt_id \
                         AND a.run_scheduled_for = h.run_scheduled_for \
                         AND (a.state = 'running' OR a.finished_at > $3))",
                )
                .await?;
            tx.execute(&sweep, &[&namespaces, &names, &micros(now)])
                .await?;
            let insert = tx
                .prepare_cached(
                    "INSERT INTO flow_holders (namespace, key, attempt_id, run_id, \
                     run_scheduled_for, job, since) \
                     SELECT ns, key, a, r, s, j, $7 FROM unnest($1::text[], $2::text[], \
                     $3::int8[], $4::int8[], $5::int8[], $6::text[]) AS u(ns, key, a, r, s, j) \
                     ON CONFLICT DO NOTHING",
                )
                .await?;
            tx.execute(
                &insert,
                &[
                    &namespaces,
                    &names,
                    &attempts,
                    &runs,
                    &instants,
                    &jobs,
                    &micros(now),
                ],
            )
            .await?;
        }
        let moved = crate::flow::moved_tats(&self.keys, &self.before, &self.book);
        if !moved.is_empty() {
            let (namespaces, names) = columns(moved.iter().map(|(k, _)| *k));
            let tats: Vec<i64> = moved.iter().map(|(_, t)| *t).collect();
            let upsert = tx
                .prepare_cached(
                    "INSERT INTO flow_rates (namespace, key, tat) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
                     ON CONFLICT (namespace, key) DO UPDATE SET tat = excluded.tat",
                )
                .await?;
            tx.execute(&upsert, &[&namespaces, &names, &tats]).await?;
        }
        Ok(())
    }
}

fn columns<'a>(keys: impl Iterator<Item = &'a (String, String)>) -> (Vec<&'a str>, Vec<&'a str>) {
    keys.map(|(a, b)| (a.as_str(), b.as_str())).unzip()
}

fn limit_record(row: &tokio_postgres::Row) -> PgResult<LimitRecord> {
    Ok(LimitRecord {
        namespace: row.try_get(0)?,
        name: row.try_get(1)?,
        spec: crate::shared::limit_spec(row.try_get(2)?)?,
        updated_at: instant(row.try_get(3)?)?,
    })
}

fn in_scope(namespaces: Option<&[String]>, namespace: &str) -> bool {
    namespaces.is_none_or(|n| n.iter().any(|x| x == namespace))
}

async fn get(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<Option<LimitRecord>> {
    let stmt = tx
        .prepare_cached(
            "SELECT namespace, name, spec, updated_at FROM flow_limits \
             WHERE namespace = $1 AND name = $2",
        )
        .await?;
    tx.query_opt(&stmt, &[&namespace, &name])
        .await?
        .map(|row| limit_record(&row))
        .transpose()
}

#[async_trait::async_trait]
impl crate::FlowStore for PgStore {
    async fn put_limit(
        &self,
        namespace: &str,
        name: &str,
        spec: &LimitSpec,
        now: Instant,
        audit: crate::Audit<bool>,
    ) -> Result<bool> {
        let text = serde_json::to_string(spec).map_err(|e| StoreError::Database(e.to_string()))?;
        transact!(self, write, |tx| {
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO flow_limits (namespace, name, spec, updated_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (namespace, name) \
                     DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at \
                     RETURNING (xmax = 0)",
                )
                .await?;
            let row = tx
                .query_one(&stmt, &[&namespace, &name, &text, &micros(now)])
                .await?;
            let created = row.try_get::<_, bool>(0)?;
            super::audit::append_for(&tx, &audit, &created).await?;
            created
        })
    }

    async fn get_limit(&self, namespace: &str, name: &str) -> Result<Option<LimitRecord>> {
        transact!(self, read, |tx| get(&tx, namespace, name).await?)
    }

    async fn list_limits(&self, namespaces: Option<&[String]>) -> Result<Vec<LimitRecord>> {
        transact!(self, read, |tx| {
            let stmt = tx
                .prepare_cached(
                    "SELECT namespace, name, spec, updated_at FROM flow_limits \
                     ORDER BY namespace, name",
                )
                .await?;
            let mut found = Vec::new();
            for row in tx.query(&stmt, &[]).await? {
                let record = limit_record(&row)?;
                if in_scope(namespaces, &record.namespace) {
                    found.push(record);
                }
            }
            found
        })
    }

    async fn delete_limit(
        &self,
        namespace: &str,
        name: &str,
        audit: crate::Audit<LimitDeletion>,
    ) -> Result<LimitDeletion> {
        transact!(self, write, |tx| {
            let deletion = if get(&tx, namespace, name).await?.is_none() {
                LimitDeletion::NotFound
            } else {
                let stmt = tx
                    .prepare_cached("SELECT name, spec FROM jobs WHERE namespace = $1")
                    .await?;
                let mut specs = Vec::new();
                for row in tx.query(&stmt, &[&namespace]).await? {
                    specs.push((
                        row.try_get::<_, String>(0)?,
                        super::rows::spec(row.try_get(1)?)?,
                    ));
                }
                let users =
                    crate::flow::jobs_using(name, specs.iter().map(|(n, s)| (n.clone(), s)));
                if users.is_empty() {
                    let stmt = tx
                        .prepare_cached(
                            "DELETE FROM flow_limits WHERE namespace = $1 AND name = $2",
                        )
                        .await?;
                    tx.execute(&stmt, &[&namespace, &name]).await?;
                    LimitDeletion::Deleted
                } else {
                    LimitDeletion::InUse(users)
                }
            };
            super::audit::append_for(&tx, &audit, &deletion).await?;
            deletion
        })
    }

    async fn key_holders(&self, namespaces: Option<&[String]>) -> Result<Vec<KeyHolder>> {
        transact!(self, read, |tx| {
            let stmt = tx
                .prepare_cached(
                    "SELECT h.namespace, h.key, h.attempt_id, h.run_id, h.job, h.since \
                     FROM flow_holders h JOIN attempts a ON a.id = h.attempt_id \
                     AND a.run_scheduled_for = h.run_scheduled_for \
                     WHERE a.state = 'running' AND ($1::text[] IS NULL OR h.namespace = ANY($1)) \
                     ORDER BY h.namespace, h.key, h.since LIMIT $2",
                )
                .await?;
            let scope: Option<Vec<&str>> =
                namespaces.map(|n| n.iter().map(String::as_str).collect());
            let mut found = Vec::new();
            for row in tx
                .query(&stmt, &[&scope, &i64::from(MAX_HOLDERS_LISTED)])
                .await?
            {
                found.push(KeyHolder {
                    namespace: row.try_get(0)?,
                    key: row.try_get(1)?,
                    attempt_id: row.try_get(2)?,
                    run_id: row.try_get(3)?,
                    job: row.try_get(4)?,
                    since: instant(row.try_get(5)?)?,
                });
            }
            found
        })
    }

    async fn sweep_rate_keys(&self, before: Instant) -> Result<u64> {
        transact!(self, write, |tx| {
            let stmt = tx
                .prepare_cached("DELETE FROM flow_rates WHERE tat < $1")
                .await?;
            tx.execute(&stmt, &[&micros(before)]).await?
        })
    }
}

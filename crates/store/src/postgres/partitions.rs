//! The time partitions of `runs`, `attempts` and `output`: creating them ahead of the clock
//! and dropping those whose runs have all expired, so that retention removes old runs without
//! deleting them row by row (and without the dead rows and index growth that leaves).
//!
//! A partition covers the runs whose instant is in `[starts, ends)`, with the attempts and
//! output of those runs beside them (`runs_<name>`, `attempts_<name>`, `output_<name>`), and is
//! listed in `run_partitions`. Two more partitions of each table are not time partitions: the
//! legacy one (what the tables held before version 13, every instant below its `ends`) and the
//! default one, which takes any instant no time partition covers (runs recorded before the
//! first partition was made, instants backfilled into the span of a dropped one). Retention
//! deletes from those two row by row, as it does from a time partition it cannot drop yet.
//!
//! Creating or dropping a partition locks the three parent tables for a moment (a partition of
//! a table that has a default one cannot be attached or detached concurrently). The lock is
//! asked for on the parents alone ([`lock_parents`]), so a vacuum of a partition does not hold
//! it up; each try gives up after [`LOCK_WAIT`] rather than hold the hot path up behind a long
//! reader, and after [`LOCK_TRIES`] the next pass tries again.
//!
//! A partition starts empty, and PostgreSQL plans statements on it by what it knew at its last
//! ANALYZE; autovacuum gets to a partition filling at thousands of runs a second too late, and
//! plans made for an empty table (a scan of the whole partition for one run) then bring a busy
//! node down within minutes. So [`refresh_statistics`] analyzes a time partition each time
//! it has changed as much as it held at its last ANALYZE.
//!
//! This module decides nothing about when runs expire: the caller gives the instant.

use super::{PgResult, Tx};
use crate::shared::micros;
use crate::{Instant, StoreError};
use chrono::{DateTime, Utc};
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// How long one try at the parents' lock waits. The hot path queues behind the waiting lock,
/// so this is what a node may stall for; shorter waits never got the lock at 5,000 runs a
/// second, whose batches hold theirs for hundreds of milliseconds.
const LOCK_WAIT: &str = "1s";
/// Tries at the parents' lock in one pass, [`LOCK_PAUSE`] apart.
const LOCK_TRIES: u32 = 3;
const LOCK_PAUSE: Duration = Duration::from_secs(2);
/// How long, once the parents are held, creating or dropping waits for the partitions it
/// touches: only a vacuum or ANALYZE can hold those then, and PostgreSQL cancels an automatic
/// one that blocks a lock after `deadlock_timeout` (1 s by default).
const PARTITION_LOCK_WAIT: &str = "5s";
/// A new partition starts at least this far ahead of the clock, so no run recorded for an
/// instant just before it (by a node whose clock is a little ahead) sits in the default
/// partition across its bounds, which would make creating it fail.
const LEAD: i64 = 60 * 1_000_000;
/// The three tables partitioned alike, in the store's lock order, with the keys each of their
/// partitions has of its own. A partitioned table's keys must hold its partition key, and
/// these do not: they hold within a partition, and so everywhere, since a run's attempts and
/// output sit in its partition and ids come from one sequence per table. Kept per partition
/// rather than with the instant added, so a lookup by id is planned as one row per partition.
const LOCAL_KEYS: [(&str, &str); 3] = [
    ("runs", "PRIMARY KEY (id)"),
    ("attempts", "PRIMARY KEY (id), ADD UNIQUE (run_id, number)"),
    ("output", "PRIMARY KEY (attempt_id, \"offset\")"),
];

/// A time partition is analyzed again once its rows changed since its last ANALYZE (inserted,
/// updated or deleted) number as many as it then held, and this many more: its statistics are
/// never far from its size, and a partition filling at a steady rate is analyzed a number of
/// times that grows only with the logarithm of its size.
const CHANGES_BEFORE_ANALYZE: i64 = 1000;

/// One row of `run_partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub name: String,
    /// None for the legacy partition, which holds every instant below `ends`.
    pub starts: Option<i64>,
    pub ends: i64,
}

/// The spans to create so that instants up to `until` have a partition: from where the last
/// partition ends, but not before `not_before`, to the next multiple of `width` since the
/// epoch, then a whole `width` each. A first piece shorter than half a width is joined to the
/// next. All in microseconds.
pub fn spans_to_create(last_end: i64, not_before: i64, until: i64, width: i64) -> Vec<(i64, i64)> {
    let width = width.max(1);
    let mut start = last_end.max(not_before);
    let mut spans = Vec::new();
    while start < until {
        let mut end = (start.div_euclid(width) + 1).saturating_mul(width);
        if end - start < width / 2 {
            end = end.saturating_add(width);
        }
        spans.push((start, end));
        start = end;
    }
    spans
}

/// The instants whose runs sit in time partitions that are still within retention (`before`
/// is the retention's cutoff): `[lowest start, highest end)` over the time partitions ending
/// after it, or None if there are none. Retention's row deletes leave these alone; the
/// partitions go whole once they have expired.
pub fn live_instants(spans: &[Span], before: i64) -> Option<(i64, i64)> {
    let live = spans.iter().filter(|s| s.ends > before);
    let starts = live.clone().filter_map(|s| s.starts).min()?;
    let ends = live.map(|s| s.ends).max()?;
    Some((starts, ends))
}

/// A partition's name: where it starts, in UTC, to the second.
fn name_of(starts: i64) -> Result<String, StoreError> {
    DateTime::<Utc>::from_timestamp_micros(starts)
        .map(|t| t.format("%Y%m%d_%H%M%S").to_string())
        .ok_or_else(|| StoreError::Database(format!("instant {starts} is out of range")))
}

pub async fn spans(tx: &Tx<'_>) -> PgResult<Vec<Span>> {
    let stmt = tx
        .prepare_cached("SELECT name, starts, ends FROM run_partitions ORDER BY ends")
        .await?;
    let mut spans = Vec::new();
    for row in tx.query(&stmt, &[]).await? {
        spans.push(Span {
            name: row.try_get(0)?,
            starts: row.try_get(1)?,
            ends: row.try_get(2)?,
        });
    }
    Ok(spans)
}

/// Creates the partitions instants up to `now + 2 × width` need, starting at least [`LEAD`]
/// ahead of the clock, under a transaction-wide advisory lock so that two nodes never create
/// the same one. Returns how many were created.
pub async fn prepare(tx: &Tx<'_>, now: Instant, width: Duration) -> PgResult<u32> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('sked.run_partitions'))",
        &[],
    )
    .await?;
    let last_end = spans(tx).await?.last().map_or(i64::MIN, |s| s.ends);
    let width = i64::try_from(width.as_micros()).unwrap_or(i64::MAX);
    let (now, until) = (
        micros(now),
        micros(now).saturating_add(width.saturating_mul(2)),
    );
    // A run the default partition holds in the span of a new partition (recorded by a node
    // whose clock ran far ahead) would make creating it fail: the partitions start after it.
    let stmt = tx
        .prepare_cached(
            "SELECT max(scheduled_for) FROM runs_default \
             WHERE scheduled_for >= $1 AND scheduled_for < $2",
        )
        .await?;
    let mut not_before = now.saturating_add(LEAD);
    let planned = loop {
        let planned = spans_to_create(last_end, not_before, until, width);
        let (Some(first), Some(last)) = (planned.first(), planned.last()) else {
            return Ok(0);
        };
        let occupied: Option<i64> = tx
            .query_one(&stmt, &[&first.0, &last.1])
            .await?
            .try_get(0)?;
        match occupied {
            Some(instant) => not_before = instant.saturating_add(1),
            None => break planned,
        }
    };
    lock_parents(tx).await?;
    for (starts, ends) in &planned {
        let name = name_of(*starts)?;
        for (table, keys) in LOCAL_KEYS {
            tx.batch_execute(&format!(
                "CREATE TABLE {table}_{name} PARTITION OF {table} \
                 FOR VALUES FROM ({starts}) TO ({ends}); \
                 ALTER TABLE {table}_{name} ADD {keys}"
            ))
            .await?;
        }
        tx.execute(
            "INSERT INTO run_partitions (name, starts, ends) VALUES ($1, $2, $3)",
            &[&name, starts, ends],
        )
        .await?;
    }
    Ok(planned.len() as u32)
}

/// Analyzes each table of a time partition that has changed as much as it held at its last
/// ANALYZE (see [`CHANGES_BEFORE_ANALYZE`]); returns how many it analyzed. Under a
/// transaction-wide advisory lock taken only if free: another node at it is doing the same.
pub async fn refresh_statistics(tx: &Tx<'_>) -> PgResult<u32> {
    let free: bool = tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtext('sked.run_partitions.statistics'))",
            &[],
        )
        .await?
        .try_get(0)?;
    if !free {
        return Ok(0);
    }
    let tables: Vec<&str> = LOCAL_KEYS.iter().map(|(table, _)| *table).collect();
    // `to_regclass` finds each table on the search path the store uses; the statistics views
    // count changes since the last ANALYZE by anyone, autovacuum included.
    let stale = tx
        .query(
            "SELECT quote_ident(c.relname) FROM run_partitions p \
             CROSS JOIN unnest($1::text[]) AS t(name) \
             JOIN pg_class c ON c.oid = to_regclass(t.name || '_' || p.name) \
             JOIN pg_stat_user_tables s ON s.relid = c.oid \
             WHERE p.starts IS NOT NULL \
               AND s.n_mod_since_analyze >= greatest(c.reltuples, 0)::bigint + $2",
            &[&tables, &CHANGES_BEFORE_ANALYZE],
        )
        .await?;
    for row in &stale {
        let table: String = row.try_get(0)?;
        tx.batch_execute(&format!("ANALYZE {table}")).await?;
    }
    Ok(stale.len() as u32)
}

/// Locks `runs`, `attempts` and `output` (in the store's lock order, without their
/// partitions) for creating or dropping a partition: up to [`LOCK_TRIES`] tries of
/// [`LOCK_WAIT`] each, [`LOCK_PAUSE`] apart, each undone by a savepoint when it times out.
/// Every statement of the hot path names a parent, so holding them is enough to keep it out.
async fn lock_parents(tx: &Tx<'_>) -> PgResult<()> {
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_WAIT}'"))
        .await?;
    let mut tries = 0;
    loop {
        tries += 1;
        tx.batch_execute("SAVEPOINT lock_parents").await?;
        match tx
            .batch_execute(
                "LOCK TABLE ONLY runs, ONLY attempts, ONLY output IN ACCESS EXCLUSIVE MODE",
            )
            .await
        {
            Ok(()) => break,
            Err(e) if tries < LOCK_TRIES && e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT lock_parents")
                    .await?;
                tokio::time::sleep(LOCK_PAUSE).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    tx.batch_execute(&format!(
        "RELEASE SAVEPOINT lock_parents; SET LOCAL lock_timeout = '{PARTITION_LOCK_WAIT}'"
    ))
    .await?;
    Ok(())
}

/// Whether the partition's runs are not all finished before `before`: some still active, or
/// some ended since.
async fn holds_kept_runs(tx: &Tx<'_>, name: &str, before: i64) -> PgResult<bool> {
    // Through the partial indexes `runs_active` and `runs_finished`: a finished run has its
    // `finished_at`, an active one has not.
    let row = tx
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM runs_{name} \
                     WHERE state IN ('waiting', 'queued', 'running')) \
                 OR EXISTS (SELECT 1 FROM runs_{name} WHERE finished_at >= $1)"
            ),
            &[&before],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The partitions ending at or before `before` whose runs have all finished before it; each is
/// checked again and dropped in its own transaction by [`drop_one`].
pub async fn droppable(tx: &Tx<'_>, before: Instant) -> PgResult<Vec<(Span, u64)>> {
    let before = micros(before);
    let mut found = Vec::new();
    for span in spans(tx).await? {
        if span.ends > before || holds_kept_runs(tx, &span.name, before).await? {
            continue;
        }
        let row = tx
            .query_one(&format!("SELECT count(*) FROM runs_{}", span.name), &[])
            .await?;
        let runs: i64 = row.try_get(0)?;
        found.push((span, u64::try_from(runs).unwrap_or(0)));
    }
    Ok(found)
}

/// Drops one partition of each table, if its runs have still all finished before `before`:
/// the parents are locked first (in the store's lock order), so no run can be recorded into it
/// between that check and the drop. Says whether it went.
pub async fn drop_one(tx: &Tx<'_>, span: &Span, before: Instant) -> PgResult<bool> {
    lock_parents(tx).await?;
    if holds_kept_runs(tx, &span.name, micros(before)).await? {
        return Ok(false);
    }
    let name = &span.name;
    tx.batch_execute(&format!(
        "DROP TABLE output_{name}, attempts_{name}, runs_{name}"
    ))
    .await?;
    tx.execute("DELETE FROM run_partitions WHERE name = $1", &[name])
        .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60 * 1_000_000;

    #[test]
    fn partitions_are_made_ahead_of_the_clock_on_multiples_of_the_width() {
        let width = 60 * MINUTE;
        let now = 1000 * width + 10 * MINUTE;
        let until = now + 2 * width;
        // Nothing yet: from just ahead of the clock to the next boundary, then whole widths,
        // until two widths ahead.
        let spans = spans_to_create(i64::MIN, now + LEAD, until, width);
        assert_eq!(
            spans,
            vec![
                (now + LEAD, 1001 * width),
                (1001 * width, 1002 * width),
                (1002 * width, 1003 * width),
            ]
        );
        // Contiguous with the last partition while it ends ahead of the clock.
        assert_eq!(
            spans_to_create(1002 * width, now + LEAD, until, width),
            vec![(1002 * width, 1003 * width)]
        );
        assert!(spans_to_create(1003 * width, now + LEAD, until, width).is_empty());
        // A last partition that ended behind the clock leaves the gap to the default one, and
        // so does a run the default partition holds ahead of the last partition.
        assert_eq!(
            spans_to_create(990 * width, now + LEAD, until, width)[0],
            (now + LEAD, 1001 * width)
        );
        assert_eq!(
            spans_to_create(1001 * width, 1001 * width + 5 * MINUTE, until, width)[0],
            (1001 * width + 5 * MINUTE, 1002 * width)
        );
    }

    #[test]
    fn a_sliver_before_the_first_boundary_is_joined_to_the_next_partition() {
        let width = 60 * MINUTE;
        let now = 1000 * width + 50 * MINUTE;
        let spans = spans_to_create(i64::MIN, now + LEAD, now + 2 * width, width);
        assert_eq!(spans[0], (now + LEAD, 1002 * width));
        for pair in spans.windows(2) {
            assert_eq!(pair[0].1, pair[1].0, "no gaps: {spans:?}");
        }
    }

    #[test]
    fn the_live_instants_are_those_of_time_partitions_not_yet_expired() {
        let span = |starts: Option<i64>, ends: i64| Span {
            name: String::new(),
            starts,
            ends,
        };
        let spans = [
            span(None, 100),
            span(Some(100), 200),
            span(Some(200), 300),
            span(Some(300), 400),
        ];
        // The legacy partition is never live: it is trimmed row by row.
        assert_eq!(live_instants(&spans, 50), Some((100, 400)));
        assert_eq!(live_instants(&spans, 200), Some((200, 400)));
        assert_eq!(live_instants(&spans, 399), Some((300, 400)));
        assert_eq!(live_instants(&spans, 400), None);
        assert_eq!(live_instants(&spans[..1], 0), None);
    }
}

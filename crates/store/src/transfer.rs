//! Moving a whole store to the other kind: the embedded SQLite file to PostgreSQL when a
//! deployment outgrows one node, and back. `sked store migrate --from sqlite:DIR --to
//! postgres://…` calls [`migrate`].
//!
//! Both ends are first brought to this version's schema (as starting sked on them would), so
//! their tables and columns are the same; every table that holds what sked knows — jobs and
//! their versions, runs, attempts and output, events, tokens, namespaces and sealed secrets,
//! the audit trail, notifications, workers — is read in one snapshot of the source and written
//! in one transaction of the target, which must hold nothing yet: a copy that fails leaves the
//! target as empty as it was. Ids are kept, so run ids, audit ids and cursors mean the same on
//! both. What only a running cluster has (node membership, leases) is not copied: the nodes
//! that start on the target make it anew.
//!
//! Owns no rule about what the rows mean; it must not be used while sked runs on the source.

use crate::{Result, StoreError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};

/// The tables copied, in an order that meets every foreign key.
pub const TABLES: &[&str] = &[
    "namespaces",
    "secrets",
    "tokens",
    "workers",
    "jobs",
    "job_versions",
    "job_dependencies",
    "event_subscriptions",
    "runs",
    "attempts",
    "output",
    "events",
    "audit",
    "notifications",
    "calendars",
    "flow_limits",
    "flow_rates",
    "flow_holders",
    "flow_dedup",
    "flow_debounce",
];

/// Tables whose `id` PostgreSQL numbers from a sequence, moved past the copied ids.
const NUMBERED: &[&str] = &[
    "tokens",
    "jobs",
    "runs",
    "attempts",
    "events",
    "audit",
    "notifications",
];

/// The one column PostgreSQL has that SQLite has not: `attempts` and `output` are partitioned
/// by their run's instant, which SQLite does not keep beside them. A copy into PostgreSQL
/// stages those tables' rows and fills the column in from the run of each: each entry joins
/// the staged rows (`s`) to rows copied before them (`r`) and names the instant there.
const PARTITION_KEY: &str = "run_scheduled_for";
const PARTITIONED: &[(&str, &str, &str)] = &[
    (
        "attempts",
        "JOIN runs r ON r.id = s.run_id",
        "r.scheduled_for",
    ),
    (
        "output",
        "JOIN attempts r ON r.id = s.attempt_id",
        "r.run_scheduled_for",
    ),
];

/// Rows sent from reader to writer at once.
const BATCH: usize = 1000;

/// One end of a migration.
#[derive(Clone)]
pub enum Location {
    /// The embedded store's file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (it may hold a password, so it is never shown).
    Postgres(String),
}

impl Location {
    /// `sqlite:DIR` (a data directory, whose `sked.db` is the store) or `sqlite:FILE.db`, and
    /// `postgres://…` or `postgresql://…`.
    pub fn parse(text: &str) -> Result<Location> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::Open(
                    "sqlite: needs the data directory, e.g. sqlite:./sked-data".to_string(),
                ));
            }
            let path = Path::new(path);
            let file = if path.extension().is_some_and(|e| e == "db") {
                path.to_path_buf()
            } else {
                path.join("sked.db")
            };
            return Ok(Location::Sqlite(file));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Location::Postgres(text.to_string()));
        }
        Err(StoreError::Open(
            "a store is sqlite:DIR (the embedded store's data directory) or postgres://… \
             (a PostgreSQL connection string)"
                .to_string(),
        ))
    }

    /// What to call it in messages: the file, or the database's host, port and name.
    pub fn describe(&self) -> String {
        match self {
            Location::Sqlite(path) => format!("sqlite:{}", path.display()),
            Location::Postgres(url) => match crate::postgres::connection::DatabaseUrl::parse(url) {
                Ok(url) => url.describe(),
                Err(_) => "a PostgreSQL database".to_string(),
            },
        }
    }
}

/// How far the copy is: `table` has `done` of its `total` rows written.
pub type Progress = Arc<dyn Fn(&'static str, u64, u64) + Send + Sync>;

/// One table's rows copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub table: &'static str,
    pub rows: u64,
}

/// A column's value on its way between the two databases. PostgreSQL's booleans travel as
/// SQLite's 0 and 1.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// What a reader sends: rows of table `TABLES[i]`.
type Batch = (usize, Vec<Vec<Cell>>);

/// Copies every table of `from` into `to`, which must hold nothing yet.
pub async fn migrate(from: &Location, to: &Location, progress: Progress) -> Result<Vec<Copied>> {
    let (sqlite, postgres, into_postgres) = match (from, to) {
        (Location::Sqlite(file), Location::Postgres(url)) => (file, url, true),
        (Location::Postgres(url), Location::Sqlite(file)) => (file, url, false),
        _ => {
            return Err(StoreError::Open(
                "a migration goes from SQLite to PostgreSQL or back; to copy a SQLite store, \
                 use sked store backup"
                    .to_string(),
            ))
        }
    };
    if into_postgres && !sqlite.exists() {
        return Err(StoreError::Open(format!(
            "{} does not exist",
            sqlite.display()
        )));
    }
    // Both ends at this version's schema, as a start of sked on them would leave them.
    drop(crate::SqliteStore::open(sqlite)?);
    drop(crate::PgStore::connect(postgres).await?);
    let columns = sqlite_columns(sqlite)?;
    let pg = crate::postgres::client(postgres).await?;
    let types = pg_types(&pg, &columns).await?;
    let target = to.describe();
    let totals = if into_postgres {
        sqlite_counts(sqlite)?
    } else {
        pg_counts(&pg).await?
    };
    let held = if into_postgres {
        pg_counts(&pg).await?
    } else {
        sqlite_counts(sqlite)?
    };
    if let Some((table, rows)) = TABLES.iter().zip(&held).find(|(_, n)| **n > 0) {
        return Err(StoreError::Open(format!(
            "{target} is not empty ({table} has {rows} rows): migrate into a store that holds \
             nothing yet"
        )));
    }
    let (send, receive) = mpsc::channel::<Batch>(4);
    let copied = if into_postgres {
        let reader = read_sqlite(sqlite.clone(), columns.clone(), send);
        let writer = write_postgres(pg, &columns, &types, receive, &totals, progress);
        let (read, written) = tokio::join!(reader, writer);
        read?;
        written?
    } else {
        let reader = read_postgres(postgres, &columns, &types, send);
        let writer = write_sqlite(sqlite.clone(), columns.clone(), receive, totals, progress);
        let (read, written) = tokio::join!(reader, writer);
        read?;
        written?
    };
    Ok(copied)
}

fn sqlite_connection(file: &Path, flags: rusqlite::OpenFlags) -> Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_with_flags(file, flags)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

/// Each table's columns, in SQLite's order (PostgreSQL's are the same, by the schema's rule).
fn sqlite_columns(file: &Path) -> Result<Vec<Vec<String>>> {
    let conn = sqlite_connection(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    TABLES
        .iter()
        .map(|table| {
            let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
            let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
            Ok(names.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .collect()
}

fn sqlite_counts(file: &Path) -> Result<Vec<u64>> {
    let conn = sqlite_connection(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    TABLES
        .iter()
        .map(|table| {
            let n: i64 =
                conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
            Ok(n.max(0) as u64)
        })
        .collect()
}

async fn pg_counts(pg: &tokio_postgres::Client) -> Result<Vec<u64>> {
    let mut counts = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let n: i64 = pg
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .try_get(0)?;
        counts.push(n.max(0) as u64);
    }
    Ok(counts)
}

/// Each column's PostgreSQL type, in SQLite's column order; an error when the two schemas do
/// not name the same columns.
async fn pg_types(pg: &tokio_postgres::Client, columns: &[Vec<String>]) -> Result<Vec<Vec<Type>>> {
    let mut types = Vec::with_capacity(TABLES.len());
    for (table, names) in TABLES.iter().zip(columns) {
        let rows = pg
            .query(
                "SELECT a.attname::text, a.atttypid FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
                 AND a.attgenerated = ''",
                &[table],
            )
            .await?;
        let mut by_name = std::collections::HashMap::new();
        let partitioned = PARTITIONED.iter().any(|(t, _, _)| t == table);
        for row in rows {
            let name: String = row.try_get(0)?;
            if partitioned && name == PARTITION_KEY {
                continue;
            }
            let oid: u32 = row.try_get(1)?;
            by_name.insert(name, Type::from_oid(oid).unwrap_or(Type::TEXT));
        }
        if by_name.len() != names.len() {
            return Err(mismatch(table));
        }
        let typed = names
            .iter()
            .map(|n| by_name.get(n).cloned().ok_or_else(|| mismatch(table)))
            .collect::<Result<Vec<_>>>()?;
        types.push(typed);
    }
    Ok(types)
}

fn mismatch(table: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "table {table} has other columns in SQLite than in PostgreSQL: both ends should be at \
         this version's schema"
    ))
}

fn column_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a table's rows are copied to: the table itself, or for a partitioned one a temporary
/// table like it without the partition key, which [`finish_table`] moves on.
async fn staging(tx: &tokio_postgres::Transaction<'_>, table: &str) -> Result<String> {
    if !PARTITIONED.iter().any(|(t, _, _)| *t == table) {
        return Ok(table.to_string());
    }
    let staged = format!("staged_{table}");
    tx.batch_execute(&format!(
        "CREATE TEMPORARY TABLE {staged} (LIKE {table}) ON COMMIT DROP; \
         ALTER TABLE {staged} DROP COLUMN {PARTITION_KEY}"
    ))
    .await?;
    Ok(staged)
}

/// Ends the copy of `table`; a partitioned table's staged rows go into it with their run's
/// instant, every one of them (a row whose run was not copied is an error, not a loss).
async fn finish_table(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
    names: &[String],
    mut writer: std::pin::Pin<Box<tokio_postgres::binary_copy::BinaryCopyInWriter>>,
) -> Result<()> {
    let staged_rows = writer.as_mut().finish().await?;
    let Some((_, join, instant)) = PARTITIONED.iter().find(|(t, _, _)| *t == table) else {
        return Ok(());
    };
    let list = column_list(names);
    let from_staged = names
        .iter()
        .map(|n| format!("s.\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let moved = tx
        .execute(
            &format!(
                "INSERT INTO {table} ({list}, {PARTITION_KEY}) \
                 SELECT {from_staged}, {instant} FROM staged_{table} s {join}"
            ),
            &[],
        )
        .await?;
    if moved != staged_rows {
        return Err(StoreError::Corrupt(format!(
            "{} of the {staged_rows} rows of {table} belong to nothing copied",
            staged_rows - moved.min(staged_rows)
        )));
    }
    Ok(())
}

/// Reads every table in one snapshot of the SQLite file, on a thread of its own.
async fn read_sqlite(
    file: PathBuf,
    columns: Vec<Vec<String>>,
    send: mpsc::Sender<Batch>,
) -> Result<()> {
    let read = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut conn = sqlite_connection(&file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let tx = conn.transaction()?;
        for (i, (table, names)) in TABLES.iter().zip(&columns).enumerate() {
            let mut stmt = tx
                .prepare(&format!(
                    "SELECT {} FROM {table} ORDER BY rowid",
                    column_list(names)
                ))
                .or_else(|_| tx.prepare(&format!("SELECT {} FROM {table}", column_list(names))))?;
            let mut rows = stmt.query([])?;
            let mut batch = Vec::with_capacity(BATCH);
            while let Some(row) = rows.next()? {
                let cells = (0..names.len())
                    .map(|c| {
                        Ok(match row.get_ref(c)? {
                            rusqlite::types::ValueRef::Null => Cell::Null,
                            rusqlite::types::ValueRef::Integer(n) => Cell::Int(n),
                            rusqlite::types::ValueRef::Real(f) => Cell::Text(f.to_string()),
                            rusqlite::types::ValueRef::Text(t) => {
                                Cell::Text(String::from_utf8_lossy(t).into_owned())
                            }
                            rusqlite::types::ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
                        })
                    })
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                batch.push(cells);
                if batch.len() == BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    if send.blocking_send((i, full)).is_err() {
                        return Ok(()); // the writer failed; it says why
                    }
                }
            }
            if send.blocking_send((i, batch)).is_err() {
                return Ok(());
            }
        }
        Ok(())
    });
    read.await
        .map_err(|e| StoreError::Database(format!("the SQLite reader stopped: {e}")))?
}

/// Writes the batches into PostgreSQL in one transaction, table by table with `COPY`.
async fn write_postgres(
    mut pg: tokio_postgres::Client,
    columns: &[Vec<String>],
    types: &[Vec<Type>],
    mut receive: mpsc::Receiver<Batch>,
    totals: &[u64],
    progress: Progress,
) -> Result<Vec<Copied>> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    let tx = pg.transaction().await?;
    let mut copied: Vec<Copied> = TABLES
        .iter()
        .map(|table| Copied { table, rows: 0 })
        .collect();
    let mut current: Option<(usize, std::pin::Pin<Box<BinaryCopyInWriter>>)> = None;
    while let Some((i, rows)) = receive.recv().await {
        if current.as_ref().is_none_or(|(open, _)| *open != i) {
            if let Some((open, writer)) = current.take() {
                finish_table(&tx, TABLES[open], &columns[open], writer).await?;
            }
            let into = staging(&tx, TABLES[i]).await?;
            let sink = tx
                .copy_in(&format!(
                    "COPY {into} ({}) FROM STDIN BINARY",
                    column_list(&columns[i])
                ))
                .await?;
            current = Some((i, Box::pin(BinaryCopyInWriter::new(sink, &types[i]))));
        }
        let Some((_, writer)) = current.as_mut() else {
            continue;
        };
        for row in rows {
            let values = row
                .into_iter()
                .zip(&types[i])
                .map(|(cell, ty)| to_postgres(cell, ty, TABLES[i]))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&(dyn ToSql + Sync)> = values
                .iter()
                .map(|v| v.as_ref() as &(dyn ToSql + Sync))
                .collect();
            writer.as_mut().write(&refs).await?;
            copied[i].rows += 1;
        }
        progress(TABLES[i], copied[i].rows, totals[i]);
    }
    if let Some((open, writer)) = current.take() {
        finish_table(&tx, TABLES[open], &columns[open], writer).await?;
    }
    for table in NUMBERED {
        tx.execute(
            &format!(
                "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
                 coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
            ),
            &[],
        )
        .await?;
    }
    check_counts(&copied, totals)?;
    tx.commit().await?;
    Ok(copied)
}

fn to_postgres(cell: Cell, ty: &Type, table: &str) -> Result<Box<dyn ToSql + Sync + Send>> {
    let wrong = || {
        StoreError::Corrupt(format!(
            "a value of table {table} does not fit PostgreSQL's {ty}"
        ))
    };
    Ok(match (cell, ty) {
        (Cell::Null, t) if *t == Type::BOOL => Box::new(None::<bool>),
        (Cell::Null, t) if *t == Type::INT4 => Box::new(None::<i32>),
        (Cell::Null, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (Cell::Null, t) if *t == Type::BYTEA => Box::new(None::<Vec<u8>>),
        (Cell::Null, _) => Box::new(None::<String>),
        (Cell::Int(n), t) if *t == Type::BOOL => Box::new(n != 0),
        (Cell::Int(n), t) if *t == Type::INT4 => Box::new(i32::try_from(n).map_err(|_| wrong())?),
        (Cell::Int(n), t) if *t == Type::INT8 => Box::new(n),
        (Cell::Int(n), t) if *t == Type::TEXT => Box::new(n.to_string()),
        (Cell::Text(s), t) if *t == Type::TEXT => Box::new(s),
        (Cell::Bytes(b), t) if *t == Type::BYTEA => Box::new(b),
        (Cell::Text(s), t) if *t == Type::BYTEA => Box::new(s.into_bytes()),
        _ => return Err(wrong()),
    })
}

/// Reads every table in one repeatable-read snapshot of PostgreSQL.
async fn read_postgres(
    url: &str,
    columns: &[Vec<String>],
    types: &[Vec<Type>],
    send: mpsc::Sender<Batch>,
) -> Result<()> {
    use futures_util::StreamExt;
    let mut pg = crate::postgres::client(url).await?;
    let tx = pg
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    for (i, (table, names)) in TABLES.iter().zip(columns).enumerate() {
        let sql = format!("SELECT {} FROM {table}", column_list(names));
        let rows = tx
            .query_raw(&sql, std::iter::empty::<&(dyn ToSql + Sync)>())
            .await?;
        futures_util::pin_mut!(rows);
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(row) = rows.next().await {
            let row = row?;
            let cells = types[i]
                .iter()
                .enumerate()
                .map(|(c, ty)| from_postgres(&row, c, ty))
                .collect::<Result<Vec<_>>>()?;
            batch.push(cells);
            if batch.len() == BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if send.send((i, full)).await.is_err() {
                    return Ok(());
                }
            }
        }
        if send.send((i, batch)).await.is_err() {
            return Ok(());
        }
    }
    tx.commit().await?;
    Ok(())
}

fn from_postgres(row: &tokio_postgres::Row, c: usize, ty: &Type) -> Result<Cell> {
    let cell = if *ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(c)?
            .map_or(Cell::Null, |b| Cell::Int(i64::from(b)))
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(c)?
            .map_or(Cell::Null, |n| Cell::Int(i64::from(n)))
    } else if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(c)?
            .map_or(Cell::Null, Cell::Int)
    } else if *ty == Type::BYTEA {
        row.try_get::<_, Option<Vec<u8>>>(c)?
            .map_or(Cell::Null, Cell::Bytes)
    } else {
        row.try_get::<_, Option<String>>(c)?
            .map_or(Cell::Null, Cell::Text)
    };
    Ok(cell)
}

/// Writes the batches into the SQLite file in one transaction, on a thread of its own.
async fn write_sqlite(
    file: PathBuf,
    columns: Vec<Vec<String>>,
    mut receive: mpsc::Receiver<Batch>,
    totals: Vec<u64>,
    progress: Progress,
) -> Result<Vec<Copied>> {
    let write = tokio::task::spawn_blocking(move || -> Result<Vec<Copied>> {
        let mut conn = sqlite_connection(
            &file,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut copied: Vec<Copied> = TABLES
            .iter()
            .map(|table| Copied { table, rows: 0 })
            .collect();
        while let Some((i, rows)) = receive.blocking_recv() {
            let marks = vec!["?"; columns[i].len()].join(", ");
            let mut stmt = tx.prepare_cached(&format!(
                "INSERT INTO {} ({}) VALUES ({marks})",
                TABLES[i],
                column_list(&columns[i])
            ))?;
            for row in rows {
                let values = row.into_iter().map(|cell| match cell {
                    Cell::Null => rusqlite::types::Value::Null,
                    Cell::Int(n) => rusqlite::types::Value::Integer(n),
                    Cell::Text(s) => rusqlite::types::Value::Text(s),
                    Cell::Bytes(b) => rusqlite::types::Value::Blob(b),
                });
                stmt.execute(rusqlite::params_from_iter(values))?;
                copied[i].rows += 1;
            }
            progress(TABLES[i], copied[i].rows, totals[i]);
        }
        check_counts(&copied, &totals)?;
        tx.commit()?;
        Ok(copied)
    });
    write
        .await
        .map_err(|e| StoreError::Database(format!("the SQLite writer stopped: {e}")))?
}

/// Every row the source counted arrived: a reader that stopped early fails the copy rather
/// than commit part of the store.
fn check_counts(copied: &[Copied], totals: &[u64]) -> Result<()> {
    for (c, total) in copied.iter().zip(totals) {
        if c.rows != *total {
            return Err(StoreError::Database(format!(
                "{} rows of {} were read, of {total} the source holds: nothing was written",
                c.rows, c.table
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_is_a_data_directory_a_file_or_a_postgres_url() {
        assert!(matches!(
            Location::parse("sqlite:./sked-data"),
            Ok(Location::Sqlite(p)) if p == Path::new("./sked-data/sked.db")
        ));
        assert!(matches!(
            Location::parse("sqlite:/var/lib/sked/sked.db"),
            Ok(Location::Sqlite(p)) if p == Path::new("/var/lib/sked/sked.db")
        ));
        let pg = Location::parse("postgres://sked:hunter2@db.internal:5432/sked").unwrap();
        assert!(!pg.describe().contains("hunter2"), "{}", pg.describe());
        assert!(pg.describe().contains("db.internal"), "{}", pg.describe());
        for bad in ["sqlite:", "mysql://x", "./sked-data", ""] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn values_fit_postgres_types_or_say_which_table_they_broke() {
        assert!(to_postgres(Cell::Int(1), &Type::BOOL, "t").is_ok());
        assert!(to_postgres(Cell::Int(i64::MAX), &Type::INT4, "t").is_err());
        let err = to_postgres(Cell::Bytes(vec![1]), &Type::INT8, "runs")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("runs"), "{err}");
    }
}

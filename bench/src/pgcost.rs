//! What a window of work cost PostgreSQL, read off the database itself: WAL written, commits,
//! rows inserted and updated, CPU time of its processes on this machine, and how often its
//! busy backends were waiting for a lock. Divided by the runs completed in the window, these
//! are the per-run figures that predict what more nodes, or a bigger database, would do.
//!
//! Statements per run need `pg_stat_statements` (in `shared_preload_libraries`, and
//! `CREATE EXTENSION pg_stat_statements` in the database), and the WAL split by kind needs
//! `CREATE EXTENSION pg_walinspect`; without them those figures are null.
//! Only reads statistics views and `/proc`; it never touches the schema under test.

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// The database's counters at one moment.
pub struct Snapshot {
    wal_lsn: String,
    commits: i64,
    inserted: i64,
    updated: i64,
    postgres_cpu_ticks: u64,
    own_cpu_ticks: u64,
    /// Statements executed, when `pg_stat_statements` is loaded (it needs
    /// `shared_preload_libraries` and `CREATE EXTENSION`).
    statements: Option<i64>,
}

impl Snapshot {
    pub async fn read(admin: &tokio_postgres::Client) -> Result<Snapshot> {
        // The statistics a backend gathers reach the shared counters when it is idle, at most
        // a second later; a window of many seconds makes that edge small.
        let row = admin
            .query_one(
                "SELECT pg_current_wal_lsn()::text, xact_commit, tup_inserted, tup_updated \
                 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .context("reading pg_stat_database")?;
        let statements = admin
            .query_one(
                "SELECT CASE WHEN to_regclass('pg_stat_statements') IS NOT NULL \
                 THEN (SELECT sum(calls)::bigint FROM pg_stat_statements) END",
                &[],
            )
            .await
            .ok()
            .and_then(|row| row.get::<_, Option<i64>>(0));
        Ok(Snapshot {
            statements,
            wal_lsn: row.get(0),
            commits: row.get(1),
            inserted: row.get(2),
            updated: row.get(3),
            postgres_cpu_ticks: cpu_ticks_of("postgres"),
            own_cpu_ticks: own_cpu_ticks(),
        })
    }
}

/// Share of busy backends' samples spent waiting for a lock, sampled every 50 ms until `until`.
pub async fn lock_waits(
    admin: &tokio_postgres::Client,
    until: std::time::Instant,
) -> Result<Waits> {
    let mut waits = Waits::default();
    while std::time::Instant::now() < until {
        let row = admin
            .query_one(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) \
                 FROM pg_stat_activity WHERE datname = current_database() \
                 AND state = 'active' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .context("sampling pg_stat_activity")?;
        waits.waiting += row.get::<_, i64>(0);
        waits.active += row.get::<_, i64>(1);
        waits.samples += 1;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(waits)
}

#[derive(Default)]
pub struct Waits {
    waiting: i64,
    active: i64,
    samples: i64,
}

/// The window's cost per run completed in it.
pub async fn per_run(
    admin: &tokio_postgres::Client,
    start: &Snapshot,
    end: &Snapshot,
    waits: &Waits,
    runs: f64,
) -> Result<Value> {
    let wal: f64 = admin
        .query_one(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8",
            &[&end.wal_lsn, &start.wal_lsn],
        )
        .await
        .context("measuring WAL")?
        .get(0);
    let runs = runs.max(1.0);
    // What the WAL was made of, by resource manager (heap rows, B-tree index entries, commits),
    // when `pg_walinspect` is installed (`CREATE EXTENSION pg_walinspect`).
    let by_kind = admin
        .query(
            "SELECT \"resource_manager/record_type\", combined_size::float8 \
             FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn) WHERE combined_size > 0",
            &[&start.wal_lsn, &end.wal_lsn],
        )
        .await
        .ok()
        .map(|rows| {
            rows.iter()
                .map(|row| (row.get::<_, String>(0), json!(row.get::<_, f64>(1) / runs)))
                .collect::<serde_json::Map<_, _>>()
        });
    let ticks = ticks_per_second();
    let per = |value: f64| value / runs;
    Ok(json!({
        "runs": runs,
        "wal_bytes_per_run": per(wal),
        "wal_bytes_per_run_by_kind": by_kind,
        "commits_per_run": per((end.commits - start.commits) as f64),
        "rows_inserted_per_run": per((end.inserted - start.inserted) as f64),
        "rows_updated_per_run": per((end.updated - start.updated) as f64),
        "postgres_cpu_us_per_run": per(
            end.postgres_cpu_ticks.saturating_sub(start.postgres_cpu_ticks) as f64 / ticks * 1e6
        ),
        "benchmark_process_cpu_us_per_run": per(
            end.own_cpu_ticks.saturating_sub(start.own_cpu_ticks) as f64 / ticks * 1e6
        ),
        "statements_per_run": end
            .statements
            .zip(start.statements)
            .map(|(end, start)| per((end - start) as f64)),
        "busy_backends_mean": waits.active as f64 / waits.samples.max(1) as f64,
        "lock_wait_share_of_busy": waits.waiting as f64 / waits.active.max(1) as f64,
    }))
}

/// User and system CPU ticks of every process named `name` (`/proc/*/stat`).
fn cpu_ticks_of(name: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            let (comm, ticks) = parse_stat(&stat)?;
            (comm == name).then_some(ticks)
        })
        .sum()
}

fn own_cpu_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| parse_stat(&stat).map(|(_, ticks)| ticks))
        .unwrap_or(0)
}

/// The command name and utime + stime of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = &stat[open + 1..close];
    // Fields after the name: state is the 3rd field of the line, utime the 14th, stime 15th.
    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

fn ticks_per_second() -> f64 {
    // USER_HZ is 100 on every Linux this benchmark runs on.
    100.0
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stat_line_gives_its_name_and_cpu_ticks() {
        let line = "42 (postgres) S 1 42 42 0 -1 4194560 500 0 0 0 17 5 0 0 20 0 1 0 100 0 0";
        assert_eq!(super::parse_stat(line), Some(("postgres", 22)));
        let odd = "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0";
        assert_eq!(super::parse_stat(odd), Some(("a (b) c", 7)));
    }
}

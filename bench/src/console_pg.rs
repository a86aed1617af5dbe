//! The console benchmark's ended runs on PostgreSQL, written set-based.
//!
//! Through the store, every run costs a fire, a start and a report: three transactions per
//! batch, each locking and reading back what it wrote, with the runs' rows updated twice, and
//! on PostgreSQL each a series of round trips; ten million runs would take hours. The rows
//! the store would leave are known, though: a run ended `succeeded` or `failed` with its one
//! attempt, and nothing else (the jobs the runs are of neither notify nor emit events, have
//! no dependencies, keys or deadlines, and no fire advances a job's firing state). So they
//! are written here in the same shape, with
//! `INSERT … SELECT … FROM generate_series`, [`CHUNK`] runs a statement: round robin over
//! the jobs, an instant a second apart, each fired, started and ended at the statement's
//! clock, the run of every tenth instant failed with exit code 1 (`console::FAIL_EVERY`) — what
//! `console::write_runs` writes through the store. The ids come from the store's own
//! sequences, runs' and attempts' alike in the instants' order.
//!
//! Then `VACUUM (ANALYZE)`: the store's tables have statistics to plan by and a visibility map
//! for index-only scans, as a database that autovacuum keeps would. (Autovacuum gets to a
//! table loaded this fast only later, and the server used here has it turned off.)

use anyhow::{Context, Result};
use sked_core::{AttemptState, Instant, RunState, Trigger};

/// Runs written per statement (and transaction).
const CHUNK: usize = 500_000;

/// Writes `runs` ended runs and their attempts over the jobs `ids`, round robin, the `n`th at
/// `first` plus `n` seconds, attempted by `worker` (registered already). `url` points into
/// the store's schema. Returns the newest run's id and the runs written.
pub async fn write_runs(
    url: &str,
    ids: &[i64],
    runs: usize,
    first: Instant,
    worker: &str,
) -> Result<(i64, usize)> {
    let client = sked_store::postgres::client(url)
        .await
        .context("connect for the runs")?;
    // Each chunk is one transaction; what a crash would lose is the benchmark's to redo.
    client.batch_execute("SET synchronous_commit = off").await?;
    let statement = client
        .prepare(
            "WITH slots AS ( \
                 SELECT u.k - 1 AS slot, j.id, j.namespace, j.name, j.priority, j.version \
                 FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, k) \
                 JOIN jobs j ON j.id = u.id), \
             numbered AS ( \
                 SELECT n, nextval('runs_id_seq') AS id \
                 FROM generate_series($2::bigint, $3::bigint - 1) AS n), \
             written AS ( \
                 INSERT INTO runs (id, job_id, namespace, job, scheduled_for, trigger, state, \
                     priority, ready_at, created_at, started_at, finished_at, attempts, \
                     failures, error, job_version, shard, shard_count) \
                 SELECT r.id, s.id, s.namespace, s.name, $4 + r.n * 1000000, $6, \
                     CASE WHEN r.n % $13 = $13 - 1 THEN $8 ELSE $7 END, s.priority, \
                     $4 + r.n * 1000000, $5, $5, $5, 1, (r.n % $13 = $13 - 1)::int, \
                     CASE WHEN r.n % $13 = $13 - 1 THEN 'exited with code 1' END, s.version, 0, 1 \
                 FROM numbered r JOIN slots s ON s.slot = r.n % $9 \
                 RETURNING id, scheduled_for, error) \
             INSERT INTO attempts (id, run_id, number, worker_id, token, state, started_at, \
                 finished_at, lease_expires_at, exit_code, error, run_scheduled_for) \
             SELECT nextval('attempts_id_seq'), w.id, 1, $10, w.id, \
                 CASE WHEN w.error IS NULL THEN $11 ELSE $12 END, \
                 $5, $5, $5 + 60000000, (w.error IS NOT NULL)::int, w.error, w.scheduled_for \
             FROM (SELECT * FROM written ORDER BY id) w",
        )
        .await
        .context("prepare the runs' statement")?;
    let first = first.timestamp_micros();
    let jobs = i64::try_from(ids.len())?;
    let fail_every = i64::try_from(crate::console::FAIL_EVERY)?;
    let mut written = 0;
    while written < runs {
        let count = CHUNK.min(runs - written);
        let t = std::time::Instant::now();
        let from = i64::try_from(written)?;
        let to = i64::try_from(written + count)?;
        let now = chrono::Utc::now().timestamp_micros();
        let attempts = client
            .execute(
                &statement,
                &[
                    &ids,
                    &from,
                    &to,
                    &first,
                    &now,
                    &Trigger::Schedule.as_str(),
                    &RunState::Succeeded.as_str(),
                    &RunState::Failed.as_str(),
                    &jobs,
                    &worker,
                    &AttemptState::Succeeded.as_str(),
                    &AttemptState::Failed.as_str(),
                    &fail_every,
                ],
            )
            .await
            .context("write a chunk of runs")?;
        if attempts != count as u64 {
            anyhow::bail!("{attempts} of {count} runs were written");
        }
        written += count;
        eprintln!(
            "console: {written} runs written ({count} in {:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }
    let t = std::time::Instant::now();
    client
        .batch_execute("SET maintenance_work_mem = '256MB'")
        .await?;
    // A statement of its own: several in one string run as one transaction, and VACUUM
    // refuses to run inside one.
    client
        .batch_execute("VACUUM (ANALYZE) jobs, job_versions, runs, attempts, workers")
        .await
        .context("vacuum after the runs")?;
    eprintln!(
        "console: VACUUM (ANALYZE) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let newest: i64 = client
        .query_one("SELECT max(id) FROM runs", &[])
        .await?
        .get(0);
    Ok((newest, written))
}

//! The SQLite schema and its migrations, applied in order on open and recorded in
//! `PRAGMA user_version`, so a store opened by a newer sked is upgraded in place.
//!
//! Instants are integers (microseconds since the epoch, UTC); states are their snake_case names.

use rusqlite::{Connection, OptionalExtension};

/// Each entry moves the schema one version up. Never edit a released entry: append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
-- AUTOINCREMENT everywhere: an id is never handed out twice, so a recreated job never meets
-- the ledger rows of a deleted one, and a run or attempt id always means one thing.
CREATE TABLE jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace      TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    description    TEXT    NOT NULL DEFAULT '',
    spec           TEXT    NOT NULL,
    -- Copied out of `spec` so that firing and completion need not parse it for every run.
    overlap        TEXT    NOT NULL,
    priority       INTEGER NOT NULL,
    retry          TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    next_fire_at   INTEGER,
    fired_count    INTEGER NOT NULL,
    schedule_epoch INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    UNIQUE (namespace, name)
);
CREATE INDEX jobs_scheduled ON jobs (next_fire_at) WHERE next_fire_at IS NOT NULL;

-- The ledger: one row per (job, instant). Namespace and job name are kept with the run so
-- that the runs of a deleted job stay readable.
CREATE TABLE runs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id           INTEGER NOT NULL,
    namespace        TEXT    NOT NULL,
    job              TEXT    NOT NULL,
    scheduled_for    INTEGER NOT NULL,
    trigger          TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    skip_reason      TEXT,
    priority         INTEGER NOT NULL,
    ready_at         INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    error            TEXT,
    UNIQUE (job_id, scheduled_for)
);
CREATE INDEX runs_by_job_name ON runs (namespace, job, scheduled_for DESC, id DESC);
CREATE INDEX runs_by_namespace ON runs (namespace, scheduled_for DESC, id DESC);
-- Partial indexes keep the hot queries off a job's history: a query uses one only when its
-- WHERE repeats the index's condition (see `ledger::JOB_SCOPED`).
CREATE INDEX runs_active ON runs (job_id, state) WHERE state IN ('waiting', 'queued', 'running');
CREATE INDEX runs_waiting ON runs (job_id, scheduled_for, id) WHERE state = 'waiting';
CREATE INDEX runs_queued ON runs (id) WHERE state = 'queued';
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE attempts (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    number           INTEGER NOT NULL,
    worker_id        TEXT    NOT NULL,
    token            INTEGER NOT NULL,
    state            TEXT    NOT NULL,
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    lease_expires_at INTEGER NOT NULL,
    exit_code        INTEGER,
    http_status      INTEGER,
    error            TEXT,
    output_bytes     INTEGER NOT NULL DEFAULT 0,
    output_truncated INTEGER NOT NULL DEFAULT 0,
    UNIQUE (run_id, number)
);
CREATE INDEX attempts_running ON attempts (worker_id) WHERE state = 'running';
CREATE INDEX attempts_leases ON attempts (lease_expires_at) WHERE state = 'running';

-- Captured output, in the chunks the worker sent; `offset` is the chunk's first byte.
CREATE TABLE output (
    attempt_id INTEGER NOT NULL REFERENCES attempts (id) ON DELETE CASCADE,
    offset     INTEGER NOT NULL,
    data       BLOB    NOT NULL,
    PRIMARY KEY (attempt_id, offset)
) WITHOUT ROWID;

CREATE TABLE workers (
    id                TEXT    PRIMARY KEY,
    name              TEXT    NOT NULL,
    labels            TEXT    NOT NULL,
    slots             INTEGER NOT NULL,
    registered_at     INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    alive             INTEGER NOT NULL
);
"#,
    r#"
-- Version 2: API tokens, the audit trail, and what a worker may run.
-- Tokens are found by the SHA-256 of their secret (lowercase hex); the secret is never kept.
-- AUTOINCREMENT: a revoked token's id is never handed to a new token, so a worker registered
-- with the old one (`workers.token_id`) is never taken for the new one's.
CREATE TABLE tokens (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT    NOT NULL UNIQUE,
    role         TEXT    NOT NULL,
    -- JSON array of namespace names, or ["*"].
    namespaces   TEXT    NOT NULL,
    shell        INTEGER NOT NULL,
    -- JSON array of "key=value" / "key=*" rules; NULL: any label.
    labels       TEXT,
    hash         TEXT    NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    last_used_at INTEGER
);

-- Read newest first (by id), often of one namespace; trimmed oldest first (by `at`).
-- `before` and `after` are JSON snapshots of the object.
CREATE TABLE audit (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    actor     TEXT    NOT NULL,
    actor_id  INTEGER,
    peer      TEXT,
    action    TEXT    NOT NULL,
    namespace TEXT,
    object    TEXT,
    before    TEXT,
    after     TEXT
);
CREATE INDEX audit_by_namespace ON audit (namespace, id);
CREATE INDEX audit_by_at ON audit (at, id);

-- Workers registered before tokens existed run every namespace, as they did. No foreign key to
-- `tokens`: revoking a token leaves its workers' rows alone (the server decides what they may
-- still do).
ALTER TABLE workers ADD COLUMN namespaces TEXT NOT NULL DEFAULT '["*"]';
ALTER TABLE workers ADD COLUMN token_id INTEGER;
"#,
    r#"
-- Version 3: namespace settings and namespace secrets.
-- A namespace has a row only once an administrator sets something; `spec` is its JSON.
CREATE TABLE namespaces (
    name       TEXT    PRIMARY KEY,
    spec       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- `sealed` is the value encrypted with the server's key; the store never holds it in clear.
CREATE TABLE secrets (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    sealed     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
"#,
    r#"
-- Version 4: dependencies between jobs.
-- One row per (dependant, upstream) pair of a namespace, by name: read by upstream when a run
-- ends (who may be released), by dependant when a definition changes.
CREATE TABLE job_dependencies (
    namespace TEXT NOT NULL,
    job       TEXT NOT NULL,
    upstream  TEXT NOT NULL,
    PRIMARY KEY (namespace, upstream, job)
) WITHOUT ROWID;
CREATE INDEX job_dependencies_by_job ON job_dependencies (namespace, job);

-- Copied out of `spec`: the fire path reads the definition only for jobs that have some.
ALTER TABLE jobs ADD COLUMN has_dependencies INTEGER NOT NULL DEFAULT 0;

-- What a waiting run waits for ('dependencies' or 'overlap'); for dependencies, the unmet
-- entries (a JSON array) and when it gives up. Runs waiting before this version waited on
-- overlap.
ALTER TABLE runs ADD COLUMN waiting_reason TEXT;
ALTER TABLE runs ADD COLUMN waiting_for TEXT;
ALTER TABLE runs ADD COLUMN waiting_until INTEGER;
UPDATE runs SET waiting_reason = 'overlap' WHERE state = 'waiting';
CREATE INDEX runs_waiting_dependencies ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'dependencies';
"#,
    r#"
-- Version 5: events. One row per (namespace, key, id); `occurred_at` is unique within a
-- namespace (the store makes it so), as the instant of the runs an event starts.
CREATE TABLE events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace      TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    event_id       TEXT    NOT NULL,
    payload        TEXT    NOT NULL,
    occurred_at    INTEGER NOT NULL,
    emitted_by_run INTEGER,
    UNIQUE (namespace, key, event_id)
);
CREATE INDEX events_by_key ON events (namespace, key, occurred_at);
CREATE INDEX events_by_instant ON events (namespace, occurred_at);
CREATE INDEX events_by_age ON events (occurred_at);

-- The jobs an event key concerns: 'schedule' (a run per event) or 'wait' (a depends_on entry),
-- kept with the definition as job_dependencies is.
CREATE TABLE event_subscriptions (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    job       TEXT NOT NULL,
    role      TEXT NOT NULL,
    PRIMARY KEY (namespace, key, role, job)
) WITHOUT ROWID;
CREATE INDEX event_subscriptions_by_job ON event_subscriptions (namespace, job);

-- Copied out of `spec` (on_success.emit): a completion learns it with the retry policy.
ALTER TABLE jobs ADD COLUMN emits TEXT;
-- `priority: auto`: `priority` holds the job's rank, the number of jobs downstream, kept as
-- the graph changes.
ALTER TABLE jobs ADD COLUMN priority_auto INTEGER NOT NULL DEFAULT 0;
-- The event that started a run (trigger 'event').
ALTER TABLE runs ADD COLUMN event_key TEXT;
ALTER TABLE runs ADD COLUMN event_id TEXT;
"#,
    r#"
-- Version 6: the ledger key, one run per (job, instant), is kept by a unique index in time
-- order, (scheduled_for, job_id), instead of the table's UNIQUE (job_id, scheduled_for). The
-- constraint is the same; what changes is where a fire writes: in job order every instant
-- landed on its own job's page, so once jobs had some history each fire dirtied a page of
-- its own, and the pages written per fire grew with the history (the store's write rate
-- doubled over ten minutes at 8,000 fires a second); in time order a batch of instants
-- appends to the same few pages. SQLite cannot drop a table constraint, so the table is
-- rebuilt as its ALTER TABLE documentation describes (`migrate` turns foreign keys off
-- around it and checks them before committing), keeping its AUTOINCREMENT high-water mark.
CREATE TABLE runs_rebuilt (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id           INTEGER NOT NULL,
    namespace        TEXT    NOT NULL,
    job              TEXT    NOT NULL,
    scheduled_for    INTEGER NOT NULL,
    trigger          TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    skip_reason      TEXT,
    priority         INTEGER NOT NULL,
    ready_at         INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    error            TEXT,
    waiting_reason   TEXT,
    waiting_for      TEXT,
    waiting_until    INTEGER,
    event_key        TEXT,
    event_id         TEXT
);
INSERT INTO runs_rebuilt (id, job_id, namespace, job, scheduled_for, trigger, state,
    skip_reason, priority, ready_at, created_at, started_at, finished_at, attempts, failures,
    cancel_requested, error, waiting_reason, waiting_for, waiting_until, event_key, event_id)
SELECT id, job_id, namespace, job, scheduled_for, trigger, state, skip_reason, priority,
    ready_at, created_at, started_at, finished_at, attempts, failures, cancel_requested, error,
    waiting_reason, waiting_for, waiting_until, event_key, event_id
FROM runs;
DELETE FROM sqlite_sequence WHERE name = 'runs_rebuilt';
INSERT INTO sqlite_sequence (name, seq) SELECT 'runs_rebuilt', seq FROM sqlite_sequence
    WHERE name = 'runs';
DROP TABLE runs;
ALTER TABLE runs_rebuilt RENAME TO runs;
CREATE UNIQUE INDEX runs_ledger_key ON runs (scheduled_for, job_id);
CREATE INDEX runs_by_job_name ON runs (namespace, job, scheduled_for DESC, id DESC);
CREATE INDEX runs_by_namespace ON runs (namespace, scheduled_for DESC, id DESC);
CREATE INDEX runs_active ON runs (job_id, state) WHERE state IN ('waiting', 'queued', 'running');
CREATE INDEX runs_waiting ON runs (job_id, scheduled_for, id) WHERE state = 'waiting';
CREATE INDEX runs_queued ON runs (id) WHERE state = 'queued';
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_waiting_dependencies ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'dependencies';
"#,
    r#"
-- Version 7: a worker asked to drain gets no new attempts.
ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- Version 8: job versions. A job's `version` counts its definitions; every definition is kept
-- in `job_versions` (the newest `shared::KEPT_VERSIONS` of each job), and each run records the
-- version it was fired under. A job's existing definition becomes its version 1.
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
CREATE TABLE job_versions (
    job_id     INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    version    INTEGER NOT NULL,
    spec       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, version)
) WITHOUT ROWID;
INSERT INTO job_versions (job_id, version, spec, created_at)
    SELECT id, 1, spec, updated_at FROM jobs;
ALTER TABLE runs ADD COLUMN job_version INTEGER;
"#,
    r#"
-- Version 9: notifications, the pings of heartbeat jobs, and metrics by job name for the jobs
-- that ask (`job_metrics`). A job's and a namespace's `notify` rules are copied out of their
-- definitions (NULL: none given) so that a run's end reads no definition; `notify_late` says a
-- rule is for `late`, which the notifier's scan looks for. A notification is recorded once per
-- (run, event, rule) and sent by whichever node claims it (`claim` counts the claims).
ALTER TABLE jobs ADD COLUMN notify TEXT;
ALTER TABLE jobs ADD COLUMN notify_late INTEGER NOT NULL DEFAULT 0;
ALTER TABLE namespaces ADD COLUMN notify TEXT;
ALTER TABLE namespaces ADD COLUMN notify_late INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_notify_late ON jobs (id) WHERE notify_late = 1;
CREATE TABLE notifications (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace    TEXT    NOT NULL,
    job          TEXT    NOT NULL,
    run_id       INTEGER NOT NULL,
    event        TEXT    NOT NULL,
    rule         INTEGER NOT NULL,
    channel      TEXT    NOT NULL,
    message      TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    sends        INTEGER NOT NULL,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    next_send_at INTEGER NOT NULL,
    sent_at      INTEGER,
    claim        INTEGER NOT NULL,
    UNIQUE (run_id, event, rule)
);
CREATE INDEX notifications_due ON notifications (next_send_at, id) WHERE state = 'pending';
CREATE INDEX notifications_by_namespace ON notifications (namespace, id);
CREATE INDEX notifications_by_age ON notifications (created_at);
-- Heartbeat jobs: `ping_grace` (micros) marks one and says how long each run waits for a
-- ping; `last_ping_at` keeps a ping that came while no run waited, for the next run to credit.
ALTER TABLE jobs ADD COLUMN job_metrics INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN ping_grace INTEGER;
ALTER TABLE jobs ADD COLUMN last_ping_at INTEGER;
CREATE INDEX runs_waiting_pings ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'ping';
"#,
    r#"
-- Version 10: sharded and broadcast jobs. A job with `shards: N` (copied out of its
-- definition) records N runs per instant, so the ledger key gains the shard: (instant, job,
-- shard), shard 0 for every run of a job that is not sharded. `shard_count` is N as the job
-- said when the instant fired. A broadcast job's shards are one per worker, each pinned to
-- its worker (`pinned_worker`); `runs_pinned` finds those whose worker was lost.
ALTER TABLE jobs ADD COLUMN shards INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN broadcast INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN shard_count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN pinned_worker TEXT;
DROP INDEX runs_ledger_key;
CREATE UNIQUE INDEX runs_ledger_key ON runs (scheduled_for, job_id, shard);
CREATE INDEX runs_pinned ON runs (pinned_worker)
    WHERE state = 'queued' AND pinned_worker IS NOT NULL;
"#,
    r#"
-- Version 11: runs held back by overlap, by job. A completion releases them only for a job
-- whose overlap policy can hold runs back; the reaper's pass finds, through this small
-- index, any left waiting with nothing of their job active (a job whose policy became
-- `allow`, or changed while its last run ended) and releases them.
CREATE INDEX runs_overlap_waiting ON runs (job_id)
    WHERE state = 'waiting' AND waiting_reason = 'overlap';
"#,
    r#"
-- Version 12: a worker that stopped cleanly says so (`stopped`: not alive, and not lost), and a
-- server node's broker publisher is told apart from the workers (`publisher`).
ALTER TABLE workers ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN publisher INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
-- Version 13: a rule that tells only the first failure of a streak and repeats while it lasts
-- (`failures: first`, `repeat`) reads when it last told of a failure of the job.
CREATE INDEX notifications_by_rule ON notifications (namespace, job, rule, created_at);
"#,
    r#"
-- Version 14: a logout ends every console session of its token made before it
-- (`Store::end_sessions`): the instant, in micros, that the token's sessions must be younger
-- than. Read with the token, so a console request costs no more than before.
ALTER TABLE tokens ADD COLUMN sessions_ended_at INTEGER;
"#,
    r#"
-- Version 15: business-day calendars, and runs that remember a moved instant.
-- A namespace's calendars, each kept whole as its JSON definition; `version` is 1 when
-- created and one more with each change.
CREATE TABLE calendars (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    spec       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
-- The instant a schedule named when its calendar moved the run to `scheduled_for` (micros);
-- NULL for a run at its own instant, and for every run recorded before this version.
ALTER TABLE runs ADD COLUMN nominal_for INTEGER;
"#,
    r#"
-- Version 16: deadlines (`sked_core::deadline`). A job with a `deadline` is flagged for the
-- watcher that judges its runs, found through a small partial index.
ALTER TABLE jobs ADD COLUMN has_deadline INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_with_deadline ON jobs (id) WHERE has_deadline = 1;
-- A run's deadlines as the watcher resolved them, those it missed, and when it was called at
-- risk: JSON, NULL for the runs of jobs without a deadline. The partial indexes hold only the
-- marked runs, so listing them never reads the rest.
ALTER TABLE runs ADD COLUMN deadline TEXT;
ALTER TABLE runs ADD COLUMN deadline_missed TEXT;
ALTER TABLE runs ADD COLUMN at_risk TEXT;
CREATE INDEX runs_deadline_missed ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE deadline_missed IS NOT NULL;
CREATE INDEX runs_at_risk ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE at_risk IS NOT NULL;
"#,
    r#"
-- Version 17: flow control by key (`sked_core::flow`). The attempts holding each concurrency
-- key: a row is written with the attempt it admits and counts while that attempt runs (an
-- ended attempt's rows are swept by the next start that reads the key), so no path that ends
-- an attempt has to remember the keys.
CREATE TABLE flow_holders (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    attempt_id INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    run_scheduled_for INTEGER NOT NULL,
    job TEXT NOT NULL,
    since INTEGER NOT NULL,
    PRIMARY KEY (namespace, key, attempt_id)
) WITHOUT ROWID;
-- Each rate key's theoretical arrival time (micros): a row whose time is past says no more
-- than a missing one, and retention removes those.
CREATE TABLE flow_rates (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    tat INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
-- Limits named once in a namespace and used by jobs (`sked_core::flow::LimitSpec`, JSON).
CREATE TABLE flow_limits (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
"#,
    r#"
-- Version 18: triggers under debounce and dedup (`sked_core::flow::trigger`). A run keeps the
-- parameters its manual trigger gave it (JSON, NULL when none) and, when debounced, what it
-- absorbed (JSON `Absorbed`, count 0 until a second trigger comes); a start never takes a
-- debounced run before its `ready_at`, which a later trigger may have moved.
ALTER TABLE runs ADD COLUMN params TEXT;
ALTER TABLE runs ADD COLUMN absorbed TEXT;
-- The run a dedup key answers with, until `expires_at` (its window past the first trigger);
-- retention deletes the expired rows.
CREATE TABLE flow_dedup (
    job_id INTEGER NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
CREATE INDEX flow_dedup_expiry ON flow_dedup (expires_at);
-- The debounced run pending for a key (a trigger absorbs into it while it has not started),
-- kept until `expires_at` (its burst's `max_wait`), after which retention deletes the row.
CREATE TABLE flow_debounce (
    job_id INTEGER NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
CREATE INDEX flow_debounce_expiry ON flow_debounce (expires_at);
"#,
    r#"
-- Version 19: the runs not yet ended, newest first per namespace (the console's "now": what
-- runs, what is queued and why). Listing them by state reads only this partial index, never
-- the ended runs behind them.
CREATE INDEX runs_unended ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE state IN ('waiting', 'queued', 'running');
"#,
    r#"
-- Version 20: each job's schedule kind as a column the database derives from the definition
-- (`ScheduleKind::of`), so the job list and the runs grid filter by kind on an index instead
-- of reading every definition. Virtual: computed when read, nothing more is stored.
ALTER TABLE jobs ADD COLUMN schedule_kind TEXT GENERATED ALWAYS AS (CASE
    WHEN json_extract(spec, '$.schedule.cron') IS NOT NULL THEN 'cron'
    WHEN json_extract(spec, '$.schedule.every') IS NOT NULL THEN 'every'
    WHEN json_extract(spec, '$.schedule.iso8601') IS NOT NULL THEN 'iso8601'
    WHEN json_extract(spec, '$.schedule.at') IS NOT NULL THEN 'at'
    WHEN json_extract(spec, '$.schedule.event') IS NOT NULL THEN 'event'
    WHEN json_extract(spec, '$.schedule.business_day') IS NOT NULL THEN 'business_day'
    WHEN json_extract(spec, '$.schedule.every_business_days') IS NOT NULL
        THEN 'every_business_days'
    ELSE 'manual' END) VIRTUAL;
CREATE INDEX jobs_by_kind ON jobs (namespace, schedule_kind, name);
"#,
    r#"
-- Version 21: the trace a run joined (`sked_core::trace::Joined`, as text): a dependant's
-- run joins the trace of the upstream run that made or released it. NULL for a run with a
-- trace of its own, and for every run recorded before this version.
ALTER TABLE runs ADD COLUMN trace_parent TEXT;
-- The trace an event's runs join: its poster's, or the run's that emitted it.
ALTER TABLE events ADD COLUMN trace_parent TEXT;
"#,
];

/// Brings the schema to the newest version, one transaction per migration.
///
/// Foreign keys are off while migrations run, so that a migration may rebuild a table others
/// refer to (dropping `runs` with them on would delete every attempt); each migration checks
/// them before it commits instead, and a violation rolls it back.
pub fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let current: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current >= MIGRATIONS.len() {
        return Ok(());
    }
    let foreign_keys: bool = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let migrated = apply(conn, current);
    conn.pragma_update(None, "foreign_keys", foreign_keys)?;
    migrated
}

fn apply(conn: &mut Connection, current: usize) -> rusqlite::Result<()> {
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        let violation: Option<String> = tx
            .query_row("PRAGMA foreign_key_check", [], |r| r.get(0))
            .optional()?;
        if let Some(table) = violation {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
                Some(format!(
                    "migration to schema version {} leaves a dangling reference in {table}",
                    index + 1
                )),
            ));
        }
        tx.pragma_update(None, "user_version", index + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// The newest schema version this build knows.
pub fn latest_version() -> usize {
    MIGRATIONS.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_store_upgrades_and_its_workers_run_every_namespace() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO workers (id, name, labels, slots, registered_at, last_heartbeat_at, \
             alive) VALUES ('w', 'w', '{}', 1, 0, 0, 1)",
            [],
        )
        .unwrap();
        // A run held back by overlap before dependencies existed.
        conn.execute(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, priority, \
             ready_at, created_at) VALUES (1, 'default', 'j', 0, 'schedule', 'waiting', 0, 0, 0)",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let reason: String = conn
            .query_row("SELECT waiting_reason FROM runs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(reason, "overlap", "it still waits on overlap");
        let version: usize = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, latest_version());
        let (namespaces, token_id): (String, Option<i64>) = conn
            .query_row(
                "SELECT namespaces, token_id FROM workers WHERE id = 'w'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((namespaces.as_str(), token_id), (r#"["*"]"#, None));
        for table in ["tokens", "audit"] {
            let count: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(count, 0, "{table}");
        }
    }

    /// Rebuilding `runs` (version 6) keeps every run, its attempts (dropping the old table
    /// with foreign keys on would have deleted them), the id high-water mark, and the ledger
    /// key; and foreign keys are on again afterwards.
    #[test]
    fn the_runs_rebuild_keeps_runs_attempts_ids_and_the_ledger_key() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        for sql in &MIGRATIONS[..5] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        let run = |id: i64, at: i64| {
            format!(
                "INSERT INTO runs (id, job_id, namespace, job, scheduled_for, trigger, state, \
                 priority, ready_at, created_at, event_key) \
                 VALUES ({id}, 7, 'default', 'j', {at}, 'schedule', 'succeeded', 0, 0, 0, 'k')"
            )
        };
        conn.execute_batch(&run(1, 100)).unwrap();
        conn.execute_batch(&run(2, 200)).unwrap();
        conn.execute_batch(&run(3, 300)).unwrap();
        conn.execute_batch(
            "INSERT INTO attempts (run_id, number, worker_id, token, state, started_at, \
             lease_expires_at) VALUES (2, 1, 'w', 1, 'succeeded', 0, 0); \
             DELETE FROM runs WHERE id = 3;",
        )
        .unwrap();

        migrate(&mut conn).unwrap();

        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(count("SELECT count(*) FROM runs"), 2);
        assert_eq!(count("SELECT count(*) FROM attempts WHERE run_id = 2"), 1);
        assert_eq!(count("SELECT count(*) FROM runs WHERE event_key = 'k'"), 2);
        assert_eq!(count("PRAGMA foreign_keys"), 1);
        // Id 3 was handed out before: AUTOINCREMENT never hands it out again.
        conn.execute_batch(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, priority, \
             ready_at, created_at) VALUES (7, 'default', 'j', 400, 'schedule', 'queued', 0, 0, 0)",
        )
        .unwrap();
        assert_eq!(count("SELECT max(id) FROM runs"), 4);
        // One run per (job, instant, shard), in any column order of the conflict target.
        let again = conn
            .execute(
                "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
                 priority, ready_at, created_at) \
                 VALUES (7, 'default', 'j', 200, 'schedule', 'queued', 0, 0, 0) \
                 ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING",
                [],
            )
            .unwrap();
        assert_eq!(again, 0);
        // Attempts still refer to runs: deleting a run takes its attempts with it.
        conn.execute_batch("DELETE FROM runs WHERE id = 2").unwrap();
        assert_eq!(count("SELECT count(*) FROM attempts"), 0);
        let plan = super::super::query_plan(
            &conn,
            "SELECT id FROM runs WHERE job_id = 7 AND scheduled_for = 200",
        )
        .join("; ");
        assert!(plan.contains("runs_ledger_key"), "{plan}");
    }

    /// Version 15 leaves runs recorded before it at their own instant (no nominal one) and
    /// starts with no calendars.
    #[test]
    fn runs_from_before_calendars_name_no_other_instant() {
        let mut conn = Connection::open_in_memory().unwrap();
        for sql in &MIGRATIONS[..14] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 14).unwrap();
        conn.execute_batch(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, priority, \
             ready_at, created_at) VALUES (1, 'default', 'j', 5, 'schedule', 'succeeded', 0, 0, 0)",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let (nominal, calendars): (Option<i64>, i64) = conn
            .query_row(
                "SELECT nominal_for, (SELECT count(*) FROM calendars) FROM runs",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((nominal, calendars), (None, 0));
    }

    /// Version 8 makes each existing definition its job's version 1, kept with the time it was
    /// last written; runs recorded before it name no version.
    #[test]
    fn existing_jobs_become_version_one() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        for sql in &MIGRATIONS[..7] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 7).unwrap();
        conn.execute_batch(
            "INSERT INTO jobs (id, namespace, name, description, spec, overlap, priority, \
             retry, state, fired_count, schedule_epoch, created_at, updated_at) \
             VALUES (1, 'default', 'j', '', '{\"target\":{\"shell\":{\"command\":\"true\"}}}', \
             'allow', 0, '{}', 'active', 0, 0, 10, 20); \
             INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, priority, \
             ready_at, created_at) VALUES (1, 'default', 'j', 5, 'schedule', 'succeeded', 0, 0, 0);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let row = |sql: &str| {
            conn.query_row(sql, [], |r| {
                Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?))
            })
            .unwrap()
        };
        assert_eq!(row("SELECT version, 0 FROM jobs"), (Some(1), Some(0)));
        assert_eq!(
            row("SELECT version, created_at FROM job_versions WHERE job_id = 1"),
            (Some(1), Some(20))
        );
        assert_eq!(row("SELECT job_version, 0 FROM runs"), (None, Some(0)));
        // Deleting the job deletes its versions.
        conn.execute_batch("DELETE FROM runs; DELETE FROM jobs")
            .unwrap();
        assert_eq!(
            row("SELECT count(*), 0 FROM job_versions"),
            (Some(0), Some(0))
        );
    }
}

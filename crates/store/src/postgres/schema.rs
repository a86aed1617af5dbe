//! The PostgreSQL schema and its migrations, applied in order at connect and recorded in the
//! `sked_schema` table, so a database used by a newer sked is upgraded in place.
//!
//! The tables and columns are SQLite's (`sqlite/schema.rs`), in PostgreSQL's types: instants are
//! BIGINT microseconds since the epoch (UTC), states their snake_case names, flags BOOLEAN,
//! captured output BYTEA. Names sort by byte (`COLLATE "C"`), as on SQLite, so a page cursor
//! means the same on both.
//!
//! Several nodes may start at once on an empty database: the version is read and the
//! migrations applied in one transaction holding an advisory lock keyed by the schema, so one
//! node migrates and the others find the work done.

use super::{Fail, PgResult};
use crate::StoreError;

/// Each entry moves the schema one version up. Never edit a released entry: append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
-- Identity columns everywhere: an id is never handed out twice, so a recreated job never meets
-- the ledger rows of a deleted one, and a run or attempt id always means one thing.
CREATE TABLE jobs (
    id             BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace      TEXT    NOT NULL,
    name           TEXT    COLLATE "C" NOT NULL,
    description    TEXT    NOT NULL DEFAULT '',
    spec           TEXT    NOT NULL,
    -- Copied out of `spec` so that firing and completion need not parse it for every run.
    overlap        TEXT    NOT NULL,
    priority       INTEGER NOT NULL,
    retry          TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    next_fire_at   BIGINT,
    fired_count    BIGINT  NOT NULL,
    schedule_epoch BIGINT  NOT NULL,
    created_at     BIGINT  NOT NULL,
    updated_at     BIGINT  NOT NULL,
    CONSTRAINT jobs_namespace_name_key UNIQUE (namespace, name)
);
CREATE INDEX jobs_scheduled ON jobs (next_fire_at) WHERE next_fire_at IS NOT NULL;

-- The ledger: one row per (job, instant). Namespace and job name are kept with the run so
-- that the runs of a deleted job stay readable.
CREATE TABLE runs (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           BIGINT  NOT NULL,
    namespace        TEXT    NOT NULL,
    job              TEXT    COLLATE "C" NOT NULL,
    scheduled_for    BIGINT  NOT NULL,
    trigger          TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    skip_reason      TEXT,
    priority         INTEGER NOT NULL,
    ready_at         BIGINT  NOT NULL,
    created_at       BIGINT  NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    error            TEXT,
    CONSTRAINT runs_job_instant_key UNIQUE (job_id, scheduled_for)
);
CREATE INDEX runs_by_job_name ON runs (namespace, job, scheduled_for DESC, id DESC);
CREATE INDEX runs_by_namespace ON runs (namespace, scheduled_for DESC, id DESC);
CREATE INDEX runs_active ON runs (job_id, state) WHERE state IN ('waiting', 'queued', 'running');
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE attempts (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           BIGINT  NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    number           INTEGER NOT NULL,
    worker_id        TEXT    NOT NULL,
    token            BIGINT  NOT NULL,
    state            TEXT    NOT NULL,
    started_at       BIGINT  NOT NULL,
    finished_at      BIGINT,
    lease_expires_at BIGINT  NOT NULL,
    exit_code        INTEGER,
    http_status      INTEGER,
    error            TEXT,
    output_bytes     BIGINT  NOT NULL DEFAULT 0,
    output_truncated BOOLEAN NOT NULL DEFAULT false,
    UNIQUE (run_id, number)
);
CREATE INDEX attempts_running ON attempts (worker_id) WHERE state = 'running';
CREATE INDEX attempts_leases ON attempts (lease_expires_at) WHERE state = 'running';

-- Captured output, in the chunks the worker sent; `offset` is the chunk's first byte.
CREATE TABLE output (
    attempt_id BIGINT NOT NULL REFERENCES attempts (id) ON DELETE CASCADE,
    "offset"   BIGINT NOT NULL,
    data       BYTEA  NOT NULL,
    PRIMARY KEY (attempt_id, "offset")
);

CREATE TABLE workers (
    id                TEXT    PRIMARY KEY,
    name              TEXT    NOT NULL,
    labels            TEXT    NOT NULL,
    slots             BIGINT  NOT NULL,
    registered_at     BIGINT  NOT NULL,
    last_heartbeat_at BIGINT  NOT NULL,
    alive             BOOLEAN NOT NULL
);
"#,
    r#"
-- The cluster: server nodes, the partitions of schedules they hold, and the maintenance duty.
-- A lease is held while `expires_at` (microseconds) is ahead; a node renews its leases every
-- third of the lease, so a dead node's leases lapse and the survivors take them.
CREATE TABLE cluster_nodes (
    id         TEXT   PRIMARY KEY,
    address    TEXT   NOT NULL,
    started_at BIGINT NOT NULL,
    seen_at    BIGINT NOT NULL
);
CREATE TABLE partition_leases (
    partition  INTEGER PRIMARY KEY,
    node       TEXT,
    expires_at BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO partition_leases (partition) SELECT generate_series(0, 255);
CREATE TABLE duty_leases (
    duty       TEXT   PRIMARY KEY,
    node       TEXT   NOT NULL,
    expires_at BIGINT NOT NULL
);
"#,
    r#"
-- Version 3: API tokens, the audit trail, and what a worker may run (SQLite's version 2).
-- Tokens are found by the SHA-256 of their secret (lowercase hex); the secret is never kept.
-- An identity id is never handed out again, so a worker registered with a revoked token
-- (`workers.token_id`) is never taken for a newer token's.
CREATE TABLE tokens (
    id           BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         TEXT    COLLATE "C" NOT NULL,
    role         TEXT    NOT NULL,
    -- JSON array of namespace names, or ["*"].
    namespaces   TEXT    NOT NULL,
    shell        BOOLEAN NOT NULL,
    -- JSON array of "key=value" / "key=*" rules; NULL: any label.
    labels       TEXT,
    hash         TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    expires_at   BIGINT,
    last_used_at BIGINT,
    CONSTRAINT tokens_name_key UNIQUE (name),
    CONSTRAINT tokens_hash_key UNIQUE (hash)
);

-- Read newest first (by id), often of one namespace; trimmed oldest first (by `at`).
-- `before` and `after` are JSON snapshots of the object, kept as text like every JSON here.
CREATE TABLE audit (
    id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        BIGINT NOT NULL,
    actor     TEXT   NOT NULL,
    actor_id  BIGINT,
    peer      TEXT,
    action    TEXT   NOT NULL,
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
ALTER TABLE workers
    ADD COLUMN namespaces TEXT NOT NULL DEFAULT '["*"]',
    ADD COLUMN token_id   BIGINT;
"#,
    r#"
-- Version 4: namespace settings and namespace secrets (SQLite's version 3).
-- A namespace has a row only once an administrator sets something; `spec` is its JSON.
CREATE TABLE namespaces (
    name       TEXT   COLLATE "C" PRIMARY KEY,
    spec       TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- `sealed` is the value encrypted with the server's key; the store never holds it in clear.
CREATE TABLE secrets (
    namespace  TEXT   COLLATE "C" NOT NULL,
    name       TEXT   COLLATE "C" NOT NULL,
    sealed     TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
"#,
    r#"
-- Version 5 (SQLite's 4): dependencies between jobs.
CREATE TABLE job_dependencies (
    namespace TEXT NOT NULL,
    job       TEXT COLLATE "C" NOT NULL,
    upstream  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (namespace, upstream, job)
);
CREATE INDEX job_dependencies_by_job ON job_dependencies (namespace, job);

ALTER TABLE jobs ADD COLUMN has_dependencies BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE runs ADD COLUMN waiting_reason TEXT;
ALTER TABLE runs ADD COLUMN waiting_for TEXT;
ALTER TABLE runs ADD COLUMN waiting_until BIGINT;
UPDATE runs SET waiting_reason = 'overlap' WHERE state = 'waiting';
CREATE INDEX runs_waiting_dependencies ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'dependencies';
"#,
    r#"
-- Version 6 (SQLite's 5): events.
CREATE TABLE events (
    id             BIGSERIAL PRIMARY KEY,
    namespace      TEXT   NOT NULL,
    key            TEXT   COLLATE "C" NOT NULL,
    event_id       TEXT   COLLATE "C" NOT NULL,
    payload        TEXT   NOT NULL,
    occurred_at    BIGINT NOT NULL,
    emitted_by_run BIGINT,
    UNIQUE (namespace, key, event_id)
);
CREATE INDEX events_by_key ON events (namespace, key, occurred_at);
CREATE INDEX events_by_instant ON events (namespace, occurred_at);
CREATE INDEX events_by_age ON events (occurred_at);

CREATE TABLE event_subscriptions (
    namespace TEXT NOT NULL,
    key       TEXT COLLATE "C" NOT NULL,
    job       TEXT COLLATE "C" NOT NULL,
    role      TEXT NOT NULL,
    PRIMARY KEY (namespace, key, role, job)
);
CREATE INDEX event_subscriptions_by_job ON event_subscriptions (namespace, job);

ALTER TABLE jobs ADD COLUMN emits TEXT;
ALTER TABLE jobs ADD COLUMN priority_auto BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN event_key TEXT;
ALTER TABLE runs ADD COLUMN event_id TEXT;
"#,
    r#"
-- Version 7: a worker asked to drain gets no new attempts (SQLite's version 7).
ALTER TABLE workers ADD COLUMN draining BOOLEAN NOT NULL DEFAULT false;
"#,
    r#"
-- Version 8: job versions (SQLite's version 8). A job's `version` counts its definitions;
-- every definition is kept in `job_versions` (the newest `shared::KEPT_VERSIONS` of each job),
-- and each run records the version it was fired under.
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
CREATE TABLE job_versions (
    job_id     BIGINT  NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    version    INTEGER NOT NULL,
    spec       TEXT    NOT NULL,
    created_at BIGINT  NOT NULL,
    PRIMARY KEY (job_id, version)
);
INSERT INTO job_versions (job_id, version, spec, created_at)
    SELECT id, 1, spec, updated_at FROM jobs;
ALTER TABLE runs ADD COLUMN job_version INTEGER;
"#,
    r#"
-- Version 9: notifications, and the pings of heartbeat jobs (SQLite's version 9). A job's and a namespace's `notify` rules are
-- copied out of their definitions (NULL: none given); `notify_late` marks a rule for `late`.
-- A notification is recorded once per (run, event, rule) and sent by whichever node claims it.
ALTER TABLE jobs ADD COLUMN notify TEXT;
ALTER TABLE jobs ADD COLUMN notify_late BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE namespaces ADD COLUMN notify TEXT;
ALTER TABLE namespaces ADD COLUMN notify_late BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX jobs_notify_late ON jobs (id) WHERE notify_late;
CREATE TABLE notifications (
    id           BIGSERIAL PRIMARY KEY,
    namespace    TEXT    NOT NULL,
    job          TEXT    NOT NULL,
    run_id       BIGINT  NOT NULL,
    event        TEXT    NOT NULL,
    rule         INTEGER NOT NULL,
    channel      TEXT    NOT NULL,
    message      TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    sends        INTEGER NOT NULL,
    last_error   TEXT,
    created_at   BIGINT  NOT NULL,
    next_send_at BIGINT  NOT NULL,
    sent_at      BIGINT,
    claim        BIGINT  NOT NULL,
    UNIQUE (run_id, event, rule)
);
CREATE INDEX notifications_due ON notifications (next_send_at, id) WHERE state = 'pending';
CREATE INDEX notifications_by_namespace ON notifications (namespace, id);
CREATE INDEX notifications_by_age ON notifications (created_at);
-- Heartbeat jobs: `ping_grace` (micros) marks one and says how long each run waits for a
-- ping; `last_ping_at` keeps a ping that came while no run waited, for the next run to credit.
ALTER TABLE jobs ADD COLUMN job_metrics BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN ping_grace BIGINT;
ALTER TABLE jobs ADD COLUMN last_ping_at BIGINT;
CREATE INDEX runs_waiting_pings ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'ping';
"#,
    r#"
-- Version 10: sharded and broadcast jobs (SQLite's version 10). A job with `shards: N`
-- records N runs per instant, so the ledger key gains the shard: (job, instant, shard), shard
-- 0 for every run of a job that is not sharded. `shard_count` is N as the job said when the
-- instant fired. A broadcast job's shards are one per worker, each pinned to its worker
-- (`pinned_worker`); `runs_pinned` finds those whose worker was lost.
ALTER TABLE jobs ADD COLUMN shards INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN broadcast BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN shard_count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN pinned_worker TEXT;
ALTER TABLE runs DROP CONSTRAINT runs_job_instant_key,
    ADD CONSTRAINT runs_ledger_key UNIQUE (job_id, scheduled_for, shard);
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
-- Version 12: queued runs by id, as on SQLite. A cluster node's sweep for runs no announcement
-- brought it pages through these, and a node starting reads them in this order: both cost the
-- queue's length, not the ledger's.
CREATE INDEX runs_queued ON runs (id) WHERE state = 'queued';
"#,
    r#"
-- Version 13: runs, attempts and output partitioned by the run's instant, so that retention
-- drops a partition of expired runs whole instead of deleting them row by row
-- (`partitions.rs`). A partitioned table's unique keys must hold its partition key: the
-- ledger key has `scheduled_for`, so that is the key, and attempts and output carry their
-- run's instant (`run_scheduled_for`) to be partitioned alike. Ids are keys of each partition
-- (`partitions::LOCAL_KEYS`): a run's attempts and output sit in its partition, and the ids
-- come from one sequence each, so they are unique across them too. No table references
-- another: retention deletes a run's attempts and output with it.
--
-- What the tables held becomes one partition of each, `*_legacy`, with its keys and indexes,
-- for every instant before the upgrade (its attempts and output say instant 0, below them
-- all). Later instants go to `*_default` until time partitions are made ahead of the clock.
ALTER TABLE output DROP CONSTRAINT output_attempt_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_run_id_fkey;
ALTER TABLE attempts ADD COLUMN run_scheduled_for BIGINT NOT NULL DEFAULT 0;
ALTER TABLE output ADD COLUMN run_scheduled_for BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ALTER COLUMN id DROP IDENTITY;
ALTER TABLE attempts ALTER COLUMN id DROP IDENTITY;
ALTER TABLE runs RENAME TO runs_legacy;
ALTER TABLE attempts RENAME TO attempts_legacy;
ALTER TABLE output RENAME TO output_legacy;
ALTER INDEX runs_pkey RENAME TO runs_legacy_pkey;
ALTER INDEX runs_ledger_key RENAME TO runs_legacy_ledger_key;
ALTER INDEX runs_by_job_name RENAME TO runs_legacy_by_job_name;
ALTER INDEX runs_by_namespace RENAME TO runs_legacy_by_namespace;
ALTER INDEX runs_active RENAME TO runs_legacy_active;
ALTER INDEX runs_finished RENAME TO runs_legacy_finished;
ALTER INDEX runs_waiting_dependencies RENAME TO runs_legacy_waiting_dependencies;
ALTER INDEX runs_waiting_pings RENAME TO runs_legacy_waiting_pings;
ALTER INDEX runs_pinned RENAME TO runs_legacy_pinned;
ALTER INDEX runs_overlap_waiting RENAME TO runs_legacy_overlap_waiting;
ALTER INDEX runs_queued RENAME TO runs_legacy_queued;
ALTER INDEX attempts_pkey RENAME TO attempts_legacy_pkey;
ALTER INDEX attempts_run_id_number_key RENAME TO attempts_legacy_run_id_number_key;
ALTER INDEX attempts_running RENAME TO attempts_legacy_running;
ALTER INDEX attempts_leases RENAME TO attempts_legacy_leases;
ALTER INDEX output_pkey RENAME TO output_legacy_pkey;

CREATE SEQUENCE runs_id_seq;
SELECT setval('runs_id_seq', coalesce(max(id), 0) + 1, false) FROM runs_legacy;
CREATE TABLE runs (LIKE runs_legacy INCLUDING DEFAULTS) PARTITION BY RANGE (scheduled_for);
ALTER TABLE runs ALTER COLUMN id SET DEFAULT nextval('runs_id_seq');
ALTER SEQUENCE runs_id_seq OWNED BY runs.id;
ALTER TABLE runs ADD CONSTRAINT runs_ledger_key UNIQUE (job_id, scheduled_for, shard);
CREATE INDEX runs_by_job_name ON runs (namespace, job, scheduled_for DESC, id DESC);
CREATE INDEX runs_by_namespace ON runs (namespace, scheduled_for DESC, id DESC);
CREATE INDEX runs_active ON runs (job_id, state) WHERE state IN ('waiting', 'queued', 'running');
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX runs_waiting_dependencies ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'dependencies';
CREATE INDEX runs_waiting_pings ON runs (waiting_until)
    WHERE state = 'waiting' AND waiting_reason = 'ping';
CREATE INDEX runs_pinned ON runs (pinned_worker)
    WHERE state = 'queued' AND pinned_worker IS NOT NULL;
CREATE INDEX runs_overlap_waiting ON runs (job_id)
    WHERE state = 'waiting' AND waiting_reason = 'overlap';
CREATE INDEX runs_queued ON runs (id) WHERE state = 'queued';

CREATE SEQUENCE attempts_id_seq;
SELECT setval('attempts_id_seq', coalesce(max(id), 0) + 1, false) FROM attempts_legacy;
CREATE TABLE attempts (LIKE attempts_legacy INCLUDING DEFAULTS)
    PARTITION BY RANGE (run_scheduled_for);
ALTER TABLE attempts ALTER COLUMN id SET DEFAULT nextval('attempts_id_seq'),
    ALTER COLUMN run_scheduled_for DROP DEFAULT;
ALTER SEQUENCE attempts_id_seq OWNED BY attempts.id;
CREATE INDEX attempts_running ON attempts (worker_id) WHERE state = 'running';
CREATE INDEX attempts_leases ON attempts (lease_expires_at) WHERE state = 'running';

CREATE TABLE output (LIKE output_legacy INCLUDING DEFAULTS)
    PARTITION BY RANGE (run_scheduled_for);
ALTER TABLE output ALTER COLUMN run_scheduled_for DROP DEFAULT;

-- The time partitions: `name` makes the tables' names (`runs_<name>` and its siblings);
-- `starts` is NULL for the legacy partition, which holds every instant before `ends`.
CREATE TABLE run_partitions (
    name   TEXT   PRIMARY KEY,
    starts BIGINT,
    ends   BIGINT NOT NULL
);
DO $$
DECLARE
    upgraded BIGINT;
BEGIN
    SELECT greatest(coalesce(max(scheduled_for) + 1, 0),
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
        INTO upgraded FROM runs_legacy;
    EXECUTE format('ALTER TABLE runs ATTACH PARTITION runs_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%s)', upgraded);
    EXECUTE format('ALTER TABLE attempts ATTACH PARTITION attempts_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%s)', upgraded);
    EXECUTE format('ALTER TABLE output ATTACH PARTITION output_legacy '
                   'FOR VALUES FROM (MINVALUE) TO (%s)', upgraded);
    INSERT INTO run_partitions (name, starts, ends) VALUES ('legacy', NULL, upgraded);
END
$$;
-- With the keys every partition has (`partitions::LOCAL_KEYS`).
CREATE TABLE runs_default PARTITION OF runs DEFAULT;
ALTER TABLE runs_default ADD PRIMARY KEY (id);
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;
ALTER TABLE attempts_default ADD PRIMARY KEY (id), ADD UNIQUE (run_id, number);
CREATE TABLE output_default PARTITION OF output DEFAULT;
ALTER TABLE output_default ADD PRIMARY KEY (attempt_id, "offset");
"#,
    r#"
-- Version 14: no index on a job's next instant. Every fire moves `next_fire_at`, and an
-- indexed column that moves makes PostgreSQL write the row anew with an entry in every index
-- of `jobs` (no HOT update), so each fire grew all of them. Nothing reads jobs in that order:
-- the schedule is read a page at a time by id.
DROP INDEX jobs_scheduled;
"#,
    r#"
-- Version 15: a worker that stopped cleanly says so (`stopped`: not alive, and not lost), and a
-- server node's broker publisher is told apart from the workers (`publisher`).
ALTER TABLE workers ADD COLUMN stopped BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE workers ADD COLUMN publisher BOOLEAN NOT NULL DEFAULT false;
"#,
    r#"
-- Version 16: a rule that tells only the first failure of a streak and repeats while it lasts
-- (`failures: first`, `repeat`) reads when it last told of a failure of the job.
CREATE INDEX notifications_by_rule ON notifications (namespace, job, rule, created_at);
"#,
    r#"
-- Version 17: a logout ends every console session of its token made before it (SQLite's
-- version 14).
ALTER TABLE tokens ADD COLUMN sessions_ended_at BIGINT;
"#,
    r#"
-- Version 18: business-day calendars, and runs that remember a moved instant (SQLite's
-- version 15). A namespace's calendars, each kept whole as its JSON definition.
CREATE TABLE calendars (
    namespace  TEXT    NOT NULL,
    name       TEXT    COLLATE "C" NOT NULL,
    spec       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    created_at BIGINT  NOT NULL,
    updated_at BIGINT  NOT NULL,
    PRIMARY KEY (namespace, name)
);
-- The instant a schedule named when its calendar moved the run to `scheduled_for`; NULL for
-- a run at its own instant. Added to the partitioned parent, so every partition, the legacy
-- and default ones and those made later, has it.
ALTER TABLE runs ADD COLUMN nominal_for BIGINT;
"#,
    r#"
-- Version 19: deadlines (SQLite's version 16). A job with a `deadline` is flagged for the
-- watcher that judges its runs.
ALTER TABLE jobs ADD COLUMN has_deadline BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX jobs_with_deadline ON jobs (id) WHERE has_deadline;
-- A run's deadlines as the watcher resolved them, those it missed, and when it was called at
-- risk (JSON; NULL for the runs of jobs without a deadline). The partial indexes hold only
-- the marked runs.
ALTER TABLE runs ADD COLUMN deadline TEXT;
ALTER TABLE runs ADD COLUMN deadline_missed TEXT;
ALTER TABLE runs ADD COLUMN at_risk TEXT;
CREATE INDEX runs_deadline_missed ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE deadline_missed IS NOT NULL;
CREATE INDEX runs_at_risk ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE at_risk IS NOT NULL;
"#,
    r#"
-- Version 20: flow control by key (SQLite's version 17). The attempts holding each
-- concurrency key, counted while the attempt runs and swept by the next start that reads the
-- key; each rate key's theoretical arrival time (micros); the limits named in a namespace.
CREATE TABLE flow_holders (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    attempt_id BIGINT NOT NULL,
    run_id BIGINT NOT NULL,
    run_scheduled_for BIGINT NOT NULL,
    job TEXT NOT NULL,
    since BIGINT NOT NULL,
    PRIMARY KEY (namespace, key, attempt_id)
);
CREATE TABLE flow_rates (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    tat BIGINT NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE TABLE flow_limits (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
"#,
    r#"
-- Version 21: triggers under debounce and dedup (SQLite's version 18). A run's trigger
-- parameters and what a debounced run absorbed (JSON); the run a dedup key answers with until
-- its window ends; the debounced run pending for a key. Each key's row is the lock two nodes
-- triggering with one key serialise on (`INSERT … ON CONFLICT DO NOTHING`, then `FOR UPDATE`).
ALTER TABLE runs ADD COLUMN params TEXT;
ALTER TABLE runs ADD COLUMN absorbed TEXT;
CREATE TABLE flow_dedup (
    job_id BIGINT NOT NULL,
    key TEXT NOT NULL,
    run_id BIGINT NOT NULL,
    recorded_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX flow_dedup_expiry ON flow_dedup (expires_at);
CREATE TABLE flow_debounce (
    job_id BIGINT NOT NULL,
    key TEXT NOT NULL,
    run_id BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX flow_debounce_expiry ON flow_debounce (expires_at);
"#,
    r#"
-- Version 22: the runs not yet ended, newest first per namespace (SQLite's version 19).
CREATE INDEX runs_unended ON runs (namespace, scheduled_for DESC, id DESC)
    WHERE state IN ('waiting', 'queued', 'running');
"#,
    r#"
-- Version 23: each job's schedule kind as a column derived from the definition (SQLite's
-- version 20), stored, so the planner keeps statistics of it and the job list filters by
-- kind on an index. Adding it rewrites the jobs table once.
ALTER TABLE jobs ADD COLUMN schedule_kind TEXT GENERATED ALWAYS AS (CASE
    WHEN spec::jsonb #>> '{schedule,cron}' IS NOT NULL THEN 'cron'
    WHEN spec::jsonb #>> '{schedule,every}' IS NOT NULL THEN 'every'
    WHEN spec::jsonb #>> '{schedule,iso8601}' IS NOT NULL THEN 'iso8601'
    WHEN spec::jsonb #>> '{schedule,at}' IS NOT NULL THEN 'at'
    WHEN spec::jsonb #>> '{schedule,event}' IS NOT NULL THEN 'event'
    WHEN spec::jsonb #>> '{schedule,business_day}' IS NOT NULL THEN 'business_day'
    WHEN spec::jsonb #>> '{schedule,every_business_days}' IS NOT NULL
        THEN 'every_business_days'
    ELSE 'manual' END) STORED;
CREATE INDEX jobs_by_kind ON jobs (namespace, schedule_kind, name);
"#,
    r#"
-- Version 24: the trace a run joined (SQLite's version 21).
ALTER TABLE runs ADD COLUMN trace_parent TEXT;
ALTER TABLE events ADD COLUMN trace_parent TEXT;
"#,
];

/// The first key of the advisory lock migrations hold (the second is the schema's name).
const MIGRATION_LOCK: i32 = 0x736b_6564; // "sked"

/// Brings the schema to the newest version in one transaction, under the advisory lock.
/// `where_` names the database in errors.
pub async fn migrate(client: &mut tokio_postgres::Client, where_: &str) -> PgResult<()> {
    let open = |e: tokio_postgres::Error| {
        Fail::Store(StoreError::Open(format!(
            "{where_}: {}",
            StoreError::from(e)
        )))
    };
    let tx = client.transaction().await.map_err(open)?;
    let migrated = apply(&tx, where_, open).await;
    // Rolled back here rather than when dropped: a store that fails to open is dropped at once,
    // and its connection with it, before a rollback queued by the drop would be sent.
    match migrated {
        Ok(()) => tx.commit().await.map_err(open),
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

async fn apply(
    tx: &tokio_postgres::Transaction<'_>,
    where_: &str,
    open: impl Fn(tokio_postgres::Error) -> Fail + Copy,
) -> PgResult<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))",
        &[&MIGRATION_LOCK],
    )
    .await
    .map_err(open)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS sked_schema ( \
             id      INTEGER PRIMARY KEY CHECK (id = 1), \
             version INTEGER NOT NULL); \
         INSERT INTO sked_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    )
    .await
    .map_err(open)?;
    let version: i32 = tx
        .query_one("SELECT version FROM sked_schema WHERE id = 1", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(open)?;
    let current = usize::try_from(version).map_err(|_| {
        Fail::Store(StoreError::Open(format!(
            "{where_}: schema version {version} is not a version"
        )))
    })?;
    if current > latest_version() {
        return Err(Fail::Store(StoreError::Open(format!(
            "{where_} has schema version {version}, newer than this sked knows ({}); \
             run a newer sked",
            latest_version()
        ))));
    }
    if current < latest_version() {
        for sql in MIGRATIONS.iter().skip(current) {
            tx.batch_execute(sql).await.map_err(open)?;
        }
        let latest = latest_version() as i32;
        tx.execute(
            "UPDATE sked_schema SET version = $1 WHERE id = 1",
            &[&latest],
        )
        .await
        .map_err(open)?;
    }
    Ok(())
}

/// The migrations up to `version`, as one script: how a test builds a database as an older
/// sked left it, to upgrade it.
pub fn migrations_through(version: usize) -> String {
    MIGRATIONS[..version.min(MIGRATIONS.len())].join("\n")
}

/// The newest schema version this build knows.
pub fn latest_version() -> usize {
    MIGRATIONS.len()
}

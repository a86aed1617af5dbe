#!/usr/bin/env bash
# What a table of runs in flight would save on PostgreSQL, measured on the ledger's own table
# shape before building it into the store.
#
# No update of a run is HOT today: `state` and `finished_at` are in indexes of `runs` (the
# partial ones the hot path seeks by), so every update writes an entry in all of them, the four
# full ones included. This script replays a run's life (inserted queued, set running, set
# succeeded: one statement per batch and step, in staggered batches as the ledger writes them)
# against two shapes in a scratch schema:
#
#   today      `runs` with all of its indexes, fillfactor 100
#   in-flight  `runs` with only the indexes of columns that never change, at FILLFACTOR, and a
#              narrow `runs_in_flight` table with the partial indexes, kept by statement
#              triggers (a row while the run is waiting, queued or running)
#
# and prints, per run: WAL bytes, wall time in the database (one psql session), the share of
# updates of `runs` that were HOT, and the bytes the tables and their indexes hold at the end.
#
#   bench/hot-updates.sh [--database-url URL] [--runs N] [--batch N] [--fillfactor "100 70 50"]
#
# Needs psql and a database it may create and drop the schema `sked_bench_hot` in.
set -euo pipefail

url=${SKED_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
runs=100000
batch=250
fillfactors="100 80 60 50"
while [ $# -gt 0 ]; do
  case $1 in
    --database-url) url=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --fillfactor) fillfactors=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ && $batch =~ ^[1-9][0-9]*$ ]] || { echo "--runs and --batch take positive integers" >&2; exit 2; }
for ff in $fillfactors; do
  [[ $ff =~ ^[0-9]+$ ]] && [ "$ff" -ge 10 ] && [ "$ff" -le 100 ] || { echo "a fillfactor is 10 to 100, not $ff" >&2; exit 2; }
done
batches=$(( (runs + batch - 1) / batch ))
runs=$(( batches * batch ))

scratch=$(mktemp -d)
sql() { PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 -d "$url" "$@"; }
cleanup() { sql -c "DROP SCHEMA IF EXISTS sked_bench_hot CASCADE" >/dev/null 2>&1 || true; rm -rf "$scratch"; }
trap cleanup EXIT

# The columns of `runs` as the store's schema has them at version 14.
table() {
  cat <<SQL
DROP SCHEMA IF EXISTS sked_bench_hot CASCADE;
CREATE SCHEMA sked_bench_hot;
SET search_path = sked_bench_hot;
CREATE TABLE runs (
    id BIGINT PRIMARY KEY, job_id BIGINT NOT NULL, namespace TEXT NOT NULL,
    job TEXT COLLATE "C" NOT NULL, scheduled_for BIGINT NOT NULL, trigger TEXT NOT NULL,
    state TEXT NOT NULL, skip_reason TEXT, priority INTEGER NOT NULL, ready_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL, started_at BIGINT, finished_at BIGINT,
    attempts INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT false, error TEXT, waiting_reason TEXT,
    waiting_for TEXT, waiting_until BIGINT, event_key TEXT, event_id TEXT, job_version INTEGER,
    shard INTEGER NOT NULL DEFAULT 0, shard_count INTEGER NOT NULL DEFAULT 1, pinned_worker TEXT,
    CONSTRAINT runs_ledger_key UNIQUE (job_id, scheduled_for, shard)
) WITH (fillfactor = $1);
CREATE INDEX runs_by_job_name ON runs (namespace, job, scheduled_for DESC, id DESC);
CREATE INDEX runs_by_namespace ON runs (namespace, scheduled_for DESC, id DESC);
SQL
}

today() {
  table 100
  cat <<'SQL'
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
SQL
}

in_flight() {
  table "$1"
  cat <<'SQL'
CREATE TABLE runs_in_flight (
    run_id BIGINT PRIMARY KEY, job_id BIGINT NOT NULL, state TEXT NOT NULL,
    waiting_reason TEXT, waiting_until BIGINT, pinned_worker TEXT);
CREATE INDEX runs_in_flight_by_job ON runs_in_flight (job_id, state);
CREATE INDEX runs_in_flight_queued ON runs_in_flight (run_id) WHERE state = 'queued';
CREATE INDEX runs_in_flight_waiting ON runs_in_flight (waiting_until)
    WHERE state = 'waiting' AND waiting_reason IN ('dependencies', 'ping');
CREATE INDEX runs_in_flight_pinned ON runs_in_flight (pinned_worker)
    WHERE state = 'queued' AND pinned_worker IS NOT NULL;
CREATE FUNCTION runs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs_in_flight (run_id, job_id, state, waiting_reason, waiting_until, pinned_worker)
  SELECT id, job_id, state, waiting_reason, waiting_until, pinned_worker FROM new_rows
  WHERE state IN ('waiting', 'queued', 'running');
  RETURN NULL;
END $$;
CREATE FUNCTION runs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM runs_in_flight f USING new_rows n
  WHERE f.run_id = n.id AND n.state NOT IN ('waiting', 'queued', 'running');
  UPDATE runs_in_flight f SET state = n.state, waiting_reason = n.waiting_reason,
      waiting_until = n.waiting_until, pinned_worker = n.pinned_worker
  FROM new_rows n WHERE f.run_id = n.id AND n.state IN ('waiting', 'queued', 'running');
  INSERT INTO runs_in_flight (run_id, job_id, state, waiting_reason, waiting_until, pinned_worker)
  SELECT n.id, n.job_id, n.state, n.waiting_reason, n.waiting_until, n.pinned_worker
  FROM new_rows n JOIN old_rows o ON o.id = n.id
  WHERE n.state IN ('waiting', 'queued', 'running')
    AND o.state NOT IN ('waiting', 'queued', 'running');
  RETURN NULL;
END $$;
CREATE TRIGGER runs_inserted AFTER INSERT ON runs REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runs_inserted();
CREATE TRIGGER runs_updated AFTER UPDATE ON runs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runs_updated();
SQL
}

# Batch k is inserted while batch k-1 starts and batch k-2 completes, each its own statement
# and transaction, as the ledger's fire, start and completion batches overlap.
workload() {
  echo "SET search_path = sked_bench_hot;"
  local k a b
  for (( k = 0; k < batches + 2; k++ )); do
    if (( k < batches )); then
      a=$(( k * batch + 1 )); b=$(( (k + 1) * batch ))
      echo "INSERT INTO runs SELECT g, g % 1000, 'default', 'job-' || (g % 1000), 1700000000000000 + g, 'schedule', 'queued', NULL, 0, 1700000000000000 + g, 1700000000000000 + g, NULL, NULL, 0, 0, false, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 1, NULL FROM generate_series($a, $b) g;"
    fi
    if (( k >= 1 && k - 1 < batches )); then
      a=$(( (k - 1) * batch + 1 )); b=$(( k * batch ))
      echo "UPDATE runs SET state = 'running', started_at = created_at + 1000, attempts = 1 WHERE id BETWEEN $a AND $b AND state = 'queued';"
    fi
    if (( k >= 2 )); then
      a=$(( (k - 2) * batch + 1 )); b=$(( (k - 1) * batch ))
      echo "UPDATE runs SET state = 'succeeded', finished_at = created_at + 2000 WHERE id BETWEEN $a AND $b;"
    fi
  done
}
workload > "$scratch/workload.sql"

measure() { # name, schema script
  sql -f "$2" >/dev/null
  local l0 l1 t0 t1
  l0=$(sql -At -c "SELECT pg_current_wal_insert_lsn()")
  t0=$(date +%s%N)
  sql -f "$scratch/workload.sql" >/dev/null
  t1=$(date +%s%N)
  l1=$(sql -At -c "SELECT pg_current_wal_insert_lsn()")
  sql -At -F $'\t' -c "
    SELECT '$1',
      round(pg_wal_lsn_diff('$l1', '$l0') / $runs),
      round(($t1 - $t0) / 1000.0 / $runs, 1),
      round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1)),
      round(sum(pg_relation_size(c.oid)) FILTER (WHERE c.relkind = 'r')::numeric / $runs),
      round(sum(pg_relation_size(c.oid)) FILTER (WHERE c.relkind = 'i')::numeric / $runs)
    FROM pg_stat_user_tables s, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE s.schemaname = 'sked_bench_hot' AND s.relname = 'runs' AND n.nspname = 'sked_bench_hot'
    GROUP BY n_tup_hot_upd, n_tup_upd"
}

printf 'shape\tWAL B/run\tdb us/run\tHOT %%\theap B/run\tindex B/run\n'
today > "$scratch/today.sql"
measure today "$scratch/today.sql"
for ff in $fillfactors; do
  in_flight "$ff" > "$scratch/in-flight.sql"
  measure "in-flight, fillfactor $ff" "$scratch/in-flight.sql"
done
today > "$scratch/today.sql"
measure "today, again" "$scratch/today.sql"

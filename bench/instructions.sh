#!/usr/bin/env bash
# CPU instructions per run, in the sked nodes and in PostgreSQL, counted by callgrind.
#
# The benchmarks elsewhere report CPU time, which moves with the machine and with whatever else
# runs on it; an instruction count does not. This starts a private PostgreSQL cluster and N
# `sked server` nodes, each under `valgrind --tool=callgrind`, with one real `sked worker` per
# node (not counted), applies no-op shell jobs that fire every second, lets them run for
# SECONDS, and stops everything gracefully, so that every counted process writes its count as
# it exits. It does this twice on the same timeline, with LOW jobs and with HIGH jobs: the
# difference in instructions over the difference in runs completed (the nodes'
# `sked_completions_accepted_total`) is what one more run costs. What does not grow with the
# runs (start-up, the schema, the nodes' and the database's own timers, each statement's first
# planning) cancels out. What the nodes' loops do each second over timelines whose lengths
# differ under callgrind, or a connection more in a pool, does not: the figure spreads between
# runs (docs/BENCHMARKS.md, "Instructions per run, counted by callgrind"), so read it as an
# order of magnitude.
#
# Callgrind cannot be asked for a count in the middle of a run here: PostgreSQL's backends are
# forked, and a forked process under valgrind has no control pipe of its own.
#
# Callgrind runs code some 50 times slower, so the rates here are tens of runs a second, not
# thousands: batches are small, and a run carries more of each pass's fixed cost than it does
# at full speed. Read the figures as the cost of a run without batching's help.
#
# The database is a fresh one, whose tables hold a few thousand rows at most; PostgreSQL would
# scan them whole where a store in service has them large enough for its indexes. So the
# cluster runs with `enable_seqscan=off`, for the plans of a store in service, and `jit=off`,
# since the costs that setting adds to scans would otherwise have every statement compiled, and
# `autovacuum=off`, for a worker that visits the new database in one timeline and not in the
# other moved the difference by billions of instructions.
# `--pg-option NAME=VALUE` sets more (repeatable).
#
# Usage: bench/instructions.sh [--nodes N] [--jobs LOW:HIGH] [--seconds S] [--sked-bin PATH]
#                              [--pg-option NAME=VALUE]...
# Prints one JSON object. Needs valgrind and PostgreSQL's server binaries (initdb, postgres);
# run as root it runs PostgreSQL as the `postgres` user.
set -euo pipefail

nodes=1 jobs=10:40 seconds=40 sked_bin=""
pg_options=(-c enable_seqscan=off -c jit=off -c autovacuum=off)
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes) nodes="$2"; shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --sked-bin) sked_bin="$2"; shift 2 ;;
        --pg-option) pg_options+=(-c "$2"); shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[[ "$jobs" =~ ^([0-9]+):([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ] ||
    { echo "--jobs wants LOW:HIGH, two job counts with LOW below HIGH" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)"
sked_bin="${sked_bin:-$here/target/release/sked}"
[ -x "$sked_bin" ] || { echo "no sked binary at $sked_bin (cargo build --release -p sked)" >&2; exit 2; }
command -v valgrind > /dev/null || { echo "valgrind is not installed" >&2; exit 2; }
pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2> /dev/null | sort -V | tail -1)"
[ -x "$pg_bin/postgres" ] || { echo "no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 2; }

top="$(mktemp -d /tmp/sked-instructions.XXXXXX)"
chmod 755 "$top"   # PostgreSQL may run as another user
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2> /dev/null || true; done
    # Run as another user, PostgreSQL is not among `pids` (its parent, runuser, is).
    for data in "$top"/run.*/pg; do
        [ -e "$data/postmaster.pid" ] &&
            "${as_pg[@]}" "$pg_bin/pg_ctl" stop -D "$data" -m immediate > /dev/null 2>&1
    done
    wait 2> /dev/null || true
    rm -rf "$top"
}
trap cleanup EXIT
as_pg=()
[ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
callgrind=(valgrind --tool=callgrind --dump-instr=no --log-file=/dev/null)
export SKED_RATE_LIMIT=0 NO_COLOR=1 RUST_LOG=warn

ready() {
    for _ in $(seq 600); do
        curl -fs "$1/readyz" > /dev/null && return 0
        sleep 0.2
    done
    echo "$1 did not become ready" >&2
    return 1
}
# The sum of each counted process's instructions, from the files callgrind wrote at exit
# (each file's `summary:` line; its `totals:` line says the same again).
instructions() {
    cat "$@" | awk '/^summary:/ {sum += $2} END {printf "%d\n", sum}'
}

# One timeline with `$1` jobs; prints "runs sked_instructions postgres_instructions".
measure() {
    local jobs="$1" dir pg_port url base port i completed=0 n
    local bases=() workers=() servers=()
    dir="$(mktemp -d "$top/run.XXXXXX")"
    chmod 755 "$dir"
    mkdir -p "$dir/cg" "$dir/pg" "$dir/sock"
    [ ${#as_pg[@]} -gt 0 ] && chown -R postgres "$dir/cg" "$dir/pg" "$dir/sock"

    pg_port="$(free_port)"
    "${as_pg[@]}" "$pg_bin/initdb" -D "$dir/pg" -U postgres --auth=trust --no-sync > "$dir/initdb.log"
    "${as_pg[@]}" "${callgrind[@]}" --callgrind-out-file="$dir/cg/postgres.%p" \
        "$pg_bin/postgres" -D "$dir/pg" -p "$pg_port" -k "$dir/sock" \
        -c listen_addresses=127.0.0.1 "${pg_options[@]}" > "$dir/postgres.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 300); do
        "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" && break
        sleep 0.2
    done
    "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres sked
    url="postgres://postgres@127.0.0.1:$pg_port/sked"

    # The nodes share one admin token and one secret key: the first node writes them.
    export SKED_ADMIN_TOKEN_FILE="$dir/admin.token" SKED_SECRET_KEY_FILE="$dir/secret.key"
    for i in $(seq 0 $((nodes - 1))); do
        port="$(free_port)"
        "${callgrind[@]}" --callgrind-out-file="$dir/cg/sked.%p" \
            "$sked_bin" server --database-url "$url" --listen "127.0.0.1:$port" \
            --data-dir "$dir/node$i" > "$dir/node$i.log" 2>&1 &
        servers+=($!)
        pids+=($!)
        bases+=("http://127.0.0.1:$port")
        ready "http://127.0.0.1:$port"
    done
    export SKED_TOKEN="$(cat "$dir/admin.token")"
    # One real worker per node, natively: its cost is not sked's.
    for base in "${bases[@]}"; do
        "$sked_bin" worker --server "$base" --slots 32 > "$dir/worker-${base##*:}.log" 2>&1 &
        workers+=($!)
        pids+=($!)
    done
    if [ "$jobs" -gt 0 ]; then
        {
            echo "jobs:"
            for j in $(seq 1 "$jobs"); do
                printf '  - name: noop-%04d\n    schedule: {every: 1s}\n' "$j"
                printf '    target: {shell: {command: "true"}}\n'
            done
        } > "$dir/jobs.yaml"
        "$sked_bin" job apply --server "${bases[0]}" -f "$dir/jobs.yaml" > /dev/null
    fi
    sleep "$seconds"

    for base in "${bases[@]}"; do
        n="$(curl -fs -H "authorization: Bearer $SKED_TOKEN" "$base/metrics" |
            awk '$1 == "sked_completions_accepted_total" {print $2}')"
        completed=$((completed + ${n%.*}))
    done
    # Workers first, so no node waits on a worker's attempt as it stops; then the nodes, then
    # the database (a fast shutdown: its backends exit, and write their counts).
    kill -TERM "${workers[@]}" 2> /dev/null || true
    wait "${workers[@]}" 2> /dev/null || true
    kill -TERM "${servers[@]}"
    wait "${servers[@]}" 2> /dev/null || true
    "${as_pg[@]}" "$pg_bin/pg_ctl" stop -D "$dir/pg" -m fast -w -t 120 > /dev/null
    echo "$completed $(instructions "$dir"/cg/sked.*) $(instructions "$dir"/cg/postgres.*)"
    # All stopped: their ids may be another process's by the time `cleanup` runs.
    pids=()
}

# In this shell, not a subshell, so that `cleanup` knows every process to stop.
measure "${jobs%:*}" > "$top/low"
measure "${jobs#*:}" > "$top/high"
python3 - "$nodes" "$seconds" "${jobs%:*}" $(cat "$top/low") "${jobs#*:}" $(cat "$top/high") <<'PY'
import json, sys
nodes, seconds, *points = map(int, sys.argv[1:])
low, high = points[:4], points[4:]
keys = ("jobs", "runs_completed", "sked_instructions", "postgres_instructions")
runs = high[1] - low[1]
per_run = lambda i: round((high[i] - low[i]) / runs) if runs > 0 else None
print(json.dumps({
    "nodes": nodes, "seconds": seconds,
    "low": dict(zip(keys, low)), "high": dict(zip(keys, high)),
    "sked_instructions_per_run": per_run(2), "postgres_instructions_per_run": per_run(3),
}))
PY

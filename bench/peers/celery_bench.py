"""Celery peer of sked-bench: Celery beat and Celery workers on Redis (broker and result
backend), measured in the scenarios of sked-bench and reported with the same JSON keys; and
Celery beat publishing to RabbitMQ (the `publish` scenario).

This file is both the benchmark driver (run it as a script) and the Celery application that
the worker and beat processes it starts import (`celery -A celery_bench`): the tasks, the
drift-free schedule class and the recording beat scheduler live here.

Scenarios (see README.md beside this file for how each maps to sked's):
  firing --schedules N --seconds S [--every 60s] [--worker]
                                                beat with N entries, each every period, anchors
                                                spread over it
  e2e --schedules R --every 1s --seconds S      R runs per second, by beat (default) or by a
      [--producer beat|direct]                  producer calling apply_async (--producer direct)
  burst --runs N                                N tasks published at one instant
  shell --seconds S                             shell process starts per second on one worker
  publish --schedules N --every 5 --seconds S   beat with N entries, each every 5 s, publishing
                                                to RabbitMQ; a consumer counts what arrives

Everything lives in one Redis database (--redis-url, db 15 by default), flushed with FLUSHDB at
the start of every run; nothing else of the Redis server is touched. `publish` does not use
Redis at all: it runs in a RabbitMQ vhost of its own, created for the run and deleted after it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from celery import Celery
from celery.beat import BeatLazyFunc, PersistentScheduler, Scheduler
from celery.schedules import schedstate, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (shared code of the peer benchmarks, beside this file)

REDIS_URL = os.environ.get("PEERBENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
# The processes this script starts for `publish` (beat) get the RabbitMQ vhost of the run as
# their broker and no result backend; every other scenario uses Redis for both.
BROKER_URL = os.environ.get("PEERBENCH_BROKER_URL", REDIS_URL)
BACKEND_URL = os.environ.get("PEERBENCH_BACKEND_URL", REDIS_URL)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
QUEUE = "peerbench"
NOOP = "peerbench.noop"
SHELL = "peerbench.shell"
META_PATTERN = "celery-task-meta-*"
# The header that carries a beat entry's name in `publish` (Celery 5.7's beat adds only
# `celery_beat_task: True`, not the entry's name).
ENTRY_HEADER = "peerbench_entry"

app = Celery("peerbench", broker=BROKER_URL, backend=BACKEND_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    enable_utc=True,
    timezone="UTC",
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=int(os.environ.get("PEERBENCH_PREFETCH", "4")),
    worker_hijack_root_logger=False,
    broker_transport_options=json.loads(os.environ.get("PEERBENCH_BROKER_OPTIONS", "{}")),
)


@app.task(name=NOOP)
def noop(due=None):
    """A no-op run: returns the instant it was due for and the instant it started."""
    return {"due": due, "started": time.time()}


@app.task(name=SHELL)
def shell(command="true"):
    """One shell process start (`/bin/sh -c COMMAND`, output captured, as sked's shell target
    does); returns when it started and its exit code."""
    started = time.time()
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=False)
    return {"started": started, "returncode": done.returncode}


# --------------------------------------------------------------------------------------------
# Beat: a schedule on a fixed grid, and a scheduler that records every publish.
# --------------------------------------------------------------------------------------------


class GridSchedule(schedule):
    """Every `period` seconds at the instants anchor + k·period (seconds since the epoch).

    Celery's own `schedule(run_every)` is due `run_every` after the last run, so each late fire
    pushes all later ones back by its lateness (drift), and all entries of the same interval
    would be anchored at beat's start. This class keeps each entry on its own fixed grid, as
    sked's `every` with an `anchor` does: it is due at the first grid instant after the last
    run, and a fire more than a period late serves the latest grid instant (Celery beat does not
    catch up on missed instants: they are skipped). `due_now` gives the grid instant a publish
    serves; it is called by beat through a BeatLazyFunc in the entry's kwargs, so each message
    carries its instant.
    """

    _EPS = 1e-6

    def __init__(self, period, anchor=0.0, nowfun=None, app=None):
        super().__init__(run_every=period, nowfun=nowfun, app=app)
        self.period = float(period)
        self.anchor = float(anchor)
        self.sent_due = None

    def last_at_or_before(self, t: float) -> float:
        return self.anchor + math.floor((t - self.anchor) / self.period + self._EPS) * self.period

    def first_after(self, t: float) -> float:
        return self.last_at_or_before(t) + self.period

    def remaining_estimate(self, last_run_at):
        nxt = self.first_after(self.maybe_make_aware(last_run_at).timestamp())
        return timedelta(seconds=max(nxt - time.time(), 0.0))

    def is_due(self, last_run_at):
        nxt = self.first_after(self.maybe_make_aware(last_run_at).timestamp())
        now = time.time()
        if now >= nxt:
            return schedstate(is_due=True, next=self.first_after(now) - now)
        return schedstate(is_due=False, next=nxt - now)

    def due_now(self) -> float:
        self.sent_due = self.last_at_or_before(time.time())
        return self.sent_due

    def __reduce__(self):
        return self.__class__, (self.period, self.anchor, self.nowfun)

    def __eq__(self, other):
        if isinstance(other, GridSchedule):
            return (self.period, self.anchor) == (other.period, other.anchor)
        return NotImplemented

    def __hash__(self):
        return hash((self.period, self.anchor))

    def __repr__(self):
        return f"<grid: every {self.period}s from {self.anchor}>"


def _beat_schedule_from_env() -> dict:
    """The beat entries described by PEERBENCH_BEAT (set only in the beat process):
    {"entries": N, "period": P, "base": T, "spread": bool, "carry_due": bool}. With spread,
    entry i is anchored at base + i·P/N; without, every entry at base. With carry_due (the
    default) each message carries the grid instant it serves (a BeatLazyFunc in its kwargs);
    without, the message is stock: no kwargs, and the entry's name in the ENTRY_HEADER header
    (a static option of the entry, nothing evaluated per publish)."""
    spec = os.environ.get("PEERBENCH_BEAT")
    if not spec:
        return {}
    spec = json.loads(spec)
    n, period, base = int(spec["entries"]), float(spec["period"]), float(spec["base"])
    carry_due = spec.get("carry_due", True)
    entries = {}
    for i in range(n):
        anchor = base + (i * period / n if spec["spread"] else 0.0)
        grid = GridSchedule(period, anchor)
        name = f"e{i:07d}"
        if carry_due:
            entries[name] = {
                "task": NOOP,
                "schedule": grid,
                "kwargs": {"due": BeatLazyFunc(grid.due_now)},
                "options": {"queue": QUEUE},
            }
        else:
            entries[name] = {
                "task": NOOP,
                "schedule": grid,
                "options": {"queue": QUEUE, "headers": {ENTRY_HEADER: name}},
            }
    return entries


app.conf.beat_schedule = _beat_schedule_from_env()


class _RecordingMixin:
    """Records, for every message beat publishes, the entry, the grid instant it serves and the
    wall-clock time right after the publish returned. Lines are buffered and written to the file
    named by PEERBENCH_RECORDS about once a second and at close. Once the schedule is set up it
    writes the time to PEERBENCH_READY."""

    _records_file = None
    _buffer: list
    _last_flush = 0.0

    def setup_schedule(self):
        super().setup_schedule()
        self._buffer = []
        path = os.environ.get("PEERBENCH_RECORDS")
        if path:
            self._records_file = open(path, "a", buffering=1 << 20)
        ready = os.environ.get("PEERBENCH_READY")
        if ready:
            tmp = ready + ".tmp"
            Path(tmp).write_text(repr(time.time()))
            os.replace(tmp, ready)

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        result = super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        published = time.time()
        grid = entry.schedule
        if self._records_file is not None and isinstance(grid, GridSchedule):
            self._buffer.append(f"{entry.name} {grid.sent_due!r} {published!r}\n")
            if published - self._last_flush > 1.0:
                self._flush()
        return result

    def _flush(self):
        self._records_file.writelines(self._buffer)
        self._records_file.flush()
        self._buffer = []
        self._last_flush = time.time()

    def close(self):
        if self._records_file is not None:
            self._flush()
            self._records_file.close()
            self._records_file = None
        super().close()


class RecordingPersistentScheduler(_RecordingMixin, PersistentScheduler):
    """Celery's default scheduler (entries and their last run kept in a shelve file, synced
    every 3 minutes), recording each publish."""


class RecordingMemoryScheduler(_RecordingMixin, Scheduler):
    """Celery's in-memory base scheduler, recording each publish."""


SCHEDULERS = {
    "persistent": "celery_bench:RecordingPersistentScheduler",
    "memory": "celery_bench:RecordingMemoryScheduler",
}


# --------------------------------------------------------------------------------------------
# The driver: processes, Redis, results.
# --------------------------------------------------------------------------------------------


class Run:
    """The processes and files of one benchmark run; `close` stops every process it started."""

    def __init__(self, args):
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="peerbench-celery-"))
        self.workers: list = []
        self.beat = None
        self.consumer = None
        self.vhost = None
        self.redis = None
        if args.scenario != "publish":  # publish runs in a RabbitMQ vhost and needs no Redis
            self.redis = _redis_client(args.redis_url)
            self.redis.flushdb()  # this database only (db 15 by default), never FLUSHALL

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(common.HERE) + os.pathsep + env.get("PYTHONPATH", "")
        env["PEERBENCH_REDIS_URL"] = self.args.redis_url
        env["PEERBENCH_PREFETCH"] = str(self.args.prefetch)
        env.update(extra)
        return env

    def start_workers(self, count=None):
        a = self.args
        count = a.workers if count is None else count
        for i in range(count):
            cmd = [
                sys.executable, "-m", "celery", "-A", "celery_bench", "worker",
                "--pool", a.pool, "--concurrency", str(a.concurrency),
                "--queues", QUEUE, "--hostname", f"peerbench{i}@%h",
                "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ]
            log = self.dir / f"worker{i}.log"
            self.workers.append(common.start_process(cmd, env=self.env(), cwd=self.dir, log_path=log))
        deadline = time.time() + 60
        while time.time() < deadline:
            for i, w in enumerate(self.workers):
                if w.poll() is not None:
                    raise RuntimeError(f"celery worker {i} exited:\n{common.tail(self.dir / f'worker{i}.log')}")
            replies = app.control.ping(timeout=1.0)
            if len(replies) >= count:
                return
        raise RuntimeError(f"celery workers not answering a ping after 60 s:\n{common.tail(self.dir / 'worker0.log')}")

    def start_beat(self, entries: int, period: float, base: float, spread: bool,
                   carry_due: bool = True, **extra_env) -> float:
        """Start beat with `entries` grid entries; returns the time its schedule was set up.
        With carry_due False (publish) the messages are stock and beat records nothing."""
        self.records = self.dir / "published.txt"
        ready = self.dir / "beat-ready"
        spec = {"entries": entries, "period": period, "base": base, "spread": spread, "carry_due": carry_due}
        env = self.env(PEERBENCH_BEAT=json.dumps(spec), PEERBENCH_READY=str(ready), **extra_env)
        if carry_due:
            env["PEERBENCH_RECORDS"] = str(self.records)
        cmd = [
            sys.executable, "-m", "celery", "-A", "celery_bench", "beat",
            "--scheduler", SCHEDULERS[self.args.beat_scheduler],
            "--schedule", str(self.dir / "beat-schedule"),
            "--pidfile", str(self.dir / "beat.pid"),
            "--loglevel", "WARNING",
        ]
        self.beat = common.start_process(cmd, env=env, cwd=self.dir, log_path=self.dir / "beat.log")
        deadline = time.time() + 60 + entries / 500
        while time.time() < deadline:
            if self.beat.poll() is not None:
                raise RuntimeError(f"celery beat exited:\n{common.tail(self.dir / 'beat.log')}")
            if ready.exists():
                return float(ready.read_text())
            time.sleep(0.05)
        raise RuntimeError(f"celery beat not set up after {deadline:.0f} s:\n{common.tail(self.dir / 'beat.log')}")

    def stop_beat(self):
        common.stop_process(self.beat, grace=30)
        self.beat = None

    def stop_workers(self):
        for w in self.workers:
            common.stop_process(w, grace=10)
        self.workers = []

    # RabbitMQ (publish): a vhost of the run's own, so that runs never mix; deleted in close.

    def rabbitmqctl(self, *args):
        done = subprocess.run([self.args.rabbitmqctl, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stderr or done.stdout}")
        return done.stdout

    def create_vhost(self) -> str:
        """Create the vhost `peerbench-PID-EPOCH`, give the URL's user all rights on it, and
        return the URL of the vhost."""
        parts = urlsplit(self.args.amqp_url)
        name = f"peerbench-{os.getpid()}-{int(time.time())}"
        self.rabbitmqctl("add_vhost", name)
        self.vhost = name
        self.rabbitmqctl("set_permissions", "-p", name, unquote(parts.username or "guest"), ".*", ".*", ".*")
        return urlunsplit((parts.scheme, parts.netloc, "/" + quote(name, safe=""), "", ""))

    def delete_vhost(self):
        if self.vhost is not None:
            try:
                self.rabbitmqctl("delete_vhost", self.vhost)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                print(f"warning: vhost {self.vhost} not deleted: {exc}", file=sys.stderr)
            self.vhost = None

    def start_consumer(self, url: str) -> None:
        """Start amqp_consumer.py on QUEUE of the vhost and wait until it consumes."""
        self.consumer_out = self.dir / "received.txt"
        self.consumer_stop = self.dir / "consumer-stop"
        ready = self.dir / "consumer-ready"
        cmd = [
            sys.executable, str(common.HERE / "amqp_consumer.py"), "--url", url, "--queue", QUEUE,
            "--exchange", QUEUE, "--key-header", ENTRY_HEADER, "--out", str(self.consumer_out),
            "--ready", str(ready), "--stop-file", str(self.consumer_stop),
        ]
        log = self.dir / "consumer.log"
        self.consumer = common.start_process(cmd, env=self.env(), cwd=self.dir, log_path=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.consumer.poll() is not None:
                raise RuntimeError(f"the AMQP consumer exited:\n{common.tail(log)}")
            if ready.exists():
                return
            time.sleep(0.05)
        raise RuntimeError(f"the AMQP consumer not consuming after 30 s:\n{common.tail(log)}")

    def stop_consumer(self) -> dict:
        """Tell the consumer to stop, wait for it to write what it received; returns its
        counters (its lines are read by `received`)."""
        if self.consumer is None:
            return {}
        self.consumer_stop.write_text("stop")
        try:
            self.consumer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        common.stop_process(self.consumer, grace=5)
        self.consumer = None
        stats = {}
        if self.consumer_out.exists():
            with open(self.consumer_out) as f:
                for line in f:
                    if line.startswith("# stats "):
                        stats = json.loads(line[len("# stats "):])
        return stats

    def received(self):
        """(entry index, received) of every message the consumer took, in arrival order;
        messages without the entry header are left out (counted by the consumer)."""
        out = []
        with open(self.consumer_out) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                name, at = line.split()
                if name.startswith("e"):
                    out.append((int(name[1:]), float(at)))
        return out

    def published(self):
        """(entry index, due, published) of every message beat published."""
        out = []
        if self.records.exists():
            with open(self.records) as f:
                for line in f:
                    name, due, published = line.split()
                    out.append((int(name[1:]), float(due), float(published)))
        return out

    def close(self):
        self.stop_beat()
        self.stop_workers()
        if self.consumer is not None:
            common.stop_process(self.consumer, grace=5)
            self.consumer = None
        self.delete_vhost()
        if self.redis is not None:
            self.redis.flushdb()  # leave the database as empty as it was found
        if not self.args.keep:
            shutil.rmtree(self.dir)
        else:
            print(f"kept {self.dir}", file=sys.stderr)


def _redis_client(url):
    import redis

    return redis.Redis.from_url(url)


def count_results(r) -> int:
    return sum(1 for _ in r.scan_iter(match=META_PATTERN, count=5000))


def read_results(r) -> list:
    """Every stored task result: (result dict, date_done as epoch seconds), read after the
    measured window with SCAN and MGET in batches."""
    keys = list(r.scan_iter(match=META_PATTERN, count=5000))
    out = []
    for i in range(0, len(keys), 2000):
        for raw in r.mget(keys[i:i + 2000]):
            if raw is None:
                continue
            meta = json.loads(raw)
            if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), dict):
                continue
            done = datetime.fromisoformat(meta["date_done"])
            if done.tzinfo is None:
                done = done.replace(tzinfo=timezone.utc)
            out.append((meta["result"], done.timestamp()))
    return out


def versions(r, rabbitmq=None) -> dict:
    import celery
    import kombu
    import redis

    out = {
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_py": redis.__version__,
        "redis_server": r.info("server").get("redis_version") if r is not None else None,
        "python": platform.python_version(),
    }
    if rabbitmq is not None:
        import amqp
        import pika

        out.pop("redis_py")
        out.pop("redis_server")
        out.update({"amqp": amqp.__version__, "pika": pika.__version__, "rabbitmq_server": rabbitmq})
    return out


def peak_rss_bytes(pid: int):
    """The peak resident set size of a live process (VmHWM), in bytes; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker_config(a) -> dict:
    return {"workers": a.workers, "pool": a.pool, "concurrency": a.concurrency, "prefetch_multiplier": a.prefetch}


def parse_every(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def firing(a, run: Run) -> dict:
    n, seconds, period = a.schedules, a.seconds, parse_every(a.every)
    if a.worker:
        run.start_workers()
    base = time.time()
    created = time.time()
    ready_at = run.start_beat(n, period, base, spread=True)
    start_to_ready = ready_at - created
    start = time.time()
    frm = start + 1.0
    to = frm + seconds
    # A second past the window, as sked-bench does, so its last instants can be published.
    common.sleep_until(to + 1.0 + (a.grace if a.worker else 0.0))
    run.stop_beat()
    run.stop_workers()

    owed = {}
    for i in range(n):
        anchor = base + i * period / n
        t = anchor + math.ceil((frm - anchor) / period) * period
        while t < to:
            owed[(i, round((t - anchor) / period))] = 0
            t += period
    lateness, unexpected = [], 0
    total_published = 0
    for i, due, published in run.published():
        total_published += 1
        if not (frm <= due < to):
            continue
        lateness.append(published - due)
        key = (i, round((due - (base + i * period / n)) / period))
        if key in owed:
            owed[key] += 1
        else:
            unexpected += 1
    lost = sum(1 for c in owed.values() if c == 0)
    doubled = sum(1 for c in owed.values() if c > 1)
    p = common.ms_percentiles(lateness)
    figures = {
        "scenario": "firing",
        "peer": "celery",
        "variant": f"beat ({a.beat_scheduler} scheduler)" + (" + workers" if a.worker else ""),
        "schedules": n,
        "fires_per_second": n / period,
        "window_seconds": seconds,
        "fires_expected": len(owed),
        "fires_recorded": p.pop("count"),
        "fires_lost": lost,
        "fires_doubled": doubled,
        "fires_unexpected": unexpected,
        "lateness_ms": p,
        "published_total": total_published,
        "start_to_ready_seconds": round(start_to_ready, 3),
    }
    if not a.worker:
        figures["messages_left_in_queue"] = run.redis.llen(QUEUE)
    else:
        started = [res["started"] - res["due"] for res, _ in read_results(run.redis)
                   if res.get("due") is not None and frm <= res["due"] < to]
        sp = common.ms_percentiles(started, keys=("p50", "p90", "p99", "max"))
        figures["started_recorded"] = sp.pop("count")
        figures["started_lateness_ms"] = sp
        figures["worker"] = worker_config(a)
    figures["notes"] = (
        f"celery beat ({a.beat_scheduler} scheduler, log level WARNING) with {n} entries each every "
        f"60 s on a fixed grid, anchors spread evenly over the minute (GridSchedule: due at "
        f"anchor + k*60 s, no drift; late fires skip missed instants as beat does). "
        f"lateness_ms = grid instant -> apply_async of the message to Redis returned, recorded in "
        f"beat; window of {seconds} s starting 1 s after beat had set up its schedule; beat stopped "
        f"1 s after the window. fires_recorded = messages published for instants of the window; "
        f"fires_lost = owed instants never published by then. Not durable per fire: beat's "
        f"schedule file is synced every 3 minutes."
        + (f" started_lateness_ms = instant -> task body started on a worker ({worker_config(a)})."
           if a.worker else " No worker ran; the messages stay in the queue.")
    )
    return figures


def e2e(a, run: Run) -> dict:
    rate, period, seconds = a.schedules, parse_every(a.every), a.seconds
    run.start_workers()
    published_direct = []
    if a.producer == "beat":
        ready_at = run.start_beat(rate, period, 0.0, spread=False)
        frm = math.ceil(ready_at) + 2.0
    else:
        frm = math.ceil(time.time()) + 2.0
    to = frm + seconds
    deadline = to + a.grace
    if a.producer == "direct":
        published_direct = direct_producer(rate, period, frm - period, to, deadline)
    common.sleep_until(deadline)
    run.stop_beat()
    results = read_results(run.redis)
    run.stop_workers()

    if a.producer == "beat":
        published = [(due, pub) for _, due, pub in run.published()]
    else:
        published = published_direct
    in_window = [(due, pub) for due, pub in published if frm <= due < to]
    ok = [(res, done) for res, done in results
          if res.get("due") is not None and frm <= res["due"] < to and done <= deadline]
    recorded = common.ms_percentiles([done - res["due"] for res, done in ok], keys=("p50", "p99", "max"))
    started = common.ms_percentiles([res["started"] - res["due"] for res, _ in ok], keys=("p50", "p99", "max"))
    pub = common.ms_percentiles([pub - due for due, pub in in_window], keys=("p50", "p99", "max"))
    count = recorded.pop("count")
    started.pop("count")
    pub.pop("count")
    offered = int(rate * seconds / period)
    who = ("celery beat (%s scheduler), %d entries every %gs, all on the same grid instants"
           % (a.beat_scheduler, rate, period)) if a.producer == "beat" else (
        "a Python producer calling apply_async %d times at each %gs instant (one connection; "
        "no scheduler: Celery's best case)" % (rate, period))
    return {
        "scenario": "e2e",
        "peer": "celery",
        "variant": f"{a.producer} producer + workers",
        "schedules": rate,
        "every": a.every,
        "window_seconds": seconds,
        "runs_offered": offered,
        "runs_in_window": len(in_window),
        "succeeded_in_window": count,
        "runs_per_second": count / seconds,
        "instant_to_recorded_ms": recorded,
        "instant_to_started_ms": started,
        "instant_to_published_ms": pub,
        "worker": worker_config(a),
        "notes": (
            f"{who} -> Redis -> Celery workers ({worker_config(a)}) run a no-op task -> result "
            f"stored in the Redis result backend. runs_per_second = results of the window's "
            f"instants stored by {a.grace:g} s after the window / {seconds} s; "
            f"instant_to_recorded_ms = instant -> result's date_done (set by the worker when "
            f"storing it). runs_in_window = messages published for the window's instants. Redis "
            f"keeps the queue and results in memory: not durable like sked's ledger."
        ),
    }


def direct_producer(rate: int, period: float, first: float, to: float, deadline: float) -> list:
    """Publish `rate` no-op tasks at each instant first, first+period, ... before `to`, each
    carrying its instant; late instants are published late rather than skipped, until
    `deadline`. Returns (due, published) of every message."""
    out = []
    t = first
    with app.producer_or_acquire() as producer:
        while t < to and time.time() < deadline:
            common.sleep_until(t)
            for _ in range(rate):
                noop.apply_async(kwargs={"due": t}, producer=producer, queue=QUEUE)
                out.append((t, time.time()))
                if time.time() >= deadline:
                    break
            t += period
    return out


def burst(a, run: Run) -> dict:
    n = a.runs
    run.start_workers()
    time.sleep(1.0)  # let the workers settle into polling the empty queue
    t0 = time.time()
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            noop.apply_async(kwargs={"due": t0}, producer=producer, queue=QUEUE)
    published_all = time.time() - t0
    deadline = t0 + a.timeout
    done = 0
    while time.time() < deadline:
        done = count_results(run.redis)
        if done >= n:
            break
        time.sleep(0.5)
    results = [(res, d) for res, d in read_results(run.redis) if res.get("due") == t0]
    run.stop_workers()
    finished = len(results)
    all_done = finished >= n
    starts = [res["started"] - t0 for res, _ in results]
    dones = [d - t0 for _, d in results]
    return {
        "scenario": "burst",
        "peer": "celery",
        "variant": "direct producer + workers",
        "runs": n,
        "published_all_ms": round(published_all * 1000, 1),
        "dispatched_all_ms": round(max(starts) * 1000, 1) if all_done else None,
        "finished_all_ms": round(max(dones) * 1000, 1) if all_done else None,
        "finished": finished,
        "timed_out": not all_done,
        "started_ms": common.ms_percentiles(starts, keys=("p50", "p99", "max")),
        "worker": worker_config(a),
        "notes": (
            f"{n} no-op tasks published by one Python producer (a loop of apply_async on one "
            f"connection) starting at instant t0, all carrying t0; workers {worker_config(a)} "
            f"already running and idle. dispatched_all_ms = t0 -> the last task body started; "
            f"finished_all_ms = t0 -> the last result's date_done; published_all_ms = t0 -> the "
            f"last apply_async returned (so dispatch cannot beat it). Waited at most {a.timeout} s; "
            f"null figures with timed_out when not all finished by then."
        ),
    }


def shell_starts(a, run: Run) -> dict:
    seconds = a.seconds
    run.start_workers()
    backlog, low = 4000, 2000

    def top_up(producer):
        for _ in range(backlog):
            shell.apply_async(kwargs={"command": "true"}, producer=producer, queue=QUEUE)

    with app.producer_or_acquire() as producer:
        top_up(producer)
        frm = time.time() + 1.0
        to = frm + seconds
        while time.time() < to:
            if run.redis.llen(QUEUE) < low:
                top_up(producer)
            time.sleep(0.2)
    results = read_results(run.redis)
    run.stop_workers()
    starts = [res for res, _ in results if "returncode" in res and frm <= res["started"] < to]
    return {
        "scenario": "shell",
        "peer": "celery",
        "variant": "direct producer + one worker",
        "window_seconds": seconds,
        "starts_in_window": len(starts),
        "starts_per_second": len(starts) / seconds,
        "failed": sum(1 for res in starts if res["returncode"] != 0),
        "worker": worker_config(a),
        "notes": (
            f"Celery workers {worker_config(a)} running tasks that "
            f"each start `/bin/sh -c true` with output captured (subprocess.run); the queue is "
            f"kept above {low} messages so the worker never waits. starts_per_second = tasks "
            f"whose process started within the {seconds} s window / {seconds}."
        ),
    }


def publish(a, run: Run) -> dict:
    """Beat with N entries every P seconds publishing to RabbitMQ; no worker; a consumer in a
    process of its own records (entry, receipt time) of every message.

    The due instant. Beat's messages carry no instant (stock messages: no kwargs; only the entry's
    name, in a static header), so it is derived from the schedule: entry i is a GridSchedule
    with anchor_i = base + i*P/N (spread, the default) or base (--aligned), due at
    anchor_i + k*P. Beat publishes an entry when it finds it due and never catches up, so a
    message serves the latest instant of its entry at or before the moment beat published it;
    the receipt follows the publish by the broker's transit only (the consumer's backlog is
    reported, and is 0 when this holds), so that instant is
        served = anchor_i + floor((received - anchor_i) / P) * P.
    The count check is on served instants: each instant of the window owed by an entry was
    published exactly once, never (missed: beat skipped it), or more than once (duplicated).
    Measured from `served`, the lag could never reach P, however far behind beat is: it would
    hide what matters. So `lag_ms` is taken from the instant at which the entry fell due and
    was still unserved, which is beat's own due time: the first instant after the one its
    previous message served (for its first message of the run: the first instant after beat had
    set its schedule up, which is no earlier than the entry's creation, so never overstates
    the lag). When beat keeps up both are the same instant; when it falls behind, `lag_ms`
    grows with the instants it skipped. `lag_from_served_instant_ms` is the other one.
    """
    n, period, seconds = a.schedules, parse_every(a.every), a.seconds
    spread = not a.aligned
    url = run.create_vhost()
    run.start_consumer(url)
    options = {"confirm_publish": True} if a.confirm_publish else {}
    base = time.time()
    ready_at = run.start_beat(
        n, period, base, spread=spread, carry_due=False,
        PEERBENCH_BROKER_URL=url, PEERBENCH_BACKEND_URL="disabled",
        PEERBENCH_BROKER_OPTIONS=json.dumps(options),
    )
    beat_pid = run.beat.pid
    frm = ready_at + a.warmup
    to = frm + seconds
    common.sleep_until(to + a.grace)
    beat_rss = peak_rss_bytes(beat_pid)
    run.stop_beat()
    time.sleep(1.0)  # what beat published last reaches the consumer
    consumer = run.stop_consumer()
    received = run.received()

    def anchor(i: int) -> float:
        return base + (i * period / n if spread else 0.0)

    def grid_floor(i: int, t: float) -> int:
        # the k of the last instant anchor_i + k*P at or before t (1e-6: float noise at an instant)
        return math.floor((t - anchor(i)) / period + 1e-6)

    # Instants owed by the window [frm, to): entry i owes k in [k_lo, k_hi).
    owed = 0
    k_range = []
    for i in range(n):
        k_lo = math.ceil((frm - anchor(i)) / period - 1e-6)
        k_hi = math.ceil((to - anchor(i)) / period - 1e-6)
        k_range.append((k_lo, k_hi))
        owed += max(k_hi - k_lo, 0)

    served_counts: dict = {}
    lag, lag_served = [], []
    first_due_k = {}  # entry -> k of the instant it next falls due (beat's due time)
    k_ready = {}
    unexpected = 0
    received_in_window = 0
    for i, at in received:
        if not 0 <= i < n:
            unexpected += 1
            continue
        if frm <= at < to:
            received_in_window += 1
        k = grid_floor(i, at)
        if i not in first_due_k:
            if i not in k_ready:
                k_ready[i] = grid_floor(i, ready_at) + 1
            due_k = min(k_ready[i], k)
        else:
            due_k = min(first_due_k[i], k)
        first_due_k[i] = k + 1
        k_lo, k_hi = k_range[i]
        if not k_lo <= k < k_hi:
            continue  # an instant of the warm-up or after the window
        served_counts[(i, k)] = served_counts.get((i, k), 0) + 1
        lag.append(at - (anchor(i) + due_k * period))
        lag_served.append(at - (anchor(i) + k * period))
    published_once = sum(1 for c in served_counts.values() if c == 1)
    duplicated = sum(1 for c in served_counts.values() if c > 1)
    in_window = sum(served_counts.values())
    lp = common.ms_percentiles(lag)
    lp.pop("count")
    sp = common.ms_percentiles(lag_served)
    sp.pop("count")
    layout = (f"anchors spread evenly over the {period:g} s period (entry i at base + i*{period:g}/{n} s)"
              if spread else "all entries on the same instants")
    return {
        "scenario": "publish",
        "peer": "celery",
        "variant": f"beat ({a.beat_scheduler} scheduler) -> RabbitMQ"
                   + (" (publisher confirms)" if a.confirm_publish else ""),
        "schedules": n,
        "every": a.every,
        "window_seconds": seconds,
        "warmup_seconds": a.warmup,
        "messages_offered_per_second": n / period,
        "messages_expected": owed,
        "messages_expected_nominal": n * seconds / period,
        "messages_in_window": in_window,
        "messages_per_second": in_window / seconds,
        "received_in_window_per_second": received_in_window / seconds,
        "instants_published_once": published_once,
        "instants_missed": owed - len(served_counts),
        "instants_duplicated": duplicated,
        "messages_unexpected": unexpected + consumer.get("without_key", 0),
        "lag_ms": lp,
        "lag_from_served_instant_ms": sp,
        "beat_peak_rss_bytes": beat_rss,
        "beat_peak_rss_mb": round(beat_rss / 2**20, 1) if beat_rss else None,
        "received_total": len(received),
        "consumer_backlog_max": consumer.get("backlog_max"),
        "left_in_queue": consumer.get("left_in_queue"),
        "start_to_ready_seconds": round(ready_at - base, 3),
        "rabbitmq": {"vhost": "a vhost of the run's own, deleted after it", "queue": QUEUE,
                     "confirm_publish": a.confirm_publish},
        "notes": (
            f"celery beat ({a.beat_scheduler} scheduler, log level WARNING, no result backend) with "
            f"{n} entries each every {period:g} s on a fixed grid (GridSchedule), {layout}; the "
            f"task messages go to RabbitMQ (durable queue '{QUEUE}' in a vhost of the run's own"
            + (", publisher confirms on: each publish waits for the broker's ack" if a.confirm_publish
               else ", Celery's default: no publisher confirms")
            + f"). No worker: a pika consumer in its own process records (entry, receipt time) of "
            f"every message. Window of {seconds} s starting {a.warmup:g} s after beat had set up its "
            f"schedule (the warm-up is not counted); beat stopped {a.grace:g} s after the window. "
            f"An instant a message served = the last instant of its entry at or before its receipt "
            f"(anchor + k*{period:g} s; beat never catches up, so it serves the latest instant at "
            f"its publish). messages_per_second = messages serving the window's instants / "
            f"{seconds} s; instants_published_once/missed/duplicated count the window's owed "
            f"instants. lag_ms = the instant the entry fell due and was unserved (the first "
            f"instant after its previous message's, or after beat's start) -> receipt by the "
            f"consumer (sked's figure stops at the broker's confirm, which the receipt follows or "
            f"precedes by about the broker's transit); lag_from_served_instant_ms = served "
            f"instant -> receipt, below {period:g} s by construction. Beat's peak RSS is VmHWM."
        ),
    }


def main(argv=None) -> int:
    common.exit_cleanly_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=REDIS_URL, help="a Redis database of its own (flushed per run)")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--workers", type=int, help="Celery worker processes (nodes); default 2 (shell: 1)")
    parser.add_argument("--pool", choices=["prefork", "threads", "solo"], help="default solo (shell: prefork)")
    parser.add_argument("--concurrency", type=int, help="per worker; default 1 (shell: 2)")
    parser.add_argument("--prefetch", type=int, default=16, help="worker_prefetch_multiplier (Celery's default: 4)")
    parser.add_argument("--beat-scheduler", default="persistent", choices=sorted(SCHEDULERS))
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, records)")
    sub = parser.add_subparsers(dest="scenario", required=True)
    f = sub.add_parser("firing")
    f.add_argument("--schedules", type=int, default=10000)
    f.add_argument("--seconds", type=int, default=70)
    f.add_argument("--every", default="60s", help="each entry's period (sked-bench firing --every)")
    f.add_argument("--worker", action="store_true", help="run workers and report started_lateness_ms")
    f.add_argument("--grace", type=float, default=2.0)
    e = sub.add_parser("e2e")
    e.add_argument("--schedules", type=int, default=2000)
    e.add_argument("--every", default="1s")
    e.add_argument("--seconds", type=int, default=20)
    e.add_argument("--producer", default="beat", choices=["beat", "direct"])
    e.add_argument("--grace", type=float, default=2.0, help="seconds after the window results may land")
    b = sub.add_parser("burst")
    b.add_argument("--runs", type=int, default=10000)
    b.add_argument("--timeout", type=float, default=120.0)
    s = sub.add_parser("shell")
    s.add_argument("--seconds", type=int, default=10)
    pb = sub.add_parser("publish", help="beat publishing to RabbitMQ, counted by a consumer")
    pb.add_argument("--schedules", type=int, default=40000)
    pb.add_argument("--every", default="5s")
    pb.add_argument("--seconds", type=int, default=600, help="the measured window, after the warm-up")
    pb.add_argument("--warmup", type=float, default=10.0,
                    help="seconds after beat set its schedule up that are not measured (default 10: two periods of 5 s)")
    pb.add_argument("--grace", type=float, default=2.0, help="seconds after the window before beat is stopped")
    pb.add_argument("--aligned", action="store_true", help="every entry on the same instants (default: spread over the period)")
    pb.add_argument("--no-confirm-publish", dest="confirm_publish", action="store_false",
                    help="Celery's default publishing, without publisher confirms")
    pb.add_argument("--amqp-url", default=AMQP_URL, help="the broker; the run's vhost replaces its path")
    pb.add_argument("--rabbitmqctl", default="rabbitmqctl", help="creates and deletes the run's vhost")
    a = parser.parse_args(argv)
    # The worker setup that gave Celery its best no-op throughput on 2 cores (see README.md):
    # two solo workers; a shell run starts processes, so there one prefork worker of two.
    defaults = (1, "prefork", 2) if a.scenario == "shell" else (2, "solo", 1)
    a.workers = defaults[0] if a.workers is None else a.workers
    a.pool = a.pool or defaults[1]
    a.concurrency = defaults[2] if a.concurrency is None else a.concurrency
    app.conf.broker_url = app.conf.result_backend = a.redis_url

    run = Run(a)
    try:
        figures = {"firing": firing, "e2e": e2e, "burst": burst, "shell": shell_starts,
                   "publish": publish}[a.scenario](a, run)
        rabbitmq = run.rabbitmqctl("version").strip() if a.scenario == "publish" else None
        figures["versions"] = versions(run.redis, rabbitmq)
        figures["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    finally:
        run.close()
    common.emit(figures, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

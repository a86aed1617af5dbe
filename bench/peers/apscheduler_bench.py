"""APScheduler peer of sked-bench: APScheduler 3's BackgroundScheduler, its jobs in memory or
(`--store sqlite`) in SQLAlchemyJobStore on a SQLite file, measured in the scenarios of
sked-bench and reported with the same JSON keys.

Scenarios (see README.md beside this file for how each maps to sked's):
  firing --schedules N --seconds S [--every 60s]   N jobs each every period, start dates spread over it
  e2e --schedules R --every 1s ...   R jobs every second, run by the scheduler's thread pool
  burst --runs N                     N jobs with the same run_date

APScheduler has no remote workers: its executor (a thread pool in the scheduler's process) runs
a no-op function. Every figure is timed in this process with time.time():
  - submitted: right after the executor accepted the run (executor.submit_job returned), the
    equivalent of sked's "run queued";
  - started: the function's first statement (it returns that time);
  - finished: when the executor reports the run done (EVENT_JOB_EXECUTED listener).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (shared code of the peer benchmarks, beside this file)

UTC = timezone.utc


def noop():
    """A no-op run: returns the instant it started."""
    return time.time()


class RecordingThreadPoolExecutor(ThreadPoolExecutor):
    """APScheduler's default executor, recording (job id, scheduled instant, time) of every run
    right after it was accepted."""

    def __init__(self, max_workers, submitted: list):
        super().__init__(max_workers)
        self.submitted = submitted

    def submit_job(self, job, run_times):
        super().submit_job(job, run_times)
        now = time.time()
        for rt in run_times:
            self.submitted.append((job.id, rt.timestamp(), now))


class Bench:
    """One scheduler, its store, and what was recorded while it ran."""

    def __init__(self, args):
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="peerbench-apscheduler-"))
        self.submitted: list = []
        self.executed: list = []  # (job id, scheduled, started, finished)
        self.missed = 0
        self.max_instances = 0
        self.errors = 0
        if args.store == "sqlite":
            store = self._sqlite_store()
        else:
            store = MemoryJobStore()
        self.scheduler = BackgroundScheduler(
            timezone=UTC,
            jobstores={"default": store},
            executors={"default": RecordingThreadPoolExecutor(args.threads, self.submitted)},
            # Run every instant however late (APScheduler's default skips runs more than 1 s
            # late and allows one running instance per job): lateness is measured, not hidden.
            job_defaults={"coalesce": False, "misfire_grace_time": None, "max_instances": 10000},
        )
        self.scheduler.add_listener(self._on_event, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)

    def _sqlite_store(self):
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from sqlalchemy import create_engine, event

        engine = create_engine(f"sqlite:///{self.dir / 'jobs.sqlite'}")

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            # The durability sked's SQLite store has: WAL, synchronous=NORMAL (a killed process
            # loses nothing committed; no fsync per commit).
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return SQLAlchemyJobStore(engine=engine)

    def _on_event(self, ev):
        if ev.code == EVENT_JOB_EXECUTED:
            self.executed.append((ev.job_id, ev.scheduled_run_time.timestamp(), ev.retval, time.time()))
        elif ev.code == EVENT_JOB_MISSED:
            self.missed += 1
        elif ev.code == EVENT_JOB_MAX_INSTANCES:
            self.max_instances += 1
        else:
            self.errors += 1

    def stop(self, timeout=30.0) -> bool:
        """Shut the scheduler down without waiting for queued runs; False if its loop did not
        stop within `timeout` (it is a daemon thread then, ended with the process)."""
        if not self.scheduler.running:
            return True
        t = threading.Thread(target=self.scheduler.shutdown, kwargs={"wait": False}, daemon=True)
        t.start()
        t.join(timeout)
        return not t.is_alive()

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def counters(self) -> dict:
        return {"missed_events": self.missed, "max_instances_events": self.max_instances, "job_errors": self.errors}


def variant(a) -> str:
    store = "SQLAlchemyJobStore on SQLite (WAL, synchronous=NORMAL)" if a.store == "sqlite" else "MemoryJobStore"
    return f"BackgroundScheduler, {store}, ThreadPoolExecutor({a.threads})"


def versions() -> dict:
    import apscheduler

    out = {"apscheduler": apscheduler.__version__, "python": platform.python_version()}
    try:
        import sqlalchemy

        out["sqlalchemy"] = sqlalchemy.__version__
    except ImportError:
        pass
    return out


def firing(a, b: Bench) -> dict:
    n, seconds, period_us = a.schedules, a.seconds, round(parse_every(a.every) * 1e6)
    base_us = int(time.time() * 1e6)
    step_us = period_us // max(n, 1)
    created = time.time()
    for i in range(n):
        anchor = datetime.fromtimestamp((base_us + step_us * i) / 1e6, UTC)
        b.scheduler.add_job(noop, IntervalTrigger(seconds=period_us / 1e6, start_date=anchor, timezone=UTC),
                            id=f"j{i:07d}")
    b.scheduler.start()
    ready = time.time()
    frm = ready + 1.0
    to = frm + seconds
    common.sleep_until(to + 1.0 + a.grace)
    stopped = b.stop()

    frm_us, to_us = int(frm * 1e6), int(to * 1e6)
    owed = {}
    for i in range(n):
        anchor = base_us + step_us * i
        t = anchor + -((anchor - frm_us) // period_us) * period_us  # first at or after frm
        while t < to_us:
            owed[(f"j{i:07d}", round(t / 1000))] = 0
            t += period_us
    lateness, unexpected = [], 0
    for job, due, sub in list(b.submitted):
        if not (frm <= due < to) or sub > to + 1.0:
            continue
        lateness.append(sub - due)
        key = (job, round(due * 1000))
        if key in owed:
            owed[key] += 1
        else:
            unexpected += 1
    started = [s - due for _, due, s, _ in list(b.executed) if frm <= due < to]
    p = common.ms_percentiles(lateness)
    sp = common.ms_percentiles(started)
    return {
        "scenario": "firing",
        "peer": "apscheduler",
        "store": a.store,
        "variant": variant(a),
        "schedules": n,
        "every": a.every,
        "fires_per_second": n / (period_us / 1e6),
        "window_seconds": seconds,
        "fires_expected": len(owed),
        "fires_recorded": p.pop("count"),
        "fires_lost": sum(1 for c in owed.values() if c == 0),
        "fires_doubled": sum(1 for c in owed.values() if c > 1),
        "fires_unexpected": unexpected,
        "lateness_ms": p,
        "started_recorded": sp.pop("count"),
        "started_lateness_ms": sp,
        "create_jobs_seconds": round(ready - created, 3),
        "scheduler_stopped_cleanly": stopped,
        **b.counters(),
        "notes": (
            f"APScheduler {variant(a)}: {n} jobs, IntervalTrigger every {a.every} with start dates "
            f"spread evenly over the period (as sked-bench's anchors). lateness_ms = scheduled "
            f"instant -> the executor accepted the run (submit_job returned); started_lateness_ms "
            f"= instant -> the no-op function started in the pool. Window of {seconds} s from 1 s "
            f"after start; fires recorded up to 1 s after the window. misfire_grace_time=None, "
            f"coalesce=False, so late runs are run late rather than skipped."
            + (" The SQLite store commits each job's next run time after each fire; runs "
               "themselves are not recorded anywhere." if a.store == "sqlite" else
               " Nothing is durable: jobs and runs live in memory.")
        ),
    }


def e2e(a, b: Bench) -> dict:
    rate, seconds = a.schedules, a.seconds
    every = parse_every(a.every)
    start_at = datetime.fromtimestamp(math.floor(time.time()), UTC)
    created = time.time()
    for i in range(rate):
        b.scheduler.add_job(noop, IntervalTrigger(seconds=every, start_date=start_at, timezone=UTC), id=f"n{i:07d}")
    b.scheduler.start()
    ready = time.time()
    frm = math.ceil(ready) + 2.0
    to = frm + seconds
    deadline = to + a.grace
    common.sleep_until(deadline)
    executed = list(b.executed)
    submitted = list(b.submitted)
    stopped = b.stop()

    ok = [(due, s, f) for _, due, s, f in executed if frm <= due < to and f <= deadline]
    recorded = common.ms_percentiles([f - due for due, _, f in ok], keys=("p50", "p99", "max"))
    started = common.ms_percentiles([s - due for due, s, _ in ok], keys=("p50", "p99", "max"))
    sub = [t - due for _, due, t in submitted if frm <= due < to]
    subp = common.ms_percentiles(sub, keys=("p50", "p99", "max"))
    count = recorded.pop("count")
    started.pop("count")
    subp.pop("count")
    return {
        "scenario": "e2e",
        "peer": "apscheduler",
        "store": a.store,
        "variant": variant(a),
        "schedules": rate,
        "every": a.every,
        "window_seconds": seconds,
        "runs_offered": int(rate * seconds / every),
        "runs_in_window": len(sub),
        "succeeded_in_window": count,
        "runs_per_second": count / seconds,
        "instant_to_recorded_ms": recorded,
        "instant_to_started_ms": started,
        "instant_to_submitted_ms": subp,
        "create_jobs_seconds": round(ready - created, 3),
        "scheduler_stopped_cleanly": stopped,
        **b.counters(),
        "notes": (
            f"APScheduler {variant(a)}: {rate} jobs every {a.every}, all on the same instants. "
            f"No remote worker: the scheduler's own thread pool runs a no-op function. "
            f"runs_per_second = runs of the window's instants finished by {a.grace:g} s after the "
            f"window / {seconds} s; instant_to_recorded_ms = instant -> the executor reported "
            f"the function done (EVENT_JOB_EXECUTED; nothing is stored). runs_in_window = runs "
            f"of the window's instants submitted to the executor."
        ),
    }


def burst(a, b: Bench) -> dict:
    n = a.runs
    b.scheduler.start(paused=True)
    # How long adding the jobs takes, so that their common instant is still ahead once all
    # are in the store.
    far = datetime.fromtimestamp(time.time() + 86400, UTC)
    t = time.time()
    for k in range(200):
        b.scheduler.add_job(noop, DateTrigger(run_date=far), id=f"calibrate{k}")
    per_job = (time.time() - t) / 200
    b.scheduler.remove_all_jobs()
    t0_us = int((time.time() + per_job * n * 1.5 + 1.0) * 1e6)
    t0 = t0_us / 1e6
    run_date = datetime.fromtimestamp(t0, UTC)
    adding = time.time()
    for i in range(n):
        b.scheduler.add_job(noop, DateTrigger(run_date=run_date), id=f"b{i:07d}")
    added = time.time()
    b.scheduler.resume()
    deadline = t0 + a.timeout
    while time.time() < deadline and len(b.executed) < n:
        time.sleep(0.1)
    executed = [e for e in list(b.executed) if abs(e[1] - t0) < 0.001]
    submitted = list(b.submitted)
    stopped = b.stop()
    all_done = len(executed) >= n
    return {
        "scenario": "burst",
        "peer": "apscheduler",
        "store": a.store,
        "variant": variant(a),
        "runs": n,
        "submitted_all_ms": round((max(s for _, _, s in submitted) - t0) * 1000, 1) if len(submitted) >= n else None,
        "dispatched_all_ms": round((max(s for _, _, s, _ in executed) - t0) * 1000, 1) if all_done else None,
        "finished_all_ms": round((max(f for _, _, _, f in executed) - t0) * 1000, 1) if all_done else None,
        "finished": len(executed),
        "timed_out": not all_done,
        "jobs_added_before_instant": added <= t0,
        "add_jobs_seconds": round(added - adding, 3),
        "scheduler_stopped_cleanly": stopped,
        **b.counters(),
        "notes": (
            f"APScheduler {variant(a)}: {n} jobs with a DateTrigger at the same instant t0, "
            f"added while the scheduler was paused and resumed before t0. dispatched_all_ms = "
            f"t0 -> the last function started; finished_all_ms = t0 -> the last "
            f"EVENT_JOB_EXECUTED; submitted_all_ms = t0 -> the last run accepted by the "
            f"executor. Waited at most {a.timeout} s."
        ),
    }


def parse_every(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


def main(argv=None) -> int:
    common.exit_cleanly_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    parser.add_argument("--threads", type=int, default=10, help="executor threads (APScheduler's default: 10)")
    sub = parser.add_subparsers(dest="scenario", required=True)
    f = sub.add_parser("firing")
    f.add_argument("--schedules", type=int, default=10000)
    f.add_argument("--seconds", type=int, default=70)
    f.add_argument("--every", default="60s", help="each job's period (sked-bench firing --every)")
    f.add_argument("--grace", type=float, default=1.0, help="seconds past the window for runs to start")
    f.add_argument("--worker", action="store_true", help="accepted for symmetry; runs always execute here")
    e = sub.add_parser("e2e")
    e.add_argument("--schedules", type=int, default=2000)
    e.add_argument("--every", default="1s")
    e.add_argument("--seconds", type=int, default=20)
    e.add_argument("--grace", type=float, default=2.0)
    bp = sub.add_parser("burst")
    bp.add_argument("--runs", type=int, default=10000)
    bp.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args(argv)

    b = Bench(a)
    try:
        figures = {"firing": firing, "e2e": e2e, "burst": burst}[a.scenario](a, b)
        figures["versions"] = versions()
        figures["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
        common.emit(figures, a.json)
    finally:
        b.stop(timeout=10)
        b.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # The executor's threads may still be running a backlog of no-op runs after the figures
    # are out; do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

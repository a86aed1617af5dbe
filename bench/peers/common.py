"""Code shared by the peer benchmarks: percentiles computed exactly as sked-bench computes
them (nearest rank), child processes started in process groups of their own and stopped with a
bounded wait, SIGTERM turned into a clean exit, and the JSON output every benchmark prints.

Only the standard library is used here, so compare.py can import it without the peers' venv.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
VENV = REPO_ROOT / "target" / "peers-venv"

_PR_SET_PDEATHSIG = 1


def percentiles(values: Iterable[float], keys=("p50", "p90", "p99", "max")) -> dict:
    """Nearest-rank percentiles, the definition of sked_core::stats::percentiles (all zero and
    count 0 for no values). Values in, the same unit out."""
    v = sorted(values)
    out = {"count": len(v)}
    for key in keys:
        if not v:
            out[key] = 0.0
        elif key == "max":
            out[key] = v[-1]
        else:
            p = float(key[1:])
            idx = math.ceil(p / 100.0 * len(v))
            out[key] = v[min(max(idx, 1), len(v)) - 1]
    return out


def ms_percentiles(seconds: Iterable[float], keys=("p50", "p90", "p99", "max")) -> dict:
    """Percentiles of durations given in seconds, reported in milliseconds (count aside)."""
    p = percentiles(seconds, keys)
    return {k: (val if k == "count" else round(val * 1000.0, 3)) for k, val in p.items()}


def emit(figures: dict, json_path: Optional[str]) -> None:
    """Print the figures as JSON and write them to `json_path` too when given."""
    text = json.dumps(figures, indent=2, sort_keys=False)
    print(text, flush=True)
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def exit_cleanly_on_signals() -> None:
    """Make SIGTERM raise SystemExit and SIGINT raise KeyboardInterrupt (even when started
    with SIGINT ignored, as a background job is), so that `finally` blocks stop the children."""

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _die_with_parent() -> None:
    """In a child before exec: get SIGKILL when the parent dies (Linux), so that a benchmark
    killed without a chance to clean up does not leave its children running."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the process group is still stopped by stop_process


def start_process(cmd, *, env=None, cwd=None, log_path=None) -> subprocess.Popen:
    """Start `cmd` in a process group of its own (so that stop_process reaches its children
    too), its output to `log_path` (or discarded)."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        if log_path:
            out.close()


def stop_process(proc: Optional[subprocess.Popen], grace: float = 10.0) -> Optional[int]:
    """SIGTERM the process group of `proc`, wait up to `grace` seconds for its leader, then
    SIGKILL the whole group. Returns the leader's exit code (None if it had to be killed)."""
    if proc is None:
        return None
    code = None
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            code = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            code = None
    else:
        code = proc.returncode
    # Whatever the leader did, nothing of its group outlives this call.
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        print(f"warning: process {proc.pid} did not exit after SIGKILL", file=sys.stderr)
    return code


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def sleep_until(t: float) -> None:
    """Sleep until the wall-clock instant `t` (seconds since the epoch); at once if past."""
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def tail(path, lines: int = 20) -> str:
    """The last lines of a log file, for error messages."""
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"

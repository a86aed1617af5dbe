#!/usr/bin/env python3
"""Side-by-side runs of sked-bench and its peers (Celery, APScheduler): one command runs sked's
scenario and then each peer's same scenario with the same parameters, back to back on the same
machine, saves every JSON under bench/results/peers/, and prints one table per peer with the
figure, sked's value, the peer's value and their ratio, oriented so that a ratio above 1 means
sked is better (throughput: sked / peer; latency: peer / sked).

    python3 bench/peers/compare.py --scenario firing --schedules 1000 --seconds 60 --peers celery,apscheduler
    python3 bench/peers/compare.py --scenario e2e --schedules 2000 --seconds 20
    python3 bench/peers/compare.py --scenario burst --runs 10000
    python3 bench/peers/compare.py --scenario publish --schedules 40000 --every 5 --seconds 600 --peers celery-beat
    python3 bench/peers/compare.py --all

Needs target/release/sked-bench (`cargo build --release -p sked-bench`, or --sked-bench PATH;
not with --peers-only, which runs the peers alone) and the peers' environment
(`bench/peers/setup.sh`). A scenario the sked-bench at hand does not have is reported as "not
run" for sked and the peers still run. Runs only with the standard library; the
peers run in target/peers-venv. Every run is bounded in time: one that overruns is stopped
(SIGTERM to its process group, SIGKILL 30 s later) and reported as not finished.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HERE = common.HERE
ROOT = common.REPO_ROOT
RESULTS = ROOT / "bench" / "results" / "peers"

# Peer variants, the group each belongs to, and the scenarios each applies to.
VARIANTS = {
    "celery-beat": ("celery", {"firing", "e2e", "publish"}),
    "celery-direct": ("celery", {"e2e", "burst", "shell"}),
    "apscheduler-memory": ("apscheduler", {"firing", "e2e", "burst"}),
    "apscheduler-sqlite": ("apscheduler", {"firing", "e2e", "burst"}),
}

# The default suite of --all: (scenario, parameters). About 12 minutes on a 2-core machine.
SUITE = [
    ("firing", {"schedules": 1000, "every": "60s", "seconds": 60}),
    ("firing", {"schedules": 10000, "every": "60s", "seconds": 30}),
    ("e2e", {"schedules": 1000, "every": "1s", "seconds": 20}),
    ("burst", {"runs": 10000}),
    ("shell", {"seconds": 10}),
]


@dataclass
class Figure:
    label: str
    path: tuple  # keys into the JSON, or a list of such tuples: the first present is used
    better: str  # "higher" or "lower"
    unit: str  # "ms", "/s", "count"


FIGURES = {
    "firing": [
        Figure("fires recorded (of owed)", ("fires_recorded",), "higher", "count"),
        Figure("lateness p50", ("lateness_ms", "p50"), "lower", "ms"),
        Figure("lateness p90", ("lateness_ms", "p90"), "lower", "ms"),
        Figure("lateness p99", ("lateness_ms", "p99"), "lower", "ms"),
        Figure("lateness max", ("lateness_ms", "max"), "lower", "ms"),
        Figure("started lateness p50", ("started_lateness_ms", "p50"), "lower", "ms"),
        Figure("started lateness p99", ("started_lateness_ms", "p99"), "lower", "ms"),
        Figure("started lateness max", ("started_lateness_ms", "max"), "lower", "ms"),
    ],
    "e2e": [
        Figure("runs/s recorded", ("runs_per_second",), "higher", "/s"),
        Figure("succeeded in window", ("succeeded_in_window",), "higher", "count"),
        Figure("instant -> recorded p50", ("instant_to_recorded_ms", "p50"), "lower", "ms"),
        Figure("instant -> recorded p99", ("instant_to_recorded_ms", "p99"), "lower", "ms"),
        Figure("instant -> recorded max", ("instant_to_recorded_ms", "max"), "lower", "ms"),
    ],
    "burst": [
        # "Queued": sked's run in the ledger, Celery's message published, APScheduler's run
        # accepted by its executor.
        Figure("instant -> all queued", [("queued_all_ms",), ("published_all_ms",), ("submitted_all_ms",)], "lower", "ms"),
        Figure("instant -> all dispatched", ("dispatched_all_ms",), "lower", "ms"),
        Figure("instant -> all finished", ("finished_all_ms",), "lower", "ms"),
    ],
    "shell": [
        Figure("process starts/s", [("starts_per_second",), ("process_starts_per_second",)], "higher", "/s"),
    ],
    # The keys sked-bench's publish is to print too (bench/peers/README.md, "publish").
    "publish": [
        Figure("messages/s (confirmed / received)", ("messages_per_second",), "higher", "/s"),
        Figure("instants published exactly once", ("instants_published_once",), "higher", "count"),
        Figure("instants missed", ("instants_missed",), "lower", "count"),
        Figure("instants duplicated", ("instants_duplicated",), "lower", "count"),
        Figure("lag p50", ("lag_ms", "p50"), "lower", "ms"),
        Figure("lag p99", ("lag_ms", "p99"), "lower", "ms"),
        Figure("lag max", ("lag_ms", "max"), "lower", "ms"),
        Figure("peak RSS", [("peak_rss_mb",), ("beat_peak_rss_mb",)], "lower", "MB"),
    ],
}


@dataclass
class Outcome:
    system: str
    figures: Optional[dict] = None
    status: str = "ok"  # ok, not run, failed, timed out
    detail: str = ""
    path: Optional[Path] = None
    seconds: float = 0.0


def die(msg: str) -> None:
    print(f"compare.py: {msg}", file=sys.stderr)
    sys.exit(2)


def check_setup(sked_bench: Optional[Path]) -> Path:
    if sked_bench is not None and (not sked_bench.is_file() or not sked_bench.stat().st_mode & 0o111):
        die(f"{sked_bench} is missing: build it with `cargo build --release -p sked-bench` "
            f"(or give --sked-bench PATH, or run the peers alone with --peers-only)")
    python = common.VENV / "bin" / "python"
    if not python.exists() or not (common.VENV / ".requirements.sha256").exists():
        die(f"the peers' environment {common.VENV} is missing: run bench/peers/setup.sh")
    return python


def sked_capabilities(sked_bench: Path) -> dict:
    """The scenarios this sked-bench has, and whether its firing takes --worker."""
    out = subprocess.run([str(sked_bench), "--help"], capture_output=True, text=True, timeout=30).stdout
    commands = set()
    in_commands = False
    for line in out.splitlines():
        if line.strip() == "Commands:":
            in_commands = True
            continue
        if in_commands:
            m = re.match(r"\s+(\S+)\s", line + " ")
            if not m:
                break
            commands.add(m.group(1))
    worker = False
    if "firing" in commands:
        help_firing = subprocess.run([str(sked_bench), "firing", "--help"], capture_output=True,
                                     text=True, timeout=30).stdout
        worker = "--worker" in help_firing
    return {"commands": commands, "firing_worker": worker}


def run_bounded(cmd, json_path: Path, timeout: float, log_path: Path, system: str) -> Outcome:
    """Run one benchmark command in its own process group, bounded by `timeout` seconds."""
    print(f"\n== {system}: {' '.join(str(c) for c in cmd)}", flush=True)
    started = time.time()
    proc = common.start_process([str(c) for c in cmd], cwd=ROOT, log_path=log_path)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        common.stop_process(proc, grace=30)
        return Outcome(system, status="timed out", detail=f"stopped after {timeout:.0f} s; log {log_path}",
                       seconds=time.time() - started)
    finally:
        common.stop_process(proc, grace=30)
    took = time.time() - started
    if proc.returncode != 0 or not json_path.exists():
        return Outcome(system, status="failed",
                       detail=f"exit {proc.returncode}; log {log_path}:\n{common.tail(log_path)}", seconds=took)
    figures = json.loads(json_path.read_text())
    print(f"   done in {took:.0f} s -> {json_path.relative_to(ROOT)}", flush=True)
    return Outcome(system, figures=figures, path=json_path, seconds=took)


def scenario_args(scenario: str, p: dict) -> list:
    if scenario == "firing":
        return ["--schedules", p["schedules"], "--every", p["every"], "--seconds", p["seconds"]]
    if scenario == "e2e":
        return ["--schedules", p["schedules"], "--every", p["every"], "--seconds", p["seconds"]]
    if scenario == "burst":
        return ["--runs", p["runs"]]
    if scenario == "publish":
        return ["--schedules", p["schedules"], "--every", p["every"], "--seconds", p["seconds"]]
    return ["--seconds", p["seconds"]]


def timeout_for(scenario: str, p: dict) -> float:
    if scenario == "firing":
        return p["seconds"] + 120 + p["schedules"] / 200
    if scenario == "e2e":
        return p["seconds"] + 120 + p["schedules"] / 200
    if scenario == "burst":
        return 300 + p["runs"] / 100
    if scenario == "publish":
        # the warm-up, beat's start-up (60 s + 2 ms an entry at most) and the vhost's set-up
        return p["seconds"] + 240 + p["schedules"] / 200
    return p["seconds"] + 120


def run_scenario(scenario: str, p: dict, variants: list, a, python: Path, caps: dict, stamp: str) -> list:
    tag = {"firing": f"{p.get('schedules')}", "e2e": f"{p.get('schedules')}",
           "burst": f"{p.get('runs')}", "shell": f"{p.get('seconds')}s",
           "publish": f"{p.get('schedules')}"}[scenario]
    base = f"{stamp}-{scenario}-{tag}"
    args = scenario_args(scenario, p)
    limit = timeout_for(scenario, p)
    outcomes = []

    worker = a.worker and scenario == "firing"
    if a.peers_only:
        outcomes.append(Outcome("sked", status="not run", detail="--peers-only"))
    elif scenario not in caps["commands"]:
        outcomes.append(Outcome("sked", status="not run", detail=f"this sked-bench has no `{scenario}` scenario"))
    else:
        cmd = [a.sked_bench]
        if a.database_url:
            cmd += ["--database-url", a.database_url]
        cmd += [scenario, *args]
        if worker and caps["firing_worker"]:
            cmd.append("--worker")
        json_path = RESULTS / f"{base}-sked.json"
        cmd += ["--json", json_path]
        outcomes.append(run_bounded(cmd, json_path, limit, RESULTS / f"{base}-sked.log", "sked"))
    if worker and not caps["firing_worker"]:
        print("   (this sked-bench's firing has no --worker: sked's started lateness is not measured)")

    for v in variants:
        json_path = RESULTS / f"{base}-{v}.json"
        if v.startswith("celery"):
            cmd = [python, HERE / "celery_bench.py", "--json", json_path, scenario, *args]
            if v == "celery-direct" and scenario == "e2e":
                cmd += ["--producer", "direct"]
            if worker:
                cmd.append("--worker")
        else:
            store = v.split("-", 1)[1]
            cmd = [python, HERE / "apscheduler_bench.py", "--store", store, "--json", json_path, scenario, *args]
        outcomes.append(run_bounded(cmd, json_path, limit, RESULTS / f"{base}-{v}.log", v))
    return outcomes


def dig(d: Optional[dict], path):
    if isinstance(path, list):
        for alternative in path:
            value = dig(d, alternative)
            if value is not None:
                return value
        return None
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def fmt(value, unit: str, expected=None) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value / 1000:.2f} s" if value >= 999.5 else f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "/s":
        return f"{value:,.1f}/s" if value < 100 else f"{value:,.0f}/s"
    if unit == "MB":
        return f"{value:,.1f} MB"
    if unit == "count" and expected:
        return f"{value:,} of {expected:,} ({100.0 * value / expected:.1f}%)"
    return f"{value:,}"


def expected(figures: Optional[dict], scenario: str):
    """What a count figure is out of: the owed fires (firing), the offered runs (e2e) or the
    owed instants (publish)."""
    if not figures:
        return None
    if scenario == "firing":
        return figures.get("fires_expected")
    if scenario == "publish":
        return figures.get("messages_expected")
    if scenario == "e2e":
        every = str(figures.get("every", "1s"))
        seconds = float(every[:-1]) if every.endswith("s") and not every.endswith("ms") else None
        if seconds:
            return int(figures["schedules"] * figures["window_seconds"] / seconds)
    return None


def ratio(sked, peer, better: str) -> str:
    if sked is None or peer is None:
        return "n/a"
    if better == "higher":
        if peer == 0:
            return "inf" if sked > 0 else "n/a"
        return f"{sked / peer:.2f}x"
    if sked == 0:
        return "inf" if peer > 0 else "1.00x"
    return f"{peer / sked:.2f}x"


def table(scenario: str, p: dict, outcomes: list) -> str:
    sked = outcomes[0]
    lines = [
        f"### {scenario} " + ", ".join(f"{k}={v}" for k, v in p.items()),
        "",
        "ratio > 1 means sked is better (throughput: sked / peer; latency: peer / sked)",
    ]
    if sked.status != "ok":
        lines.append(f"sked: {sked.status} ({sked.detail})")
    for peer in outcomes[1:]:
        lines.append("")
        variant = dig(peer.figures, ("variant",)) or ""
        lines.append(f"sked vs {peer.system}" + (f" [{variant}]" if variant else "")
                     + ("" if peer.status == "ok" else f": {peer.status} ({peer.detail.splitlines()[0] if peer.detail else ''})"))
        lines.append("")
        lines.append("| figure | sked | " + peer.system + " | ratio |")
        lines.append("|---|---:|---:|---:|")
        for f in FIGURES[scenario]:
            s, q = dig(sked.figures, f.path), dig(peer.figures, f.path)
            if s is None and q is None:
                continue
            lines.append(f"| {f.label} | {fmt(s, f.unit, expected(sked.figures, scenario))} "
                         f"| {fmt(q, f.unit, expected(peer.figures, scenario))} | {ratio(s, q, f.better)} |")
        if peer.figures and scenario == "burst" and peer.figures.get("timed_out"):
            lines.append(f"| finished before the time limit | | {peer.figures.get('finished'):,} of {p['runs']:,} | |")
    return "\n".join(lines)


def resolve_variants(names: str, scenario: str) -> list:
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name in VARIANTS:
            chosen = [name]
        else:
            chosen = [v for v, (group, _) in VARIANTS.items() if group == name]
            if not chosen:
                die(f"unknown peer {name!r}: one of celery, apscheduler, {', '.join(VARIANTS)}")
        out += [v for v in chosen if scenario in VARIANTS[v][1] and v not in out]
    return out


def main() -> int:
    common.exit_cleanly_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(FIGURES))
    parser.add_argument("--all", action="store_true", help="the default suite (about 12 minutes)")
    parser.add_argument("--schedules", type=int)
    parser.add_argument("--seconds", type=int)
    parser.add_argument("--every", help="firing: default 60s; e2e: default 1s; publish: default 5s")
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--peers", default="celery,apscheduler",
                        help="groups (celery, apscheduler) or variants (" + ", ".join(VARIANTS) + ")")
    parser.add_argument("--worker", action="store_true",
                        help="firing: run workers too and compare started lateness (sked-bench --worker)")
    parser.add_argument("--sked-bench", type=Path, default=ROOT / "target" / "release" / "sked-bench")
    parser.add_argument("--database-url", help="passed to sked-bench (PostgreSQL instead of SQLite)")
    parser.add_argument("--peers-only", action="store_true",
                        help="run the peers alone (no sked-bench needed); sked's column reads 'not run'")
    a = parser.parse_args()
    if not a.all and not a.scenario:
        parser.error("give --scenario or --all")

    python = check_setup(None if a.peers_only else a.sked_bench)
    caps = {"commands": set(), "firing_worker": False} if a.peers_only else sked_capabilities(a.sked_bench)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")

    if a.every and re.fullmatch(r"[0-9]+(\.[0-9]+)?", a.every):
        a.every += "s"  # `--every 5` means 5 s, as sked-bench spells it
    if a.all:
        plan = SUITE
        a.worker = caps["firing_worker"]  # started lateness on both sides, or on neither
    else:
        defaults = {"firing": (10000, 70), "e2e": (2000, 20), "burst": (None, None), "shell": (None, 10),
                    "publish": (40000, 600)}
        sched, secs = defaults[a.scenario]
        p = {"firing": lambda: {"schedules": a.schedules or sched, "every": a.every or "60s",
                                "seconds": a.seconds or secs},
             "e2e": lambda: {"schedules": a.schedules or sched, "every": a.every or "1s", "seconds": a.seconds or secs},
             "burst": lambda: {"runs": a.runs},
             "shell": lambda: {"seconds": a.seconds or secs},
             "publish": lambda: {"schedules": a.schedules or sched, "every": a.every or "5s",
                                 "seconds": a.seconds or secs}}[a.scenario]()
        plan = [(a.scenario, p)]

    tables = []
    for scenario, p in plan:
        variants = resolve_variants(a.peers, scenario)
        outcomes = run_scenario(scenario, p, variants, a, python, caps, stamp)
        if not variants:
            print(f"   (no peer of {a.peers} runs the {scenario} scenario)")
        text = table(scenario, p, outcomes)
        tables.append(text)
        print("\n" + text, flush=True)

    summary = RESULTS / f"{stamp}-summary.md"
    summary.write_text(f"# sked vs peers, {stamp}\n\n" + "\n\n".join(tables) + "\n")
    print(f"\nsaved under {RESULTS.relative_to(ROOT)}/ ({summary.name} and one JSON per run)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ncompare.py: interrupted; the run in progress was stopped", file=sys.stderr)
        sys.exit(130)

#!/usr/bin/env python3
"""Print a Celery app's beat schedule as JSON, for `sked import celery-beat FILE`.

    python celery-beat-export.py proj.celery:app > beat.json
    sked import celery-beat beat.json --connection celery --out jobs.yaml

Run it with the app's own Python (its virtualenv, from its project directory, with the
settings it needs to import), so the schedule is the one beat would read. It imports the app
and reads `app.conf.beat_schedule`; it starts nothing, connects to nothing and writes nothing
but standard output.

What it prints: the app's time zone (`timezone`, `enable_utc`), the scheme of its broker URL
(never the URL: it may hold a password), and for each entry its name, task, args, kwargs,
the options sked's Celery target carries (queue, exchange, routing_key, priority, expires; the
names of any others) and its schedule: a crontab (Celery's original field strings and the sets
Celery expanded them to), an interval in seconds, or a solar event. Each entry is on its own
line, so sked's importer can say which line it could not translate. The output is bounded:
at most MAX_ENTRIES entries and MAX_BYTES bytes, else it stops with an error.

A schedule kept in django-celery-beat's database is not in `beat_schedule`: import that one
with `sked import celery-beat postgres://...`.
"""

import datetime
import json
import sys

FORMAT = "sked-celery-beat-export/1"
MAX_ENTRIES = 10000
MAX_BYTES = 4 * 1024 * 1024
CARRIED_OPTIONS = ("queue", "exchange", "routing_key", "priority", "expires")
CRONTAB_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")


def fail(message):
    print("celery-beat-export: " + message, file=sys.stderr)
    sys.exit(1)


def scheme_of(url):
    """The scheme of a broker URL (or of the first of several), without anything else."""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if not isinstance(url, str) or "://" not in url:
        return None
    first = url.split(";", 1)[0]
    return first.split("://", 1)[0].strip() or None


def original(value):
    """A crontab field as Celery's original: a string as written, else a comma list."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    try:
        return ",".join(str(v) for v in sorted(value))
    except TypeError:
        return repr(value)[:200]


def schedule_of(schedule, app):
    from celery import schedules

    if isinstance(schedule, schedules.crontab):
        out = {"type": "crontab"}
        for field in CRONTAB_FIELDS:
            out[field] = original(getattr(schedule, "_orig_" + field))
        out["expanded"] = {f: sorted(getattr(schedule, f)) for f in CRONTAB_FIELDS}
        return out
    if isinstance(schedule, schedules.solar):
        return {"type": "solar", "event": schedule.event, "lat": schedule.lat, "lon": schedule.lon}
    if isinstance(schedule, schedules.schedule):
        return {
            "type": "interval",
            "seconds": schedule.run_every.total_seconds(),
            "relative": bool(schedule.relative),
        }
    return {"type": "unknown", "class": type(schedule).__name__}


def name_of(value):
    """A kombu Queue or Exchange by its name; a string as it is."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return getattr(value, "name", None) or repr(value)[:200]


def options_of(options):
    out = {}
    for key in CARRIED_OPTIONS:
        if key not in options:
            continue
        value = options[key]
        if key == "expires" and isinstance(value, datetime.datetime):
            out[key] = {"at": value.isoformat()}
        else:
            out[key] = name_of(value)
    others = sorted(k for k in options if k not in CARRIED_OPTIONS)
    if others:
        out["others"] = others
    return out


def jsonable(value, what):
    try:
        json.dumps(value)
        return value, None
    except (TypeError, ValueError):
        return None, "%s are not JSON (%s)" % (what, type(value).__name__)


def entry_of(name, entry, app):
    from celery.schedules import maybe_schedule

    out = {"name": str(name)}
    if not isinstance(entry, dict):
        out["error"] = "the entry is a %s, not a dict" % type(entry).__name__
        return out
    out["task"] = entry.get("task")
    args, error = jsonable(list(entry.get("args") or ()), "args")
    kwargs, kw_error = jsonable(dict(entry.get("kwargs") or {}), "kwargs")
    if error or kw_error:
        out["error"] = error or kw_error
    out["args"] = args
    out["kwargs"] = kwargs
    out["options"] = options_of(entry.get("options") or {})
    relative = bool(entry.get("relative", False))
    try:
        schedule = maybe_schedule(entry.get("schedule"), relative, app=app)
        out["schedule"] = schedule_of(schedule, app)
    except Exception as e:  # a schedule Celery itself would refuse
        out["error"] = "its schedule is not one Celery reads: %s" % str(e)[:200]
    return out


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        fail("usage: celery-beat-export.py MODULE[:APP]   (e.g. proj.celery:app)")
    sys.path.insert(0, ".")
    from celery import __version__ as celery_version
    from celery.app.utils import find_app

    try:
        app = find_app(argv[1])
    except Exception as e:
        fail("cannot import the Celery app %r: %s" % (argv[1], str(e)[:300]))
    conf = app.conf
    schedule = conf.beat_schedule or {}
    if len(schedule) > MAX_ENTRIES:
        fail("beat_schedule has %d entries; at most %d are exported" % (len(schedule), MAX_ENTRIES))
    timezone = conf.timezone
    header = {
        "format": FORMAT,
        "celery_version": celery_version,
        "timezone": None if timezone is None else str(timezone),
        "enable_utc": bool(conf.enable_utc),
        "broker_scheme": scheme_of(conf.broker_url),
        "beat_scheduler": str(conf.beat_scheduler) if conf.beat_scheduler else None,
    }
    lines = [json.dumps(header)[:-1] + ', "entries": [']
    entries = [json.dumps(entry_of(n, e, app), sort_keys=True) for n, e in schedule.items()]
    for i, entry in enumerate(entries):
        lines.append(entry + ("," if i + 1 < len(entries) else ""))
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_BYTES:
        fail("the export is over %d bytes, the most sked import reads" % MAX_BYTES)
    sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)

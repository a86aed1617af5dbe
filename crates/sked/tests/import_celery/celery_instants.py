"""The next instants of Celery crontab entries, by Celery's own arithmetic.

Reads from standard input a JSON object {"start": ISO instant, "count": N, "entries":
[{"minute", "hour", "day_of_week", "day_of_month", "month_of_year", "timezone"}, ...]} and
prints, for each entry, the list of its next N instants in UTC.

Method: as beat does. Each entry is a `celery.schedules.crontab` of an app whose timezone is
the entry's; beat asks `is_due(last_run_at)`, which is `remaining_estimate(last_run_at)`
against now. So from the last instant L (the start, then each instant found), with the clock
set to L (`nowfun`), the next instant is L + crontab.remaining_estimate(L): the moment beat
would find it due, had it sent the previous one exactly on time.
"""

import json
import sys
from datetime import datetime, timezone

from celery import Celery
from celery.schedules import crontab

request = json.load(sys.stdin)
start = datetime.fromisoformat(request["start"].replace("Z", "+00:00"))
count = int(request["count"])
apps = {}
out = []
for entry in request["entries"]:
    zone = entry["timezone"]
    if zone not in apps:
        app = Celery("instants", set_as_current=False)
        app.conf.timezone = zone
        app.conf.enable_utc = True
        apps[zone] = app
    clock = {"now": start}
    cron = crontab(
        minute=entry["minute"],
        hour=entry["hour"],
        day_of_week=entry["day_of_week"],
        day_of_month=entry["day_of_month"],
        month_of_year=entry["month_of_year"],
        nowfun=lambda: clock["now"],
        app=apps[zone],
    )
    instants = []
    last = start
    for _ in range(count):
        clock["now"] = last
        nxt = (last + cron.remaining_estimate(last)).astimezone(timezone.utc)
        instants.append(nxt.strftime("%Y-%m-%dT%H:%M:%SZ"))
        last = nxt
    out.append(instants)
json.dump(out, sys.stdout)

"""django-celery-beat on the test's PostgreSQL database: `migrate` makes its tables with its
own migrations; `populate` saves periodic tasks through its models, as its admin would.

The database is SKED_DJANGO_DATABASE_URL (postgres://USER[:PASSWORD]@HOST:PORT/NAME).
"""

import os
import sys
from datetime import datetime, timezone
from urllib.parse import unquote, urlparse

import django
from django.conf import settings

url = urlparse(os.environ["SKED_DJANGO_DATABASE_URL"])
settings.configure(
    INSTALLED_APPS=["django_celery_beat"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": unquote(url.username or ""),
            "PASSWORD": unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or 5432),
        }
    },
    USE_TZ=True,
    TIME_ZONE="UTC",
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402


def populate():
    import json

    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    nightly = CrontabSchedule.objects.create(
        minute="30", hour="4", day_of_week="mon-fri", day_of_month="*",
        month_of_year="*", timezone="Europe/London",
    )
    PeriodicTask.objects.create(
        name="nightly report", task="proj.tasks.report", crontab=nightly,
        args=json.dumps([7, "eu"]), kwargs=json.dumps({"full": True}), queue="reports",
        priority=6, expire_seconds=300, description="the nightly numbers",
    )
    every = IntervalSchedule.objects.create(every=90, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(
        name="poll every 90s", task="proj.tasks.poll", interval=every, enabled=False,
    )
    first_monday = CrontabSchedule.objects.create(
        minute="0", hour="9", day_of_week="1", day_of_month="1-7", month_of_year="*",
        timezone="UTC",
    )
    PeriodicTask.objects.create(name="first monday", task="proj.tasks.m", crontab=first_monday)
    friday = CrontabSchedule.objects.create(
        minute="0", hour="0", day_of_week="fri", day_of_month="13", month_of_year="*",
        timezone="UTC",
    )
    PeriodicTask.objects.create(name="friday 13th", task="proj.tasks.f", crontab=friday)
    sun = SolarSchedule.objects.create(event="sunset", latitude=51.5, longitude=-0.1)
    PeriodicTask.objects.create(name="sunset", task="proj.tasks.s", solar=sun)
    clocked = ClockedSchedule.objects.create(
        clocked_time=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    )
    PeriodicTask.objects.create(
        name="once", task="proj.tasks.o", clocked=clocked, one_off=True,
    )


if sys.argv[1] == "migrate":
    call_command("migrate", "django_celery_beat", verbosity=0)
elif sys.argv[1] == "populate":
    populate()
else:
    sys.exit("usage: django_beat.py migrate|populate")

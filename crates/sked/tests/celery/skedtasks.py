"""Tasks of a plain Celery app that sked's Celery target tests send work to.

Each task appends one JSON line to the file in SKED_TASK_LOG saying what it received, so a
test reads back, on the worker's side, every task that ran: its id, args, kwargs, retries and
sked's envelope headers.
"""

import json
import os
import time

from celery import Celery

app = Celery(
    "skedtasks",
    broker=os.environ["SKED_CELERY_BROKER"],
    backend=os.environ.get("SKED_CELERY_BACKEND") or None,
)
app.conf.update(
    accept_content=["json"],
    task_serializer="json",
    result_serializer="json",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)


def note(kind, request, **extra):
    headers = {k: v for k, v in vars(request).items() if k.startswith("sked-")}
    line = {
        "kind": kind,
        "id": request.id,
        "args": list(request.args or []),
        "kwargs": dict(request.kwargs or {}),
        "retries": request.retries,
        "headers": headers,
        **extra,
    }
    with open(os.environ["SKED_TASK_LOG"], "a") as log:
        log.write(json.dumps(line) + "\n")


@app.task(bind=True, name="skedtasks.record")
def record(self, *args, **kwargs):
    note("record", self.request)
    return {"args": list(args), "kwargs": kwargs}


@app.task(bind=True, name="skedtasks.fail")
def fail(self, *args, **kwargs):
    note("fail", self.request)
    raise ValueError("the ledger does not balance")


@app.task(bind=True, name="skedtasks.flaky", max_retries=3)
def flaky(self, *args, **kwargs):
    note("flaky", self.request)
    if self.request.retries < 1:
        raise self.retry(countdown=0.5)
    return "done after a retry"


@app.task(bind=True, name="skedtasks.slow")
def slow(self, seconds, *args, **kwargs):
    note("slow", self.request)
    time.sleep(seconds)
    note("slow-finished", self.request)
    return "slept"

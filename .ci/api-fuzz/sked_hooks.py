"""Keeps schemathesis's calls to sked bounded in time.

Two operations legitimately hold a request open: a worker's lease long poll (`wait_ms`, up to
the server's limit of 30 s) and a followed log (`follow=true`, until the run ends, which with
no worker is never). Valid values there are made short; invalid ones are left alone, so the
server's refusal of them is still checked.
"""

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs):
    path = case.operation.path
    if path == "/api/v1/workers/{id}/lease" and isinstance(case.body, dict):
        wait = case.body.get("wait_ms")
        if isinstance(wait, int) and not isinstance(wait, bool) and wait > 200:
            case.body["wait_ms"] = 200
    if path == "/api/v1/runs/{id}/log" and isinstance(case.query, dict):
        if case.query.get("follow") in (True, "true"):
            case.query["follow"] = "false"

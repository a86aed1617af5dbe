"""Keeps schemathesis's calls to sked bounded in time, and its own token valid.

Two operations legitimately hold a request open: a worker's lease long poll (`wait_ms`, up to
the server's limit of 30 s) and a followed log (`follow=true`, until the run ends, which with
no worker is never). Valid values there are made short; invalid ones are left alone, so the
server's refusal of them is still checked.

The fuzzer sends the server's admin token. Schemathesis reuses values it has seen in answers,
and a token listing shows that token's name: left alone, it revokes its own token within
seconds and tests nothing but the 401 from then on. A revocation of that name is sent for a
name no token has instead (a 404, still checked against the document).
"""

import os

import schemathesis

ADMIN_TOKEN_NAME = os.environ.get("SKED_FUZZ_ADMIN_TOKEN_NAME")


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
    if (
        path == "/api/v1/tokens/{name}"
        and case.method.upper() == "DELETE"
        and ADMIN_TOKEN_NAME
        and isinstance(case.path_parameters, dict)
        and case.path_parameters.get("name") == ADMIN_TOKEN_NAME
    ):
        case.path_parameters["name"] = "not-the-fuzzers-own-token"

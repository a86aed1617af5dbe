#!/usr/bin/env python3
"""An AMQP consumer instrumented with the OpenTelemetry SDK, as a user's service would be,
for sked's trace test: it takes the messages of one queue, continues the trace each one's
`traceparent` header names (W3C Trace Context, the SDK's own propagator) with a consumer span
of its own, exported over OTLP/HTTP, and inside that span reports the run's outcome to the
completion address the message carries (`sked-complete-url`, `sked-complete-token`), passing
its own trace context on that request too.

Usage: consumer.py --url AMQP_URL --exchange X --queue Q --routing-key K \
                   --otlp http://127.0.0.1:PORT --ready FILE --count N

It declares the exchange (direct), the queue and the binding, writes --ready, handles --count
messages, flushes its spans and exits 0.
"""

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import pika
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--url", "--exchange", "--queue", "--routing-key", "--otlp", "--ready"):
        p.add_argument(name, required=True)
    p.add_argument("--count", type=int, default=1)
    a = p.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": "consumer"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=a.otlp + "/v1/traces")))
    tracer = provider.get_tracer("consumer")
    propagator = TraceContextTextMapPropagator()

    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    ch = conn.channel()
    ch.exchange_declare(a.exchange, exchange_type="direct", auto_delete=True)
    ch.queue_declare(a.queue, auto_delete=True)
    ch.queue_bind(a.queue, a.exchange, routing_key=a.routing_key)
    Path(a.ready).write_text("ready\n")

    handled = 0
    for method, properties, body in ch.consume(a.queue, inactivity_timeout=60):
        if method is None:
            print("no message within 60 s", file=sys.stderr)
            return 1
        headers = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in (properties.headers or {}).items()}
        parent = propagator.extract(headers)
        with tracer.start_as_current_span(
            f"{a.queue} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"messaging.system": "rabbitmq", "messaging.operation.type": "process"},
        ):
            carrier = {}
            propagator.inject(carrier)
            request = urllib.request.Request(
                headers["sked-complete-url"],
                data=json.dumps({"token": headers["sked-complete-token"], "outcome": "succeeded"}).encode(),
                headers={"Content-Type": "application/json", **carrier},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read()
        ch.basic_ack(method.delivery_tag)
        handled += 1
        if handled >= a.count:
            break
    ch.cancel()
    conn.close()
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

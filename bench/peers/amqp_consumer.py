"""A light AMQP 0-9-1 consumer for the `publish` scenario: it reads one queue of a RabbitMQ
vhost and writes, for every message, the message's key (the value of one header) and the
wall-clock time it was received, one line each, to a file. It executes nothing; the benchmark
that started it reads the file afterwards and does the counting.

    python amqp_consumer.py --url amqp://guest:guest@127.0.0.1:5672/VHOST --queue Q \\
        --exchange X --key-header H --out FILE --ready FILE (--stop-file FILE | --until EPOCH)

It declares the exchange (direct, durable), the queue (durable) and the binding itself before
it writes --ready, so that nothing published after that is unrouted, with the same arguments as
Celery declares them (a mismatch would close the channel). It acknowledges in batches
(multiple=True, every 200 messages or every 0.1 s) with a prefetch of 2,000, so that what it has
not yet taken stays in the queue and shows up as `messages_ready`: once a second it reads the
queue's depth on a second channel (passive declare) and keeps the largest, reported at the end
as the consumer's backlog. With a backlog, receipt trails the publish by that much and any
figure derived from the receipt time is off by as much; the benchmark reports it.

It stops once --stop-file exists (checked every 0.1 s), at --until (epoch seconds), or on
SIGTERM/SIGINT, writes its lines and a last line `# stats {json}` with its counters, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (shared code of the peer benchmarks, beside this file)

PREFETCH = 2000
ACK_EVERY = 200


def main(argv=None) -> int:
    common.exit_cleanly_on_signals()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--exchange", required=True)
    p.add_argument("--routing-key", help="default: the queue's name")
    p.add_argument("--key-header", required=True, help="the header whose value identifies the message's schedule")
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True, help="file written once the queue is declared and consumed")
    p.add_argument("--stop-file", help="stop once this file exists")
    p.add_argument("--until", type=float, default=float("inf"), help="stop at this instant (epoch seconds)")
    a = p.parse_args(argv)
    stop = Path(a.stop_file) if a.stop_file else None

    lines: list = []
    stats = {"received": 0, "without_key": 0, "backlog_max": 0, "backlog_samples": 0}
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    try:
        ch = conn.channel()
        ch.exchange_declare(a.exchange, exchange_type="direct", durable=True, auto_delete=False)
        ch.queue_declare(a.queue, durable=True, auto_delete=False)
        ch.queue_bind(a.queue, a.exchange, routing_key=a.routing_key or a.queue)
        ch.basic_qos(prefetch_count=PREFETCH)
        probe = conn.channel()
        state = {"unacked": 0, "last_tag": 0}
        header = a.key_header

        def on_message(_ch, method, props, _body):
            now = time.time()
            headers = props.headers or {}
            key = headers.get(header)
            if key is None:
                stats["without_key"] += 1
                key = "-"
            elif isinstance(key, bytes):
                key = key.decode(errors="replace")
            lines.append(f"{key} {now!r}\n")
            state["unacked"] += 1
            state["last_tag"] = method.delivery_tag
            if state["unacked"] >= ACK_EVERY:
                ch.basic_ack(state["last_tag"], multiple=True)
                state["unacked"] = 0

        ch.basic_consume(a.queue, on_message, auto_ack=False)
        tmp = a.ready + ".tmp"
        Path(tmp).write_text(repr(time.time()))
        Path(tmp).rename(a.ready)
        next_probe = time.time() + 1.0
        while time.time() < a.until and not (stop is not None and stop.exists()):
            conn.process_data_events(time_limit=0.1)
            if state["unacked"]:
                ch.basic_ack(state["last_tag"], multiple=True)
                state["unacked"] = 0
            if time.time() >= next_probe:
                depth = probe.queue_declare(a.queue, passive=True).method.message_count
                stats["backlog_max"] = max(stats["backlog_max"], depth)
                stats["backlog_samples"] += 1
                next_probe += 1.0
        stats["left_in_queue"] = probe.queue_declare(a.queue, passive=True).method.message_count
    finally:
        stats["received"] = len(lines)
        with open(a.out, "w") as f:
            f.writelines(lines)
            f.write("# stats " + json.dumps(stats) + "\n")
        try:
            conn.close()
        except Exception:  # noqa: BLE001  (closing after an error: nothing more to report)
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

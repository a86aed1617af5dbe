#!/usr/bin/env python3
"""OTLP trace receiver for sked's integration tests.

It decodes what it receives with the official OpenTelemetry protobuf
definitions (the `opentelemetry-proto` package from PyPI), so sked's trace
export is checked against the protocol itself, not against sked's own idea
of it. It serves, on 127.0.0.1 only:

  * OTLP/HTTP: POST /v1/traces, Content-Type application/x-protobuf,
    optionally gzip Content-Encoding;
  * OTLP/gRPC: opentelemetry.proto.collector.trace.v1.TraceService/Export.

Every span received is appended to --out as one JSON line (flushed after
each request), together with the request's `x-*` headers or metadata.
When every requested port accepts connections it prints
`ready http=<port> grpc=<port>` (0 = not served). SIGTERM stops it cleanly.

Usage: receiver.py --http-port N --grpc-port M --out FILE
"""

import argparse
import gzip
import json
import signal
import sys
import threading
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

MAX_BODY = 8 * 1024 * 1024


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def span_records(request, protocol, headers):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "attributes": attributes(s.attributes),
                    "events": [{"name": e.name, "time_ns": e.time_unix_nano} for e in s.events],
                    "status_code": s.status.code,
                    "status_message": s.status.message,
                    "resource": resource,
                    "scope": ss.scope.name,
                    "protocol": protocol,
                    "headers": headers,
                }


class Sink:
    def __init__(self, path):
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, request, protocol, headers):
        with self._lock:
            for record in span_records(request, protocol, headers):
                self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()

    def close(self):
        with self._lock:
            self._file.close()


def x_headers(pairs):
    return {k.lower(): v for k, v in pairs if k.lower().startswith("x-")}


def gunzip_bounded(data):
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, MAX_BODY + 1)
    if len(out) > MAX_BODY:
        raise OverflowError
    if not d.eof:
        raise gzip.BadGzipFile("truncated gzip body")
    return out


class HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sink = None  # set in main()

    def reply(self, code, body=b"", ctype="text/plain"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reject(self, code, message):
        # Read and drop the body first, so the client gets to see the answer
        # instead of a connection reset while it is still sending.
        length = self.headers.get("Content-Length", "")
        if length.isdigit():
            left = int(length)
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        else:
            self.close_connection = True
        self.reply(code, message.encode() + b"\n")

    def do_POST(self):
        if self.path.split("?", 1)[0] != "/v1/traces":
            return self.reject(404, "not found")
        ctype = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/x-protobuf":
            return self.reject(415, "only application/x-protobuf")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return self.reject(415, "unsupported content-encoding")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return self.reject(411, "content-length required")
        if int(length) > MAX_BODY:
            return self.reject(413, "body too large")
        body = self.rfile.read(int(length))
        try:
            if encoding == "gzip":
                body = gunzip_bounded(body)
            request = ts_pb2.ExportTraceServiceRequest.FromString(body)
        except OverflowError:
            return self.reply(413, b"body too large\n")
        except (DecodeError, zlib.error, gzip.BadGzipFile):
            return self.reply(400, b"undecodable body\n")
        self.sink.write(request, "http", x_headers(self.headers.items()))
        self.reply(200, ts_pb2.ExportTraceServiceResponse().SerializeToString(),
                   "application/x-protobuf")

    def do_GET(self):
        self.reject(404, "not found")

    do_PUT = do_DELETE = do_PATCH = do_GET

    def log_message(self, *args):
        pass


class TraceService(ts_grpc.TraceServiceServicer):
    def __init__(self, sink):
        self.sink = sink

    def Export(self, request, context):
        self.sink.write(request, "grpc", x_headers(context.invocation_metadata()))
        return ts_pb2.ExportTraceServiceResponse()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, default=0, help="0 = don't serve OTLP/HTTP")
    p.add_argument("--grpc-port", type=int, default=0, help="0 = don't serve OTLP/gRPC")
    p.add_argument("--out", required=True, help="JSON-lines file to append spans to")
    args = p.parse_args()

    sink = Sink(args.out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    http_server = grpc_server = None
    if args.http_port:
        HttpHandler.sink = sink
        http_server = ThreadingHTTPServer(("127.0.0.1", args.http_port), HttpHandler)
        http_server.daemon_threads = True
        threading.Thread(target=http_server.serve_forever, daemon=True).start()
    if args.grpc_port:
        grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_receive_message_length", MAX_BODY)],
        )
        ts_grpc.add_TraceServiceServicer_to_server(TraceService(sink), grpc_server)
        if grpc_server.add_insecure_port(f"127.0.0.1:{args.grpc_port}") == 0:
            sys.exit(f"cannot bind gRPC port {args.grpc_port}")
        grpc_server.start()

    http_port = http_server.server_address[1] if http_server else 0
    print(f"ready http={http_port} grpc={args.grpc_port}", flush=True)

    stop.wait()
    if http_server:
        http_server.shutdown()
        http_server.server_close()
    if grpc_server:
        grpc_server.stop(grace=1).wait()
    sink.close()


if __name__ == "__main__":
    main()

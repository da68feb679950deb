"""A local OTLP/HTTP trace receiver for the tracing-overhead benchmark: counts spans, keeps none.

    .venv/bin/python tests/perf/otlp_sink.py --port 4318 &
    .venv/bin/python tests/perf/bench_gateway.py --scenarios 1 --gateway-args \\
        "GATEWAY_TRACING__ENABLED=true OTEL_TRACES_SAMPLER=always_on \\
         OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318"
    kill %1    # prints the spans and export requests it received

Each export request is decoded with ``opentelemetry-proto`` (so a malformed
one is an error, not a count) and answered 200 with an empty
``ExportTraceServiceResponse``. Loopback only.
"""

from __future__ import annotations

import argparse
import gzip
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_lock = threading.Lock()
_counts = {"requests": 0, "spans": 0, "errors": 0}
_EMPTY = ExportTraceServiceResponse().SerializeToString()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        try:
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            export = ExportTraceServiceRequest.FromString(body)
            spans = sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
            status = 200 if self.path == "/v1/traces" else 404
        except Exception:
            spans, status = 0, 400
        with _lock:
            _counts["requests"] += 1
            _counts["spans"] += spans
            _counts["errors"] += status != 200
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(_EMPTY)))
        self.end_headers()
        self.wfile.write(_EMPTY)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    opts = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", opts.port), _Handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    print(
        f"otlp_sink: {_counts['spans']} spans in {_counts['requests']} export requests, "
        f"{_counts['errors']} refused",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

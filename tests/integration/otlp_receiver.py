"""A real OTLP/HTTP trace receiver on a loopback port, for tests.

It accepts ``POST /v1/traces`` (protobuf, gzip or not), decodes each export
request with the ``opentelemetry-proto`` package, and keeps every span as a
plain ``ReceivedSpan``. Tests wait on what arrived with ``wait_for`` (a
bounded deadline on the state itself, never a fixed sleep).
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import ServerThread, running

# Span kinds and status codes, as the protocol numbers them.
SPAN_KIND_SERVER = 2
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    kind: int
    status_code: int
    status_message: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str


@dataclass
class Receiver:
    server: ServerThread
    spans: list[ReceivedSpan] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # every decoded export request, raw
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        """The value for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the SDK appends /v1/traces)."""
        return self.server.url

    def by_request_id(self) -> dict[str, ReceivedSpan]:
        with self.lock:
            return {
                str(span.attributes["gateway.request_id"]): span
                for span in self.spans
                if "gateway.request_id" in span.attributes
            }

    def wait_for(self, *request_ids: str, timeout: float = 20.0) -> dict[str, ReceivedSpan]:
        """The spans of these requests, once they have all arrived (else AssertionError)."""
        return self.wait_until(lambda spans: all(rid in spans for rid in request_ids), timeout)

    def wait_until(
        self, done: Callable[[dict[str, ReceivedSpan]], bool], timeout: float = 20.0
    ) -> dict[str, ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            spans = self.by_request_id()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not received in {timeout}s; have {sorted(spans)}")
            time.sleep(0.02)


def _app(receiver_ref: list[Receiver]) -> Starlette:
    async def traces(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        receiver = receiver_ref[0]
        received = []
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            status_code=span.status.code,
                            status_message=span.status.message,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            events=[
                                (e.name, e.time_unix_nano, _attributes(e.attributes))
                                for e in span.events
                            ],
                            resource=resource,
                            scope=scope_spans.scope.name,
                        )
                    )
        with receiver.lock:
            receiver.bodies.append(body)
            receiver.spans.extend(received)
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )

    return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    ref: list[Receiver] = []
    with running(_app(ref)) as server:
        receiver = Receiver(server)
        ref.append(receiver)
        yield receiver

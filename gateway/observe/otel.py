"""OpenTelemetry traces: one server span per proxied request, named and attributed by the
GenAI semantic conventions, exported over OTLP/HTTP by the SDK's batch processor.

Imported only when ``tracing.enabled`` is set (it needs the ``otel`` extra):
a gateway without tracing imports nothing of OpenTelemetry. Everything the
SDK configures from its own ``OTEL_*`` variables (endpoint, headers, service
name, resource, sampler, batch sizes, propagators) is left to it.

The span opens as the request begins (``start``), so that its context can go
upstream in ``traceparent``/``tracestate``, with the client's trace context,
if any, as parent; the client's sampled flag counts only if the operator's
sampler is a parent-based one (``OTEL_TRACES_SAMPLER=always_on`` samples every
request, whatever the client sent). It ends when the finished record reaches
this object as an observer (``observe``): attributes, the first-token event,
the status (ERROR exactly when the stream's outcome is incomplete), the end
time. No prompt or completion text is in a record, so none can be in a span.

Export never blocks the relay: ``span.end`` only queues the span in the batch
processor's bounded queue, which its own thread empties; a dead or slow
collector costs dropped spans, not latency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import get_global_textmap
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, StatusCode, set_span_in_context

from gateway import __version__
from gateway.guard import Outcome
from gateway.observe.accesslog import bounded
from gateway.observe.record import RequestRecord
from gateway.protocols import spec_for

__all__ = ["SERVICE", "OtelTracing"]

#: ``service.name`` unless ``OTEL_SERVICE_NAME`` (or ``OTEL_RESOURCE_ATTRIBUTES``) names one.
SERVICE = "llm-stream-gateway"
#: The span event at the first output-carrying event of a stream.
FIRST_TOKEN_EVENT = "gateway.first_token"

#: Fields of the record that become ``gateway.<field>`` attributes when they are set.
_WHEN_SET = (
    "time_to_first_token",
    "time_to_first_byte",
    "upstream_request_id",
    "rejected",
    "error",
)
#: (host, port) of a route's upstream, or None when it is not to be recorded.
AddressOf = Callable[[str, str | None], tuple[str, int | None] | None]


def _resource() -> Resource:
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    return resource


class OtelTracing:
    """The trace hook (``start``) and the observer that ends each span (``observe``)."""

    name = "tracing"

    def __init__(self, address_of: AddressOf | None = None) -> None:
        # shutdown_on_exit=False: the lifespan shuts it down, bounded (``shutdown``); the
        # SDK's own atexit handler could wait half a minute on a dead collector.
        self.provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self.provider.get_tracer("gateway", __version__)
        self._propagator = get_global_textmap()
        self.fields = frozenset(name.lower().encode("latin-1") for name in self._propagator.fields)
        self._address_of = address_of

    # -- request start: the span, and the context that goes upstream -----------------------

    def start(self, record: RequestRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        carrier: dict[str, str] = {}
        fields = self.fields
        for name, value in headers:
            if name in fields:
                key, text = name.decode("latin-1"), value.decode("latin-1")
                # Repeated headers combine as an HTTP list (two traceparents: invalid, ignored).
                carrier[key] = f"{carrier[key]},{text}" if key in carrier else text
        parent: Context | None = self._propagator.extract(carrier) if carrier else None
        start_ns = time.time_ns() - int((time.monotonic() - record.started) * 1e9)
        span = self._tracer.start_span(
            f"{record.method} {record.route}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={"gateway.route": record.route, "http.request.method": record.method},
        )
        out: dict[str, str] = {}
        self._propagator.inject(out, context=set_span_in_context(span, parent))
        record.trace = (span, start_ns)
        record.trace_headers = tuple(
            (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in out.items()
        )

    # -- request end: the observer ----------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        trace = record.trace
        if trace is None:
            return
        record.trace = None
        span: Span = trace[0]
        start_ns: int = trace[1]
        if not span.is_recording():  # not sampled
            span.end()
            return
        name, attributes = self._describe(record)
        span.update_name(name)
        span.set_attributes(attributes)
        if record.time_to_first_token is not None:
            span.add_event(
                FIRST_TOKEN_EVENT,
                {"gateway.time_to_first_token": record.time_to_first_token},
                timestamp=start_ns + int(record.time_to_first_token * 1e9),
            )
        verdict = record.verdict
        if verdict is not None and verdict.outcome is Outcome.INCOMPLETE:
            span.set_status(StatusCode.ERROR, str(verdict.reason))
        span.end(end_time=start_ns + int(record.duration * 1e9))

    def _describe(self, record: RequestRecord) -> tuple[str, dict[str, Any]]:
        """The span's name and attributes, from the finished record."""
        # gateway.route and http.request.method were given at the start (for samplers).
        attributes: dict[str, Any] = {
            "gateway.request_id": record.request_id,
            "gateway.stream": record.stream,
            "gateway.client": record.client_name,
            "http.request.body.size": record.bytes_in,
            "http.response.body.size": record.bytes_out,
        }
        name = f"{record.method} {record.route}"
        if record.status:
            attributes["http.response.status_code"] = record.status
        if record.upstream is not None:
            attributes["gateway.upstream"] = record.upstream
            address = (
                self._address_of(record.route, record.upstream)
                if self._address_of is not None
                else None
            )
            if address is not None:
                attributes["server.address"] = address[0]
                if address[1] is not None:
                    attributes["server.port"] = address[1]
        model = bounded(record.model)
        if record.protocol is not None:
            spec = spec_for(record.protocol)
            if spec.genai_operation is not None:
                attributes["gen_ai.operation.name"] = spec.genai_operation
                name = f"{spec.genai_operation} {model}" if model else spec.genai_operation
            if spec.genai_provider is not None:
                attributes["gen_ai.provider.name"] = spec.genai_provider
        if model:
            attributes["gen_ai.request.model"] = model
        if record.upstream_model:
            attributes["gen_ai.response.model"] = bounded(record.upstream_model)
        usage = record.usage
        if usage is not None:
            if usage.input_tokens is not None:
                attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            if usage.output_tokens is not None:
                attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        verdict = record.verdict
        if verdict is not None:
            attributes["gateway.outcome"] = str(verdict.outcome)
            attributes["gateway.reason"] = str(verdict.reason)
            if verdict.outcome is Outcome.INCOMPLETE:
                attributes["error.type"] = str(verdict.reason)
            finish = verdict.raw_finish_reasons
            if finish:
                attributes["gen_ai.response.finish_reasons"] = [
                    bounded(finish[index]) for index in sorted(finish)
                ]
        schema = record.schema_verdict
        if schema is not None:
            attributes["gateway.schema.verdict"] = str(schema.result)
            attributes["gateway.schema.kind"] = str(schema.kind)
            if schema.event >= 0:
                attributes["gateway.schema.pointer"] = schema.pointer
                attributes["gateway.schema.event"] = schema.event
            if schema.detail:
                attributes["gateway.schema.detail"] = schema.detail
        for field in _WHEN_SET:
            value = getattr(record, field)
            if value is not None and value != "":
                attributes["gateway." + field] = value
        return name, attributes

    def shutdown(self, timeout: float) -> None:
        """Flush and stop the exporter, waiting at most ``timeout`` seconds (a dead
        collector must not hold the process: the flush runs in a daemon thread)."""
        flush = threading.Thread(
            target=self.provider.shutdown, name="gateway-tracing-shutdown", daemon=True
        )
        flush.start()
        flush.join(timeout)

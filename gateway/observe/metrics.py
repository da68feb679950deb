"""Prometheus metrics: names, labels, buckets, and turning a finished request into samples.

Label values are bounded (docs/wire-contract.md, "Where the verdict is
recorded"): route names come from the config,
outcomes and reasons from the guard's closed vocabulary, models through an
allow-list (``ModelLabels``). Histogram buckets follow the OpenTelemetry
GenAI semantic conventions. In multiprocess mode (several workers) the
registry is collected from prometheus-client's per-process files; the
environment variable ``PROMETHEUS_MULTIPROC_DIR`` must be set before
``prometheus_client`` is first imported (the command line does that).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway import __version__, guard_build
from gateway.observe.record import RequestRecord
from gateway.observe.runtime import runtime_registry
from gateway.observe.table import Bounds, Declared, build
from gateway.observe.ws_metrics import WsMetrics

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Metrics",
    "ModelLabels",
    "multiprocess_enabled",
    "observe_all",
]

# OpenTelemetry GenAI semantic conventions, explicit bucket boundaries.
OPERATION_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip


def duration_buckets(longest: float) -> tuple[float, ...]:
    """The GenAI operation-duration buckets, doubled on past 81.92 s until ``longest``.

    A request lasts up to its total deadline (``timeouts.total``, 3600 s by
    default): without buckets up there every long stream lands in ``+Inf``.
    """
    buckets = list(OPERATION_DURATION_BUCKETS)
    while buckets[-1] < longest:
        buckets.append(round(buckets[-1] * 2, 2))
    return tuple(buckets)


TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip


def first_token_buckets(longest_first_byte: float) -> tuple[float, ...]:
    """The GenAI time-to-first-token buckets, doubled on past 10 s until ``longest_first_byte``.

    The convention's boundaries stop at 10 s, but a provider may take until the
    first-byte deadline (``timeouts.first_byte``, 300 s by default) to answer: without
    buckets up there every slow first token lands in ``+Inf``, where no quantile is read.
    """
    buckets = list(TIME_TO_FIRST_TOKEN_BUCKETS)
    while buckets[-1] < longest_first_byte:
        buckets.append(round(buckets[-1] * 2, 2))
    return tuple(buckets)


TIME_PER_OUTPUT_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip

OTHER_MODEL = "other"
NO_MODEL = "none"


def observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for every value, with one increment per bucket.

    prometheus-client has no bulk observe, and a stream's chunk gaps are one
    per output event: observing each took a lock and a Python loop over the
    buckets per event. Here each value is placed with ``bisect`` (the bucket
    ``observe`` would pick: the first upper bound >= the value) and each bucket
    and the sum are incremented once. It reads the histogram child's own
    ``_upper_bounds``, ``_buckets`` and ``_sum`` (stable since
    prometheus-client 0.4, and checked by a test against ``observe``); a child
    without them gets the plain ``observe`` per value.
    """
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect_left(bounds, value)] += 1
    total.inc(sum(values))
    for index, count in enumerate(counts):
        if count:
            buckets[index].inc(count)


Add = Callable[[float], None]


def fast_add(child: Any) -> Add:
    """``child.inc`` of a Counter's or Gauge's child without its checks per call: the
    child's value's own ``inc`` (private ``_value``, the same object prometheus-client's
    ``inc`` and ``dec`` end in, a lock in one process, a file in several). The label
    values are set and the amounts are the caller's to check (>= 0 for a Counter).
    tests/unit/test_metrics_fast.py holds it to the public API."""
    value = getattr(child, "_value", None)
    inc = getattr(value, "inc", None)
    if inc is None or getattr(child, "_is_most_recent", False):
        return child.inc  # type: ignore[no-any-return]
    return inc  # type: ignore[no-any-return]


def fast_observe(child: Any) -> Add:
    """``child.observe`` of a Histogram's child with a bisect for the bucket (prometheus-
    client walks every bound in Python): its private ``_sum``, ``_buckets`` and
    ``_upper_bounds``, as ``observe_all`` reads them; NaN (no bucket) takes ``observe``."""
    try:
        bounds, buckets, total = child._upper_bounds, child._buckets, child._sum
    except AttributeError:
        return child.observe  # type: ignore[no-any-return]
    add_sum = total.inc
    adds = [bucket.inc for bucket in buckets]
    observe = child.observe

    def fast(amount: float) -> None:
        if amount != amount:  # NaN
            observe(amount)
            return
        add_sum(amount)
        adds[bisect_left(bounds, amount)](1)

    return fast


def _counted(count: float) -> float:
    """A count for a Counter's fast path: what ``Counter.inc`` refuses is refused here."""
    if count < 0:
        raise ValueError(f"Counters can only be incremented by non-negative amounts: {count}")
    return count


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _label_safe(value: str) -> bool:
    """Short, and encodable as UTF-8 (a lone surrogate would break every later scrape)."""
    if len(value) > 128:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ModelLabels:
    """Maps model names onto a bounded set of label values.

    A client's claim alone never becomes a label, or an attacker could squat
    every slot with made-up names; a claim the configuration names (a key of an
    upstream's ``models`` map) is bounded, and is the label. With an explicit
    allow-list, the client's
    model or the upstream's reported one passes when it is on the list; without
    one, the model a 2xx upstream answer reported passes, for the first
    ``limit`` distinct names. Everything else becomes ``other`` (``none`` when
    no model was named at all).
    """

    def __init__(self, allowed: Iterable[str] = (), limit: int = 50) -> None:
        self._fixed = frozenset(allowed)
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def label(
        self, claimed: str | None, reported: str | None = None, *, configured: bool = False
    ) -> str:
        """The label for a request that asked for ``claimed`` and was answered by ``reported``.

        ``configured``: ``claimed`` is named in the configuration (an upstream's
        ``models`` map), so it is bounded and is the label.
        """
        if not claimed and not reported:
            return NO_MODEL
        if configured and claimed and _label_safe(claimed):
            return claimed
        if self._fixed:
            for model in (claimed, reported):
                if model and model in self._fixed:
                    return model
            return OTHER_MODEL
        model = reported
        if not model:
            return OTHER_MODEL
        if model in self._seen:
            return model
        with self._lock:
            if len(self._seen) < self._limit and _label_safe(model):
                self._seen.add(model)
                return model
        return OTHER_MODEL


class Metrics:
    """All gateway metrics on one registry: the table below, one row a metric
    (``gateway.observe.table``), in the order they are exposed."""

    name = "metrics"

    requests = Declared(
        "gateway_requests_total",
        Counter,
        "Proxied requests by the status the client got.",
        ("route", "method", "code", "client"),
    )
    request_duration = Declared(
        "gateway_request_duration_seconds",
        Histogram,
        "Request received to last byte sent.",
        ("route", "stream"),
        buckets=lambda b: duration_buckets(b.request),
    )
    streams = Declared(
        "gateway_streams_total",
        Counter,
        "Requests that asked for a stream, by verdict.",
        ("route", "model", "outcome", "reason", "client"),
    )
    active_streams = Declared(
        "gateway_active_streams",
        Gauge,
        "Streams being relayed now.",
        ("route",),
        mode="livesum",
    )
    time_to_first_byte = Declared(
        "gateway_time_to_first_byte_seconds",
        Histogram,
        "Request received to first body byte sent to the client.",
        ("route",),
        buckets=lambda b: first_token_buckets(b.first_byte),
    )
    time_to_first_token = Declared(
        "gateway_time_to_first_token_seconds",
        Histogram,
        "Request received to the first event carrying output.",
        ("route", "model"),
        buckets=lambda b: first_token_buckets(b.first_byte),
    )
    time_per_output_chunk = Declared(
        "gateway_time_per_output_chunk_seconds",
        Histogram,
        "Gaps between upstream reads that carried output (events in one read count once).",
        ("route", "model"),
        buckets=lambda b: TIME_PER_OUTPUT_TOKEN_BUCKETS,
    )
    tokens = Declared(
        "gateway_tokens_total",
        Counter,
        "Tokens as reported by the provider.",
        ("route", "model", "type", "client"),
    )
    client_tokens = Declared(
        "gateway_client_tokens_total",
        Counter,
        "Tokens charged to a named client: reported by the provider, or estimated.",
        ("client", "route", "model", "type", "source"),
    )
    spend = Declared(
        "gateway_spend_usd_total",
        Counter,
        "Money charged, in USD, priced from verified usage (evidence: reported, estimated, "
        "partial, unpriced).",
        ("client", "team", "model", "route", "evidence"),
    )
    schema_verdicts = Declared(
        "gateway_schema_verdicts_total",
        Counter,
        "Schema verdicts of structured answers and tool calls (kind: answer, tool; verdict: "
        "valid, invalid, refused, unchecked).",
        ("route", "protocol", "kind", "verdict"),
    )
    schema_holds = Declared(
        "gateway_schema_holds_total",
        Counter,
        'Answers held until they validated (schema_check = "hold"), by what each came to: '
        "released, retried, failed, over_bytes, over_time.",
        ("route", "result"),
    )
    limited_requests = Declared(
        "gateway_limited_requests_total",
        Counter,
        "Requests a named client's limits refused (429), or 503 with the backend down.",
        ("client", "limit"),
    )
    budget_remaining = Declared(
        "gateway_client_budget_remaining_tokens",
        Gauge,
        "Tokens left in a named client's day or month budget, as last counted.",
        ("client", "window"),
        mode="mostrecent",
    )
    budget_tokens = Declared(
        "gateway_client_budget_tokens",
        Gauge,
        "A named client's day or month token budget (per worker with limits_per_worker).",
        ("client", "window"),
        mode="mostrecent",
    )
    limit_backend_errors = Declared(
        "gateway_limit_backend_errors_total",
        Counter,
        "Limits backend calls that failed or timed out, by operation.",
        ("operation",),
    )
    usage_unknown = Declared(
        "gateway_usage_unknown_total",
        Counter,
        "Streams that ended without reported usage.",
        ("route", "model"),
    )
    relayed_bytes = Declared(
        "gateway_relayed_bytes_total",
        Counter,
        "Body bytes relayed, by direction.",
        ("route", "direction"),
    )
    rejected = Declared(
        "gateway_rejected_requests_total",
        Counter,
        "Requests refused before reaching an upstream.",
        ("reason",),
    )
    cache = Declared(
        "gateway_cache_total",
        Counter,
        "Response cache decisions: hit, miss, bypass, follow (a live leader's answer), "
        "stored, refused (not stored: why).",
        ("route", "result", "reason"),
    )
    cache_saved_tokens = Declared(
        "gateway_cache_saved_tokens_total",
        Counter,
        "Provider tokens (input + output) that cache hits did not spend.",
        ("route",),
    )
    request_errors = Declared(
        "gateway_request_errors_total",
        Counter,
        "Requests whose exchange with the upstream or the client failed, by kind.",
        ("route", "error"),
    )
    upstream_attempts = Declared(
        "gateway_upstream_attempts_total",
        Counter,
        "Attempts on each upstream of a route's pool, by result.",
        ("route", "upstream", "result"),
    )
    continuations = Declared(
        "gateway_continuations_total",
        Counter,
        "Streams cut after some text that were continued, by result.",
        ("route", "upstream", "result"),
    )
    upstream_ejected = Declared(
        "gateway_upstream_ejected",
        Gauge,
        "1 from an upstream's ejection until a probe request succeeds (any worker).",
        ("route", "upstream"),
        mode="livemax",
    )
    upstream_active = Declared(
        "gateway_upstream_active_streams",
        Gauge,
        "Requests in flight on an upstream, streams included (what balancing compares).",
        ("route", "upstream"),
        mode="livesum",
    )
    observer_errors = Declared(
        "gateway_observer_errors_total",
        Counter,
        "Failures of an observer (metrics, access log, tracing, status) on a finished request.",
        ("observer",),
    )
    forged_annotations = Declared(
        "gateway_forged_annotations_total",
        Counter,
        "Upstream comment lines that began with the annotation's prefix, never relayed.",
        ("route",),
    )
    partial_event_refusals = Declared(
        "gateway_partial_event_refusals_total",
        Counter,
        "Streams ended because all streams together held limits.max_partial_event_bytes "
        "of unfinished events.",
        ("route",),
    )
    captures_written = Declared(
        "gateway_captures_written_total",
        Counter,
        "Capture files written (routes with capture set).",
        ("route",),
    )
    captures_dropped = Declared(
        "gateway_captures_dropped_total",
        Counter,
        "Captures not written: the writer's queue was full, or the write failed.",
        ("route", "reason"),
    )
    access_log_dropped = Declared(
        "gateway_access_log_dropped_lines_total",
        Counter,
        "Access-log lines dropped: stdout did not take them (a stalled reader).",
    )
    build_info = Declared(
        "gateway_build_info",
        Gauge,
        "Build information; the value is always 1. guard: compiled or python.",
        ("version", "guard"),
        mode="max",
    )
    resumes = Declared(
        "gateway_resumes_total",
        Counter,
        "Resumes of a stream (GET .../gateway/streams/{id}, a Responses retrieve), by result.",
        ("route", "result"),
    )
    detached_streams = Declared(
        "gateway_detached_streams",
        Gauge,
        "Streams read on into their log after their client left.",
        ("route",),
        mode="livesum",
    )
    stream_store_bytes = Declared(
        "gateway_stream_store_bytes",
        Gauge,
        "Bytes of stream logs this process holds in the stream store (its own accounting).",
        mode="livesum",
    )
    resume_off = Declared(
        "gateway_resume_off_total",
        Counter,
        "Streams of a resumable route served without resume, by reason (store_full, store_error).",
        ("route", "reason"),
    )
    key_changes = Declared(
        "gateway_key_changes_total",
        Counter,
        "Changes to issued keys made by this process (admin API), by action "
        "(create, update, rotate, revoke).",
        ("action",),
    )

    def __init__(
        self, longest_request_seconds: float = 3600.0, longest_first_byte_seconds: float = 300.0
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # _created series: noise
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._adds: dict[tuple[Any, ...], Add] = {}
        self.multiprocess = multiprocess_enabled()
        #: The multiprocess directory (None with one process); the status page shares it.
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        #: process_* and python_* (gateway.observe.runtime), appended to the exposition.
        self.runtime = runtime_registry(self.multiprocess_dir)
        build(self, self.registry, Bounds(longest_request_seconds, longest_first_byte_seconds))
        self.build_info.labels(__version__, guard_build()).set(1)
        #: The Responses WebSocket connections' own (gateway.observe.ws_metrics).
        self.websocket = WsMetrics(self.registry)

    def stream_started(self, route: str) -> None:
        self._add(self.active_streams, route)(1)

    def stream_ended(self, route: str) -> None:
        self._add(self.active_streams, route)(-1)

    def upstream_started(self, route: str, upstream: str) -> None:
        self._add(self.upstream_active, route, upstream)(1)

    def upstream_ended(self, route: str, upstream: str) -> None:
        self._add(self.upstream_active, route, upstream)(-1)

    def upstream_out(self, route: str, upstream: str, out: bool) -> None:
        """An upstream was ejected (``out``), or returned by a successful probe."""
        self._child(self.upstream_ejected, route, upstream).set(1 if out else 0)

    def continuation(self, route: str, upstream: str, result: str) -> None:
        """A cut stream's continuation: ``ok``, ``rejected``, ``failed``, ``not_honoured``,
        ``not_continuable``, ``body_unreadable``."""
        self._child(self.continuations, route, upstream, result).inc()

    def upstream_declared(self, route: str, upstream: str) -> None:
        """Show an upstream's gauges, and its route's streams, at 0 from the start:
        absent series hide a pool, and an autoscaler reading ``gateway_active_streams``
        (the HPA through the Prometheus Adapter, KEDA) finds no value for a pod that has
        served no stream yet."""
        self._child(self.upstream_ejected, route, upstream).set(0)
        self._child(self.upstream_active, route, upstream)
        self._child(self.active_streams, route)

    def resumed(self, route: str, result: str) -> None:
        """A resume: ``ok``, ``not_found``, ``expired``, ``bad_cursor``, ``owner_lost``,
        ``continued``."""
        self._child(self.resumes, route, result).inc()

    def detached(self, route: str, delta: int) -> None:
        self._add(self.detached_streams, route)(delta)

    def store_bytes(self, size: int) -> None:
        self.stream_store_bytes.set(size)

    def resume_refused(self, route: str, reason: str) -> None:
        self._child(self.resume_off, route, reason).inc()

    def key_changed(self, action: str) -> None:
        self._child(self.key_changes, action).inc()

    def reject(self, reason: str) -> None:
        self._child(self.rejected, reason).inc()

    def cached(self, route: str, result: str, reason: str = "") -> None:
        """One response-cache decision (``reason``: a closed vocabulary, or empty)."""
        self._child(self.cache, route, result, reason).inc()

    def cache_saved(self, route: str, tokens: int) -> None:
        if tokens > 0:
            self._child(self.cache_saved_tokens, route).inc(tokens)

    def limited(self, client: str, limit: str) -> None:
        self._child(self.limited_requests, client, limit).inc()

    def limit_backend_failed(self, operation: str) -> None:
        self._child(self.limit_backend_errors, operation).inc()

    def budget(self, client: str, window: str, limit: int, used: int) -> None:
        """A client's budget as last counted: ``used`` of ``limit`` in ``window``."""
        self._child(self.budget_tokens, client, window).set(limit)
        self._child(self.budget_remaining, client, window).set(max(limit - used, 0))

    def observer_failed(self, observer: str) -> None:
        self._child(self.observer_errors, observer).inc()

    def forged_annotations_dropped(self, route: str, count: int) -> None:
        self._child(self.forged_annotations, route).inc(count)

    def partial_event_refused(self, route: str) -> None:
        self._child(self.partial_event_refusals, route).inc()

    def capture_written(self, route: str) -> None:
        self._child(self.captures_written, route).inc()

    def capture_dropped(self, route: str, reason: str) -> None:
        self._child(self.captures_dropped, route, reason).inc()

    def access_log_lines_dropped(self, lines: int) -> None:
        self.access_log_dropped.inc(lines)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, memoized: label values are bounded, lookups are hot."""
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _add(self, metric: Any, *values: str) -> Add:
        """``_child(metric, *values)``'s ``inc`` (``observe`` for a Histogram), the fast way
        (``fast_add``, ``fast_observe``), memoized like the children."""
        key = (metric, *values)
        add = self._adds.get(key)
        if add is None:
            child = self._child(metric, *values)
            add = fast_observe(child) if isinstance(metric, Histogram) else fast_add(child)
            self._adds[key] = add
        return add

    def observe(self, record: RequestRecord) -> None:
        """Record one finished proxied request."""
        add = self._add
        route, model, client = record.route, record.model_label, record.client_name
        add(self.requests, route, record.method, str(record.status), client)(1)
        add(self.request_duration, route, "true" if record.stream else "false")(record.duration)
        if record.time_to_first_byte is not None:
            add(self.time_to_first_byte, route)(record.time_to_first_byte)
        if record.time_to_first_token is not None:
            add(self.time_to_first_token, route, model)(record.time_to_first_token)
        if record.chunk_gaps:
            observe_all(self._child(self.time_per_output_chunk, route, model), record.chunk_gaps)
        if record.bytes_out:
            add(self.relayed_bytes, route, "upstream_to_client")(record.bytes_out)
        if record.bytes_in:
            add(self.relayed_bytes, route, "client_to_upstream")(record.bytes_in)
        if record.error is not None:
            add(self.request_errors, route, record.error)(1)
        for attempt in record.attempts:
            add(self.upstream_attempts, route, attempt.upstream, attempt.result)(1)
        verdict = record.verdict
        usage = record.usage
        if usage is not None:
            for kind, count in usage.as_dict().items():
                if count:
                    add(self.tokens, route, model, kind, client)(_counted(count))
        charge = record.charge
        if charge is not None:
            source = charge.source.value
            if charge.input:
                add(self.client_tokens, client, route, model, "input", source)(
                    _counted(charge.input)
                )
            if charge.output:
                add(self.client_tokens, client, route, model, "output", source)(
                    _counted(charge.output)
                )
        spend = record.spend
        if spend is not None and (spend.nanos or spend.evidence != "reported"):
            add(self.spend, client, record.team or "none", model, route, spend.evidence.value)(
                spend.nanos / 1_000_000_000
            )
        for part in record.schema:
            add(self.schema_verdicts, route, record.protocol or "none", part.kind, part.result)(1)
        for result in record.schema_holds:
            add(self.schema_holds, route, result)(1)
        if record.stream and verdict is not None:
            outcome, reason = verdict.outcome.value, verdict.reason.value
            add(self.streams, route, model, outcome, reason, client)(1)
            if usage is None:
                add(self.usage_unknown, route, model)(1)

    def exposition(self) -> bytes:
        """The text exposition of all metrics (summed over workers in multiprocess mode)."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry) + generate_latest(self.runtime)
        return generate_latest(self.registry) + generate_latest(self.runtime)

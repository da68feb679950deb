"""RequestRecord: the facts about one proxied request, filled in by the relay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.guard.verdict import Usage, Verdict
from gateway.policy.errors import RequestError
from gateway.schema.verdict import SchemaVerdict, worst

if TYPE_CHECKING:
    from gateway.money.charge import Charge
    from gateway.policy.quota import Cost

__all__ = ["Attempt", "Part", "RequestRecord"]


@dataclass(frozen=True, slots=True)
class Part:
    """One attempt's share of a rescued answer (``gateway.proxy.continuation``): the
    upstream and model that relayed it, how it ended, and what it was billed."""

    upstream: str
    model: str | None
    outcome: str  # "complete", or the reason the attempt was cut
    usage: Usage
    #: ``reported`` (the upstream reported its usage whole), else ``estimated`` (from
    #: the request and what it relayed, its reported counts included)
    evidence: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a request on one upstream of its route's pool."""

    upstream: str  # the upstream's configured name
    result: str  # ok, connect_error, timeout, status_429, status_5xx, status_4xx, ...
    duration: float  # seconds, from sending the request to the end of this attempt
    #: Why an attempt that failed before anything reached the client failed (the
    #: stream's reason, e.g. ``idle_timeout`` behind ``early_eof``): the log's
    #: ``retry_cause``. None for an answer relayed to the client.
    cause: str | None = None


@dataclass(slots=True)
class RequestRecord:
    """Mutable while the request runs; handed to metrics and the access log at the end.

    Times are seconds on the monotonic clock relative to ``started``; None
    means the moment never came (no byte sent, no token seen).
    """

    request_id: str
    route: str
    method: str
    path: str
    started: float
    client: str | None = None  # the peer address, or the client behind a trusted proxy
    client_name: str = "anonymous"  # the named client whose key it presented ([[clients]])
    charge: Cost | None = None  # what a named client was charged (its limits, its tokens)
    #: What it cost in money (``gateway.spend``), with its evidence; None: not priced.
    spend: Charge | None = None
    team: str | None = None  # the named client's team, if it has one
    #: The budgets its settlement charged, each with what it has left (its receipt's).
    #: (scope, limit, value, left, whether it counts money in nano-dollars)
    budgets: list[tuple[str, str, int, int, bool]] | None = None
    status: int = 0
    model: str | None = None  # as the client asked (logged; a label only via the allow-list)
    upstream_model: str | None = None  # as a 2xx answer of the upstream reported it
    model_label: str = "none"
    user_agent: str | None = None
    stream: bool = False
    verdict: Verdict | None = None
    #: The schema check's verdict of each judged part (answer, tool calls), when the
    #: request asked for a schema (``gateway.schema``); empty: nothing was checked.
    schema: list[SchemaVerdict] = field(default_factory=list)
    #: On a route with ``schema_check = "hold"``: what each held answer came to
    #: (``released``, ``retried``, ``failed``, ``over_bytes``, ``over_time``).
    schema_holds: list[str] = field(default_factory=list)
    usage: Usage | None = None  # reported usage (streamed or from a JSON body)
    #: A continued stream that ended without a whole continuation: what all its attempts
    #: were billed, estimated (no reported usage covers them).
    billed: Usage | None = None
    #: A rescued answer's attempts that relayed part of it, in order: each is priced at
    #: its own upstream's prices, and the answer costs their sum (``gateway.spend``).
    parts: list[Part] = field(default_factory=list)
    #: Each part's money (nano-dollars; None: unpriced), once priced.
    part_nanos: list[int | None] = field(default_factory=list)
    upstream_request_id: str | None = None
    upstream: str | None = None  # the name of the upstream whose answer the client got
    attempts: list[Attempt] = field(default_factory=list)
    time_to_first_byte: float | None = None
    time_to_first_token: float | None = None
    duration: float = 0.0
    bytes_in: int = 0  # client -> upstream (request body bytes forwarded, every attempt's)
    bytes_out: int = 0  # upstream -> client (response body bytes sent, annotation included)
    chunk_gaps: list[float] = field(default_factory=list)
    rejected: str | None = None  # reason label when refused before reaching an upstream
    error: RequestError | None = None  # a closed vocabulary, never exception text
    #: Continuations of a stream cut after some text reached the client.
    continued: int = 0
    #: Why a cut stream on a route that continues was not continued, where it was not
    #: even tried (``body_unreadable``, ``not_continuable``).
    not_continued: str | None = None
    #: The client left a resumable stream and its answer was read on into the log.
    detached: bool = False
    #: On a caching route: hit, follow, miss, refused or bypass (``gateway.cache``).
    cache: str | None = None
    #: The upstream's chunks, on a route that captures its streams: a
    #: ``gateway.capture.tap.Tap``, which only the capture writer reads (observe is below
    #: capture, so the record does not name it).
    tap: object = None
    protocol: str | None = None  # the registry's name of the request's protocol, once known
    transport: str = "http"  # "websocket": one response (or the end) of a WebSocket connection
    #: WebSocket facts: the connection's id, and at its end its responses and close codes.
    websocket: dict[str, Any] | None = None
    # Set by a trace hook at the start (gateway.observe.hooks): its handle (a span), ended
    # by its observer, and the headers that carry the request's trace context upstream.
    trace: Any = None
    trace_headers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def schema_verdict(self) -> SchemaVerdict | None:
        """The one schema verdict that speaks for the request (the worst part's)."""
        return worst(self.schema) if self.schema else None

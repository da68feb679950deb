"""The start half of per-request tracing: a hook the relay calls once as a request begins.

Tracing has two moments. At the start the hook opens whatever it keeps for
the request (a span) in ``record.trace`` and puts the headers that carry
the request's context upstream in ``record.trace_headers``; the relay adds
those to the upstream request and drops the client's own headers of the
same names (``fields``), so exactly one trace context goes upstream. At the
end the same object, as an observer, ends it from the finished record. With
no hook configured, the relay pays one ``if`` per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.observe.record import RequestRecord

__all__ = ["TraceHook", "TracingHook"]


class TraceHook(Protocol):
    """Starts a request's trace; as an observer (``name``, ``observe``) it ends it."""

    @property
    def fields(self) -> frozenset[bytes]:
        """Lower-case names of the request headers the hook sets upstream."""
        ...

    def start(self, record: RequestRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """A request began (``headers``: the client's): set ``record.trace``/``trace_headers``."""
        ...


class TracingHook(TraceHook, Protocol):
    """A trace hook that is also the observer ending each trace, and can be shut down."""

    @property
    def name(self) -> str: ...

    def observe(self, record: RequestRecord) -> None: ...

    def shutdown(self, timeout: float) -> None:
        """Flush what is queued and stop, waiting at most ``timeout`` seconds."""
        ...

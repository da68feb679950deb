"""Any other event stream: SSE framing is checked, no completion contract applies."""

from __future__ import annotations

from gateway.guard import FramingOnly, Protocol
from gateway.guard.usage import chat_usage
from gateway.protocols._spec import ProtocolSpec, body_says_stream

__all__ = ["SSE"]

SSE = ProtocolSpec(
    protocol=Protocol.SSE,
    contract=FramingOnly,
    matches=lambda path: True,
    wants_stream=body_says_stream,
    answer_usage=lambda body: chat_usage(body.get("usage")),
    any_path=True,
    # a path no protocol claims may front any provider: every provider's overloaded
    cool_down_statuses=frozenset({429, 503, 529}),
)

"""The protocol registry: one ``ProtocolSpec`` per protocol family, and lookups over them.

Nothing else in the gateway knows a protocol's details: the relay, routing,
settings, captures, the probe and the access log ask the registry. Adding a
protocol is its contract module in ``gateway/guard/`` (which names its
framing), its spec module here and one line in ``REGISTRY``
(docs/adding-a-protocol.md). Order matters for path detection: the first spec whose
``matches`` accepts a path wins, and ``SSE`` (framing only) comes last.
"""

from __future__ import annotations

from gateway.guard import Protocol
from gateway.protocols._spec import (
    ClientRequests,
    ContractOptions,
    CredentialStyle,
    ErrorShape,
    ProtocolSpec,
    Redaction,
    Redactor,
    Tool,
    openai_error,
)
from gateway.protocols.anthropic import MESSAGES
from gateway.protocols.bedrock import BEDROCK
from gateway.protocols.google import GEMINI
from gateway.protocols.ollama import OLLAMA
from gateway.protocols.openai import CHAT, COMPLETIONS, RESPONSES
from gateway.protocols.sse import SSE

__all__ = [
    "ANY_PATH",
    "REGISTRY",
    "RETRIEVABLE",
    "UPSTREAM_REQUEST_ID_HEADERS",
    "ClientRequests",
    "ContractOptions",
    "CredentialStyle",
    "ErrorShape",
    "ProtocolSpec",
    "Redaction",
    "Redactor",
    "Tool",
    "detect",
    "openai_error",
    "spec_for",
]

#: Every protocol, in path-detection order (``SSE`` last: it matches anything).
REGISTRY: tuple[ProtocolSpec, ...] = (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    MESSAGES,
    GEMINI,
    OLLAMA,
    BEDROCK,
    SSE,
)

#: The spec of a path no other spec claims (a route for any path): its framing is checked,
#: no completion contract applies. What a caller falls back to without naming it.
ANY_PATH: ProtocolSpec = SSE

#: Every header an upstream may name its own request id in, the registry's order.
UPSTREAM_REQUEST_ID_HEADERS: tuple[str, ...] = tuple(
    dict.fromkeys(name for spec in REGISTRY for name in spec.request_id_headers)
)

#: The protocols whose streams a client may retrieve again by an id they name.
RETRIEVABLE: tuple[ProtocolSpec, ...] = tuple(spec for spec in REGISTRY if spec.retrieval)

_BY_NAME: dict[Protocol, ProtocolSpec] = {spec.protocol: spec for spec in REGISTRY}


def spec_for(protocol: Protocol | str) -> ProtocolSpec:
    """The spec of a protocol by name."""
    return _BY_NAME[Protocol(protocol)]


def detect(path: str) -> ProtocolSpec:
    """The protocol a request path (below the route prefix) speaks, by its last segment(s)."""
    path = path.split("?", 1)[0]
    for spec in REGISTRY:
        if spec.matches(path):
            return spec
    return ANY_PATH

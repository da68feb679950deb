"""ProtocolSpec: everything the gateway knows about one protocol family, in one frozen record.

The guard's contract class holds what the stream itself must satisfy (its
termination rule, finish-reason table, wording and error-event shape); the
spec adds what the rest of the gateway needs around it: which request paths
speak the protocol, how a request asks for a stream, how to read usage and
model from a non-streamed answer, and how the upstream expects its credential.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.guard import Contract, Protocol, Reason, Usage

__all__ = ["ContractOptions", "CredentialStyle", "ProtocolSpec", "body_says_stream"]

Json = dict[str, Any]


class CredentialStyle(enum.StrEnum):
    """How an upstream expects the route's credential."""

    BEARER = "bearer"  # Authorization: Bearer <key>
    X_API_KEY = "x-api-key"  # Anthropic
    X_GOOG_API_KEY = "x-goog-api-key"  # Google's Gemini API


@dataclass(frozen=True, slots=True)
class ContractOptions:
    """Route options a contract may honour."""

    require_finish_reason: bool = True
    withhold_usage: bool = False


def body_says_stream(path: str, body: Json | None) -> bool:
    """The OpenAI/Anthropic way: the JSON body has ``"stream": true``."""
    return body is not None and body.get("stream") is True


def _model_field(body: Json) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


@dataclass(frozen=True, slots=True)
class ProtocolSpec:
    """One protocol family: its contract and everything the relay must know about it."""

    protocol: Protocol
    #: The guard's contract class for a stream of this protocol.
    contract: type[Contract]
    #: Whether a request path (below the route's prefix, no query) speaks this protocol.
    matches: Callable[[str], bool]
    #: Whether a request (path below the prefix, parsed JSON body or None) asks for a stream.
    wants_stream: Callable[[str, Json | None], bool]
    #: Usage of a whole non-streamed answer (its parsed JSON object).
    answer_usage: Callable[[Json], Usage | None]
    #: The credential style used for a route fixed to this protocol (``auto``).
    credential: CredentialStyle = CredentialStyle.BEARER
    #: The model that answered, from a whole non-streamed answer.
    answer_model: Callable[[Json], str | None] = _model_field
    #: Build the contract for one stream from the route's options.
    make_contract: Callable[[ContractOptions], Contract] | None = None
    #: Rewrite a stream request's JSON body to ask for usage; True when it did (Chat only).
    ask_for_usage: Callable[[Json], bool] | None = None
    #: ``gen_ai.operation.name`` of the OpenTelemetry GenAI semantic conventions.
    genai_operation: str | None = None
    #: ``gen_ai.provider.name``: the provider whose API this is (an OpenAI-compatible
    #: server speaks ``openai``'s; the conventions name no better value for it).
    genai_provider: str | None = None

    @property
    def name(self) -> str:
        return str(self.protocol)

    @property
    def finish_table(self) -> Mapping[str, Reason]:
        return self.contract.finish_table

    def new_contract(self, options: ContractOptions) -> Contract:
        if self.make_contract is not None:
            return self.make_contract(options)
        return self.contract()

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
from dataclasses import dataclass, field
from typing import Any

from gateway.guard import Contract, Framing, Protocol, Reason, Usage

__all__ = [
    "ClientRequests",
    "ContractOptions",
    "CredentialStyle",
    "ProtocolSpec",
    "Tool",
    "body_says_stream",
]

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
    #: A clean end after every choice finished is complete without ``[DONE]`` (Chat,
    #: Completions: a route's ``termination = "finish"``).
    end_on_finish: bool = False


@dataclass(frozen=True, slots=True)
class Tool:
    """A function tool as a client declares it: name, description, JSON Schema."""

    name: str
    description: str
    parameters: Json


@dataclass(frozen=True, slots=True)
class ClientRequests:
    """How a client asks this protocol for an answer (``gateway probe`` speaks through it).

    Each builder returns a fresh JSON body; ``tool`` and ``choices`` are None
    where the protocol has no tool calls or no several answers per request.
    """

    #: The request path below the route's prefix (query included) for a model.
    path: Callable[[str, bool], str]
    #: A body asking ``model`` to answer ``prompt`` within ``max_tokens``, streamed or not.
    text: Callable[[str, str, int, bool], Json]
    #: Headers the protocol requires of a client besides the content type.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Declare one tool in a body and make the model call it.
    tool: Callable[[Json, Tool], None] | None = None
    #: Ask a body for ``n`` answers.
    choices: Callable[[Json, int], None] | None = None


def body_says_stream(path: str, body: Json | None) -> bool:
    """The OpenAI/Anthropic way: the JSON body has ``"stream": true``."""
    return body is not None and body.get("stream") is True


def _model_field(body: Json) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


def body_model(path: str, body: Json | None) -> str | None:
    """The OpenAI/Anthropic way: the request body's ``model``."""
    return _model_field(body) if body is not None else None


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
    #: The credential style (``auto``) of a request in this protocol.
    credential: CredentialStyle = CredentialStyle.BEARER
    #: A spec for any path no other claims (bare SSE): its requests' credential style
    #: on a route for any path is guessed from the upstream's host instead.
    any_path: bool = False
    #: The model that answered, from a whole non-streamed answer.
    answer_model: Callable[[Json], str | None] = _model_field
    #: The model a request asks for (path below the prefix, parsed JSON body or None).
    request_model: Callable[[str, Json | None], str | None] = body_model
    #: Build the contract for one stream from the route's options.
    make_contract: Callable[[ContractOptions], Contract] | None = None
    #: Rewrite a stream request's JSON body to ask for usage; True when it did (Chat only).
    ask_for_usage: Callable[[Json], bool] | None = None
    #: How a client speaks it (None: no answer shape to ask for, e.g. bare SSE).
    requests: ClientRequests | None = None
    #: ``gen_ai.operation.name`` of the OpenTelemetry GenAI semantic conventions.
    genai_operation: str | None = None
    #: ``gen_ai.provider.name``: the provider whose API this is (an OpenAI-compatible
    #: server speaks ``openai``'s; the conventions name no better value for it).
    genai_provider: str | None = None
    #: Request headers that change an answer (the response cache keys on them), lowercase.
    answer_headers: tuple[bytes, ...] = ()
    #: The finish reason of a whole non-streamed answer, in the bounded vocabulary;
    #: None when it did not finish (or the protocol's answer has no such reason). The
    #: response cache stores a plain answer only with a finish in ``cache_reasons``.
    answer_finish: Callable[[Json], Reason | None] | None = None

    @property
    def name(self) -> str:
        return str(self.protocol)

    @property
    def framing(self) -> Framing:
        """How its streams are framed (media type, decoder, trailer): the contract's."""
        return self.contract.framing

    @property
    def finish_table(self) -> Mapping[str, Reason]:
        return self.contract.finish_table

    def new_contract(self, options: ContractOptions) -> Contract:
        if self.make_contract is not None:
            return self.make_contract(options)
        return self.contract()

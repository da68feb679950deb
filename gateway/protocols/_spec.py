"""ProtocolSpec: everything the gateway knows about one protocol family, in one frozen record.

The guard's contract class holds what the stream itself must satisfy (its
termination rule, finish-reason table, wording and error-event shape); the
spec adds what the rest of the gateway needs around it: which request paths
speak the protocol, how a request asks for a stream, how to read usage and
model from a non-streamed answer, and how the upstream expects its credential.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.guard import Contract, Framing, Protocol, Reason, Usage
from gateway.protocols.credentials import CredentialStyle
from gateway.protocols.retrieval import Retrieval
from gateway.protocols.structured import Structured

__all__ = [
    "ClientRequests",
    "ContractOptions",
    "CredentialStyle",
    "ErrorShape",
    "ProtocolSpec",
    "Redaction",
    "Tool",
    "UsageBasis",
    "body_says_stream",
    "openai_error",
]

Json = dict[str, Any]

#: The JSON body of an error of the gateway's own: (status, message, OpenAI ``type``,
#: code, request id) -> body, in the shape the protocol's SDKs read as their own.
ErrorShape = Callable[[int, str, str, str, str], Json]


class Redactor(typing.Protocol):
    """What a capture's redactor offers a protocol (``gateway.capture.redact.Redactor``):
    masking of SSE blocks, of one JSON text per line, and of one JSON text."""

    def stream(self, data: bytes) -> bytes: ...

    def lines(self, data: bytes) -> bytes: ...

    def json(self, raw: bytes, tree: object) -> bytes: ...

    def learn(
        self,
        *,
        structural: frozenset[str] = ...,
        arguments: frozenset[str] = ...,
        indexes: tuple[str, ...] = ...,
    ) -> None: ...


#: How a captured stream of the protocol is redacted: (redactor, the stream's bytes) ->
#: the same bytes with every text masked, same length, same framing.
Redaction = Callable[[Redactor], Callable[[bytes], bytes]]


def openai_error(status: int, message: str, type_: str, code: str, request_id: str) -> Json:
    """OpenAI's ``{"error": {"message", "type", "code", "param": null}}`` (the default,
    and the shape of an error with no route)."""
    text = f"{message} (request_id={request_id})"
    return {"error": {"message": text, "type": type_, "code": code, "param": None}}


def _sse_redaction(redactor: Redactor) -> Callable[[bytes], bytes]:
    return redactor.stream


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
    #: Ask a body for an answer that fits a JSON Schema (its structured outputs).
    structured: Callable[[Json, Json], None] | None = None
    #: Where the simulator serves the protocol, for ``gateway probe --simulator``: below
    #: ``/v1`` (its route for any path) or on a route of its own fixed to the protocol.
    simulator_prefix: str = "/v1"


@dataclass(frozen=True, slots=True)
class UsageBasis:
    """How a protocol's reported counts relate to each other, so that a charge prices
    each token once (``gateway.spend``): whether its input count already holds the
    cached input (read and written), and whether its output count already holds the
    reasoning tokens."""

    input_includes_cached: bool = True
    output_includes_reasoning: bool = True


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
    #: The request fields that limit the answer's length (a dotted path for a nested
    #: one), the first one the field to add when a request names none
    #: (``budget_enforcement = "strict"`` caps them at the tokens the client has left).
    output_limit: tuple[str, ...] = ()
    #: ``gen_ai.operation.name`` of the OpenTelemetry GenAI semantic conventions.
    genai_operation: str | None = None
    #: ``gen_ai.provider.name``: the provider whose API this is (an OpenAI-compatible
    #: server speaks ``openai``'s; the conventions name no better value for it).
    genai_provider: str | None = None
    #: The shape of the gateway's own JSON errors on a route of this protocol.
    error_shape: ErrorShape = openai_error
    #: How a capture of one of its streams is redacted (by its framing's rules).
    redaction: Redaction = _sse_redaction
    #: Whether a cut stream may be continued by another request (``continue_after_cut``),
    #: the way httpx's ``Auth`` declares ``requires_request_body``: the contract then
    #: keeps the text (``keep_text``), says when it is ``continuable()`` and gives the
    #: ``joint``, and ``gateway.protocols.continuation`` builds the request.
    continuable: bool = False
    #: Substrings of an upstream URL that mark this provider's host: on a route for any
    #: path with ``credential_style = "auto"``, its credential goes in this spec's style.
    hosts: tuple[str, ...] = ()
    #: The AWS service a SigV4 signature of its requests names (``credential = SIGV4``).
    signing_service: str | None = None
    #: Its streams name an id a client may retrieve the stream by, from a cursor
    #: (the Responses API's ``GET {prefix}/responses/{id}?stream=true&starting_after=N``):
    #: a resumable stream's log is then found under that id too (``gateway.resume``).
    retrieval: Retrieval | None = None
    #: Request headers that change an answer (the response cache keys on them), lowercase.
    answer_headers: tuple[bytes, ...] = ()
    #: The finish reason of a whole non-streamed answer, in the bounded vocabulary;
    #: None when it did not finish (or the protocol's answer has no such reason). The
    #: response cache stores a plain answer only with a finish in ``cache_reasons``.
    answer_finish: Callable[[Json], Reason | None] | None = None
    #: Response headers its upstreams name their own request id in (the access log's
    #: ``upstream_request_id``, the client's ``x-upstream-request-id``), lowercase.
    request_id_headers: tuple[str, ...] = ()
    #: Statuses whose ``Retry-After`` makes its upstream cool down (a 429 without one:
    #: its doubling backoff): overloaded, by this protocol's words.
    cool_down_statuses: frozenset[int] = frozenset({429, 503})
    #: The provider whose prices its models are priced at in the price table (a
    #: ``genai-prices`` provider id); None: none (self-hosted), unless the upstream's
    #: URL or a price override names one.
    price_provider: str | None = None
    #: How its usage's counts relate (what a charge adds up).
    usage_basis: UsageBasis = UsageBasis()
    #: Where its requests carry a schema for the answer or its tools, and where its
    #: events carry the answer's text and tool calls (``gateway.schema``'s check);
    #: None: nothing of it is checked.
    structured: Structured | None = None

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

    def _output_limits(self, request: Json) -> list[tuple[str, str, int]]:
        """Each output field a request names with a positive count: (member, nested
        member or "", count). A count of 0 or less (Ollama's -1, no limit) is none."""
        found = []
        for path in self.output_limit:
            head, _, rest = path.partition(".")
            value = request.get(head)
            if value is None:  # the usual case: one lookup
                continue
            if rest:
                value = value.get(rest) if isinstance(value, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.append((head, rest, value))
        return found

    def requested_output(self, request: Json | None, default: int) -> int:
        """The output a request allows itself, by this protocol's own fields (the most
        any of them allows), else ``default`` (the route's reservation for a request that
        names none)."""
        if not self.output_limit or request is None:
            return default
        limits = self._output_limits(request)
        return max(count for _, _, count in limits) if limits else default

    def capped_output(self, request: Json | None, cap: int) -> Json:
        """The changes to a request (top-level members, objects merged) that limit its
        output to at most ``cap`` tokens: each of its output fields it names above the
        cap, or the first one when it names none; {} when nothing needs to change."""
        if not self.output_limit or request is None:
            return {}
        changes: Json = {}
        limits = self._output_limits(request)
        for head, rest, value in limits:
            if value > cap:
                changes[head] = {rest: cap} if rest else cap
        if not limits:
            head, _, rest = self.output_limit[0].partition(".")
            changes[head] = {rest: cap} if rest else cap
        return changes

    def new_contract(self, options: ContractOptions) -> Contract:
        if self.make_contract is not None:
            return self.make_contract(options)
        return self.contract()

"""The probe's checks: what each sends (fixed, synthetic, short) and how it is judged.

A check is run only where the route's protocol has it, as the protocol
registry says: ``usage`` where the protocol can be asked for usage
(``ProtocolSpec.ask_for_usage``), ``tool_call`` where it has tool calls and
``choices`` where one request can ask for several answers
(``ClientRequests.tool`` / ``.choices``). Every request is built by the
protocol's own ``ClientRequests``; the prompts are built in here, harmless
and short, with small ``max_tokens``, so a probe costs little.

A check is judged from what the gateway recorded of the request (its
``RequestRecord``: status, verdict, usage, timings), never by parsing the
answer a second way; the client side only adds what a client sees (the
status and media type it got, and where the usage chunk came). A cell keeps
categories only: no prompt, no answer text, no key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from gateway.guard import Contract, Framing, Outcome, Reason
from gateway.guard.framing import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_LINE_BYTES
from gateway.observe import RequestRecord
from gateway.protocols import ProtocolSpec, Tool
from gateway.simulator import STRUCTURED_SCHEMA

__all__ = [
    "CHECKS",
    "INVALID_MODEL",
    "Cell",
    "Observed",
    "ProbeRequest",
    "Target",
    "build_request",
    "checks_for",
    "judge",
    "usage_position",
]

#: Every check, in the order a route is probed.
CHECKS: Final = (
    "stream",
    "usage",
    "tool_call",
    "choices",
    "schema",
    "plain",
    "interrupted",
    "refused",
)
#: A model no provider has (the simulator refuses names that start with ``no-such-model``).
INVALID_MODEL: Final = "no-such-model-gateway-probe"

TEXT_PROMPT: Final = "Say hello in five words or fewer."
COUNT_PROMPT: Final = "Count from 1 to 100, one number per line."
TOOL_PROMPT: Final = "What is the weather in Paris? Use the get_weather tool."
TOOL: Final = Tool(
    name="get_weather",
    description="Get the current weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name."}},
        "required": ["city"],
    },
)
SCHEMA_PROMPT: Final = "Invent a person: a name, an age and a role (admin or user), as JSON."
#: The schema the ``schema`` check asks the answer to fit (in the strict-mode subset):
#: the one the simulator's structured answers are written against.
SCHEMA: Final = STRUCTURED_SCHEMA
_MAX_TOKENS: Final = {"tool_call": 64, "schema": 64, "interrupted": 256}
_DEFAULT_MAX_TOKENS: Final = 32


@dataclass(frozen=True, slots=True)
class Target:
    """One route, in one of its protocols, with one model."""

    route: str
    prefix: str
    spec: ProtocolSpec
    model: str

    @property
    def protocol(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """What one check sends through the gateway."""

    path: str  # the route's prefix and the protocol's path
    headers: dict[str, str]
    body: dict[str, Any]
    stream: bool

    def content(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


def checks_for(spec: ProtocolSpec) -> list[str]:
    """The checks a protocol has, in order (none for a protocol no client speaks)."""
    requests = spec.requests
    if requests is None:
        return []
    have = {
        "usage": spec.ask_for_usage is not None,
        "tool_call": requests.tool is not None,
        "choices": requests.choices is not None,
        "schema": requests.structured is not None,
    }
    return [name for name in CHECKS if have.get(name, True)]


def build_request(check: str, target: Target, extra: Mapping[str, str] = {}) -> ProbeRequest:
    """The fixed request of ``check`` for ``target`` (``extra``: more headers)."""
    spec = target.spec
    requests = spec.requests
    if requests is None or check not in checks_for(spec):
        raise ValueError(f"protocol {spec.name} has no check {check!r}")
    stream = check != "plain"
    model = INVALID_MODEL if check == "refused" else target.model
    prompt = {
        "tool_call": TOOL_PROMPT,
        "interrupted": COUNT_PROMPT,
        "schema": SCHEMA_PROMPT,
    }.get(check, TEXT_PROMPT)
    max_tokens = _MAX_TOKENS.get(check, _DEFAULT_MAX_TOKENS)
    body = requests.text(model, prompt, max_tokens, stream)
    if check == "usage" and spec.ask_for_usage is not None:
        spec.ask_for_usage(body)
    elif check == "tool_call" and requests.tool is not None:
        requests.tool(body, TOOL)
    elif check == "choices" and requests.choices is not None:
        requests.choices(body, 2)
    elif check == "schema" and requests.structured is not None:
        requests.structured(body, dict(SCHEMA))
    headers = {"content-type": "application/json", **requests.headers, **extra}
    return ProbeRequest(target.prefix + requests.path(model, stream), headers, body, stream)


@dataclass(slots=True)
class Observed:
    """What the probe, as a client, saw of one check."""

    status: int | None = None
    media_type: str | None = None
    #: The body, for the ``usage`` check's chunk position (other checks: empty).
    body: bytes = b""
    #: ``interrupted``: the probe closed the stream after its first content event.
    closed_early: bool = False
    #: A failure on the client side (the probe's own deadline, a broken connection).
    client_error: str | None = None


@dataclass(slots=True)
class Cell:
    """One row of the matrix: one route x model x check."""

    route: str
    protocol: str
    model: str
    check: str
    started_at: str
    passed: bool = False
    problem: str | None = None
    status: int | None = None
    media_type: str | None = None
    outcome: str | None = None
    reason: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    terminator: str | None = None
    usage: str | None = None
    usage_position: str | None = None
    tool_calls: int | None = None
    choices: int | None = None
    #: ``schema``: the gateway's schema verdict (valid: the upstream honoured the schema).
    schema: str | None = None
    error: str | None = None
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every field in order, the timings gathered under ``timings_ms``."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _TIMINGS}
        row["timings_ms"] = {"ttfb": self.ttfb_ms, "ttft": self.ttft_ms, "total": self.total_ms}
        return row


#: The fields of a ``Cell`` that its dict gathers under ``timings_ms``.
_TIMINGS: Final = frozenset({"ttfb_ms", "ttft_ms", "total_ms"})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def usage_position(body: bytes, framing: Framing = Contract.framing) -> str:
    """Where a Chat stream carried its usage: ``after_finish`` (a chunk of its own
    after every finish, as OpenAI sends it), ``with_finish``, ``before_finish``,
    ``several_chunks``, or ``absent``."""
    decoder = framing.new_decoder(DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_EVENT_BYTES)
    events = decoder.feed(body) + decoder.close()
    rows: list[tuple[bool, bool]] = []  # (carries usage, carries a finish)
    for event in events:
        try:
            obj = json.loads(event.data)
        except ValueError:
            continue  # [DONE], or anything that is not a chunk
        if not isinstance(obj, dict) or "error" in obj:
            continue
        choices = obj.get("choices")
        finish = isinstance(choices, list) and any(
            isinstance(c, dict) and c.get("finish_reason") for c in choices
        )
        rows.append((obj.get("usage") is not None, finish))
    carrying = [i for i, (usage, _) in enumerate(rows) if usage]
    if not carrying:
        return "absent"
    if len(carrying) > 1:
        return "several_chunks"
    at = carrying[0]
    finishes = [i for i, (_, finish) in enumerate(rows) if finish]
    if rows[at][1]:
        return "with_finish"
    if finishes and at > max(finishes):
        return "after_finish"
    return "before_finish"


def judge(
    check: str, target: Target, started_at: str, seen: Observed, record: RequestRecord | None
) -> Cell:
    """The cell of one check, from the gateway's record of it and what the client saw."""
    cell = Cell(target.route, target.protocol, target.model, check, started_at)
    cell.status = seen.status
    cell.media_type = seen.media_type
    if record is None:
        cell.problem = (
            f"no answer: {seen.client_error}"
            if seen.client_error
            else "the gateway recorded nothing"
        )
        return cell
    cell.status = record.status or seen.status
    cell.error = record.error
    cell.ttfb_ms = _ms(record.time_to_first_byte)
    cell.ttft_ms = _ms(record.time_to_first_token)
    cell.total_ms = _ms(record.duration)
    if check != "refused":
        cell.usage = "reported" if record.usage is not None else "unknown"
    verdict = record.verdict
    if verdict is not None:
        cell.outcome = str(verdict.outcome)
        cell.reason = str(verdict.reason)
        cell.finish_reasons = [str(r) for _, r in sorted(verdict.finish_reasons.items())]
        if verdict.outcome is Outcome.COMPLETE or verdict.reason is Reason.MISSING_FINISH:
            cell.terminator = "seen"
        elif verdict.reason is Reason.MISSING_DONE:
            cell.terminator = "missing"
        cell.tool_calls = verdict.tool_calls
        cell.choices = len(verdict.finish_reasons)
    schema = record.schema_verdict
    if schema is not None:
        cell.schema = str(schema.result)
    cell.problem = _problem(check, cell, seen, record, target.spec.framing.media_type)
    if check == "usage":
        cell.usage_position = usage_position(seen.body, target.spec.framing)
    cell.passed = cell.problem is None
    return cell


def _problem(
    check: str, cell: Cell, seen: Observed, record: RequestRecord, media_type: str
) -> str | None:
    """Why the check failed, in the probe's own words (None: it holds); ``media_type``
    is the one the protocol's framing streams in."""
    verdict = record.verdict
    status = record.status
    ended = f"{cell.outcome} ({cell.reason})" if verdict is not None else f"status {status}"
    if check == "refused":
        if record.rejected is not None:
            return f"the gateway refused it itself ({record.rejected})"
        if not 400 <= status < 500:
            return f"expected the provider's 4xx for an unknown model, got status {status}"
        if record.error is not None or (
            verdict is not None and verdict.reason is not Reason.UPSTREAM_STATUS
        ):
            return f"expected the provider's status relayed as it is, got {ended}"
        return None
    if check == "plain":
        if not 200 <= status < 300:
            return f"status {status}"
        if record.error is not None:
            return f"the answer was not relayed whole ({record.error})"
        if seen.media_type != "application/json":
            return f"media type {seen.media_type}, not application/json"
        return None
    if verdict is None:
        return f"no stream: status {status}" + (f" ({record.error})" if record.error else "")
    if check == "interrupted":
        if not seen.closed_early:
            return f"the stream ended ({ended}) before its first content event"
        if verdict.reason is Reason.CLIENT_DISCONNECT:
            return None
        if verdict.complete:
            return (
                "recorded complete although the probe left after the first content event "
                "(the whole answer was relayed before the gateway saw it leave)"
            )
        return f"expected client_disconnect, recorded {ended}"
    if not verdict.complete:
        return f"the stream ended {ended}"
    if seen.media_type != media_type:
        return f"media type {seen.media_type}, not {media_type}"
    if check == "usage":
        if verdict.usage is None:
            return "include_usage was accepted but no usage was reported"
        if verdict.usage.input_tokens is None or verdict.usage.output_tokens is None:
            return "usage lacks input or output tokens"
    elif check == "tool_call":
        if verdict.reason is not Reason.TOOL_CALLS or verdict.tool_calls < 1:
            return f"expected a tool call, the model finished with {verdict.reason}"
    elif check == "choices" and len(verdict.finish_reasons) != 2:
        return f"expected 2 choices to finish, {len(verdict.finish_reasons)} did"
    elif check == "schema":
        schema = record.schema_verdict
        if schema is None:
            return "no schema verdict (the route's schema_check is off)"
        if str(schema.result) != "valid":
            where = f" at {schema.pointer or '/'}" if schema.event >= 0 else ""
            detail = f": {schema.detail}" if schema.detail else ""
            return f"the upstream did not honour the schema ({schema.result}{where}{detail})"
    return None

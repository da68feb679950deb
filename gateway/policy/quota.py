"""A client's quota as arithmetic: what each limit is, its windows, the reservation
estimate, the settlement.

Pure: no clock (``now`` is always passed in, seconds since the epoch), no I/O.
The counters and the limiter that keeps them are ``gateway.limits``; the
gateway's own byte and concurrency limits (the ``[limits]`` table) are
``gateway.settings.GatewayLimits``. This module says what a limit is (``Limit``:
each kind with its own facts), which counters a request touches, by how much,
and what it finally cost.

- Windows are fixed UTC windows: a minute, a day, a month. A counter is named
  by its scope, its limit and its window's start, and lives until the
  window's end: nothing grows without bound.
- A reservation is the input estimate (the bytes of the prompt's text, 4 a
  token) plus the output the request allows by its protocol's own fields
  (``ProtocolSpec.requested_output``), or the route's
  ``default_output_reservation``.
- The settlement replaces it by the cost: the provider's reported usage when
  there is some (``reported``), else the input estimate plus the output bytes
  actually relayed, 4 a token (``estimated``). Never zero for a stream that
  produced output.
"""

from __future__ import annotations

import calendar
import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "BYTES_PER_TOKEN",
    "NOTHING",
    "Check",
    "Cost",
    "Limit",
    "Rule",
    "Source",
    "Window",
    "checks_for",
    "cost_of",
    "estimate_from",
    "estimate_input",
    "input_bound",
    "measure_input",
    "output_estimate",
    "window_end",
    "window_start",
]

#: The estimate's exchange rate, until the upstream's usage says otherwise.
BYTES_PER_TOKEN = 4


class Window(enum.StrEnum):
    """A fixed UTC window: the ``window`` label of the budget gauges."""

    MINUTE = "minute"
    DAY = "day"
    MONTH = "month"
    #: No end: a total budget (its counter's end is ``FOREVER``).
    TOTAL = "total"


#: The end of a total budget's window (9999-12-31T00:00:00Z): a counter that lives on.
FOREVER = 253402214400


class Limit(enum.StrEnum):
    """A client limit, with its own facts (the way httpx's ``codes`` carry their phrase):
    its window (None: the concurrency count), whether it counts tokens, its family of
    ``x-ratelimit-*`` headers (``requests``, ``tokens``) and the error ``code`` a refusal
    answers with. Its value is the ``limit`` label of ``gateway_limited_requests_total``
    and its name in ``[clients.limits]``."""

    window: Window | None
    counts_tokens: bool
    family: str
    code: str

    def __new__(
        cls, value: str, window: Window | None, counts_tokens: bool, family: str, code: str
    ) -> Limit:
        member = str.__new__(cls, value)
        member._value_ = value
        member.window = window
        member.counts_tokens = counts_tokens
        member.family = family
        member.code = code
        return member

    REQUESTS_PER_MINUTE = (
        "requests_per_minute",
        Window.MINUTE,
        False,
        "requests",
        "rate_limit_exceeded",
    )
    TOKENS_PER_MINUTE = ("tokens_per_minute", Window.MINUTE, True, "tokens", "rate_limit_exceeded")
    TOKENS_PER_DAY = ("tokens_per_day", Window.DAY, True, "tokens", "insufficient_quota")
    TOKENS_PER_MONTH = ("tokens_per_month", Window.MONTH, True, "tokens", "insufficient_quota")
    USD_PER_DAY = ("usd_per_day", Window.DAY, False, "usd", "insufficient_quota")
    USD_PER_MONTH = ("usd_per_month", Window.MONTH, False, "usd", "insufficient_quota")
    USD_TOTAL = ("usd_total", Window.TOTAL, False, "usd", "insufficient_quota")
    MAX_CONCURRENT_STREAMS = (
        "max_concurrent_streams",
        None,
        False,
        "requests",
        "rate_limit_exceeded",
    )

    @property
    def counts_money(self) -> bool:
        """Counts a request's money (nano-dollars), not its tokens or itself."""
        return self.family == "usd"

    @property
    def is_budget(self) -> bool:
        """A day's or a month's budget: spent, it answers ``insufficient_quota``."""
        return self.code == "insufficient_quota"


class Source(enum.StrEnum):
    """Where a settled cost came from: the ``source`` label of client tokens."""

    REPORTED = "reported"
    ESTIMATED = "estimated"


def window_start(window: Window, now: float) -> int:
    """The start of the UTC window that holds ``now``, in whole epoch seconds."""
    second = int(now)
    if window is Window.TOTAL:
        return 0
    if window is Window.MINUTE:
        return second - second % 60
    if window is Window.DAY:
        return second - second % 86400
    year, month = time.gmtime(second)[:2]
    return calendar.timegm((year, month, 1, 0, 0, 0))


def window_end(window: Window, now: float) -> int:
    """The end of the UTC window that holds ``now`` (the next one's start)."""
    if window is Window.TOTAL:
        return FOREVER
    start = window_start(window, now)
    if window is Window.MINUTE:
        return start + 60
    if window is Window.DAY:
        return start + 86400
    year, month = time.gmtime(start)[:2]
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


@dataclass(frozen=True, slots=True)
class Rule:
    """One scope's limits: a client's, or its share of one route or one model.

    ``scope`` names it in counters (``team-a``, ``team-a/route=chat``,
    ``team-a/model=gpt-4o``, a team's ``team:eng``); ``limits`` maps each configured
    limit to its value (a money limit's in nano-dollars); ``tag`` groups counters that
    one request touches together (a client in a team and its team share the team's).
    """

    scope: str
    limits: Mapping[Limit, int]
    tag: str = ""


class Check(NamedTuple):
    """One counter a request must fit in: ``used + amount <= value`` within its window,
    where the amount is the request's reserved tokens (``tokens``), else 1.

    ``key`` names the counter (scope, limit, window start); ``expires`` is its
    window's end (None: the concurrency count, which has no window). ``money``: the
    amount is the request's reserved money instead. ``tag``: its rule's. Nothing in it
    depends on the request but its scopes and the minute: checks are kept and reused.
    """

    scope: str
    limit: Limit
    value: int
    key: str
    tokens: bool
    expires: int | None
    money: bool = False
    tag: str = ""

    def amount(self, reserved: int, money: int = 0) -> int:
        return reserved if self.tokens else money if self.money else 1


def checks_for(rules: Iterable[Rule], stream: bool, now: float) -> list[Check]:
    """The counters a request touches at ``now``: requests, tokens, maybe one stream."""
    checks: list[Check] = []
    bounds: dict[Window, tuple[int, int]] = {}
    for rule in rules:
        for limit, value in rule.limits.items():
            window = limit.window
            if window is None:
                if stream:
                    key = f"{rule.scope}|{limit}"
                    checks.append(
                        Check(rule.scope, limit, value, key, False, None, False, rule.tag)
                    )
                continue
            bound = bounds.get(window)
            if bound is None:
                bound = bounds[window] = (window_start(window, now), window_end(window, now))
            key = f"{rule.scope}|{limit}|{bound[0]}"
            checks.append(
                Check(
                    rule.scope,
                    limit,
                    value,
                    key,
                    limit.counts_tokens,
                    bound[1],
                    limit.counts_money,
                    rule.tag,
                )
            )
    return checks


# -- the reservation estimate ---------------------------------------------------------------

#: Request fields whose text is the input: every protocol's names for it.
_INPUT_FIELDS = ("messages", "prompt", "input", "contents", "system", "instructions", "tools")


#: Tokens a message costs besides its text (its role, its delimiters): OpenAI's cookbook
#: counts 3 to 4 a message, and 3 for the answer's priming; both are counted on the
#: generous side.
MESSAGE_OVERHEAD = 4
#: The answer's priming, counted once a request.
REQUEST_OVERHEAD = 4
#: Request fields that hold the messages (each object in them is a message).
_MESSAGE_FIELDS = ("messages", "contents", "input")


def measure_input(request: Mapping[str, Any] | None, body_size: int) -> tuple[int, int]:
    """The UTF-8 bytes of a request's text and its count of messages; a body the gateway
    could not read as JSON is all text, one message."""
    if request is None:
        return body_size, 1
    # the fields' own strings here, their lists and objects in one walk (a walk a field
    # cost more than the text: this is on every limited request's path)
    size = 0
    messages = 0
    nested: list[object] = []
    for name in _INPUT_FIELDS:
        value = request.get(name)
        if value is None:
            continue
        kind = type(value)
        if kind is str:
            size += len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
            messages += 1 if name in _MESSAGE_FIELDS else 0
        elif kind is dict or kind is list:
            if kind is list and name in _MESSAGE_FIELDS:
                messages += len(value)
            nested.append(value)
    return (size + _nested_bytes(nested) if nested else size), messages


def estimate_input(request: Mapping[str, Any] | None, body_size: int) -> int:
    """Input tokens of a request: the UTF-8 bytes of its text, ``BYTES_PER_TOKEN`` a token,
    plus each message's overhead (``MESSAGE_OVERHEAD``) and the answer's priming."""
    return estimate_from(*measure_input(request, body_size))


def estimate_from(size: int, messages: int) -> int:
    """``estimate_input`` of a text of ``size`` bytes in ``messages`` messages."""
    return _tokens(size) + MESSAGE_OVERHEAD * messages + REQUEST_OVERHEAD


def input_bound(request: Mapping[str, Any] | None, body_size: int) -> int:
    """An upper bound of a request's input tokens (``budget_enforcement = "strict"``): one
    token a byte of its text (no byte-level tokenizer makes more tokens than bytes),
    plus each message's overhead and the answer's priming."""
    size, messages = measure_input(request, body_size)
    return size + MESSAGE_OVERHEAD * messages + REQUEST_OVERHEAD


def _tokens(size: int) -> int:
    return -(-size // BYTES_PER_TOKEN)


def _text_bytes(value: object) -> int:
    """The UTF-8 bytes of every string in ``value`` (nested lists and objects, as JSON
    parses them: exact types, checked with ``type`` because it is on the request path)."""
    if type(value) is str:
        text: str = value
        return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
    return _nested_bytes([value])


def _nested_bytes(stack: list[object]) -> int:
    """The UTF-8 bytes of every string in the lists and objects on ``stack`` (emptied).

    Each container's items are dispatched in one loop (strings counted there, only
    containers pushed): a chat message is one pop, not one a value.
    """
    total = 0
    pop = stack.pop
    push = stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            items: Iterable[object] = item.values()  # type: ignore[attr-defined]
        elif kind is list:
            items = item  # type: ignore[assignment]
        else:
            continue
        for part in items:
            kind = type(part)
            if kind is str:
                text: str = part  # type: ignore[assignment]
                total += len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
            elif kind is dict or kind is list:
                push(part)
    return total


# -- the settlement -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cost:
    """What a request really cost, in tokens, and where the numbers came from; ``money``
    its price in nano-dollars (``gateway.spend``), 0 when not priced."""

    input: int
    output: int
    source: Source
    money: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output


#: The cost of a request that never reached an upstream.
NOTHING = Cost(0, 0, Source.ESTIMATED)


def output_estimate(stream: bool, events: int, content_chars: int, body_bytes: int) -> int:
    """Output tokens of an answer that reported no usage, from what reached the client.

    A stream: its content characters, ``BYTES_PER_TOKEN`` a token, or its body bytes
    when it relayed events but no text (tool calls); nothing when it relayed no event.
    A plain answer: its body bytes.
    """
    if not stream:
        return _tokens(body_bytes)
    if events == 0:
        return 0
    return _tokens(content_chars) if content_chars else max(_tokens(body_bytes), 1)


def cost_of(
    reported_input: int | None,
    reported_output: int | None,
    estimated_input: int,
    estimated_output: int,
) -> Cost:
    """The cost of an answer: the provider's usage when it reported some, else estimated.

    A reported usage with one side missing takes the estimate for that side.
    """
    if reported_input is None and reported_output is None:
        return Cost(estimated_input, estimated_output, Source.ESTIMATED)
    return Cost(
        estimated_input if reported_input is None else reported_input,
        estimated_output if reported_output is None else reported_output,
        Source.REPORTED,
    )

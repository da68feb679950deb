"""Client limits without a socket: the windows, the estimate, the cost, the memory
backend's all-or-none reservation, and the limiter's answers, on a fake clock."""

from __future__ import annotations

import asyncio
import calendar
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.limits import BackendError, Limiter, LimitRefused, Reserved
from gateway.limits.backend import Ask, Bill
from gateway.limits.memory import MemoryBackend
from gateway.policy.quota import (
    Check,
    Cost,
    Limit,
    Rule,
    Source,
    Window,
    checks_for,
    cost_of,
    estimate_input,
    input_bound,
    output_estimate,
    window_end,
    window_start,
)
from gateway.protocols import spec_for
from gateway.proxy.limited import limited_body, limited_headers
from gateway.settings import ClientConfig, ClientLimits

NOW = calendar.timegm((2026, 12, 31, 23, 59, 30))  # 30 s before a new year


def test_windows_are_utc_minutes_days_and_months() -> None:
    assert window_start(Window.MINUTE, NOW + 0.7) == NOW - 30
    assert window_end(Window.MINUTE, NOW) == NOW + 30
    assert window_start(Window.DAY, NOW) == calendar.timegm((2026, 12, 31, 0, 0, 0))
    assert window_end(Window.DAY, NOW) == NOW + 30
    assert window_start(Window.MONTH, NOW) == calendar.timegm((2026, 12, 1, 0, 0, 0))
    assert window_end(Window.MONTH, NOW) == calendar.timegm((2027, 1, 1, 0, 0, 0))
    february = calendar.timegm((2028, 2, 10, 12, 0, 0))
    assert window_end(Window.MONTH, february) == calendar.timegm((2028, 3, 1, 0, 0, 0))


@given(st.floats(min_value=0, max_value=4e9), st.sampled_from(list(Window)))
def test_a_window_holds_its_instant(now: float, window: Window) -> None:
    assert window_start(window, now) <= now < window_end(window, now)


def test_the_input_estimate_is_the_prompt_text_four_bytes_a_token() -> None:
    """Plus each message's overhead (4) and the answer's priming (4)."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    assert estimate_input(chat, 10_000) == (400 + len("user")) // 4 + 4 + 4
    assert estimate_input({"prompt": "é" * 4}, 0) == 2 + 4  # UTF-8 bytes
    gemini = {"contents": [{"parts": [{"text": "abcd" * 10}]}]}
    assert estimate_input(gemini, 0) == 10 + 4 + 4
    assert estimate_input(None, 401) == 101 + 4 + 4  # not JSON: the whole body, one message


def test_the_strict_input_bound_is_a_token_a_byte_plus_the_overheads() -> None:
    system = {"role": "system", "content": "é" * 10}
    chat = {"messages": [system, {"role": "user", "content": "hi"}]}
    assert input_bound(chat, 0) == len("system") + 20 + len("user") + 2 + 2 * 4 + 4
    assert input_bound(None, 50) == 50 + 4 + 4


def test_the_cost_is_reported_when_there_is_usage_else_estimated_and_never_zero() -> None:
    assert cost_of(12, 30, 99, 99) == Cost(12, 30, Source.REPORTED)
    assert cost_of(None, 30, 9, 99) == Cost(9, 30, Source.REPORTED)
    assert cost_of(None, None, 9, 5) == Cost(9, 5, Source.ESTIMATED)
    assert output_estimate(True, events=3, content_chars=10, body_bytes=900) == 3
    assert output_estimate(True, events=3, content_chars=0, body_bytes=1) == 1  # tool calls
    assert output_estimate(True, events=0, content_chars=0, body_bytes=300) == 0
    assert output_estimate(False, 0, 0, 41) == 11


def test_checks_name_a_counter_per_scope_limit_and_window() -> None:
    rule = Rule(
        "team-a",
        {
            Limit.REQUESTS_PER_MINUTE: 10,
            Limit.TOKENS_PER_DAY: 1000,
            Limit.MAX_CONCURRENT_STREAMS: 2,
        },
    )
    plain = checks_for([rule], stream=False, now=NOW)
    assert [(c.limit, c.amount(300)) for c in plain] == [
        (Limit.REQUESTS_PER_MINUTE, 1),
        (Limit.TOKENS_PER_DAY, 300),
    ]
    assert plain[0].key == f"team-a|requests_per_minute|{NOW - 30}"
    stream = checks_for([rule], stream=True, now=NOW)
    assert stream[-1].expires is None
    assert stream[-1].amount(300) == 1


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _ask(member: str, tokens: int, strict: bool = False) -> Ask:
    return Ask(member, tokens - 10, 10, strict, 60)


def test_the_memory_backend_reserves_all_or_none_and_settles_the_difference() -> None:
    backend = MemoryBackend()
    rule = Rule("c", {Limit.TOKENS_PER_MINUTE: 100, Limit.REQUESTS_PER_MINUTE: 3})
    first = checks_for([rule], False, NOW)
    assert _run(backend.reserve(first, _ask("r1", 60), NOW)) == Reserved(None, [60, 1], 10)
    # 60 + 60 > 100: refused, and the request counter is not touched either; every counter
    # is told as it stands (the headers of the 429)
    assert _run(backend.reserve(first, _ask("r2", 60), NOW)) == Reserved(0, [60, 1], 10)
    assert _run(backend.read(first, NOW)) == [60, 1]
    # the first one really cost 25: 35 come back, and the next fits
    assert _run(backend.settle(first, first, _ask("r1", 60), Bill(60, 25))) == [25, 1]
    assert _run(backend.reserve(first, _ask("r3", 60), NOW)) == Reserved(None, [85, 2], 10)
    # a new minute: fresh counters; the old window's are swept
    later = checks_for([rule], False, NOW + 60)
    assert _run(backend.reserve(later, _ask("r4", 60), NOW + 60)) == Reserved(None, [60, 1], 10)
    assert len(backend._counters) == 2


def test_strict_reserves_at_most_what_is_left_and_refuses_when_nothing_is() -> None:
    backend = MemoryBackend()
    rule = Rule("c", {Limit.TOKENS_PER_MINUTE: 100, Limit.TOKENS_PER_DAY: 1000})
    checks = checks_for([rule], False, NOW)
    big = Ask("r1", 30, 500, True, 60)
    assert _run(backend.reserve(checks, big, NOW)) == Reserved(None, [100, 100], 70)
    assert _run(backend.reserve(checks, Ask("r2", 1, 500, True, 60), NOW)).refused == 0


def test_a_stream_that_crosses_a_window_is_charged_in_full() -> None:
    """Reserved in one minute, settled in the next: what it cost beyond its reservation
    goes to the new minute, never dropped with the old one."""
    backend = MemoryBackend()
    rule = Rule("c", {Limit.TOKENS_PER_MINUTE: 1000, Limit.TOKENS_PER_DAY: 10_000})
    before = checks_for([rule], False, NOW - 40)  # the day ends at NOW + 30
    after = checks_for([rule], False, NOW + 40)
    assert _run(backend.reserve(before, _ask("r1", 100), NOW - 40)).refused is None
    assert _run(backend.settle(before, after, _ask("r1", 100), Bill(100, 700))) == [600, 600]
    assert _run(backend.read(before, NOW + 40)) == [100, 100]


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _limiter(limits: ClientLimits, **kwargs: Any) -> tuple[Limiter, _Clock, list[Any]]:
    client = ClientConfig(name="team-a", key_sha256=["0" * 64], limits=limits)
    clock = _Clock(NOW)
    budgets: list[Any] = []
    limiter = Limiter(
        [client], MemoryBackend(), clock=clock, on_budget=lambda *a: budgets.append(a), **kwargs
    )
    return limiter, clock, budgets


def _reserve(limiter: Limiter, request: dict[str, Any], stream: bool = False) -> Any:
    estimate = estimate_input(request, 0)
    output = spec_for("chat").requested_output(request, 1024)
    return _run(limiter.reserve("team-a", "chat", "m", estimate, output, stream, "rid", 60))


def test_the_limiter_refuses_what_does_not_fit_until_the_window_ends() -> None:
    limiter, clock, budgets = _limiter(
        ClientLimits(requests_per_minute=2, tokens_per_minute=1000, tokens_per_day=5000)
    )
    request = {"messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 100}
    one = _reserve(limiter, request)
    assert one.reserved == 208
    assert dict(one.headers)[b"x-ratelimit-remaining-requests"] == b"1"
    assert dict(one.headers)[b"x-ratelimit-remaining-tokens"] == b"792"
    assert budgets[-1] == ("team-a", Window.DAY, 5000, 208)
    _reserve(limiter, request)
    with pytest.raises(LimitRefused) as refused:
        _reserve(limiter, request)
    assert refused.value.status == 429
    assert refused.value.limit is Limit.REQUESTS_PER_MINUTE
    assert refused.value.retry_after == 30
    # the 429 carries all six headers, each with what is really left
    headers = dict(limited_headers(refused.value, NOW))
    assert headers[b"x-ratelimit-limit-requests"] == b"2"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"584"
    assert headers[b"x-ratelimit-reset-tokens"] == b"30.000s"
    assert headers[b"x-ratelimit-reset-requests"] == b"30.000s"
    clock.now += 30
    _reserve(limiter, request)


def test_a_spent_budget_is_insufficient_quota_until_the_day_ends() -> None:
    limiter, _, _ = _limiter(ClientLimits(tokens_per_day=300))
    request = {"prompt": "x" * 400, "max_tokens": 100}
    reservation = _reserve(limiter, request)
    _run(limiter.settle(reservation, Cost(100, 150, Source.REPORTED)))
    with pytest.raises(LimitRefused) as refused:
        _reserve(limiter, request)
    assert refused.value.limit is Limit.TOKENS_PER_DAY
    body = limited_body("chat", refused.value, "rid", NOW)
    assert b'"code":"insufficient_quota"' in body
    assert b"2027-01-01T00:00:00Z" in body
    assert (b"x-should-retry", b"false") in limited_headers(refused.value, NOW)


def test_concurrent_streams_are_counted_out_at_settlement() -> None:
    limiter, _, _ = _limiter(ClientLimits(max_concurrent_streams=1))
    first = _reserve(limiter, {}, stream=True)
    _reserve(limiter, {}, stream=False)  # a plain answer is no stream
    with pytest.raises(LimitRefused) as refused:
        _reserve(limiter, {}, stream=True)
    assert refused.value.retry_after == 1.0
    _run(limiter.settle(first, Cost(0, 0, Source.ESTIMATED)))
    _run(limiter.settle(first, Cost(0, 0, Source.ESTIMATED)))  # once only
    _reserve(limiter, {}, stream=True)
    with pytest.raises(LimitRefused):
        _reserve(limiter, {}, stream=True)


class _Broken(MemoryBackend):
    remote = True

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[str] = []

    async def reserve(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        raise BackendError("unreachable")

    def cancel(self, checks: list[Check], ask: Ask) -> None:
        self.cancelled.append(ask.member)


def test_a_failing_backend_allows_or_denies_as_configured() -> None:
    client = ClientConfig(
        name="team-a", key_sha256=["0" * 64], limits=ClientLimits(requests_per_minute=1)
    )
    errors: list[str] = []
    allow = Limiter([client], _Broken(), on_error=errors.append)
    reservation = _reserve(allow, {})
    # served unreserved, and settled at its whole cost when the backend answers again
    assert not reservation.counted
    assert not reservation.settled
    broken = _Broken()
    deny = Limiter([client], broken, deny_on_error=True, on_error=errors.append)
    with pytest.raises(LimitRefused) as refused:
        _reserve(deny, {})
    assert refused.value.status == 503
    assert refused.value.label == "backend_error"
    assert errors == ["reserve", "reserve"]
    # the reservation it gave up on is cancelled: should it run late, it counts nothing
    assert len(broken.cancelled) == 1


class _NotReady(MemoryBackend):
    remote = True
    ready = False


def test_nothing_is_admitted_before_the_backend_answered_once() -> None:
    client = ClientConfig(
        name="team-a", key_sha256=["0" * 64], limits=ClientLimits(requests_per_minute=1)
    )
    limiter = Limiter([client], _NotReady())
    assert not limiter.ready
    with pytest.raises(LimitRefused) as refused:
        _reserve(limiter, {})
    assert refused.value.status == 503


@pytest.mark.parametrize(
    ("protocol", "needle"),
    [
        ("chat", b'"code":"rate_limit_exceeded"'),
        ("responses", b'"type":"requests"'),
        ("messages", b'"type":"rate_limit_error"'),
        ("gemini", b'"status":"RESOURCE_EXHAUSTED"'),
        ("ollama", b'{"error":"This client'),
    ],
)
def test_a_refusal_speaks_the_protocols_error_shape(protocol: str, needle: bytes) -> None:
    refused = LimitRefused(429, Limit.REQUESTS_PER_MINUTE, 12.5, [])
    assert needle in limited_body(protocol, refused, "rid", NOW)
    headers = dict(limited_headers(refused, NOW))
    assert headers[b"retry-after"] == b"13"
    assert headers[b"retry-after-ms"] == b"12500"


class _Untouchable(MemoryBackend):
    remote = True

    async def reserve(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        raise AssertionError("a request with no counter to check is not sent to the backend")


def test_a_request_with_no_counter_to_check_asks_no_backend() -> None:
    client = ClientConfig(
        name="team-a", key_sha256=["0" * 64], limits=ClientLimits(max_concurrent_streams=1)
    )
    limiter = Limiter([client], _Untouchable())
    reservation = _reserve(limiter, {}, stream=False)
    assert reservation.checks == []
    _run(limiter.settle(reservation, Cost(1, 1, Source.REPORTED)))

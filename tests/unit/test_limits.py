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
from gateway.limits.memory import MemoryBackend
from gateway.policy.limits import (
    Check,
    Cost,
    Limit,
    Rule,
    Source,
    Window,
    checks_for,
    cost_of,
    estimate_input,
    output_estimate,
    requested_output,
    window_end,
    window_start,
)
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
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    assert estimate_input(chat, 10_000) == (400 + len("user")) // 4
    assert estimate_input({"prompt": "é" * 4}, 0) == 2  # UTF-8 bytes
    gemini = {"contents": [{"parts": [{"text": "abcd" * 10}]}]}
    assert estimate_input(gemini, 0) == 10
    assert estimate_input(None, 401) == 101  # not JSON: the whole body


def test_the_output_reservation_reads_each_protocols_name() -> None:
    assert requested_output({"max_tokens": 50}, 1024) == 50
    assert requested_output({"max_completion_tokens": 60, "max_tokens": 50}, 1024) == 60
    assert requested_output({"max_output_tokens": 70}, 1024) == 70
    assert requested_output({"generationConfig": {"maxOutputTokens": 80}}, 1024) == 80
    assert requested_output({"options": {"num_predict": 90}}, 1024) == 90  # Ollama
    assert requested_output({"options": {"num_predict": -1}}, 1024) == 1024  # no limit
    assert requested_output({"max_tokens": True}, 1024) == 1024
    assert requested_output({}, 1024) == 1024
    assert requested_output(None, 7) == 7


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


def test_the_memory_backend_reserves_all_or_none_and_settles_the_difference() -> None:
    backend = MemoryBackend()
    rule = Rule("c", {Limit.TOKENS_PER_MINUTE: 100, Limit.REQUESTS_PER_MINUTE: 3})
    first = checks_for([rule], False, NOW)
    assert _run(backend.reserve(first, 60, "r1", NOW, 60)) == Reserved(None, [60, 1])
    # 60 + 60 > 100: refused, and the request counter is not touched either
    assert _run(backend.reserve(first, 60, "r2", NOW, 60)).refused == 0
    assert _run(backend.read(first, NOW)) == [60, 1]
    # the first one really cost 25: 35 come back, and the next fits
    assert _run(backend.settle(first, 25 - 60, "r1")) == [25, 1]
    assert _run(backend.reserve(first, 60, "r3", NOW, 60)) == Reserved(None, [85, 2])
    # a new minute: fresh counters; the old window's are swept
    later = checks_for([rule], False, NOW + 60)
    assert _run(backend.reserve(later, 60, "r4", NOW + 60, 60)) == Reserved(None, [60, 1])
    assert len(backend._counters) == 2


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
    return _run(limiter.reserve("team-a", "chat", "m", request, estimate, 1024, stream, "rid", 60))


def test_the_limiter_refuses_what_does_not_fit_until_the_window_ends() -> None:
    limiter, clock, budgets = _limiter(
        ClientLimits(requests_per_minute=2, tokens_per_minute=1000, tokens_per_day=5000)
    )
    request = {"messages": [{"role": "user", "content": "x" * 396}], "max_tokens": 100}
    one = _reserve(limiter, request)
    assert one.reserved == 200
    assert dict(one.headers)[b"x-ratelimit-remaining-requests"] == b"1"
    assert dict(one.headers)[b"x-ratelimit-remaining-tokens"] == b"800"
    assert budgets[-1] == ("team-a", Window.DAY, 5000, 200)
    _reserve(limiter, request)
    with pytest.raises(LimitRefused) as refused:
        _reserve(limiter, request)
    assert refused.value.status == 429
    assert refused.value.limit is Limit.REQUESTS_PER_MINUTE
    assert refused.value.retry_after == 30
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

    async def reserve(
        self, checks: list[Check], reserved: int, member: str, now: float, hold: float
    ) -> Reserved:
        raise BackendError("unreachable")


class _Slow(MemoryBackend):
    remote = True

    async def reserve(
        self, checks: list[Check], reserved: int, member: str, now: float, hold: float
    ) -> Reserved:
        await asyncio.sleep(3600)
        raise AssertionError("not reached")


@pytest.mark.parametrize("backend", [_Broken, _Slow])
def test_a_failing_backend_allows_or_denies_as_configured(backend: type[MemoryBackend]) -> None:
    client = ClientConfig(
        name="team-a", key_sha256=["0" * 64], limits=ClientLimits(requests_per_minute=1)
    )
    errors: list[str] = []
    allow = Limiter([client], backend(), timeout=0.01, on_error=errors.append)
    reservation = _reserve(allow, {})
    assert reservation.checks == []
    assert reservation.settled
    deny = Limiter([client], backend(), timeout=0.01, deny_on_error=True, on_error=errors.append)
    with pytest.raises(LimitRefused) as refused:
        _reserve(deny, {})
    assert refused.value.status == 503
    assert refused.value.label == "backend_error"
    assert errors == ["reserve", "reserve"]


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

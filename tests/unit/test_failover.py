"""Failover's vocabulary: the result of an attempt, what may be retried, Retry-After."""

from __future__ import annotations

import email.utils

import pytest

from gateway.guard import Outcome, Reason, Verdict
from gateway.policy.errors import RequestError
from gateway.policy.failover import (
    AttemptFailure,
    Result,
    health_of,
    result_of_answer,
    result_of_failure,
    result_of_held,
    result_of_status,
    retry_after_seconds,
    retryable,
)
from gateway.policy.pool import Health
from gateway.proxy.exchange import bare_verdict
from gateway.settings import DEFAULT_RETRY_ON, RouteConfig


@pytest.mark.parametrize(
    ("failure", "result"),
    [
        (
            AttemptFailure(RequestError.CONNECT_ERROR, 502, Reason.UPSTREAM_UNAVAILABLE),
            Result.CONNECT_ERROR,
        ),
        (
            AttemptFailure(RequestError.CONNECT_TIMEOUT, 504, Reason.UPSTREAM_UNAVAILABLE),
            Result.CONNECT_ERROR,
        ),
        (AttemptFailure(None, 504, Reason.FIRST_BYTE_TIMEOUT), Result.TIMEOUT),
        (AttemptFailure(None, 504, Reason.TOTAL_TIMEOUT), Result.TIMEOUT),
        (
            AttemptFailure(RequestError.UPSTREAM_BAD_RESPONSE, 502, Reason.UPSTREAM_DISCONNECT),
            Result.EARLY_EOF,
        ),
    ],
)
def test_a_failure_before_the_head_has_one_result(failure: AttemptFailure, result: Result) -> None:
    assert result_of_failure(failure) is result


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (200, Result.OK),
        (204, Result.OK),
        (304, Result.OK),
        (400, Result.STATUS_4XX),
        (404, Result.STATUS_4XX),
        (429, Result.STATUS_429),
        (500, Result.STATUS_5XX),
        (503, Result.STATUS_5XX),
        (529, Result.STATUS_5XX),
    ],
)
def test_a_status_has_one_result(status: int, result: Result) -> None:
    assert result_of_status(status) is result


def test_the_default_retry_causes_leave_first_byte_timeouts_out() -> None:
    retry_on = RouteConfig(upstream="http://u.test/v1").retry_on
    assert tuple(retry_on) == DEFAULT_RETRY_ON
    assert [r for r in Result if retryable(r, retry_on)] == [
        Result.CONNECT_ERROR,
        Result.STATUS_429,
        Result.STATUS_5XX,
        Result.EARLY_EOF,
    ]
    assert retryable(Result.TIMEOUT, ["first_byte_timeout"])
    for never in (Result.OK, Result.STATUS_4XX, Result.INCOMPLETE):
        assert not retryable(never, ["connect", "first_byte_timeout", "429", "5xx", "early_eof"])


@pytest.mark.parametrize(
    ("reason", "result"),
    [
        (Reason.MISSING_DONE, Result.EARLY_EOF),
        (Reason.UPSTREAM_DISCONNECT, Result.EARLY_EOF),
        (Reason.UPSTREAM_ERROR, Result.EARLY_EOF),
        (Reason.INVALID_JSON, Result.EARLY_EOF),
        (Reason.FIRST_BYTE_TIMEOUT, Result.TIMEOUT),
        (Reason.IDLE_TIMEOUT, Result.TIMEOUT),
        (Reason.TOTAL_TIMEOUT, Result.TIMEOUT),
        (Reason.LIMIT_EXCEEDED, Result.INCOMPLETE),
    ],
)
def test_a_held_answer_that_fails_before_it_starts(reason: Reason, result: Result) -> None:
    assert result_of_held(reason) is result


def test_an_answer_the_client_got_is_ok_or_incomplete_or_its_status() -> None:
    complete = Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)
    assert result_of_answer(200, complete, None) is Result.OK
    assert result_of_answer(200, None, None) is Result.OK
    cut = bare_verdict(Reason.UPSTREAM_DISCONNECT)
    assert result_of_answer(200, cut, None) is Result.INCOMPLETE
    assert result_of_answer(200, None, RequestError.UPSTREAM_DISCONNECT) is Result.INCOMPLETE
    late = bare_verdict(Reason.FIRST_BYTE_TIMEOUT)
    assert result_of_answer(200, late, None) is Result.TIMEOUT  # held or not
    assert result_of_answer(503, bare_verdict(Reason.UPSTREAM_STATUS), None) is Result.STATUS_5XX


def test_health_blames_the_upstream_only_for_its_own_failures() -> None:
    assert health_of(Result.OK) is Health.OK
    assert health_of(Result.STATUS_4XX) is Health.OK
    assert health_of(Result.STATUS_5XX) is Health.FAILED
    assert health_of(Result.CONNECT_ERROR, Reason.UPSTREAM_UNAVAILABLE) is Health.FAILED
    assert health_of(Result.TIMEOUT, Reason.FIRST_BYTE_TIMEOUT) is Health.FAILED
    assert health_of(Result.TIMEOUT, Reason.TOTAL_TIMEOUT) is Health.NEUTRAL
    assert health_of(Result.INCOMPLETE, Reason.IDLE_TIMEOUT) is Health.FAILED
    assert health_of(Result.INCOMPLETE, Reason.MISSING_DONE) is Health.FAILED
    for blameless in (
        Reason.CLIENT_DISCONNECT,
        Reason.CLIENT_STALLED,
        Reason.GATEWAY_SHUTDOWN,
        Reason.LIMIT_EXCEEDED,
    ):
        assert health_of(Result.INCOMPLETE, blameless) is Health.NEUTRAL
    assert health_of(Result.INCOMPLETE, None, RequestError.CLIENT_STALLED) is Health.NEUTRAL
    assert health_of(Result.INCOMPLETE, None, RequestError.UPSTREAM_DISCONNECT) is Health.FAILED


def test_retry_after_in_seconds_or_as_a_date_capped() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds(b"7", now, 300) == 7
    assert retry_after_seconds(" 12 ", now, 300) == 12
    assert retry_after_seconds("86400", now, 300) == 300
    date = email.utils.formatdate(now + 90, usegmt=True)
    assert retry_after_seconds(date, now, 300) == pytest.approx(90)
    past = email.utils.formatdate(now - 90, usegmt=True)
    for nothing in (None, "", "0", "-5", "soon", past, "1.5"):
        assert retry_after_seconds(nothing, now, 300) is None, nothing

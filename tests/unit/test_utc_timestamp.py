"""The log timestamp, formatted once a second, against formatting it every time."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from gateway.logsetup import utc_timestamp


def _every_time(seconds: float) -> str:
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


@given(st.lists(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False), max_size=20))
def test_the_same_text_as_strftime_every_time(moments: list[float]) -> None:
    # Runs of moments within a second and across seconds, in any order: the
    # cache of recent seconds never hands one second's text to another.
    for seconds in moments + sorted(moments) + [m + 0.5 for m in moments]:
        assert utc_timestamp(seconds) == _every_time(seconds)


def test_a_known_moment() -> None:
    assert utc_timestamp(1_764_633_600.25) == "2025-12-02T00:00:00.250Z"
    assert utc_timestamp(1_764_633_599.999) == "2025-12-01T23:59:59.999Z"

"""LogGate: a warning that outside input could repeat opens at most once an interval."""

from __future__ import annotations

from gateway.logsetup import LogGate


def test_it_opens_once_within_its_interval() -> None:
    gate = LogGate(3600.0)
    assert [gate.open() for _ in range(5)] == [True, False, False, False, False]


def test_with_no_interval_it_is_always_open() -> None:
    gate = LogGate(0.0)
    assert all(gate.open() for _ in range(5))

"""The stream deadlines on one re-arming timer, driven by a fake clock (no sleeping).

``Watchdog`` only asks its loop for ``time()`` and ``call_at()``: a fake loop
that advances time by hand shows exactly when each deadline fires, and that
waiting for a slow client is never mistaken for upstream silence.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import cast

from gateway.guard import Reason
from gateway.proxy.deadlines import Watchdog
from gateway.settings import Timeouts


class FakeLoop:
    """``time()`` and ``call_at()`` on a clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, _Handle]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(callback, when)
        heapq.heappush(self._timers, (when, next(self._order), handle))
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock, running every timer that falls due on the way, in order."""
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, handle = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.callback()
        self.now = target

    @property
    def pending(self) -> int:
        return sum(1 for _, _, h in self._timers if not h.cancelled)


class _Handle:
    def __init__(self, callback: Callable[[], None], when: float) -> None:
        self.callback = callback
        self.cancelled = False
        self._when = when

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


TIMEOUTS = Timeouts(first_byte=10.0, idle=5.0, total=100.0, client_send=3.0)


def watchdog(loop: FakeLoop, stops: list[Reason], total: float = 100.0) -> Watchdog:
    return Watchdog(cast(asyncio.AbstractEventLoop, loop), stops.append, TIMEOUTS, total)


def test_first_byte_deadline() -> None:
    loop, stops = FakeLoop(), []
    watchdog(loop, stops)
    loop.advance(9.9)
    assert stops == []
    loop.advance(0.2)
    assert stops == [Reason.FIRST_BYTE_TIMEOUT]


def test_idle_deadline_runs_from_the_last_chunk() -> None:
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops)
    loop.advance(2.0)
    dog.first_chunk()
    for _ in range(10):  # a chunk every 4 s: never idle for 5
        loop.advance(4.0)
        dog.last = loop.time()
    assert stops == []
    loop.advance(5.1)
    assert stops == [Reason.IDLE_TIMEOUT]


def test_a_slow_client_is_not_upstream_silence_until_the_send_timeout() -> None:
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops)
    dog.first_chunk()
    dog.sending = True  # the relay waits for the client
    dog.last = loop.time()
    loop.advance(2.9)  # longer than nothing, shorter than client_send
    assert stops == []
    dog.sending = False  # the client took the bytes
    dog.last = loop.time()
    loop.advance(4.9)
    assert stops == []
    dog.sending = True
    dog.last = loop.time()
    loop.advance(3.1)
    assert stops == [Reason.CLIENT_STALLED]


def test_the_send_deadline_is_not_late_behind_a_longer_idle_timer() -> None:
    # The idle timer is armed 5 s ahead; a send that starts at once must still be
    # judged at client_send (3 s), not when the idle timer would have fired.
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops)
    dog.first_chunk()
    dog.sending = True
    loop.advance(3.05)
    assert stops == [Reason.CLIENT_STALLED]


def test_total_deadline_wins_over_everything() -> None:
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops, total=7.0)
    dog.first_chunk()
    for _ in range(3):
        loop.advance(2.0)
        dog.last = loop.time()
    loop.advance(1.5)
    assert stops == [Reason.TOTAL_TIMEOUT]


def test_one_timer_at_a_time_and_cancel_stops_it() -> None:
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops)
    dog.first_chunk()
    for _ in range(50):
        loop.advance(1.0)
        dog.last = loop.time()
    assert loop.pending == 1
    dog.cancel()
    loop.advance(1000.0)
    assert stops == []


def test_the_first_chunk_re_arms_only_for_a_sooner_idle_deadline() -> None:
    # Armed at client_send (3 s), before idle would fall due: no new timer, and the
    # armed check still ends an idle stream on time.
    loop, stops = FakeLoop(), []
    dog = watchdog(loop, stops)
    armed = len(loop._timers)
    dog.first_chunk()
    assert len(loop._timers) == armed
    loop.advance(5.1)
    assert stops == [Reason.IDLE_TIMEOUT]

    # Armed at first byte (10 s) with idle 1 s: the first chunk must bring it forward.
    loop, stops = FakeLoop(), []
    quick_idle = Timeouts(first_byte=10.0, idle=1.0, total=100.0, client_send=30.0)
    dog = Watchdog(cast(asyncio.AbstractEventLoop, loop), stops.append, quick_idle, 100.0)
    dog.first_chunk()
    loop.advance(0.9)
    assert stops == []
    loop.advance(0.2)
    assert stops == [Reason.IDLE_TIMEOUT]

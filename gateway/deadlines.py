"""Deadlines of one stream: first byte, idle gap, total, on a single re-arming timer.

The relay stamps ``last`` on every chunk (a float store); the timer fires at
the earliest deadline that could have passed, re-arms itself when data came
meanwhile, and otherwise calls ``stop`` with the deadline's reason. While the
relay waits for a slow client (``sending``) the idle clock does not run. That is
one timer per idle period instead of one reschedule per chunk, which cost
more than the guard on the hot path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.guard import Reason
from gateway.settings import Timeouts

__all__ = ["Watchdog"]


class Watchdog:
    __slots__ = (
        "_handle",
        "_loop",
        "_stop",
        "first_byte",
        "got_chunk",
        "idle",
        "last",
        "sending",
        "total",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stop: Callable[[Reason], None],
        timeouts: Timeouts,
        total_deadline: float,
    ) -> None:
        self._loop = loop
        self._stop = stop
        self.first_byte = timeouts.first_byte
        self.idle = timeouts.idle
        self.total = total_deadline
        self.last = loop.time()
        self.got_chunk = False
        #: True while the relay waits for the client to take bytes: that wait is the
        #: client's, not upstream silence, so only the total deadline runs meanwhile.
        self.sending = False
        self._handle = loop.call_at(min(self.last + self.first_byte, self.total), self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if now >= self.total:
            self._stop(Reason.TOTAL_TIMEOUT)
            return
        limit = self.last + (self.idle if self.got_chunk else self.first_byte)
        if self.sending:
            limit = now + self.idle
        elif now >= limit:
            self._stop(Reason.IDLE_TIMEOUT if self.got_chunk else Reason.FIRST_BYTE_TIMEOUT)
            return
        self._handle = self._loop.call_at(min(limit, self.total), self._check)

    def first_chunk(self) -> None:
        """From now on the idle deadline applies: re-arm once, if it comes sooner."""
        self.got_chunk = True
        self.last = self._loop.time()
        self._handle.cancel()
        self._handle = self._loop.call_at(min(self.last + self.idle, self.total), self._check)

    def cancel(self) -> None:
        self._handle.cancel()

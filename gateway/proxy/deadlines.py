"""Deadlines of one stream: first byte, idle gap, client send, total, on one re-arming timer.

The relay stamps ``last`` on every chunk and after every send (a float store);
the timer fires at the earliest deadline that could have passed, re-arms
itself when data came meanwhile, and otherwise calls ``stop`` with the
deadline's reason. While the relay waits for the client to take bytes
(``sending``, stamped just before the send) the idle clock does not run and
the client-send clock does: a client that takes nothing for ``client_send``
seconds is ``client_stalled``. That is one timer per idle period instead of
one reschedule per chunk, which cost more than the guard on the hot path.
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
        "client_send",
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
        self.client_send = timeouts.client_send
        self.total = total_deadline
        self.last = loop.time()
        self.got_chunk = False
        #: True while the relay waits for the client to take bytes: that wait is the
        #: client's, not upstream silence, so the client-send deadline runs instead of idle.
        self.sending = False
        self._handle: asyncio.TimerHandle
        self._arm(self.last + self.first_byte)

    def _arm(self, limit: float) -> None:
        # A send may start at any moment: never sleep past where its deadline could be.
        soonest = min(limit, self._loop.time() + self.client_send, self.total)
        self._handle = self._loop.call_at(soonest, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if now >= self.total:
            self._stop(Reason.TOTAL_TIMEOUT)
            return
        if self.sending:
            limit = self.last + self.client_send
            if now >= limit:
                self._stop(Reason.CLIENT_STALLED)
                return
        else:
            limit = self.last + (self.idle if self.got_chunk else self.first_byte)
            if now >= limit:
                self._stop(Reason.IDLE_TIMEOUT if self.got_chunk else Reason.FIRST_BYTE_TIMEOUT)
                return
        self._arm(limit)

    def first_chunk(self) -> None:
        """From now on the idle deadline applies: re-arm once, if it comes sooner than
        the check already armed (which otherwise re-arms itself for it when it fires;
        with the default deadlines it does: client-send comes before first-byte)."""
        self.got_chunk = True
        self.last = now = self._loop.time()
        if self._handle.when() > min(now + self.idle, self.total):
            self._handle.cancel()
            self._arm(now + self.idle)

    def cancel(self) -> None:
        self._handle.cancel()

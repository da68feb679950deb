"""Process lifecycle: readiness, admission of new work, and the drain on shutdown.

The relay registers every in-flight exchange here. On SIGTERM the gateway
stops being ready at once, refuses new requests, gives in-flight streams up
to the drain timeout, then stops the rest with ``gateway_shutdown`` so that
each still gets its incomplete annotation (never a silent cut).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["Lifecycle"]

log = logging.getLogger("gateway")


class Lifecycle:
    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.ready = False
        self.draining = False
        self._inflight: dict[object, Callable[[], None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_task: asyncio.Task[None] | None = None
        self._on_drain: list[Callable[[], None]] = []

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def inflight_keys(self) -> list[object]:
        """The keys of the requests in flight now (the relay's exchanges)."""
        return list(self._inflight)

    def register(self, key: object, stop: Callable[[], None]) -> None:
        self._inflight[key] = stop
        self._idle.clear()

    def unregister(self, key: object) -> None:
        self._inflight.pop(key, None)
        if not self._inflight:
            self._idle.set()

    def on_drain(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called when the drain begins (long-lived connections close
        at once when nothing is in flight on them)."""
        self._on_drain.append(callback)

    def begin_drain(self, then: Callable[[], None] | None = None) -> None:
        """Start draining (call from the event loop): not ready, no new work, timed drain.

        ``then`` runs once every in-flight request has ended (the server's own
        shutdown, so that it closes its sockets only after the drain).
        """
        if self.draining:
            return
        self.ready = False
        self.draining = True
        log.info(
            "draining: %d request(s) in flight, up to %.1fs", self.inflight, self.drain_timeout
        )
        loop = asyncio.get_running_loop()
        self._drain_task = loop.create_task(self._drain(then))
        for callback in self._on_drain:
            callback()

    async def _drain(self, then: Callable[[], None] | None) -> None:
        if not await self.wait_idle(self.drain_timeout):
            log.warning(
                "drain timeout: stopping %d request(s) with gateway_shutdown", self.inflight
            )
            self.stop_all()
            await self.wait_idle(5.0)
        log.info("drained")
        if then is not None:
            then()

    async def wait_idle(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def stop_all(self) -> None:
        """Stop every in-flight request now (final shutdown)."""
        for stop in list(self._inflight.values()):
            stop()

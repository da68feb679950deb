"""Process lifecycle: readiness, admission of new work, and the drain on shutdown.

The relay registers every in-flight exchange here. On SIGTERM the gateway
stops being ready at once, refuses new requests, gives in-flight streams up
to the drain timeout, then stops the rest with ``gateway_shutdown`` so that
each still gets its incomplete annotation (never a silent cut).

The process is in one ``State`` at a time (after h11's ``_state.py``):
``starting`` until the server is up, ``ready``, ``draining`` from SIGTERM,
``stopped`` at the end. ``_TRANSITIONS`` is every move allowed; any other
is a ``LifecycleError``, never a silent state mix (``ready`` and
``draining`` read the state, they are not two flags that could disagree).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable

__all__ = ["Lifecycle", "LifecycleError", "State"]

log = logging.getLogger("gateway")


class State(enum.StrEnum):
    """Where the process is in its life (``/readyz`` reports it)."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


#: Every allowed move; staying in a state is always allowed (a no-op).
_TRANSITIONS: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.READY, State.DRAINING, State.STOPPED}),
    State.READY: frozenset({State.DRAINING, State.STOPPED}),
    State.DRAINING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
}


class LifecycleError(RuntimeError):
    """A lifecycle transition the table does not allow (a bug in the caller)."""


class Lifecycle:
    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self._state = State.STARTING
        self._inflight: dict[object, Callable[[], None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_task: asyncio.Task[None] | None = None
        self._on_drain: list[Callable[[], None]] = []

    @property
    def state(self) -> State:
        return self._state

    def move(self, to: State) -> None:
        """Go to ``to``; a move ``_TRANSITIONS`` does not allow raises ``LifecycleError``."""
        if to is self._state:
            return
        if to not in _TRANSITIONS[self._state]:
            raise LifecycleError(f"lifecycle: {self._state} -> {to} is not allowed")
        self._state = to

    @property
    def ready(self) -> bool:
        """Whether the process takes work (``/readyz``)."""
        return self._state is State.READY

    @ready.setter
    def ready(self, value: bool) -> None:
        # Kept for the server's start and end: True is "started", False is "stopped".
        self.move(State.READY if value else State.STOPPED)

    @property
    def draining(self) -> bool:
        """Whether new work is refused: draining, or already stopped."""
        return self._state is State.DRAINING or self._state is State.STOPPED

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
        self.move(State.DRAINING)
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

"""What a limits backend does: reserve all of a request's counters or none, settle them.

A backend is told the checks (``gateway.policy.limits.Check``) and applies
them atomically: either every counter had room and all were increased, or
none was and the first one without room is named. ``settle`` adds what the
request really cost minus what it reserved to the token counters whose
window has not ended, and counts the stream out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.policy.limits import Check

__all__ = ["Backend", "BackendError", "Reserved"]


class BackendError(Exception):
    """The backend could not be asked in time (unreachable, slow, or it failed)."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """A reservation's answer: ``refused`` is the index of the check without room (its
    counter stood at ``used[refused]``), or None; ``used`` the counters after it."""

    refused: int | None
    used: list[int]


class Backend(Protocol):
    #: Whether the backend is across a network (its calls are bounded by limits_timeout).
    remote: bool

    async def reserve(
        self, checks: list[Check], reserved: int, member: str, now: float, hold: float
    ) -> Reserved:
        """Apply ``checks`` all or none (``reserved`` tokens to the token counters, 1 to the
        others); a stream (concurrency) is held by ``member`` for at most ``hold`` seconds,
        should it never be settled (a process that died)."""
        ...

    async def settle(self, checks: list[Check], delta: int, member: str) -> list[int | None]:
        """Add ``delta`` to the token counters still alive and count ``member``'s stream
        out; returns each counter's value after (None: its window ended)."""
        ...

    async def read(self, checks: list[Check], now: float) -> list[int]:
        """The counters' values now (for the status page and the budget gauges)."""
        ...

    async def prepare(self) -> None:
        """Get ready before the first request (connect, load scripts); may fail."""
        ...

    async def close(self) -> None: ...

"""What a limits backend does: reserve all of a request's counters or none, settle them.

A backend is told the checks (``gateway.policy.quota.Check``) and applies
them atomically: either every counter had room and all were increased, or
none was and the first one without room is named. Every reservation has its
own identity (``Ask.member``) and expiry (``Ask.hold``): settling it is
idempotent, a settle whose reservation never counted charges the whole cost
and subtracts nothing, and a reservation that arrives after its settle (a
backend that ran a command the gateway had given up on) counts nothing.

``settle`` adds what the request really cost minus what it reserved to the
token counters of the windows it reserved in; a window that ended meanwhile
(a stream that crossed a minute, a UTC day, a month) gets the rest charged
to the current one (``current``), so a long stream is charged in full.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from gateway.policy.quota import Check

__all__ = ["Ask", "Backend", "BackendError", "Bill", "Reserved", "money_of"]


class BackendError(Exception):
    """The backend could not be asked in time (unreachable, slow, or it failed)."""


def money_of(input_money: int, output: int, output_pico: int) -> int:
    """The money a reservation holds: its input's, and its output tokens at the dearest
    output price (pico-dollars a token), rounded up to the nano-dollar."""
    return input_money + -(-output * output_pico // 1000)


class Ask(NamedTuple):
    """One reservation: its identity, the input it reserves, the output it wants (with
    ``strict``, at most what the token and money counters have left), and how long it
    may live; ``input_money`` what its input may cost (nano-dollars) and ``output_pico``
    the dearest price of one output token (pico-dollars), for the money counters."""

    member: str
    input: int
    output: int
    strict: bool
    hold: float
    input_money: int = 0
    output_pico: int = 0


class Reserved(NamedTuple):
    """A reservation's answer: ``refused`` is the index of the check without room, or
    None; ``used`` every counter (before the request when refused, after it when
    admitted); ``output`` the output tokens reserved (``strict``: capped at what was left);
    ``money`` the nano-dollars reserved."""

    refused: int | None
    used: list[int]
    output: int
    money: int = 0

    def reserved(self, ask: Ask) -> int:
        return ask.input + self.output


class Bill(NamedTuple):
    """What a reservation is settled by: the tokens it ``reserved`` and those the request
    really cost (``cost``), the same in nano-dollars for the money counters, and whether
    it was ``served`` (a request refused after its reservation was not)."""

    reserved: int
    cost: int
    served: bool = True
    reserved_money: int = 0
    cost_money: int = 0


class Backend(Protocol):
    #: Whether the backend is across a network (it may fail, and may be slow).
    remote: bool

    @property
    def ready(self) -> bool:
        """Whether the backend has answered once (before that, nothing is admitted)."""
        ...

    @property
    def down_for(self) -> float | None:
        """Seconds since the backend stopped answering, None while it answers."""
        ...

    async def reserve(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        """Apply ``checks`` all or none (the reserved tokens to the token counters, the
        reserved money to the money counters, 1 to the others); a stream (concurrency) is
        held by ``ask.member`` for at most ``ask.hold`` seconds, should it never be
        settled (a process that died)."""
        ...

    async def settle(
        self, checks: list[Check], current: list[Check], ask: Ask, bill: Bill
    ) -> list[int | None]:
        """Replace ``bill.reserved`` by ``bill.cost`` in the token counters (``current``:
        the same checks in the windows of now), ``bill.reserved_money`` by
        ``bill.cost_money`` in the money counters, and count the stream out; once. A
        request not ``served`` is counted out of its requests too. Returns each current
        counter's value after (None: unknown)."""
        ...

    async def read(self, checks: list[Check], now: float) -> list[int]:
        """The counters' values now (for the status page and the budget gauges)."""
        ...

    async def prepare(self) -> None:
        """Get ready before the first request (connect, load scripts); may fail."""
        ...

    async def close(self) -> None: ...

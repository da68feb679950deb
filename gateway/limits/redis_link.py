"""The Redis link: one thread per worker that talks to Redis for the limiter.

Why a thread: a deadline kept on the event loop times the loop, not Redis. A
burst of 200 requests keeps the loop busy for longer than any sensible
``limits_timeout``, so an ``asyncio.timeout`` around the call fired while the
reply was already on the socket, and healthy Redis counted as down. Here the
deadline is the socket's own (``socket_timeout``, measured by the kernel's
poll while this thread waits without the interpreter lock): it measures
Redis and the network, whatever the loop does.

Why batches: every call the loop hands over while a round trip is in flight
waits for it and then goes in one pipeline (one write, one read), so a
burst costs a few round trips, not one a request. Each call is one Lua
script and atomic on its own, so pipelining changes no answer. A call waits
at most for the round trip before it and its own: about twice the timeout.

Durable calls (settlements and cancellations) that fail are kept, bounded
in number and each until its ``durable_until``, and sent again once Redis
answers: their scripts are idempotent (``redis_backend``), so a settlement
whose first attempt did run counts once. A call fails whether the batch
raised or its own reply says it did not run (``gateway.redisconn.away``: a
cluster's pipeline answers a failing master's commands so, among good
replies; a master with ``min-replicas-to-write`` and no replica answers
NOREPLICAS).

Outages are logged when they start and when they end (with their length
and how many calls failed). ``ready`` turns true at the first answer and
stays so: before it, the limiter admits no limited request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

from gateway.limits.backend import BackendError
from gateway.redisconn import RedisTarget
from gateway.redisconn.away import is_away
from gateway.redisconn.clients import sync_client

__all__ = ["Call", "RedisLink", "Script"]

log = logging.getLogger("gateway")

#: Calls kept for another attempt at most (beyond: the oldest are dropped, and counted).
MAX_RETRIES = 100_000
#: Seconds between attempts at the kept calls while Redis is away.
RETRY_INTERVAL = 0.5
#: The kept calls sent again at most in one pipeline.
RETRY_BATCH = 512


@dataclass(frozen=True, slots=True)
class Script:
    """A call of one of the link's scripts (by its index) with its keys and arguments."""

    index: int
    keys: list[str]
    args: list[Any]


Command = Script | tuple[Any, ...]


@dataclass(slots=True)
class Call:
    """Commands sent together, answered together (a list of their replies)."""

    commands: list[Command]
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[list[Any]] | None
    #: monotonic time until which a failed call is sent again (0: never)
    durable_until: float = 0.0
    answered: bool = field(default=False)


class RedisLink:
    """A thread that sends the calls handed to it, in batches, on its own connection."""

    def __init__(self, target: RedisTarget, timeout: float, scripts: tuple[str, ...]) -> None:
        self._target = target
        self._timeout = timeout
        #: Built by the thread at its first call (a cluster client asks its seeds then).
        self._client: Any = None
        self._scripts = scripts
        #: The loop's own bound on a call, far beyond the socket's: only a thread stuck
        #: where no socket timeout reaches (a name lookup) meets it.
        self._backstop = max(2.0, 40 * timeout)
        self._shas: list[str] | None = None
        self._cond = threading.Condition()
        self._pending: list[Call] = []
        self._retry: collections.deque[Call] = collections.deque()
        self._stopped = False
        self._thread: threading.Thread | None = None
        #: Whether Redis has answered once.
        self.ready = False
        #: monotonic time the current outage started (None: none)
        self._down_since: float | None = None
        self._failed_calls = 0
        self._dropped = 0
        #: Pipelines sent (a burst's calls share them).
        self.round_trips = 0

    @property
    def down_for(self) -> float | None:
        """Seconds since Redis stopped answering (the current outage), None while it
        answers."""
        since = self._down_since
        return None if since is None else time.monotonic() - since

    # -- the loop's side -------------------------------------------------------------------

    async def call(self, commands: list[Command], durable_for: float = 0.0) -> list[Any]:
        """Send ``commands`` in the next batch; their replies, or BackendError. With
        ``durable_for``, a failed call is sent again for that many seconds (its caller
        has its error at once all the same)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        until = time.monotonic() + durable_for if durable_for > 0 else 0.0
        self._submit(Call(commands, loop, future, until))
        try:
            async with asyncio.timeout(self._backstop):
                return await future
        except TimeoutError:
            raise BackendError("no answer from the Redis link") from None

    def send(self, commands: list[Command], durable_for: float) -> None:
        """Send ``commands`` without waiting for them (a cancellation): kept and sent
        again while Redis is away, for ``durable_for`` seconds."""
        self._submit(Call(commands, None, None, time.monotonic() + durable_for))

    def _submit(self, call: Call) -> None:
        with self._cond:
            if self._stopped:
                raise BackendError("closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gateway-redis-link", daemon=True
                )
                self._thread.start()
            self._pending.append(call)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(5.0)
        if self._retry:
            log.warning(
                "limits backend: %d settlements were never sent to Redis (it did not answer "
                "before the gateway stopped): what they reserved stays counted until its "
                "window ends, their stream slots until their hold ends",
                len(self._retry),
            )
        if self._client is not None:
            self._client.close()

    # -- the thread's side -----------------------------------------------------------------

    def _run(self) -> None:
        retry_at = 0.0
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    if self._retry:
                        wait = retry_at - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._stopped:
                    for call in self._pending:
                        self._answer(call, BackendError("closed"))
                    self._pending = []
                    return
                batch, self._pending = self._pending, []
            now = time.monotonic()
            if self._retry and (batch or now >= retry_at):
                kept = [c for c in self._retry if c.durable_until > now]
                self._retry.clear()
                batch = kept[:RETRY_BATCH] + batch
                self._retry.extend(kept[RETRY_BATCH:])
            if batch and not self._send(batch):
                retry_at = time.monotonic() + RETRY_INTERVAL

    def _send(self, batch: list[Call]) -> bool:
        self.round_trips += 1
        try:
            replies = self._execute(batch)
        except Exception as exc:  # RedisError, OSError; anything else must not end the thread
            self._went_down(exc, len(batch))
            for call in batch:
                self._failed(call, BackendError(type(exc).__name__))
            return False
        # A cluster's pipeline answers a node's absence per command (a failing master's
        # slots), among good replies: those calls did not run, and are kept like a batch
        # that failed whole; a batch that met only absences is an outage.
        away = [next((r for r in reply if is_away(r)), None) for reply in replies]
        if all(error is not None for error in away):
            self._went_down(away[0] or Exception(), len(batch))
            for call, error in zip(batch, away, strict=True):
                self._failed(call, BackendError(type(error).__name__))
            return False
        self._answered()
        for call, reply, absent in zip(batch, replies, away, strict=True):
            if absent is not None:
                self._failed(call, BackendError(type(absent).__name__))
                continue
            error = next((r for r in reply if isinstance(r, Exception)), None)
            self._answer(call, BackendError(str(error)) if error is not None else reply)
        return not any(away)

    def _execute(self, batch: list[Call]) -> list[list[Any]]:
        if self._client is None:
            self._client = sync_client(self._target, timeout=self._timeout)
        if self._shas is None:
            self._shas = [self._client.script_load(text) for text in self._scripts]
        replies = self._pipeline(batch)
        missing = [i for i, reply in enumerate(replies) if _no_script(reply)]
        if missing:  # Redis restarted and forgot the scripts: none of those ran
            self._shas = [self._client.script_load(text) for text in self._scripts]
            again = self._pipeline([batch[i] for i in missing])
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    def _pipeline(self, batch: list[Call]) -> list[list[Any]]:
        assert self._shas is not None
        pipe = self._client.pipeline(transaction=False)
        sizes = []
        for call in batch:
            sizes.append(len(call.commands))
            for command in call.commands:
                if isinstance(command, Script):
                    pipe.execute_command(
                        "EVALSHA",
                        self._shas[command.index],
                        len(command.keys),
                        *command.keys,
                        *command.args,
                    )
                else:
                    pipe.execute_command(*command)
        flat = pipe.execute(raise_on_error=False)
        replies = []
        at = 0
        for size in sizes:
            replies.append(flat[at : at + size])
            at += size
        return replies

    def _failed(self, call: Call, error: BackendError) -> None:
        self._answer(call, error)
        if call.durable_until > time.monotonic():
            if len(self._retry) >= MAX_RETRIES:
                self._retry.popleft()
                self._dropped += 1
            self._retry.append(call)

    def _answer(self, call: Call, result: list[Any] | BackendError) -> None:
        if call.answered or call.future is None or call.loop is None:
            call.answered = True
            return
        call.answered = True
        with contextlib.suppress(RuntimeError):  # its loop has closed
            call.loop.call_soon_threadsafe(_resolve, call.future, result)

    def _went_down(self, exc: BaseException, calls: int) -> None:
        self._failed_calls += calls
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "limits backend: Redis does not answer (%s); limited requests follow "
                "on_backend_error until it does, settlements are kept and sent again",
                type(exc).__name__,
            )

    def _answered(self) -> None:
        if not self.ready:
            self.ready = True
            log.info("limits backend: Redis answers; limited requests are admitted")
        if self._down_since is not None:
            log.warning(
                "limits backend: Redis answers again after %.1f s (%d calls failed, %d "
                "settlements still to send, %d dropped)",
                time.monotonic() - self._down_since,
                self._failed_calls,
                len(self._retry),
                self._dropped,
            )
            self._down_since = None
            self._failed_calls = 0


def _no_script(reply: list[Any]) -> bool:
    return any(isinstance(r, NoScriptError) for r in reply)


def _resolve(future: asyncio.Future[list[Any]], result: list[Any] | BackendError) -> None:
    if future.done():
        return
    if isinstance(result, BackendError):
        future.set_exception(result)
    else:
        future.set_result(result)

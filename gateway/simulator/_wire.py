"""Writing a scripted response: pacing, random partitions, aborts, disconnects.

:class:`ScriptedResponse` runs two tasks side by side: the writer, which
plays the script's steps, and a watcher, which waits for the client's
``http.disconnect``. Whichever ends first cancels the other, so a stall (or a
writer blocked on backpressure) ends as soon as the client goes away.

An :class:`Abort` step raises :class:`SimulatedAbort` after the response has
started; the server then closes the connection without the chunked body's
terminating chunk, which the client sees as a transport error. The
``uvicorn.error`` logger gets a filter that drops only that exception's
traceback. When the server shuts down (``closing`` is set), responses still
being written are cut the same way at once, so a stall of an hour never holds
up a shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from typing import Any, Final

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.simulator._script import Abort, Sleep, Step, Write

__all__ = ["Closing", "ScriptedResponse", "SimulatedAbort", "install_abort_log_filter"]

#: Yield to the event loop after this many bytes written without a pause,
#: so one fast stream cannot starve the other tasks of the loop.
_YIELD_EVERY_BYTES: Final = 256 * 1024


class SimulatedAbort(Exception):
    """Raised on purpose to cut a response body (fault ``abort_mid_body``)."""


class Closing:
    """A shutdown flag that any event loop can wait on (an ``asyncio.Event`` binds to one)."""

    def __init__(self) -> None:
        self.is_set = False
        self._waiters: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        self.is_set = True
        for waiter in list(self._waiters):
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def clear(self) -> None:
        self.is_set = False

    async def wait(self) -> None:
        if self.is_set:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _AbortLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedAbort)


_ABORT_FILTER: Final = _AbortLogFilter()


def install_abort_log_filter() -> None:
    """Keep the intended aborts out of the server's error log (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if _ABORT_FILTER not in logger.filters:
        logger.addFilter(_ABORT_FILTER)


def _piece_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.5:
        return rng.randint(1, 8)
    if roll < 0.85:
        return rng.randint(9, 256)
    return rng.randint(257, 4096)


class _Output:
    """Sends body bytes, optionally re-cut into random pieces across event boundaries."""

    def __init__(self, send: Send, rng: random.Random | None) -> None:
        self._send = send
        self._rng = rng
        self._leftover = b""
        self._next = _piece_size(rng) if rng is not None else 0
        self._unyielded = 0

    async def _emit(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self._unyielded += len(data)
        if self._rng is not None or self._unyielded >= _YIELD_EVERY_BYTES:
            self._unyielded = 0
            await asyncio.sleep(0)

    async def write(self, data: bytes) -> None:
        if self._rng is None:
            await self._emit(data)
            return
        chunk = self._leftover + data if self._leftover else data
        pos = 0
        while len(chunk) - pos >= self._next:
            await self._emit(chunk[pos : pos + self._next])
            pos += self._next
            self._next = _piece_size(self._rng)
        self._leftover = chunk[pos:]

    async def flush(self) -> None:
        """Send what is held back (before a pause, an abort or the end)."""
        if self._rng is None:
            return
        chunk, self._leftover = self._leftover, b""
        pos = 0
        while pos < len(chunk):
            size = min(_piece_size(self._rng), len(chunk) - pos)
            await self._emit(chunk[pos : pos + size])
            pos += size


class _Pacer:
    """Spaces content deltas ``1/tps`` apart; late deltas do not burst to catch up."""

    def __init__(self, tps: float) -> None:
        self.interval = 1.0 / tps if tps > 0 else 0.0
        self._next_at: float | None = None

    @property
    def active(self) -> bool:
        return self.interval > 0

    async def wait(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._next_at is None or self._next_at < now:
            self._next_at = now
        delay = self._next_at - now
        if delay > 0:
            await asyncio.sleep(delay)
        self._next_at += self.interval

    def reset(self) -> None:
        self._next_at = None


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ScriptedResponse(Response):
    """A response played from script steps, with the client's disconnect watched throughout."""

    def __init__(
        self,
        *,
        status_code: int,
        headers: list[tuple[str, str]],
        steps: Iterable[Step],
        tps: float = 0.0,
        partition_seed: int | None = None,
        stall_before: float = 0.0,
        closing: Closing | None = None,
    ) -> None:
        super().__init__(status_code=status_code)
        self.closing = closing
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers]
        self.steps = steps
        self.tps = tps
        self.partition_seed = partition_seed
        self.stall_before = stall_before

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._play(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        tasks: set[asyncio.Future[Any]] = {writer, watcher}
        if self.closing is not None:
            tasks.add(asyncio.ensure_future(self.closing.wait()))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        if not watcher.cancelled():
            watcher.exception()  # retrieved: a failing receive() counts as a disconnect
        if not writer.cancelled() and (error := writer.exception()) is not None:
            raise error
        if writer.cancelled() and self.closing is not None and self.closing.is_set:
            # The server is shutting down: cut the response at once, quietly.
            raise SimulatedAbort("the simulator is shutting down")

    async def _play(self, send: Send) -> None:
        if self.stall_before > 0:
            await asyncio.sleep(self.stall_before)
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        rng = None
        if self.partition_seed is not None:
            rng = random.Random(f"partition:{self.partition_seed}")
        out = _Output(send, rng)
        pacer = _Pacer(self.tps)
        for step in self.steps:
            if isinstance(step, Write):
                if step.paced and pacer.active:
                    await out.flush()
                    await pacer.wait()
                await out.write(step.data)
            elif isinstance(step, Sleep):
                await out.flush()
                await asyncio.sleep(step.seconds)
                pacer.reset()
            elif isinstance(step, Abort):
                await out.flush()
                raise SimulatedAbort("abort_mid_body: body cut without its terminating chunk")
        await out.flush()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

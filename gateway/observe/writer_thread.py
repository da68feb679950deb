"""WriterThread: one daemon thread that does, off the event loop, what the loop hands it.

For work that may block (a file, a pipe to a log shipper) and must never
hold a request: the loop offers an item to a bounded queue and goes on; a
full queue refuses it (the caller drops and counts it). ``close`` lets the
thread finish what it holds, for a bounded time, so that a stalled write
never holds the shutdown. The access log and the capture writer use it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["WriterThread"]

T = TypeVar("T")


class WriterThread(Generic[T]):
    """``handle`` runs in the thread on each item, in order; it must not raise."""

    def __init__(self, name: str, handle: Callable[[T], None], size: int) -> None:
        self._name = name
        self._handle = handle
        self._queue: queue.Queue[T | None] = queue.Queue(size)
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def offer(self, item: T) -> bool:
        """Hand ``item`` to the thread; False when the queue is full (never waits)."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread handle what it holds (for at most ``timeout`` seconds), then
        stop it. May block: call it from a thread, or where blocking is harmless."""
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        thread.join(max(deadline - time.monotonic(), 0.0))
        if not thread.is_alive():
            self._thread = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._handle(item)

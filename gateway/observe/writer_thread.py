"""WriterThread: one daemon thread that does, off the event loop, what the loop hands it.

For work that may block (a file, a pipe to a log shipper) and must never
hold a request: the loop offers an item with a weight (a capture: 1; a batch
of log lines: its line count) and goes on; an item that would take what
waits past ``capacity`` is refused (the caller drops and counts it). What is
offered before ``start`` waits for the thread. ``close`` lets the thread
finish what it holds, items offered meanwhile included, for a bounded time,
so that a stalled write never holds the shutdown; once the thread has ended,
``offer`` refuses and ``running`` is False (the caller does the work itself).
The access log and the capture writer use it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from gateway.logsetup import LogGate

__all__ = ["WriterThread"]

log = logging.getLogger("gateway")

T = TypeVar("T")


class WriterThread(Generic[T]):
    """``handle`` runs in the thread on each item, in order; what it raises is logged
    (at most once a minute) and the thread goes on."""

    def __init__(self, name: str, handle: Callable[[T], None], capacity: int) -> None:
        self._name = name
        self._handle = handle
        self._capacity = capacity
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._changed = threading.Condition()
        self._waiting = 0  # the weight offered and not yet handled
        self._closing = False
        self._ended = False
        self._thread: threading.Thread | None = None
        self._failure_log = LogGate()

    @property
    def running(self) -> bool:
        """Started and not ended: what ``offer`` takes will be handled."""
        return self._thread is not None and not self._ended

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def offer(self, item: T, weight: int = 1) -> bool:
        """Hand ``item`` to the thread; False (never waits) once the thread has ended, or
        when what waits would pass the capacity."""
        with self._changed:
            if self._ended or self._waiting + weight > self._capacity:
                return False
            self._waiting += weight
            self._items.append((item, weight))
            self._changed.notify()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread handle what it holds, and what is offered meanwhile, then end
        (waiting at most ``timeout`` seconds for it). May block: call it from a thread,
        or where blocking is harmless."""
        thread = self._thread
        if thread is None:
            return
        with self._changed:
            self._closing = True
            self._changed.notify()
        thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._items and not self._closing:
                    self._changed.wait()
                if not self._items:  # closing, and nothing left: nothing more is taken
                    self._ended = True
                    return
                item, weight = self._items.popleft()
            try:
                self._handle(item)
            except Exception:
                if self._failure_log.open():
                    log.exception("%s failed (logged at most once a minute)", self._name)
            finally:
                with self._changed:
                    self._waiting -= weight

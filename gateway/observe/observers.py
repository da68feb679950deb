"""Observers: the list each finished request is handed to, each isolated from the others.

The relay fills one ``RequestRecord`` per request and hands it to
``Observers.observe`` once, at the end. Every observer (metrics, the access
log, whatever comes next) runs in turn; one that raises never stops the
others nor touches the response. A failure is counted through ``on_error``
(``gateway_observer_errors_total{observer}``) and logged at most once per
``log_interval`` seconds per observer, so hostile input cannot flood the log.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.observe.record import RequestRecord

__all__ = ["Observer", "Observers"]

log = logging.getLogger("gateway")


class Observer(Protocol):
    """Anything that wants each finished request: a bounded ``name`` and ``observe``."""

    @property
    def name(self) -> str: ...

    def observe(self, record: RequestRecord) -> None: ...


class Observers:
    """Runs every observer on each record; isolates, counts and rate-limits failures."""

    def __init__(
        self,
        observers: Sequence[Observer],
        on_error: Callable[[str], None] = lambda name: None,
        *,
        log_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._observers = tuple(observers)
        self._on_error = on_error
        self._log_interval = log_interval
        self._clock = clock
        self._last_logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def observe(self, record: RequestRecord) -> None:
        for observer in self._observers:
            try:
                observer.observe(record)
            except Exception:
                self.failed(observer.name)

    def failed(self, name: str) -> None:
        """Count and (rate-limited) log a failure of observer ``name``; call from ``except``."""
        with contextlib.suppress(Exception):  # the counter failing must not escape either
            self._on_error(name)
        now = self._clock()
        last = self._last_logged.get(name)
        if last is not None and now - last < self._log_interval:
            self._suppressed[name] = self._suppressed.get(name, 0) + 1
            return
        suppressed = self._suppressed.pop(name, 0)
        self._last_logged[name] = now
        log.exception(
            "observer %s failed on a request (%d more failure(s) not logged since the last)",
            name,
            suppressed,
        )

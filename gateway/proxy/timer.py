"""A deadline for one await: a loop timer that cancels the task, without asyncio.Timeout.

``asyncio.timeout_at`` costs a context manager, a state machine and, in
Python 3.11, a ``getpid()`` system call behind each of its
``get_running_loop()`` and ``current_task()`` calls, on entering and on
rescheduling: tens of microseconds a request over the few awaits a request
bounds. ``Deadline`` is the same mechanism with the loop and the task given
(the exchange has both): one ``call_at`` that cancels the task, and on the
way out the same test asyncio.Timeout makes (``Task.uncancel()`` against the
cancellations counted when it was armed) to tell its own cancellation from
anyone else's (a client gone, the drain), which passes through untouched.

Use::

    deadline = Deadline(loop, task, when)
    try:
        result = await something()
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        ...  # the deadline passed: what TimeoutError would have meant
    finally:
        deadline.cancel()

``move(when)`` re-arms it for the next phase of the same request.
"""

from __future__ import annotations

import asyncio

__all__ = ["Deadline"]


class Deadline:
    __slots__ = ("_cancelling", "_fired", "_handle", "_loop", "_task")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object], when: float
    ) -> None:
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()
        self._fired = False
        self._handle = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def move(self, when: float) -> None:
        """Arm it for ``when`` instead (a deadline that already fired stays fired)."""
        self._handle.cancel()
        if not self._fired:
            self._handle = self._loop.call_at(when, self._fire)

    def cancel(self) -> None:
        """Disarm it (idempotent)."""
        self._handle.cancel()

    def expired(self) -> bool:
        """For a caught ``CancelledError``: True when it was this deadline's own (and no
        one else's too), which it then takes back; False: re-raise it."""
        self._handle.cancel()
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling

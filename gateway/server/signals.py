"""Stop signals: SIGTERM and SIGINT (Ctrl-C) both drain; a second one stops at once.

uvicorn's own handler (``Server.handle_exit``) would, on SIGINT, start the
server's shutdown straight away: it waits ``timeout_graceful_shutdown`` for
open streams, then cancels their tasks (a ``CancelledError`` traceback, a
client cut with no annotation, an access-log line with no verdict). So the
gateway takes both signals from uvicorn:

- the first one starts the drain (``Lifecycle.begin_drain``); once every
  in-flight request has ended, the server is told to exit through
  ``should_exit``, the way a uvicorn ``Server`` is stopped from code, and the
  process exits 0 after SIGTERM (the signal has been handled), 130 after SIGINT
  (128 + 2, what a shell expects of a command a Ctrl-C ended: ``stopped_by``);
- a second one of the same signal stops every in-flight request now with
  ``gateway_shutdown`` (each still gets its annotation and its log line) and
  then tells the server to exit. The other signal does not: with
  ``--workers N`` a terminal's Ctrl-C reaches every worker, and uvicorn's
  supervisor then sends each a SIGTERM too, which must not cut the drain
  short.

Where there is no uvicorn ``Server`` behind the previous handler (a test
server in a thread installs none), the previous handler is called instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

__all__ = [
    "STOP_SIGNALS",
    "exit_status",
    "install_drain_handlers",
    "restore_handlers",
    "stopped_by",
]

#: The signals that stop the gateway: a supervisor's SIGTERM, a terminal's Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

Handlers = dict[signal.Signals, Any]

#: The stop signal this process received first, if any (``stopped_by``).
_received: list[int] = []


def stopped_by() -> int | None:
    """The stop signal this process took first, or None."""
    return _received[0] if _received else None


def exit_status(signum: int | None) -> int:
    """A server's exit status once it stopped: 130 after SIGINT (a shell's convention for
    a command a Ctrl-C ended), 0 otherwise (SIGTERM is a supervisor's normal stop)."""
    return 128 + signal.SIGINT if signum == signal.SIGINT else 0


def install_drain_handlers(
    begin_drain: Callable[[Callable[[], None]], None], stop_all: Callable[[], None]
) -> Handlers:
    """Take SIGTERM and SIGINT; the previous handlers, for ``restore_handlers``.

    Returns an empty mapping where signals cannot be taken (not the main
    thread, no running loop).
    """
    try:
        loop = asyncio.get_running_loop()
        previous: Handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    except (ValueError, RuntimeError):
        return {}
    first: list[int] = []  # the signal that started the drain

    def handler(signum: int, frame: FrameType | None) -> None:
        fallback = previous.get(signal.Signals(signum))
        server = getattr(fallback, "__self__", None)

        def exit_server() -> None:
            if isinstance(server, uvicorn.Server):
                server.should_exit = True
            elif callable(fallback):
                fallback(signum, frame)

        def stop_now() -> None:
            stop_all()
            exit_server()

        if first:
            if signum == first[0]:
                loop.call_soon_threadsafe(stop_now)
            return
        first.append(signum)
        _received.append(signum)
        loop.call_soon_threadsafe(begin_drain, exit_server)

    installed: Handlers = {}
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. a test server in a thread)
            restore_handlers(installed)
            return {}
        installed[sig] = previous[sig]
    return installed


def restore_handlers(previous: Handlers) -> None:
    """Put back the handlers ``install_drain_handlers`` replaced."""
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(sig, handler)

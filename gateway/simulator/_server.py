"""Running the simulator: blocking (``serve``) or as a task in a running loop.

In a running loop it shares uvicorn's loggers with its owner's server, so its
own start-up and shutdown lines ("Uvicorn running on ...") are dropped there:
the owner would print them twice, once with the simulator's port.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
from collections.abc import Generator
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette

from gateway.simulator._app import create_simulator_app
from gateway.simulator._wire import Closing

__all__ = ["RunningSimulator", "serve", "start_in_background"]

#: Stalled streams may last an hour; shutting down waits this long, then cancels them.
_GRACEFUL_SHUTDOWN_SECONDS = 1

#: Set in the context of a background simulator's task (and so of every task it starts).
_IN_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "gateway_simulator_in_background", default=False
)


class _QuietInBackground(logging.Filter):
    """Drops uvicorn's informational lines logged by a background simulator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _IN_BACKGROUND.get()


def _quiet_uvicorn_in_background() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietInBackground) for f in logger.filters):
        logger.addFilter(_QuietInBackground())


def serve(
    host: str = "127.0.0.1",
    port: int = 9000,
    *,
    default_tps: float = 0,
    default_tokens: int = 20,
    log_level: str = "info",
    access_log: bool = True,
    default_fault: str = "none",
    default_status: int = 500,
) -> None:
    """Run the simulator until interrupted (uvloop and httptools when installed)."""
    app = create_simulator_app(
        default_tps=default_tps,
        default_tokens=default_tokens,
        default_fault=default_fault,
        default_status=default_status,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="auto",
        http="auto",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_SECONDS,
    )
    _SimulatorServer(config, app, own_signals=True).run()


class _SimulatorServer(uvicorn.Server):
    """uvicorn's server, cutting open responses at shutdown; optionally leaving signals alone."""

    def __init__(self, config: uvicorn.Config, app: Starlette, *, own_signals: bool) -> None:
        super().__init__(config)
        self._closing: Closing = app.state.closing
        self._own_signals = own_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if self._own_signals:
            with super().capture_signals():
                yield
        else:
            yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._closing.set()
        await super().shutdown(sockets)


@dataclass(slots=True)
class RunningSimulator:
    """A simulator serving in the current event loop."""

    server: uvicorn.Server
    task: asyncio.Task[None]
    app: Starlette
    host: str
    port: int

    @property
    def base_url(self) -> str:
        """``http://host:port`` (append ``/v1`` for an SDK's ``base_url``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, give open streams ``grace`` seconds, then cancel what is left."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace)
        except TimeoutError:
            self.server.force_exit = True
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def _serve(server: uvicorn.Server) -> None:
    try:
        await server.serve()
    except SystemExit as exc:  # uvicorn exits on a bind error; never let it stop the loop
        raise RuntimeError(f"the simulator server exited (code {exc.code})") from None


async def start_in_background(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    default_tps: float = 0,
    default_tokens: int = 20,
    startup_timeout: float = 10.0,
) -> RunningSimulator:
    """Start the simulator as a task of the running loop; return once it listens.

    ``port=0`` picks a free port; the bound one is ``.port``. The server
    neither installs signal handlers nor configures logging (the owner's stay in
    force), logs no access lines, and its start-up and shutdown lines are
    dropped (warnings and errors are not); stop it with ``await running.stop()``.
    """
    app = create_simulator_app(default_tps=default_tps, default_tokens=default_tokens)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http="auto",
        log_config=None,
        log_level=None,
        access_log=False,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = _SimulatorServer(config, app, own_signals=False)
    _quiet_uvicorn_in_background()
    context = contextvars.copy_context()
    context.run(_IN_BACKGROUND.set, True)
    task = asyncio.create_task(_serve(server), name="gateway-simulator", context=context)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + startup_timeout
    while not server.started:
        if task.done():
            task.result()  # raises the startup error
            raise RuntimeError("the simulator server stopped before it started")
        if loop.time() > deadline:
            server.should_exit = True
            task.cancel()
            raise RuntimeError("the simulator server did not start in time")
        await asyncio.sleep(0.005)
    bound = port
    for listener in server.servers:
        for sock in listener.sockets:
            bound = sock.getsockname()[1]
            break
        break
    return RunningSimulator(server=server, task=task, app=app, host=host, port=bound)

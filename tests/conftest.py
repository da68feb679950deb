"""Shared test fixtures: real uvicorn servers on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from tests import guard_source

guard_source.install()

# Hypothesis profiles: every @given test takes its settings from here, none sets its own.
# No deadline in either: a loaded two-core machine runs one example in far more than
# hypothesis's 200 ms now and then, which says nothing about the code. ``ci`` is
# derandomized (the same examples every run, so a failure reproduces) with the counts
# the property tests are held to; ``dev``, for the inner loop, runs far fewer.
# HYPOTHESIS_PROFILE picks one by name; otherwise CI=true picks ``ci``.
_SLOW_OR_LARGE = [HealthCheck.too_slow, HealthCheck.data_too_large]
hypothesis_settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=_SLOW_OR_LARGE
)
hypothesis_settings.register_profile(
    "dev",
    max_examples=25,
    deadline=None,
    derandomize=False,  # hypothesis's own default turns it on where CI is set
    suppress_health_check=_SLOW_OR_LARGE,
)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"
)
hypothesis_settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    stale = [] if guard_source.PURE else guard_source.stale_compiled_modules()
    if stale:
        raise pytest.UsageError(
            f"the compiled guard is older than its source ({', '.join(sorted(stale))}): "
            "run `make test` (it rebuilds it), or set PURE_PYTHON_GUARD=1"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A loopback port where nothing listens, for as long as the block runs.

    A port free_port() handed out can be bound by another test's server meanwhile, and
    the dead upstream answers. This one stays bound, never listened on: a connect to it
    is refused (ECONNREFUSED, as to a free port) and no other socket can bind it (no
    SO_REUSEADDR here, so even uvicorn's bind gets EADDRINUSE).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port where nothing listens, for the whole test (``held_port``)."""
    with held_port() as port:
        yield port


class ServerThread:
    """A real uvicorn server (uvloop + httptools) running an ASGI app in a thread."""

    def __init__(self, app: Any, **config: Any) -> None:
        self._app = app
        self._chosen_port = "port" not in config  # free_port()'s: another may be tried
        self.port = config.pop("port", None) or free_port()
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "loop": "uvloop",
            "http": "httptools",
            "log_level": "warning",
            "access_log": False,
            "lifespan": "on",
            "timeout_graceful_shutdown": 2,
            # As `gateway serve` runs it: the gateway reads X-Forwarded-* itself.
            "proxy_headers": False,
        }
        options.update(config)
        self._options = options
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        # uvicorn exits the thread when its bind fails; start() tells that apart.
        with contextlib.suppress(SystemExit):
            self.server.run()

    def start(self) -> ServerThread:
        for _ in range(3 if self._chosen_port else 1):
            self.thread.start()
            deadline = time.monotonic() + 60  # generous: a loaded machine starts slowly
            while self.thread.is_alive() and time.monotonic() < deadline:
                if self.server.started:
                    return self
                time.sleep(0.01)
            if self.thread.is_alive():
                break  # too slow, not a failed bind
            # uvicorn exits when its bind fails: another server took the port between
            # free_port() and the bind. Once more, on another port.
            self.port = self._options["port"] = free_port()
            self.server = uvicorn.Server(uvicorn.Config(self._app, **self._options))
            self.thread = threading.Thread(target=self._serve, daemon=True)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def running(app: Any, **config: Any) -> Iterator[ServerThread]:
    server = ServerThread(app, **config).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def simulator() -> Iterator[ServerThread]:
    from gateway.simulator import create_simulator_app

    with running(create_simulator_app()) as server:
        yield server


class PortTaken(RuntimeError):
    """The gateway process could not bind its port: another server took it first."""


class GatewayProcess:
    """The gateway as a real separate process (``python -m gateway serve``).

    Its stdout (the access log) is read as it comes, by a thread (``drain``): a pipe
    nobody reads holds 64 KiB, and beyond what the gateway's log queue then holds its
    lines are dropped. ``drain=False`` leaves ``proc.stdout`` to the test. Its stderr is
    always read as it comes, by a thread of its own: the gateway's warnings go there
    from its event loop, which a full pipe would block (``stderr`` is what came so far).
    """

    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, *, drain: bool = True
    ) -> None:
        import os
        import subprocess
        import sys
        import threading

        self.port = free_port()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(self.port), *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._stderr = b""
        self._stderr_ended = False
        self._stderr_changed = threading.Condition()
        errors, self.proc.stderr = self.proc.stderr, None  # communicate() leaves it be
        assert errors is not None

        def read_errors() -> None:
            while chunk := os.read(errors.fileno(), 65536):
                with self._stderr_changed:
                    self._stderr += chunk
                    self._stderr_changed.notify_all()
            errors.close()
            with self._stderr_changed:
                self._stderr_ended = True
                self._stderr_changed.notify_all()

        self._errors = threading.Thread(target=read_errors, daemon=True)
        self._errors.start()
        self._stdout: list[bytes] = []
        self._drain: threading.Thread | None = None
        if drain:
            pipe, self.proc.stdout = self.proc.stdout, None  # communicate() leaves it be
            assert pipe is not None

            def read() -> None:
                while chunk := os.read(pipe.fileno(), 65536):
                    self._stdout.append(chunk)
                pipe.close()

            self._drain = threading.Thread(target=read, daemon=True)
            self._drain.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stderr(self) -> bytes:
        """What the process wrote on stderr so far."""
        with self._stderr_changed:
            return self._stderr

    def wait_ready(self, timeout: float = 60) -> GatewayProcess:
        import httpx

        from tests import web

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc.communicate()
                self._errors.join(30)
                text = self.stderr.decode(errors="replace")[-2000:]
                if "address already in use" in text.lower():
                    raise PortTaken(text)
                raise RuntimeError(f"gateway exited: {text}")
            try:
                ready = web.get(self.url + "/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                ready = False
            if ready and self._listening():
                return self
            time.sleep(0.05)
        raise RuntimeError("gateway did not become ready")

    def _listening(self) -> bool:
        """Whether this process holds the port's listening socket. Between free_port()
        and the gateway's bind, another test's server can take the port; its /readyz
        answers too (a run once tested a gateway with client keys, and got 401s)."""
        import psutil

        try:
            process = psutil.Process(self.proc.pid)
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
            for c in connections
        )

    def wait_stderr(self, needle: bytes, count: int = 1, timeout: float = 60) -> None:
        """Wait until the process has written ``needle`` ``count`` times on stderr.

        For a state only the process's own lines show (each of ``--workers N`` started);
        what is read here is still part of what ``stop()`` returns.
        """
        with self._stderr_changed:
            self._stderr_changed.wait_for(
                lambda: self._stderr.count(needle) >= count or self._stderr_ended, timeout
            )
            seen = self._stderr
        assert seen.count(needle) >= count, f"no {count} x {needle!r} on stderr: {seen[-2000:]!r}"

    def stop(self) -> tuple[bytes, bytes]:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=30)
        except Exception:
            self.proc.kill()
            try:
                out, _ = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                # Gone, yet its pipes stay open: a process it started outlived it.
                self.proc.wait()
                if self.proc.stdout is not None:
                    self.proc.stdout.close()
                raise AssertionError(
                    "the gateway exited but a process it started still holds its output"
                ) from None
        # The process has exited: its output is at its end (unless a process it started
        # still holds it, which the join's bound turns into a failure, not a hang).
        self._errors.join(30)
        if self._errors.is_alive():
            raise AssertionError("the gateway exited but a process it started holds its stderr")
        if self._drain is not None:
            self._drain.join(30)
            out = b"".join(self._stdout)
        return out or b"", self.stderr


@contextlib.contextmanager
def gateway_process(
    args: list[str], env: dict[str, str] | None = None, *, drain: bool = True
) -> Iterator[GatewayProcess]:
    for attempt in range(3):
        gateway = GatewayProcess(args, env, drain=drain)
        try:
            gateway.wait_ready()
            break
        except PortTaken:  # it exited: another server bound the port first
            if attempt == 2:
                raise
        except BaseException:
            gateway.stop()
            raise
    try:
        yield gateway
    finally:
        gateway.stop()

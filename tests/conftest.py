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


class ServerThread:
    """A real uvicorn server (uvloop + httptools) running an ASGI app in a thread."""

    def __init__(self, app: Any, **config: Any) -> None:
        self.port = free_port()
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
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60  # generous: a loaded machine starts slowly
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

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


class GatewayProcess:
    """The gateway as a real separate process (``python -m gateway serve``).

    Its stdout (the access log) is read as it comes, by a thread (``drain``): a pipe
    nobody reads holds 64 KiB, and a gateway whose access-log write blocks on a full
    pipe stops answering. ``drain=False`` leaves ``proc.stdout`` to the test.
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
        self._stderr_seen = b""  # what wait_stderr read before stop()
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

    def wait_ready(self, timeout: float = 60) -> GatewayProcess:
        import httpx

        from tests import web

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _out, err = self.proc.communicate()
                raise RuntimeError(f"gateway exited: {err.decode(errors='replace')[-2000:]}")
            try:
                if web.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gateway did not become ready")

    def wait_stderr(self, needle: bytes, count: int = 1, timeout: float = 60) -> None:
        """Wait until the process has written ``needle`` ``count`` times on stderr.

        For a state only the process's own lines show (each of ``--workers N`` started);
        what is read here is still part of what ``stop()`` returns.
        """
        import os
        import select

        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout
        while self._stderr_seen.count(needle) < count:
            remaining = deadline - time.monotonic()
            seen = self._stderr_seen[-2000:]
            assert remaining > 0, f"no {count} x {needle!r} on stderr: {seen!r}"
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 65536)
                assert chunk, f"stderr closed before {count} x {needle!r}: {self._stderr_seen!r}"
                self._stderr_seen += chunk

    def stop(self) -> tuple[bytes, bytes]:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=30)
        except Exception:
            self.proc.kill()
            out, err = self.proc.communicate()
        if self._drain is not None:
            self._drain.join(30)  # the process has exited: its stdout is at its end
            out = b"".join(self._stdout)
        return out or b"", self._stderr_seen + err


@contextlib.contextmanager
def gateway_process(
    args: list[str], env: dict[str, str] | None = None, *, drain: bool = True
) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(args, env, drain=drain)
    try:
        yield gateway.wait_ready()
    finally:
        gateway.stop()

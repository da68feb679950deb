"""A real ``redis-server`` (the Debian package) on a free loopback port, and a TCP proxy
that delays what goes through it (a slow Redis).

The server keeps nothing on disk (no RDB, no AOF) unless given a directory to keep its
append-only file in (``persist``), is stopped by its PID (``kill``: as a crash would), and
can be stopped and started again on the same port (Redis going away mid-run, and coming
back). ``persistence`` gives other options instead (a shipped file's own).

``redis_server()`` is the Redis of every Redis-backed test. With ``mode="cluster"``, or
for every such test with ``TEST_REDIS_MODE=cluster`` in the environment (``make
test-redis-cluster``), it is a cluster of three masters instead
(``tests.integration.redis_sets.ClusterServer``), with the same face: a test names its
Redis to a gateway with ``settings`` (``toml`` in a config file), reads it with
``client()``, and stops, kills or pauses it through these methods, never through one
process or one port, so that it runs unchanged on either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.redisconn import RedisTarget
from tests.conftest import free_port

__all__ = [
    "MODE_VARIABLE",
    "DelayingProxy",
    "RedisServer",
    "also_on_a_cluster",
    "redis_server",
    "suite_mode",
]

#: The environment variable that makes every Redis-backed test's Redis a cluster.
MODE_VARIABLE = "TEST_REDIS_MODE"


#: A test run twice: on the suite's Redis, then on a cluster of three masters (the
#: ``redis`` fixture of tests/integration/conftest.py reads the param): a representative
#: of its Redis user on a cluster in every ``make test``, where ``make
#: test-redis-cluster`` runs every Redis-backed test on one.
also_on_a_cluster = pytest.mark.parametrize(
    "redis", [None, "cluster"], indirect=True, ids=["redis", "cluster"]
)


def suite_mode() -> str:
    """``server`` (one redis-server) or ``cluster``, as the environment says."""
    mode = os.environ.get(MODE_VARIABLE, "").strip().lower() or "server"
    if mode not in ("server", "cluster"):
        raise ValueError(f"{MODE_VARIABLE} must be server or cluster, not {mode!r}")
    return mode


def _binary() -> str:
    found = shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")
    if found is None:
        if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return found


class RedisServer:
    """With ``tls`` (a directory), it speaks TLS only, with a self-signed certificate for
    127.0.0.1 that it makes there (``ca``), and ``url`` is a ``rediss://`` URL."""

    mode = "server"

    def __init__(
        self,
        password: str | None = None,
        tls: Path | None = None,
        persist: Path | None = None,
        persistence: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.password = password
        self.tls = tls
        self.persist = persist
        #: options that replace "no persistence" (``appendonly``, ``dir``...): kept across
        #: a stop and a start
        self.persistence = persistence
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ca(self) -> Path:
        assert self.tls is not None
        return self.tls / "cert.pem"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def target(self) -> RedisTarget:
        return RedisTarget.build("standalone", self.url)

    @property
    def settings(self) -> dict[str, Any]:
        """The gateway's settings naming it."""
        return {"redis_url": self.url}

    @property
    def toml(self) -> str:
        return f"redis_url = {json.dumps(self.url)}"

    def client(self, **options: Any) -> Any:
        """A blocking client (``redis.Redis``)."""
        import redis

        return redis.Redis.from_url(self.url, **options)

    def calls(self, *commands: str) -> int:
        """How many times the server ran these commands (``INFO commandstats``)."""
        with self.client() as client:
            stats = client.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """The process stopped (SIGSTOP) for the block: connections open, nothing answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def _certificate(self) -> dict[str, str]:
        assert self.tls is not None
        key = self.tls / "key.pem"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-keyout", str(key), "-out", str(self.ca), "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return {
            "port": "0",
            "tls-port": str(self.port),
            "tls-cert-file": str(self.ca),
            "tls-key-file": str(key),
            "tls-ca-cert-file": str(self.ca),
            "tls-auth-clients": "no",
        }

    def start(self) -> RedisServer:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",
            "appendonly": "no",
            "daemonize": "no",
            "loglevel": "warning",
        }
        if self.persist is not None:  # as the shipped compose file and manifests run it
            options |= {"appendonly": "yes", "appendfsync": "always", "dir": str(self.persist)}
        if self.persistence is not None:
            options |= self.persistence
        if self.password:
            options["requirepass"] = self.password
        if self.tls is not None:
            options |= self._certificate()
        args = [part for name, value in options.items() for part in (f"--{name}", value)]
        self.proc = subprocess.Popen(
            [_binary(), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "redis-server exited at start"
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw,
                self._wrapped(raw) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                    return self
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def _wrapped(self, raw: socket.socket) -> socket.socket:
        if self.tls is None:
            return raw
        context = ssl.create_default_context(cafile=str(self.ca))
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    def kill(self) -> None:
        """Stop it at once, as a crash would (nothing flushed at exit)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def redis_server(
    password: str | None = None,
    tls: Path | None = None,
    persist: Path | None = None,
    mode: str | None = None,
) -> Iterator[Any]:
    """A ``RedisServer``, or a ``ClusterServer`` (``mode="cluster"``; by default as
    ``TEST_REDIS_MODE`` says). A password, TLS or persistence asked for is a server's."""
    mode = mode or ("server" if (password or tls or persist) else suite_mode())
    if mode == "cluster":
        from tests.integration.redis_sets import ClusterServer

        with tempfile.TemporaryDirectory(prefix="cluster-") as directory:
            cluster = ClusterServer(Path(directory))
            try:
                yield cluster.start()
            finally:
                cluster.stop()
        return
    server = RedisServer(password, tls, persist).start()
    try:
        yield server
    finally:
        server.stop()


class DelayingProxy:
    """127.0.0.1:port -> target, holding every chunk towards the target ``delay`` seconds."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> DelayingProxy:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port)
        )
        self._started.set()
        self._loop.run_forever()
        self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delayed: bool) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while chunk := await src.read(65536):
                    if delayed and self.delay:  # read each time: a test may change it
                        await asyncio.sleep(self.delay)
                    dst.write(chunk)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

"""A real ``redis-server`` (the Debian package) on a free loopback port, and a TCP proxy
that delays what goes through it (a slow Redis).

The server keeps nothing on disk (no RDB, no AOF) unless given a directory to keep its
append-only file in (``persist``), is stopped by its PID (``kill``: as a crash would), and
can be stopped and started again on the same port (Redis going away mid-run, and coming
back). ``persistence`` gives other options instead (a shipped file's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

__all__ = ["DelayingProxy", "RedisServer", "redis_server"]


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
    password: str | None = None, tls: Path | None = None, persist: Path | None = None
) -> Iterator[RedisServer]:
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

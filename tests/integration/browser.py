"""A real headless Chromium (Debian's ``chromium`` package), driven over the DevTools protocol.

Started with a fresh profile, no background networking, and
``--remote-debugging-port=0``: Chromium picks a free loopback port and
writes it to ``DevToolsActivePort`` in the profile. The page target is
driven over its WebSocket (the ``websockets`` package, which uvicorn's
``standard`` extra brings) to navigate, read the rendered text
(``document.body.innerText``), evaluate an expression and take a screenshot.

Missing Chromium skips the test locally and fails it under ``CI=true``
(the convention of the deployment tests); ``.ci/run`` installs it.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from tests import web

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1400,1800",
)


def chromium_path() -> str:
    """The Chromium binary, or skip (locally) / fail (``CI=true``) without it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    message = "chromium not found on PATH; install it with `apt-get install chromium`"
    if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
        pytest.fail(f"{message} (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip(message)


class Page:
    """One page target over the DevTools protocol."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are dropped)."""
        call_id = next(self._ids)
        self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("method") == method:
                params: dict[str, Any] = message.get("params", {})
                return params

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self) -> str:
        """The page's rendered text, as a person sees it."""
        return str(self.evaluate("document.body.innerText"))

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(
            self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        )
        path.write_bytes(data)
        return data


@contextlib.contextmanager
def chromium() -> Iterator[Page]:
    """A fresh headless Chromium, and its first page."""
    binary = chromium_path()
    with tempfile.TemporaryDirectory(prefix="gateway-chromium-") as profile:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: its helpers are ended with it
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None:
                    raise RuntimeError(f"chromium exited: {proc.stderr.read()[-2000:]!r}")  # type: ignore[union-attr]
                if time.monotonic() > deadline:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.05)
            port = int(port_file.read_text().splitlines()[0])
            targets = web.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(t for t in targets if t["type"] == "page")
            with connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024) as socket:
                yield Page(socket)
        finally:
            _end_group(proc)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """End Chromium and the helpers it started (its process group), and wait until all
    are gone: a renderer still writing to the profile makes removing it fail."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    for stop in (signal.SIGKILL, None):  # 10 s to end, then killed and 10 s more
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)  # is any process of the group left?
            except ProcessLookupError:
                return
            time.sleep(0.02)
        if stop is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, stop)

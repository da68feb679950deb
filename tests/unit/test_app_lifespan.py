"""The app's lifespan opens what it owns on one ``AsyncExitStack``: a start that fails
at any step closes what the steps before it opened, newest first, and a clean stop
closes everything in the reverse order of the start."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import socket
from typing import Any

import pytest

from gateway.app import START_STEPS, create_app
from gateway.settings import Settings

pytestmark = pytest.mark.timeout(60)


class _Injected(RuntimeError):
    pass


def _settings() -> Settings:
    """Every step has something to open: the simulator, the writers, a limiter."""
    key = hashlib.sha256(b"sk-team").hexdigest()
    return Settings(
        simulator=True,
        access_log=True,
        clients=[{"name": "team", "key_sha256": [key], "limits": {"tokens_per_day": 1000}}],
    )


def _simulator_port(gateway: Any) -> int | None:
    for route in gateway.routes:
        if route.name == "simulator":
            return int(route.endpoints[0].url.rsplit(":", 1)[1].split("/")[0])
    return None


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def test_a_clean_start_and_stop_close_everything_in_reverse() -> None:
    app = create_app(_settings())
    gateway = app.gateway  # type: ignore[attr-defined]

    async def run() -> list[str]:
        async with app.router.lifespan_context(app):
            opened = list(gateway.opened)
            port = _simulator_port(gateway)
            assert port is not None
            assert _listens(port)
        assert not _listens(port)
        return opened

    opened = asyncio.run(run())
    assert {"simulator", "access_log", "upstream", "bodies", "limiter", "signals", "ready"} <= set(
        opened
    )
    assert gateway.opened == []
    assert gateway.closed == list(reversed(opened))


@pytest.mark.parametrize("failing", START_STEPS)
def test_a_failed_start_closes_what_it_opened(failing: str) -> None:
    app = create_app(_settings())
    gateway = app.gateway  # type: ignore[attr-defined]
    open_when_it_failed: list[str] = []

    async def fail(stack: Any) -> None:
        open_when_it_failed.extend(gateway.opened)
        raise _Injected(failing)

    setattr(gateway, f"_open_{failing}", fail)
    handler_before = signal.getsignal(signal.SIGTERM)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            raise AssertionError("the start should have failed")

    with pytest.raises(_Injected):
        asyncio.run(run())
    steps_before = START_STEPS[: START_STEPS.index(failing)]
    assert ("simulator" in open_when_it_failed) == ("simulator" in steps_before)
    assert ("signals" in open_when_it_failed) == ("signals" in steps_before)
    # What was open is closed, newest first; nothing is left open.
    assert gateway.opened == []
    assert gateway.closed == list(reversed(open_when_it_failed))
    # ... for real: the handlers are back, the writer thread ended, the simulator is gone.
    assert signal.getsignal(signal.SIGTERM) == handler_before
    assert not gateway.access_log._writer.running
    port = _simulator_port(gateway)
    if port is not None:
        assert not _listens(port)
    assert not gateway.lifecycle.ready


def test_the_start_log_names_the_configured_store_and_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 45 item 15: it said "stream store none" where the reference documents the
    default ``memory``; it now names the setting, and says when nothing uses it."""
    app = create_app(Settings(simulator=True))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            pass

    with caplog.at_level("INFO", logger="gateway"):
        asyncio.run(run())
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("limits:")]
    assert "none" not in line
    assert "backend memory (unused: no client has limits)" in line
    assert "stream store memory (unused: no route resumes or caches)" in line

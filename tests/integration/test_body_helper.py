"""The body parser's helper process (a large request body is parsed there, off the loop)
ends with the gateway process that started it, however that process ends."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.control import WAIT_SECONDS

# Over OFF_LOOP_BYTES (1 MiB): parsed in the helper process.
BIG_BODY = json.dumps(
    {
        "model": "sim",
        "stream": True,
        "messages": [{"role": "user", "content": "x" * (2 << 20)}],
    }
).encode()


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone, or a zombie
        return ""


def _helpers(gateway: psutil.Process) -> list[psutil.Process]:
    """The gateway's helper processes (multiprocessing's spawned children)."""
    return [c for c in gateway.children(recursive=True) if "multiprocessing" in _command(c)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def started_helper(simulator: ServerThread) -> Iterator[tuple[object, list[psutil.Process]]]:
    with gateway_process(["--upstream", simulator.url + "/v1"]) as gw:
        response = web.post(
            gw.url + "/v1/chat/completions",
            content=BIG_BODY,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        helpers = _helpers(psutil.Process(gw.proc.pid))
        assert any("spawn_main" in _command(h) for h in helpers), helpers
        yield gw, helpers


def _gone(processes: list[psutil.Process]) -> bool:
    return not any(_alive(p) for p in processes)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_helper_ends_with_the_gateway(
    started_helper: tuple[object, list[psutil.Process]], how: signal.Signals
) -> None:
    gw, helpers = started_helper
    os.kill(gw.proc.pid, how)  # type: ignore[attr-defined]
    deadline = time.monotonic() + WAIT_SECONDS
    while not _gone(helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [(p.pid, _command(p)) for p in helpers if _alive(p)]
    for process in helpers:  # the test's own leftovers, never left running
        if _alive(process):
            process.kill()
    assert _gone(helpers), f"helpers outlived the gateway ({how.name}): {left}"

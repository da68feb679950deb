"""Helpers for integration tests: start a gateway in front of a simulator, read streams."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.app import create_app
from gateway.guard import SSEDecoder
from gateway.server.edge import uvicorn_options
from gateway.settings import Settings
from tests import web
from tests.conftest import ServerThread, running

#: How often a wait looks at its condition again.
POLL_SECONDS = 0.02


def wait_until(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Return once ``check()`` holds, looked at every 20 ms; fail after ``seconds``.

    A test waits for the state it needs, never a fixed time (as uvicorn's
    ``tests/utils.py:run_server`` waits for ``server.started``)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(POLL_SECONDS)


async def until(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """``wait_until`` on the event loop: the loop runs on while it waits."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(POLL_SECONDS)


ANNOTATION = re.compile(
    rb": gateway outcome=(?P<outcome>complete|incomplete) reason=(?P<reason>[a-z_]+) "
    rb"(?:continued=(?P<continued>[1-9][0-9]*) )?"
    rb"(?:schema=(?P<schema>[a-z]+) (?:schema_kind=(?P<schema_kind>[a-z]+) "
    rb"schema_at=(?P<schema_at>\S+) schema_event=(?P<schema_event>[0-9]+) )?)?"
    rb"request_id=(?P<rid>[A-Za-z0-9._-]+)\n\Z"
)


@contextlib.contextmanager
def gateway_for(upstream: str, **settings: Any) -> Iterator[ServerThread]:
    """A real gateway (uvicorn, uvloop, httptools) whose /v1 route goes to ``upstream``."""
    options: dict[str, Any] = {"access_log": False}
    if "routes" not in settings:
        options["upstream_url"] = upstream
    options.update(settings)
    with running(create_app(Settings(**options)), **uvicorn_options()) as server:
        yield server


#: The admin key of ``gateway_with_clients``'s issued variant.
KEYS_ADMIN = "sk-helper-keys-admin-0123"
_ISSUED_FIELDS = ("limits", "route_limits", "model_limits", "budget_enforcement", "routes")


@contextlib.contextmanager
def gateway_with_clients(
    upstream: str, issued: bool, clients: list[dict[str, Any]], **settings: Any
) -> Iterator[ServerThread]:
    """``gateway_for`` with these named clients: configured in its settings, or (``issued``)
    issued at run time through the admin API with the same names, digests, routes and
    limits (the memory store), so that a test of named clients runs against issued keys."""
    if not issued:
        if clients:
            settings["clients"] = clients
        with gateway_for(upstream, **settings) as server:
            yield server
        return
    digest = hashlib.sha256(KEYS_ADMIN.encode()).hexdigest()
    admin = {"name": "keys-admin", "key_sha256": [digest], "keys_admin": True}
    with gateway_for(upstream, clients=[admin], keys={"store": "memory"}, **settings) as server:
        prefix = settings["routes"][0]["prefix"] if settings.get("routes") else "/v1"
        for client in clients:
            body = {"client": client["name"], "key_sha256": client["key_sha256"]}
            body |= {k: client[k] for k in _ISSUED_FIELDS if k in client}
            answer = web.post(
                f"{server.url}{prefix}/gateway/keys",
                json=body,
                headers={"authorization": f"Bearer {KEYS_ADMIN}"},
                timeout=30,
            )
            assert answer.status_code == 201, answer.text
        yield server


def access_log_lines(out: str | bytes) -> list[dict[str, Any]]:
    """The access-log lines (one JSON object each) in a gateway's stdout, in order.

    An in-process gateway writes them to ``sys.stdout`` (read it with ``capsys``); it
    flushes what it holds when it stops, so after ``with gateway_for(...)`` all are there.
    """
    text = out.decode() if isinstance(out, bytes) else out
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def access_log_until(capsys: pytest.CaptureFixture[str], request_id: str) -> list[dict[str, Any]]:
    """The access-log lines an in-process gateway wrote, until ``request_id``'s is there.

    It flushes its lines within 0.1 s; this waits up to 10 s for that one.
    """
    seen = ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen += capsys.readouterr().out
        lines = access_log_lines(seen)
        if any(entry["request_id"] == request_id for entry in lines):
            return lines
        time.sleep(0.05)
    raise AssertionError(f"no access-log line for {request_id}: {seen[-2000:]}")


def access_log_line(capsys: pytest.CaptureFixture[str], request_id: str) -> dict[str, Any]:
    """The access-log line of ``request_id`` (see ``access_log_until``)."""
    lines = access_log_until(capsys, request_id)
    return next(entry for entry in lines if entry["request_id"] == request_id)


def annotation(body: bytes) -> dict[str, str]:
    """The trailing annotation of a guarded stream (asserts it is there and last)."""
    match = ANNOTATION.search(body)
    assert match is not None, f"no trailing annotation in {body[-300:]!r}"
    return {k: v.decode() for k, v in match.groupdict().items() if v is not None}


def assert_whole_events(body: bytes) -> None:
    """The body is whole SSE blocks plus comment lines: no fragment of an event."""
    decoder = SSEDecoder()
    decoder.feed(body)
    assert decoder.pending_bytes == 0, f"fragment at the end: {body[decoder.boundary :]!r}"


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total

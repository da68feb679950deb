"""Helpers for integration tests: start a gateway in front of a simulator, read streams."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

from gateway.app import create_app
from gateway.edge import uvicorn_options
from gateway.guard import SSEDecoder
from gateway.settings import Settings
from tests.conftest import ServerThread, running

ANNOTATION = re.compile(
    rb": gateway outcome=(?P<outcome>complete|incomplete) reason=(?P<reason>[a-z_]+) "
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


def access_log_lines(out: str | bytes) -> list[dict[str, Any]]:
    """The access-log lines (one JSON object each) in a gateway's stdout, in order.

    An in-process gateway writes them to ``sys.stdout`` (read it with ``capsys``); it
    flushes what it holds when it stops, so after ``with gateway_for(...)`` all are there.
    """
    text = out.decode() if isinstance(out, bytes) else out
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def annotation(body: bytes) -> dict[str, str]:
    """The trailing annotation of a guarded stream (asserts it is there and last)."""
    match = ANNOTATION.search(body)
    assert match is not None, f"no trailing annotation in {body[-300:]!r}"
    return {k: v.decode() for k, v in match.groupdict().items()}


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

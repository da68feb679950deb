"""Hostile schemas and answers through the real app (in-process, a mock upstream): a
schema nested 10,000 deep, a 1 MB enum, a pattern that backtracks catastrophically,
$ref cycles, a 5 MB structured answer and 200 concurrent structured streams: every
verdict right (never ``valid`` for what was not checked), the event loop never held
up long (the CPU time of each callback is measured while they run)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tests.integration.helpers import annotation
from tests.integration.test_relay_inprocess import SSE, Upstream, answer, in_process, run


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def stream(*deltas: str) -> bytes:
    events = [_event({"choices": [{"index": 0, "delta": {"content": d}}]}) for d in deltas]
    events.append(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return b"".join(events) + b"data: [DONE]\n\n"


def body(schema: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def nested(depth: int) -> str:
    """A schema nested ``depth`` deep, as text (too deep for ``json.dumps``)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


def raw_body(schema_text: str) -> bytes:
    head = json.dumps(body(None))
    return head.replace('"schema": null', '"schema": ' + schema_text).encode()


HOSTILE: dict[str, Any] = {
    "enum": {"enum": ["x" * 10 + str(i) for i in range(80_000)]},  # about 1 MB
    "pattern": {"type": "string", "pattern": "^(a+)+$"},
    "cycle": {
        "$ref": "#/$defs/a",
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
    },
}


class Ticker:
    """Every callback that held the event loop for 100 ms or more of CPU while it runs.

    Each callback's own CPU time (``time.thread_time``), not the wall clock asyncio's debug
    mode reads: on a busy machine the process can be paused inside any callback, and that
    pause is not work the callback did. A schema that stalls the loop burns CPU, and is
    caught whatever the machine's load."""

    LIMIT = 0.1

    def __init__(self) -> None:
        self.slow: list[str] = []
        self._original = asyncio.events.Handle._run

    def __enter__(self) -> Ticker:
        original, slow, limit = self._original, self.slow, self.LIMIT

        def timed(handle: asyncio.Handle) -> None:
            start = time.thread_time()
            original(handle)
            spent = time.thread_time() - start
            if spent >= limit:
                slow.append(f"{handle!r} used {spent:.3f} s of CPU")

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]


def test_hostile_schemas_are_unchecked_never_valid() -> None:
    answer_text = '"' + "a" * 40 + '!"'
    upstream = Upstream(lambda r: answer(200, stream(answer_text[:10], answer_text[10:]), **SSE))

    async def test() -> None:
        async with in_process(upstream) as client:
            with Ticker() as ticker:
                bodies = {name: raw_body(json.dumps(s)) for name, s in HOSTILE.items()}
                bodies["deep"] = raw_body(nested(10_000))
                for name, content in bodies.items():
                    response = await client.post(
                        "/v1/chat/completions",
                        content=content,
                        headers={"content-type": "application/json"},
                    )
                    note = annotation(response.content)
                    assert (note["outcome"], note.get("schema")) == ("complete", "unchecked"), name
            assert not ticker.slow, ticker.slow

    run(test)


def test_a_5_mb_structured_answer_is_unchecked_past_the_bound_and_held_in_bounded_memory() -> None:
    piece = json.dumps("x" * 1000) + ", "
    deltas = ["["] + [piece] * 5_000 + ["1]"]
    data = stream(*deltas)

    async def reads() -> AsyncIterator[bytes]:  # as a socket hands them: 64 KiB at most
        for at in range(0, len(data), 65_536):
            yield data[at : at + 65_536]

    upstream = Upstream(lambda r: httpx.Response(200, headers=SSE, content=reads()))

    async def test() -> None:
        async with in_process(upstream) as client:
            with Ticker() as ticker:
                response = await client.post("/v1/chat/completions", json=body({"type": "array"}))
            assert not ticker.slow, ticker.slow
        note = annotation(response.content)
        assert (note["outcome"], note["schema"]) == ("complete", "unchecked")

    run(test)


def test_200_concurrent_structured_streams_each_get_their_verdict() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }

    def reply(request: Any) -> Any:
        n = json.loads(request.content)["n"]
        text = '{"n": ' + (str(n) if n % 2 else '"odd"') + "}"
        return answer(200, stream(text[:4], text[4:]), **SSE)

    async def test() -> None:
        async with in_process(Upstream(reply)) as client:
            with Ticker() as ticker:
                responses = await asyncio.gather(
                    *(
                        client.post("/v1/chat/completions", json={**body(schema), "n": n})
                        for n in range(200)
                    )
                )
            assert not ticker.slow, ticker.slow
        for n, response in enumerate(responses):
            note = annotation(response.content)
            assert note["schema"] == ("valid" if n % 2 else "invalid"), n
            if not n % 2:
                assert (note["schema_at"], note["schema_event"]) == ("/n", "1")

    run(test)

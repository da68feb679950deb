"""What the relay keeps of a JSON request body, and how it rewrites one (``request_body``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from gateway.proxy.request_body import HELPER_SECONDS, BodyParser, rewrite, summary

BOM = b"\xef\xbb\xbf"


def test_the_summary_keeps_small_members_only() -> None:
    body = json.dumps(
        {
            "model": "gpt-x",
            "stream": True,
            "max_tokens": 5,
            "stream_options": {"include_usage": False},
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"deep": {"er": 1}},
            "long": "x" * 5000,
        }
    ).encode()
    assert summary(body) == {
        "model": "gpt-x",
        "stream": True,
        "max_tokens": 5,
        "stream_options": {"include_usage": False},
    }


def test_a_bom_and_any_content_are_read_as_json_and_non_objects_are_not() -> None:
    assert summary(BOM + b'{"stream": true}') == {"stream": True}
    assert summary(b'[{"stream": true}]') is None
    assert summary(b"stream=true") is None
    assert summary(b'{"stream": tru') is None
    assert rewrite(b"not json", {"model": "m"}) is None


def test_rewrite_merges_object_members_and_keeps_the_rest() -> None:
    body = (
        BOM
        + json.dumps(
            {"model": "a", "stream_options": {"other": [1, 2]}, "messages": [{"content": "héllo"}]},
            ensure_ascii=False,
        ).encode()
    )
    out = rewrite(body, {"model": "b", "stream_options": {"include_usage": True}})
    assert out is not None
    assert json.loads(out) == {
        "model": "b",
        "stream_options": {"other": [1, 2], "include_usage": True},
        "messages": [{"content": "héllo"}],
    }
    assert "héllo".encode() in out  # UTF-8 as it came, not escaped


def test_a_lone_surrogate_survives_a_rewrite_as_an_escape() -> None:
    out = rewrite(b'{"model": "\\ud800"}', {"stream": True})
    assert out is not None
    assert json.loads(out) == {"model": "\ud800", "stream": True}


def test_the_helper_process_gives_what_the_loop_would() -> None:
    body = json.dumps({"model": "m", "stream": True, "messages": ["x" * 4096] * 64}).encode()

    async def both() -> tuple[object, object]:
        parser = BodyParser(off_loop_bytes=1024)
        try:
            return await parser.summary(body), await parser.rewrite(body, {"model": "n"})
        finally:
            parser.close()

    got_summary, got_rewrite = asyncio.run(both())
    assert got_summary == summary(body)
    assert got_rewrite == rewrite(body, {"model": "n"})


def test_the_summary_keeps_the_model_whatever_its_length() -> None:
    from gateway.proxy.request_body import summary

    long = "m" * 10_000
    kept = summary(json.dumps({"model": long, "stream": True, "note": "x" * 10_000}).encode())
    assert kept is not None
    assert kept["model"] == long
    assert "note" not in kept  # other long strings are still left out


def _die(body: bytes) -> int:
    """Ends the helper process it runs in, as its memory bound can."""
    import os

    os._exit(1)


def _size(body: bytes) -> int:
    return len(body)


def test_a_body_the_helper_dies_on_is_not_parsed_on_the_loop() -> None:
    """The helper died on a body: the answer is None (the body goes on unparsed), never
    the work done on the loop instead; the next body gets a new helper."""
    import asyncio

    async def run() -> tuple[int | None, int | None]:
        parser = BodyParser(off_loop_bytes=10)
        try:
            died = await parser.run(_die, b"x" * 100)
            again = await parser.run(_size, b"y" * 100)
        finally:
            parser.close()
        return died, again

    assert asyncio.run(run()) == (None, 100)


def _stall(body: bytes) -> int:
    import time

    time.sleep(3600)
    return len(body)


@pytest.mark.parametrize(
    ("work", "seconds"),
    [
        pytest.param(_die, HELPER_SECONDS, id="dies"),
        # stuck on a body (seen: spinning in the kernel near its memory budget): past
        # ``helper_seconds`` it is killed and replaced, the body queued behind not cancelled
        pytest.param(_stall, 1.0, id="stalls"),
    ],
)
def test_bodies_waiting_on_a_helper_that_dies_or_stalls_all_go_on_unparsed(
    work: Callable[[bytes], int], seconds: float
) -> None:
    """Two bodies queued on the helper when it dies or stalls past its deadline: each is
    answered None (none raises or is cancelled, none is parsed on the loop), and the
    next body gets a new helper."""
    import asyncio

    async def run() -> list[int | None]:
        parser = BodyParser(off_loop_bytes=10, helper_seconds=seconds)
        try:
            answers = await asyncio.gather(
                parser.run(work, b"x" * 100), parser.run(_size, b"z" * 50)
            )
            return [*answers, await parser.run(_size, b"y" * 100)]
        finally:
            parser.close()

    assert asyncio.run(run()) == [None, None, 100]

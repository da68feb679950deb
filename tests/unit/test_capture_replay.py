"""Capture files and replay: the format round-trips, the byte cap holds, the ending counts.

Pure: captures are built in memory (or read from a tmp file) and replayed
through the guard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.capture import Capture, CaptureError, dumps, load, loads, replay

CHUNKS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"xx"}}]}\n',
    b'\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
]


def _capture(**overrides: object) -> Capture:
    fields: dict[str, object] = {
        "request_id": "req-1",
        "route": "r",
        "upstream": "r",
        "protocol": "chat",
        "outcome": "incomplete",
        "reason": "missing_done",
        "gateway_version": "0.0.0",
        "ending": "eof",
        "chunks": [(0.01 * i, chunk) for i, chunk in enumerate(CHUNKS, 1)],
    }
    fields.update(overrides)
    return Capture(**fields)  # type: ignore[arg-type]


def test_a_capture_round_trips_through_its_file(tmp_path: Path) -> None:
    cut_utf8 = "数".encode()[:2]  # a chunk boundary inside a character: kept as base64
    capture = _capture(chunks=[(0.5, CHUNKS[0]), (0.75, cut_utf8), (1.0, CHUNKS[1])])
    text = dumps(capture)
    assert text.isascii()
    assert '"base64"' in text
    assert text.count('"data"') == 2
    path = tmp_path / "x.capture.json"
    path.write_text(text)
    again = load(path)
    assert again.chunks == capture.chunks
    assert again.header() == capture.header()
    assert json.loads(text)["format"] == "gateway-capture/1"


@pytest.mark.parametrize(
    ("ending", "reason", "expected"),
    [
        ("eof", "missing_done", ("incomplete", "missing_done")),
        ("transport_error", "upstream_disconnect", ("incomplete", "upstream_disconnect")),
        ("decoding_error", "invalid_shape", ("incomplete", "invalid_shape")),
        ("stopped", "idle_timeout", ("incomplete", "idle_timeout")),
        ("open", "total_timeout", ("incomplete", "total_timeout")),
    ],
)
def test_the_ending_decides_where_the_bytes_do_not(
    ending: str, reason: str, expected: tuple[str, str]
) -> None:
    result = replay(_capture(ending=ending, reason=reason))
    assert result.replayed == expected
    assert result.result == "same"
    assert result.chunks == 2
    assert result.bytes == sum(map(len, CHUNKS))


def test_a_verdict_the_guard_no_longer_reaches_is_a_difference() -> None:
    """Recorded invalid_json with the reader still open (the guard decided): replaying
    bytes that are fine must not fall back on the recorded reason."""
    result = replay(_capture(ending="open", reason="invalid_json"))
    assert result.replayed is None
    assert result.result == "different"
    edited = replay(_capture(outcome="complete", reason="stop"))
    assert edited.replayed == ("incomplete", "missing_done")
    assert edited.result == "different"


def test_the_client_leaving_overrides_the_bytes_as_the_relay_did() -> None:
    done = [*CHUNKS, b"data: [DONE]\n\n"]
    chunks = [(0.1, c) for c in done]
    assert replay(_capture(chunks=chunks, outcome="complete", reason="stop")).result == "same"
    left = replay(_capture(chunks=chunks, reason="client_disconnect", ending="open"))
    assert left.replayed == ("incomplete", "client_disconnect")


def test_the_byte_cap_cuts_trailing_chunks_and_says_so() -> None:
    chunks = [(0.001 * i, b'data: {"n": %d}\n\n' % i) for i in range(400)]
    capture = _capture(chunks=list(chunks), protocol="sse")
    full = dumps(_capture(chunks=list(chunks), protocol="sse"))
    text = dumps(capture, 4096)
    assert len(full) > 4096 >= len(text) > 3000
    again = loads(text)
    assert again.truncated
    assert capture.truncated
    assert 0 < len(again.chunks) < 400
    kept = [data for _, data in again.chunks]
    # Whole chunks, the last one maybe in part.
    assert kept[:-1] == [data for _, data in chunks[: len(kept) - 1]]
    assert chunks[len(kept) - 1][1].startswith(kept[-1])
    assert [data for _, data in capture.chunks] == kept
    assert replay(again).result == "undecided"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ('{"format": "other"}', "not a capture"),
        ('{"format": "gateway-capture/1", "verdict": {}, "chunks": []}', "'request_id' is missing"),
    ],
)
def test_what_is_no_capture_is_said_so(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.capture.json"
    path.write_text(text)
    with pytest.raises(CaptureError, match=message) as caught:
        load(path)
    assert str(path) in str(caught.value)


def test_an_unknown_protocol_is_no_capture_to_replay() -> None:
    with pytest.raises(CaptureError, match="unknown protocol"):
        replay(_capture(protocol="smoke-signals"))

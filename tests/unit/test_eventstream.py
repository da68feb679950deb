"""The AWS event stream framing: frames checked against botocore's own parser.

botocore's ``EventStreamBuffer`` is the independent reference (the guard
never imports botocore): every frame the guard's encoder writes is parsed
back by it, every partition of a recorded stream gives the decoder the same
frames and the guard the same verdict and bytes, a flipped bit anywhere is
caught by a CRC (or a length the prelude CRC guards), and a frame or headers
over the budget are refused before they are buffered.
"""

from __future__ import annotations

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.guard import BedrockContract, Reason, StreamGuard
from gateway.guard.eventstream import (
    EventStreamDecoder,
    FrameCorrupt,
    FrameTooLarge,
    encode_frame,
    parse_headers,
)
from tests.unit.bedrock_streams import CONVERSE_TEXT, CONVERSE_TOOL, INVOKE_MESSAGES, frame
from tests.unit.helpers import bytewise, random_partition, run_guard

PROPERTY = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

STREAMS = {
    "converse-text": CONVERSE_TEXT,
    "converse-tool": CONVERSE_TOOL,
    "invoke": INVOKE_MESSAGES,
}


def botocore_frames(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


def decoded(
    chunks: list[bytes], decoder: EventStreamDecoder | None = None
) -> list[tuple[str, str, str, int, int]]:
    decoder = decoder or EventStreamDecoder()
    out = []
    for piece in chunks:
        out += [(e.event, e.data, e.id, e.start, e.end) for e in decoder.feed(piece)]
    return out


def test_botocore_reads_what_the_encoder_writes() -> None:
    data = b"".join(CONVERSE_TOOL)
    frames = botocore_frames(data)
    assert len(frames) == len(CONVERSE_TOOL)
    assert [h[":event-type"] for h, _ in frames] == [e[0] for e in decoded([data])]
    assert [p.decode() for _, p in frames] == [e[1] for e in decoded([data])]


@pytest.mark.parametrize("name", STREAMS)
def test_any_partition_gives_the_same_frames_and_verdict(name: str) -> None:
    data = b"".join(STREAMS[name])
    whole = decoded([data])
    assert whole[-1][4] == len(data)
    assert decoded(bytewise(data)) == whole
    reference = run_guard(BedrockContract(), [data])
    assert reference.verdict.complete
    for cut in range(1, len(data)):
        assert decoded([data[:cut], data[cut:]]) == whole
        run = run_guard(BedrockContract(), [data[:cut], data[cut:]])
        assert run.output == reference.output == data
        assert run.verdict == reference.verdict


@PROPERTY
@given(name=st.sampled_from(sorted(STREAMS)), draw=st.data())
def test_random_partitions_give_the_same_frames_and_verdict(name: str, draw: st.DataObject) -> None:
    data = b"".join(STREAMS[name])
    chunks = random_partition(draw, data, max_cuts=40)
    assert decoded(chunks) == decoded([data])
    run = run_guard(BedrockContract(), chunks)
    assert run.output == data
    assert run.verdict == run_guard(BedrockContract(), [data]).verdict


def test_only_whole_frames_are_forwarded() -> None:
    data = b"".join(CONVERSE_TEXT)
    guard = StreamGuard(BedrockContract())
    first = len(CONVERSE_TEXT[0])
    assert guard.feed(data[: first - 1]) == b""
    assert guard.feed(data[first - 1 : first + 5]) == CONVERSE_TEXT[0]
    assert guard.held_bytes == 5


@PROPERTY
@given(name=st.sampled_from(sorted(STREAMS)), data=st.data())
def test_a_flipped_bit_anywhere_is_caught(name: str, data: st.DataObject) -> None:
    stream = b"".join(STREAMS[name])
    position = data.draw(st.integers(0, len(stream) - 1))
    bit = data.draw(st.integers(0, 7))
    broken = bytearray(stream)
    broken[position] ^= 1 << bit
    with pytest.raises(FrameCorrupt):
        decoded([bytes(broken)])
    with pytest.raises(ChecksumMismatch):  # botocore agrees
        botocore_frames(bytes(broken))


def test_a_corrupt_crc_is_invalid_shape_and_the_frame_is_withheld() -> None:
    frames = list(CONVERSE_TEXT)
    bad = bytearray(frames[2])
    bad[-1] ^= 0xFF
    frames[2] = bytes(bad)
    run = run_guard(BedrockContract(), [b"".join(frames)])
    assert run.verdict.reason is Reason.INVALID_SHAPE
    assert run.output == frames[0] + frames[1]
    with pytest.raises(ChecksumMismatch):
        botocore_frames(bytes(bad))


def test_a_frame_over_the_limit_is_refused_from_its_prelude() -> None:
    big = frame("contentBlockDelta", {"delta": {"text": "x" * 5000}, "contentBlockIndex": 0})
    decoder = EventStreamDecoder(1024, 4096)
    with pytest.raises(FrameTooLarge):
        decoder.feed(big[:12])  # the prelude alone tells
    guard = StreamGuard(BedrockContract(), EventStreamDecoder(1024, 4096))
    out = guard.feed(CONVERSE_TEXT[0] + big)
    assert out == CONVERSE_TEXT[0]
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED


def test_headers_over_the_limit_are_refused() -> None:
    data = encode_frame({":event-type": "x" * 200, ":message-type": "event"}, b"{}")
    with pytest.raises(FrameTooLarge):
        EventStreamDecoder(100, 4096).feed(data)
    assert decoded([data], EventStreamDecoder(1024, 4096))[0][0] == "x" * 200


def test_headers_of_every_type_are_read_as_botocore_reads_them() -> None:
    raw = (
        b"\x01a\x00"  # true
        + b"\x01b\x01"  # false
        + b"\x01c\x02\xff"  # byte -1
        + b"\x01d\x03\x01\x00"  # short 256
        + b"\x01e\x04\x00\x00\x01\x00"  # int 256
        + b"\x01f\x05"
        + (2**40).to_bytes(8, "big")  # long
        + b"\x01g\x06\x00\x02hi"  # bytes
        + b"\x01h\x07\x00\x02ok"  # string
        + b"\x01i\x08"
        + (1700000000000).to_bytes(8, "big")  # timestamp
        + b"\x01j\x09"
        + bytes(range(16))  # uuid
    )
    ours = parse_headers(raw)
    total = 16 + len(raw)
    import struct
    import zlib

    prelude = struct.pack(">II", total, len(raw))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + raw
    message = body + struct.pack(">I", zlib.crc32(body))
    theirs = botocore_frames(message)[0][0]
    assert set(ours) == set(theirs)
    for name in "abcdefgh":
        assert ours[name] == theirs[name], name
    with pytest.raises(FrameCorrupt):
        parse_headers(b"\x01a\x07\x00\x05ab")  # cut short
    with pytest.raises(FrameCorrupt):
        parse_headers(b"\x01a\x0a")  # unknown type


def test_a_torn_last_frame_is_not_a_clean_end() -> None:
    data = b"".join(CONVERSE_TEXT)
    run = run_guard(BedrockContract(), [data[:-3]])
    assert run.verdict.reason is Reason.MISSING_DONE
    assert run.output == b"".join(CONVERSE_TEXT[:-1])


# -- streams the simulator renders, under each of its faults -----------------------------

SIM_FAULTS = (
    "none",
    "tool_calls",
    "length",
    "choices_2",
    "drop_before_done",
    "drop_mid_event",
    "done_without_finish",
    "error_event",
    "invalid_json",
    "invalid_shape",
    "content_after_finish",
    "invalid_tool_arguments",
)


def _simulated(protocol: str, fault: str) -> bytes:
    """The bytes the simulator writes for one Bedrock stream (its own encoder's frames)."""
    from gateway.simulator._knobs import read_knobs
    from gateway.simulator._protocols import make_plan
    from gateway.simulator._renderers import make_renderer
    from gateway.simulator._script import Write, stream_steps

    body: dict[str, object] = {"messages": [], "max_tokens": 64}
    knobs = read_knobs({"x-sim-fault": fault}, body, default_tps=0, default_tokens=12)
    plan = make_plan(protocol, body, knobs, 100, model="sim-model")  # type: ignore[arg-type]
    renderer = make_renderer(plan, crlf=False)
    return b"".join(s.data for s in stream_steps(renderer, knobs) if isinstance(s, Write))


SIMULATED = {
    (protocol, fault): _simulated(protocol, fault)
    for protocol in ("bedrock_converse", "bedrock_invoke")
    for fault in SIM_FAULTS
}


@PROPERTY
@given(key=st.sampled_from(sorted(SIMULATED)), draw=st.data())
def test_every_partition_of_a_simulated_stream_gives_its_frames_and_verdict(
    key: tuple[str, str], draw: st.DataObject
) -> None:
    data = SIMULATED[key]
    whole = run_guard(BedrockContract(), [data])
    chunks = random_partition(draw, data, max_cuts=30)
    run = run_guard(BedrockContract(), chunks)
    assert run.verdict == whole.verdict
    assert run.output == whole.output
    if key[1] != "invalid_shape":  # botocore reads the same frames (a bad CRC: it raises)
        decoder = EventStreamDecoder()
        ours = [e for piece in chunks for e in decoder.feed(piece)]
        theirs = botocore_frames(data[: decoder.boundary])
        assert [e.data.encode() for e in ours] == [payload for _, payload in theirs]


def test_the_simulated_streams_get_the_verdicts_their_faults_mean() -> None:
    verdicts = {
        key: run_guard(BedrockContract(), [data]).verdict for key, data in SIMULATED.items()
    }
    for protocol in ("bedrock_converse", "bedrock_invoke"):
        reasons = {fault: str(verdicts[protocol, fault].reason) for fault in SIM_FAULTS}
        assert reasons["none"] == "stop"
        assert reasons["tool_calls"] == "tool_calls"
        assert reasons["length"] == "length"
        assert reasons["choices_2"] == "stop"
        assert reasons["drop_before_done"] == "missing_done"
        assert reasons["drop_mid_event"] == "missing_done"
        assert reasons["done_without_finish"] == "missing_finish"
        assert reasons["error_event"] == "upstream_error"
        assert reasons["invalid_json"] == "invalid_json"
        assert reasons["invalid_shape"] == "invalid_shape"
        assert reasons["content_after_finish"] == "content_after_finish"
        assert reasons["invalid_tool_arguments"] == "invalid_tool_arguments"

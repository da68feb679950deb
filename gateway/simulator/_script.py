"""Fault choreography: the steps (writes, sleeps, an abort) of one scripted response.

Faults are defined once here, against the neutral renderer interface, and so
apply to every protocol alike. Steps are produced lazily: a 200 MB stream
costs the memory of one event.

Mid-stream faults act after :data:`CUT_AFTER` content deltas (fewer when the
answer is shorter).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from gateway.simulator._knobs import DEFAULT_HUGE_EVENT_BYTES, Knobs
from gateway.simulator._protocols import Lane, Renderer
from gateway.simulator._sse import dumps
from gateway.simulator._text import filler

__all__ = [
    "CUT_AFTER",
    "HEARTBEAT_INTERVAL",
    "Abort",
    "Sleep",
    "Step",
    "Write",
    "json_steps",
    "stream_steps",
]

CUT_AFTER: Final = 3
HEARTBEAT_INTERVAL: Final = 0.1
#: The piece whose event ``drop_mid_utf8`` cuts after the first byte of "数".
UTF8_PIECE: Final = "数据🌍 "
AFTER_FINISH_PIECE: Final = "after finish "


@dataclass(frozen=True, slots=True)
class Write:
    """Write bytes. ``paced`` writes (content deltas) follow ``x-sim-tps``."""

    data: bytes
    paced: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    """Write nothing for a while (the client's disconnect still ends it at once)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Abort:
    """Cut the HTTP body without its terminating chunk: a transport error at the client."""


Step = Write | Sleep | Abort

_MID_FAULTS: Final = frozenset(
    {
        "drop_after_text",
        "drop_mid_event",
        "drop_mid_utf8",
        "abort_mid_body",
        "error_event",
        "heartbeats_forever",
        "stall_mid_stream",
        "invalid_json",
        "invalid_shape",
        "huge_event",
        "done_after_cut",
    }
)


def _writes(chunks: Iterable[bytes]) -> Iterator[Step]:
    for chunk in chunks:
        yield Write(chunk)


def _mid_fault(
    r: Renderer, knobs: Knobs, lane: Lane, piece: str | None
) -> Generator[Step, None, bool]:
    """Apply a mid-stream fault before ``piece``; return True when the body ends here."""
    fault = knobs.fault
    if fault == "drop_after_text":
        return True
    if fault == "drop_mid_event":
        data = r.delta(lane, piece or "partial ")
        yield Write(data[: len(data) // 2])
        return True
    if fault == "drop_mid_utf8":
        data = r.delta(lane, UTF8_PIECE)
        at = data.find(UTF8_PIECE.encode())  # not found: encoded (a Bedrock chunk's base64)
        yield Write(data[: at + 1] if at >= 0 else data[: len(data) // 2])
        return True
    if fault == "abort_mid_body":
        yield Abort()
        return True
    if fault == "error_event":
        yield Write(r.error_event())
        return True
    if fault == "done_after_cut":  # a server that ends an aborted generation cleanly
        yield from _writes(r.terminator())
        return True
    if fault == "heartbeats_forever":
        beat = r.framer.comment("ping")
        for _ in range(math.ceil(knobs.stall_seconds / HEARTBEAT_INTERVAL)):
            yield Sleep(HEARTBEAT_INTERVAL)
            yield Write(beat)
        return True
    if fault == "stall_mid_stream":
        yield Sleep(knobs.stall_seconds)
        return False
    if fault == "invalid_json":
        yield Write(r.invalid_json_event(lane, piece or "invalid "))
        return False
    if fault == "invalid_shape":
        yield Write(r.invalid_shape_event(lane))
        return False
    if fault == "huge_event":
        kept = len(lane.parts)
        yield Write(r.delta(lane, filler(knobs.chunk_bytes or DEFAULT_HUGE_EVENT_BYTES)))
        del lane.parts[kept:]  # one huge event: the Responses done events do not repeat it
        lane.emitted += 1
        return False
    return False


def stream_steps(r: Renderer, knobs: Knobs) -> Iterator[Step]:
    """The steps of a streamed answer under ``knobs.fault``."""
    plan = r.plan
    fault = knobs.fault
    total = sum(lane.count for lane in plan.lanes)
    cut_at = min(CUT_AFTER, max(total - 1, 0)) if fault in _MID_FAULTS else -1
    delivered = 0
    after_finish_sent = False
    # A stream without a terminator (Gemini) ends with its finishing events: the
    # "terminator" that drop_before_done drops is those events.
    unclosed = fault == "done_without_finish" or (
        fault == "drop_before_done" and not r.has_terminator
    )

    yield from _writes(r.start())
    groups = [plan.lanes] if r.interleaved else [[lane] for lane in plan.lanes]
    for group in groups:
        for lane in group:
            yield from _writes(r.open_lane(lane))
            lane.opened = True
        active = list(group)
        while active:
            for lane in list(active):
                piece = next(lane.pieces, None)
                if piece is None:
                    active.remove(lane)
                    if unclosed:
                        continue
                    yield from _writes(r.close_lane(lane))
                    lane.closed = True
                    if fault == "content_after_finish" and not after_finish_sent:
                        after_finish_sent = True
                        yield Write(r.delta(lane, AFTER_FINISH_PIECE))
                    continue
                if delivered == cut_at:
                    cut_at = -1
                    if (yield from _mid_fault(r, knobs, lane, piece)):
                        return
                yield Write(r.delta(lane, piece), paced=True)
                lane.emitted += 1
                delivered += 1
    # An answer too short to reach the cut point: the fault acts after the lanes.
    if cut_at >= 0 and plan.lanes and (yield from _mid_fault(r, knobs, plan.lanes[0], None)):
        return

    yield from _writes(r.finish(stopped=fault != "done_without_finish"))
    if fault == "drop_before_done":
        return
    yield from _writes(r.terminator())


def json_steps(r: Renderer, knobs: Knobs) -> tuple[list[Step], int | None]:
    """The steps of a non-streamed JSON answer, and its Content-Length (None: chunked)."""
    body = dumps(r.body()).encode()
    fault = knobs.fault
    half = len(body) // 2
    if fault == "abort_mid_body":
        return [Write(body[:half]), Abort()], None
    if fault == "invalid_json":
        return [Write(body[:-2])], len(body) - 2
    if fault in ("drop_after_text", "drop_mid_event", "drop_before_done"):
        return [Write(body[:half])], None
    if fault == "drop_mid_utf8":
        cut = next((i for i, byte in enumerate(body) if byte >= 0x80), half)
        return [Write(body[: cut + 1])], None
    if fault == "stall_mid_stream":
        return [Write(body[:half]), Sleep(knobs.stall_seconds), Write(body[half:])], None
    return [Write(body)], len(body)

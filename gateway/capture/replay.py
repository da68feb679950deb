"""Replay: feed a capture through the guard, chunk by chunk as it arrived, for a verdict.

Sans-IO like the guard itself: the capture's chunks go to a fresh
``StreamGuard`` with the protocol, contract options and byte limits the
stream was judged with. Then the ending the relay saw is applied where the
bytes could not decide: a clean end (``eof``), a transport error
(``upstream_disconnect``), a broken content encoding (``invalid_shape``), or
the relay stopping the stream for the recorded reason (a deadline, the
drain). A stream the client ended (``client_disconnect``, ``client_stalled``)
or the drain cut says nothing about the upstream's bytes: the relay's own
verdict overrides the guard's there, and replay does the same.

The replayed verdict is compared with the recorded one: ``same``,
``different`` (the guard now judges these bytes otherwise, or reaches no
verdict where it once rejected an event: a regression, or the fix the
capture was kept for), or ``undecided`` (the capture was cut at its byte
cap before anything was decided).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.capture.fileformat import Capture, CaptureError
from gateway.guard import Reason, StreamGuard, Verdict
from gateway.protocols import ContractOptions, spec_for

__all__ = ["RELAY_SIDE_REASONS", "Replayed", "replay"]

#: Reasons that belong to the client or the gateway, not to the upstream's bytes.
RELAY_SIDE_REASONS = frozenset(
    {Reason.CLIENT_DISCONNECT, Reason.CLIENT_STALLED, Reason.GATEWAY_SHUTDOWN}
)
#: Reasons for which the relay stops reading an upstream the guard has not judged.
_STOP_REASONS = RELAY_SIDE_REASONS | {
    Reason.FIRST_BYTE_TIMEOUT,
    Reason.IDLE_TIMEOUT,
    Reason.TOTAL_TIMEOUT,
}
_ENDINGS = {
    "transport_error": Reason.UPSTREAM_DISCONNECT,
    "decoding_error": Reason.INVALID_SHAPE,
}


@dataclass(frozen=True, slots=True)
class Replayed:
    """The recorded and the replayed verdict of one capture."""

    recorded: tuple[str, str]  # (outcome, reason)
    replayed: tuple[str, str] | None  # None: the bytes led to no verdict
    truncated: bool
    chunks: int
    bytes: int

    @property
    def result(self) -> Literal["same", "different", "undecided"]:
        if self.replayed is None and self.truncated:
            return "undecided"
        return "same" if self.replayed == self.recorded else "different"


def replay(capture: Capture) -> Replayed:
    """Judge the capture's chunks again (CaptureError for an unknown protocol or reason)."""
    try:
        spec = spec_for(capture.protocol)
        recorded_reason = Reason(capture.reason)
    except ValueError:
        raise CaptureError(
            f"unknown protocol {capture.protocol!r} or reason {capture.reason!r}"
        ) from None
    options = ContractOptions(
        require_finish_reason=capture.options.get("require_finish_reason", True) is not False
    )
    limits = capture.limits
    decoder = spec.framing.new_decoder(
        limits.get("max_line_bytes", 16 * 1024 * 1024),
        limits.get("max_event_bytes", 16 * 1024 * 1024),
    )
    guard = StreamGuard(
        spec.new_contract(options), decoder, max_stream_bytes=limits.get("max_response_bytes")
    )
    fed = 0
    for _, chunk in capture.chunks:
        guard.feed(chunk)
        fed += len(chunk)
        if guard.done:
            break
    verdict: Verdict | None = guard.verdict
    if verdict is None and not capture.truncated:
        if capture.ending == "eof":
            verdict = guard.eof()
        elif capture.ending in _ENDINGS:
            verdict = guard.abort(_ENDINGS[capture.ending])
        elif recorded_reason in _STOP_REASONS:
            verdict = guard.abort(recorded_reason)
    if recorded_reason in RELAY_SIDE_REASONS:
        verdict = guard.abort(recorded_reason, force=True)
    replayed = None if verdict is None else (str(verdict.outcome), str(verdict.reason))
    return Replayed(
        recorded=(capture.outcome, capture.reason),
        replayed=replayed,
        truncated=capture.truncated,
        chunks=len(capture.chunks),
        bytes=fed,
    )

"""The AWS event stream decoder (``application/vnd.amazon.eventstream``): binary frames,
incremental, checked and bounded; and the encoder of one frame.

A frame (AWS calls it a message) is::

    total length (4, big-endian)  headers length (4)  prelude CRC (4)
    headers (headers length bytes)
    payload (total length - headers length - 16 bytes)
    message CRC (4)

The prelude CRC is the CRC-32 of the eight bytes before it, the message CRC
that of every byte before it. A header is a name (1-byte length, UTF-8), a
type (1 byte) and a value: 0/1 true/false (no value), 2/3/4/5 an integer of
1/2/4/8 bytes, 6 bytes and 7 a string (2-byte length), 8 a timestamp (8
bytes), 9 a UUID (16 bytes).

Each whole frame is one ``Event``: ``id`` is its ``:message-type``
(``event``, ``exception`` or ``error``), ``event`` its ``:event-type`` (an
exception's ``:exception-type``, an error's ``:error-code``), ``data`` its
payload as UTF-8 (an error's ``:error-message`` when the payload is empty).

Checks, each at the frame where it fails, whatever the partition of the
input: the prelude CRC as soon as the prelude is whole (so a corrupt length
is never waited for), the lengths (a frame shorter than its own prelude and
CRC, headers that do not fit: ``invalid_shape``; a frame over
``max_frame_bytes`` or headers over ``max_header_bytes``: ``limit_exceeded``,
known from the prelude, before the frame is buffered), the message CRC, and
the headers' encoding. ``boundary`` is the offset after the last whole
frame: a torn frame is never forwardable. A frame the body's end cuts is
dropped (``close``), and the end is not clean (``clean_end``).

Work is linear in the bytes: each chunk is appended to one buffer, and each
frame is checked once, by ``zlib.crc32`` (C).
"""

from __future__ import annotations

import struct
import zlib

from gateway.guard.decoder import Decoder, Event
from gateway.guard.errors import BudgetExceeded, GuardError
from gateway.guard.sse import DEFAULT_MAX_EVENT_BYTES

__all__ = [
    "MAX_HEADER_BYTES",
    "EventStreamDecoder",
    "FrameCorrupt",
    "FrameTooLarge",
    "encode_frame",
    "parse_headers",
]

_PRELUDE = 12
_OVERHEAD = 16  # prelude and message CRC
#: AWS's own bound on a frame's headers (botocore refuses more).
MAX_HEADER_BYTES = 128 * 1024
_U32 = struct.Struct(">I")
_PRELUDE_FIELDS = struct.Struct(">III")
_FIXED = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}  # header type -> value bytes

_new_event = tuple.__new__


class FrameCorrupt(GuardError):
    """A frame whose CRC, lengths or headers are not what the framing allows."""

    reason = "invalid_shape"


class FrameTooLarge(BudgetExceeded):
    """A frame, or its headers, over the decoder's budget."""


def parse_headers(data: bytes) -> dict[str, object]:
    """A frame's headers by name (bytes values stay bytes); FrameCorrupt when malformed."""
    headers: dict[str, object] = {}
    pos, size = 0, len(data)
    while pos < size:
        length = data[pos]
        end = pos + 1 + length
        if length == 0 or end + 1 > size:
            raise FrameCorrupt("a frame header is cut short")
        try:
            name = data[pos + 1 : end].decode()
        except UnicodeDecodeError:
            raise FrameCorrupt("a frame header's name is not UTF-8") from None
        kind = data[end]
        pos = end + 1
        value: object
        if kind == 0 or kind == 1:
            value = kind == 0
        elif kind in _FIXED:
            width = _FIXED[kind]
            if pos + width > size:
                raise FrameCorrupt("a frame header is cut short")
            raw = data[pos : pos + width]
            value = raw if kind == 9 else int.from_bytes(raw, "big", signed=True)
            pos += width
        elif kind == 6 or kind == 7:
            if pos + 2 > size:
                raise FrameCorrupt("a frame header is cut short")
            width = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
            if pos + width > size:
                raise FrameCorrupt("a frame header is cut short")
            raw = data[pos : pos + width]
            pos += width
            if kind == 6:
                value = raw
            else:
                try:
                    value = raw.decode()
                except UnicodeDecodeError:
                    raise FrameCorrupt("a frame header's value is not UTF-8") from None
        else:
            raise FrameCorrupt(f"a frame header has the unknown type {kind}")
        if name in headers:
            raise FrameCorrupt(f"a frame repeats its header {name}")
        headers[name] = value
    return headers


def encode_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One frame with string headers (in the order given) and ``payload``."""
    parts: list[bytes] = []
    for name, value in headers.items():
        key = name.encode()
        text = value.encode()
        parts.append(bytes([len(key)]) + key + b"\x07" + len(text).to_bytes(2, "big") + text)
    head = b"".join(parts)
    total = _OVERHEAD + len(head) + len(payload)
    prelude = _U32.pack(total) + _U32.pack(len(head))
    prelude += _U32.pack(zlib.crc32(prelude))
    body = prelude + head + payload
    return body + _U32.pack(zlib.crc32(body))


class EventStreamDecoder(Decoder):
    """Incremental event stream decoder with budgets per frame and per frame's headers.

    Built like every framing's decoder from two budgets: ``max_line_bytes``
    bounds a frame's headers (and AWS's 128 KiB bounds them anyway), and
    ``max_event_bytes`` a whole frame.
    """

    def __init__(
        self,
        max_line_bytes: int = MAX_HEADER_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(max_line_bytes, max_event_bytes)
        self.max_header_bytes = min(max_line_bytes, MAX_HEADER_BYTES)
        self.max_frame_bytes = max_event_bytes
        self._buffer = bytearray()  # bytes after ``boundary``
        self._need = 0  # the total length of the frame being buffered (0: unknown yet)

    def _feed(self, data: bytes, start: int, events: list[Event]) -> None:
        self._buffer += data
        self._frames(events)

    def clean_end(self, held: bytes) -> bool:
        """Only an end between frames is clean: any byte left over is a torn frame."""
        return not held

    def _frames(self, events: list[Event]) -> None:
        buffer = self._buffer
        pos = 0
        size = len(buffer)
        while size - pos >= _PRELUDE:
            need = self._need or self._prelude(buffer, pos)
            self._need = need
            if size - pos < need:
                break
            frame = bytes(buffer[pos : pos + need])
            start = self._boundary
            events.append(self._frame(frame, start))
            self._boundary = start + need
            self._need = 0
            pos += need
        if pos:
            del buffer[:pos]

    def _prelude(self, buffer: bytearray, pos: int) -> int:
        total, header_length, crc = _PRELUDE_FIELDS.unpack_from(buffer, pos)
        if zlib.crc32(buffer[pos : pos + 8]) != crc:
            raise FrameCorrupt("a frame's prelude CRC does not match")
        if total < _OVERHEAD or header_length > total - _OVERHEAD:
            raise FrameCorrupt("a frame's lengths are inconsistent")
        if header_length > self.max_header_bytes:
            raise FrameTooLarge(f"a frame's headers exceed {self.max_header_bytes} bytes")
        if total > self.max_frame_bytes:
            raise FrameTooLarge(f"a frame exceeds {self.max_frame_bytes} bytes")
        return int(total)

    def _frame(self, frame: bytes, start: int) -> Event:
        total = len(frame)
        (crc,) = _U32.unpack_from(frame, total - 4)
        if zlib.crc32(frame[: total - 4]) != crc:
            raise FrameCorrupt("a frame's message CRC does not match")
        (header_length,) = _U32.unpack_from(frame, 4)
        headers = parse_headers(frame[_PRELUDE : _PRELUDE + header_length])
        payload = frame[_PRELUDE + header_length : total - 4]
        kind = _text(headers.get(":message-type"))
        if kind == "exception":
            name = _text(headers.get(":exception-type"))
        elif kind == "error":
            name = _text(headers.get(":error-code"))
            if not payload:
                payload = _text(headers.get(":error-message")).encode()
        else:
            name = _text(headers.get(":event-type"))
        try:
            data = payload.decode()
        except UnicodeDecodeError:
            data = payload.decode("utf-8", "replace")
        event: Event = _new_event(Event, (name, data, kind, None, start, start + total))
        return event


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""

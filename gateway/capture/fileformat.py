"""The capture file: one redacted upstream stream and the facts needed to replay it.

A capture is one JSON object (``format: "gateway-capture/1"``), written one
chunk per line so that a person can read it and a diff can show it:

- who and what: ``gateway_version``, ``captured_at`` (UTC), ``request_id``,
  ``upstream_request_id`` (the provider's own id, for its support),
  ``route``, ``upstream`` (names from the configuration, never a URL),
  ``protocol``, ``model`` (as the client asked), ``status``,
  ``content_type`` (the one header kept);
- the verdict the gateway reached (``outcome``, ``reason``, the normalized
  finish reason per choice, the event count);
- what replaying needs: the contract ``options`` and byte ``limits`` the
  stream was judged with, and how the upstream body ended (``ending``);
- the stream: ``head_at`` and, per chunk, ``at`` (seconds from the request's
  start) and its redacted bytes as ``data`` (text) or ``base64`` (when the
  chunk boundary cut a character); ``received`` counts every byte and chunk,
  kept or not, and ``truncated`` says the file was cut at its byte cap.

Nothing else: no header but the content type, no URL, no text of the stream.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.guard import Contract

__all__ = ["FORMAT", "SUFFIX", "Capture", "CaptureError", "dumps", "load", "loads"]

FORMAT = "gateway-capture/1"
#: Capture files end with this; eviction and ``tests/captures/`` look for it.
SUFFIX = ".capture.json"


class CaptureError(ValueError):
    """A file that is not a capture this gateway can read."""


@dataclass(slots=True)
class Capture:
    """One capture, in memory. ``chunks`` hold the redacted bytes with their times."""

    request_id: str
    route: str
    upstream: str
    protocol: str
    outcome: str
    reason: str
    gateway_version: str
    captured_at: str = ""
    upstream_request_id: str | None = None
    model: str | None = None
    status: int = 200
    #: What captures made before NDJSON all were: the default framing's.
    content_type: str = Contract.framing.media_type
    finish_reasons: dict[str, str] = field(default_factory=dict)
    events: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    ending: str = "open"
    truncated: bool = False
    received_bytes: int = 0
    received_chunks: int = 0
    head_at: float = 0.0
    chunks: list[tuple[float, bytes]] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        """Everything but the chunks, as the file shows it."""
        return {
            "format": FORMAT,
            "gateway_version": self.gateway_version,
            "captured_at": self.captured_at,
            "request_id": self.request_id,
            "upstream_request_id": self.upstream_request_id,
            "route": self.route,
            "upstream": self.upstream,
            "protocol": self.protocol,
            "model": self.model,
            "status": self.status,
            "content_type": self.content_type,
            "verdict": {
                "outcome": self.outcome,
                "reason": self.reason,
                "finish_reasons": self.finish_reasons,
                "events": self.events,
            },
            "options": self.options,
            "limits": self.limits,
            "ending": self.ending,
            "truncated": self.truncated,
            "received": {"bytes": self.received_bytes, "chunks": self.received_chunks},
            "head_at": self.head_at,
        }


def _chunk_line(at: float, data: bytes) -> str:
    try:
        entry: dict[str, Any] = {"at": round(at, 6), "data": data.decode("utf-8")}
    except UnicodeDecodeError:
        entry = {"at": round(at, 6), "base64": base64.b64encode(data).decode("ascii")}
    return json.dumps(entry, separators=(", ", ": "))


def _assemble(head: str, lines: list[str]) -> str:
    return head[: -len("\n}")] + ',\n  "chunks": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}\n"


def dumps(capture: Capture, max_bytes: int | None = None) -> str:
    """The file's text (ASCII); with ``max_bytes``, trailing chunks are left out (and
    ``truncated`` set) until it fits, the last one kept in part if there is room."""
    lines = [_chunk_line(at, data) for at, data in capture.chunks]
    text = _assemble(json.dumps(capture.header(), indent=2), lines)
    if max_bytes is None or len(text) <= max_bytes:
        return text
    capture.truncated = True
    head = json.dumps(capture.header(), indent=2)
    size = len(_assemble(head, [])) + sum(len(line) + 6 for line in lines) - 6 * bool(lines)
    while lines and size > max_bytes:
        size -= len(lines.pop()) + 6 * bool(lines)
    kept = len(lines)
    if kept < len(capture.chunks):
        # What room is left takes the longest prefix of the first chunk left out.
        at, data = capture.chunks[kept]
        room = max_bytes - size - 6 * bool(lines)
        low, high = 0, len(data)
        while low < high:
            middle = (low + high + 1) // 2
            if len(_chunk_line(at, data[:middle])) <= room:
                low = middle
            else:
                high = middle - 1
        if low:
            lines.append(_chunk_line(at, data[:low]))
            capture.chunks[kept] = (at, data[:low])
            kept += 1
    del capture.chunks[kept:]
    return _assemble(head, lines)


def _field(obj: Mapping[str, Any], name: str, kind: type) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise CaptureError(f"field {name!r} is missing or not a {kind.__name__}")
    return value


def loads(text: str | bytes) -> Capture:
    """Parse a capture file's text (CaptureError when it is not one)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CaptureError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CaptureError(f'not a capture (no "format": "{FORMAT}")')
    verdict = _field(obj, "verdict", dict)
    received_raw = obj.get("received")
    received: dict[str, Any] = received_raw if isinstance(received_raw, dict) else {}
    chunks: list[tuple[float, bytes]] = []
    for index, entry in enumerate(_field(obj, "chunks", list)):
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), int | float):
            raise CaptureError(f"chunk {index} has no time")
        try:
            if isinstance(entry.get("data"), str):
                data = entry["data"].encode("utf-8")
            elif isinstance(entry.get("base64"), str):
                data = base64.b64decode(entry["base64"], validate=True)
            else:
                raise CaptureError(f"chunk {index} has neither data nor base64")
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise CaptureError(f"chunk {index}: {exc}") from None
        chunks.append((float(entry["at"]), data))
    options = obj.get("options")
    limits = obj.get("limits")
    return Capture(
        request_id=_field(obj, "request_id", str),
        route=_field(obj, "route", str),
        upstream=_field(obj, "upstream", str),
        protocol=_field(obj, "protocol", str),
        outcome=_field(verdict, "outcome", str),
        reason=_field(verdict, "reason", str),
        gateway_version=_field(obj, "gateway_version", str),
        captured_at=str(obj.get("captured_at", "")),
        upstream_request_id=obj.get("upstream_request_id"),
        model=obj.get("model"),
        status=int(obj.get("status", 200)),
        content_type=str(obj.get("content_type", "")),
        finish_reasons=dict(verdict.get("finish_reasons") or {}),
        events=int(verdict.get("events", 0)),
        options=dict(options) if isinstance(options, dict) else {},
        limits={k: v for k, v in limits.items() if isinstance(v, int)}
        if isinstance(limits, dict)
        else {},
        ending=str(obj.get("ending", "open")),
        truncated=obj.get("truncated") is True,
        received_bytes=int(received.get("bytes", 0)),
        received_chunks=int(received.get("chunks", 0)),
        head_at=float(obj.get("head_at", 0.0)),
        chunks=chunks,
    )


def load(path: Path) -> Capture:
    """Read a capture file (CaptureError, naming the file, when it is not one)."""
    try:
        return loads(path.read_bytes())
    except CaptureError as exc:
        raise CaptureError(f"{path}: {exc}") from None
    except OSError as exc:
        raise CaptureError(f"{path}: {exc.strerror or exc}") from None

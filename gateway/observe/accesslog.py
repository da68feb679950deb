"""The access log: one JSON object per request on stdout.

Fields are the facts of the request (DESIGN.md §5); never prompt or
completion text, never credentials or client keys.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, TextIO

from gateway.observe.record import RequestRecord

__all__ = ["AccessLog", "log_fields"]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


def log_fields(record: RequestRecord) -> dict[str, Any]:
    verdict = record.verdict
    usage = record.usage
    return {
        "request_id": record.request_id,
        "route": record.route,
        "method": record.method,
        "path": record.path,
        "client": record.client,
        "status": record.status,
        "model": record.model,
        "stream": record.stream,
        "outcome": str(verdict.outcome) if verdict else None,
        "reason": str(verdict.reason) if verdict else None,
        "finish_reasons": {str(k): v for k, v in verdict.raw_finish_reasons.items()}
        if verdict
        else None,
        "ttfb_ms": _ms(record.time_to_first_byte),
        "ttft_ms": _ms(record.time_to_first_token),
        "duration_ms": _ms(record.duration),
        "bytes_in": record.bytes_in,
        "bytes_out": record.bytes_out,
        "usage": usage.as_dict() if usage is not None else None,
        "upstream_request_id": record.upstream_request_id,
        "rejected": record.rejected,
        "error": record.error,
    }


class AccessLog:
    """Writes one line per request; ``enabled=False`` makes it a no-op.

    Lines are buffered and flushed within ``flush_interval`` seconds (and at
    shutdown), so a busy gateway does not pay a write system call per request.
    """

    def __init__(
        self,
        enabled: bool = True,
        stream: TextIO | None = None,
        flush_interval: float = 0.1,
        max_buffered: int = 256,
    ) -> None:
        self.enabled = enabled
        self._stream = stream
        self._interval = flush_interval
        self._max = max_buffered
        self._lines: list[str] = []
        self._scheduled = False

    def write(self, record: RequestRecord) -> None:
        if not self.enabled:
            return
        self._lines.append(
            json.dumps(log_fields(record), separators=(",", ":"), ensure_ascii=False)
        )
        if len(self._lines) >= self._max:
            self.flush()
        elif not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = True
            loop.call_later(self._interval, self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._lines:
            return
        out = self._stream if self._stream is not None else sys.stdout
        out.write("\n".join(self._lines) + "\n")
        self._lines.clear()
        out.flush()

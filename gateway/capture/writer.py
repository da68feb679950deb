"""CaptureWriter: the observer that turns a finished stream's tap into a capture file.

On the event loop it only decides and enqueues: a record whose route
captures (``capture = "incomplete"``: an incomplete verdict whose reason is
the upstream's, not the client's or the drain's; ``"all"``: every stream)
goes into a bounded queue, or, when the queue is full, is dropped and
counted (``gateway_captures_dropped_total{reason="queue_full"}``): writing
captures never blocks or slows the relay. One writer thread redacts
(``gateway.capture.redact``), writes the file atomically (a temporary name,
then a rename) and evicts the oldest capture files of the directory beyond
its count cap; a failure there is counted as ``write_error`` and logged at
most once a minute.

Files are named ``<UTC time>-<route>-<request id>.capture.json``, so the
names sort oldest first; eviction touches no other file.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway import __version__
from gateway.capture.fileformat import SUFFIX, Capture, dumps
from gateway.capture.redact import Redactor
from gateway.capture.replay import RELAY_SIDE_REASONS
from gateway.capture.tap import Tap
from gateway.logsetup import LogGate
from gateway.observe.accesslog import bounded
from gateway.observe.record import RequestRecord
from gateway.observe.writer_thread import WriterThread
from gateway.settings import GatewayLimits, RouteConfig, Settings

__all__ = ["QUEUE_SIZE", "CaptureWriter"]

log = logging.getLogger("gateway")

#: Captures waiting for the writer thread; more are dropped (and counted).
QUEUE_SIZE = 64


@dataclass(slots=True)
class _Job:
    capture: Capture
    directory: Path
    max_bytes: int
    max_files: int


class CaptureWriter:
    """Writes redacted captures of the streams of the routes that ask for them."""

    name = "captures"

    def __init__(
        self,
        routes: Mapping[str, RouteConfig],
        limits: GatewayLimits,
        *,
        on_written: Callable[[str], None] = lambda route: None,
        on_dropped: Callable[[str, str], None] = lambda route, reason: None,
        queue_size: int = QUEUE_SIZE,
        autostart: bool = True,
    ) -> None:
        self._routes = dict(routes)
        self._limits = {
            "max_line_bytes": limits.max_line_bytes,
            "max_event_bytes": limits.max_event_bytes,
            "max_response_bytes": limits.max_response_bytes,
        }
        self._on_written = on_written
        self._on_dropped = on_dropped
        self._writer = WriterThread("gateway-captures", self._handle, queue_size)
        self._failure_log = LogGate()
        if autostart:
            self.start()

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        *,
        on_written: Callable[[str], None],
        on_dropped: Callable[[str, str], None],
    ) -> CaptureWriter | None:
        """A writer for the routes that capture, or None when none does."""
        routes = {r.name: r for r in settings.effective_routes() if r.capture != "off"}
        if not routes:
            return None
        return cls(routes, settings.limits, on_written=on_written, on_dropped=on_dropped)

    # -- on the event loop ------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        tap = record.tap
        if not isinstance(tap, Tap):
            return
        route = self._routes.get(record.route)
        verdict = record.verdict
        if route is None or verdict is None:
            return
        if route.capture == "incomplete" and (
            verdict.complete or verdict.reason in RELAY_SIDE_REASONS
        ):
            return
        assert route.capture_dir is not None  # settings check it
        capture = Capture(
            request_id=record.request_id,
            route=record.route,
            # The upstream of the pool whose answer this was (a pool of one: the route's).
            upstream=record.upstream or record.route,
            protocol=tap.protocol,
            outcome=str(verdict.outcome),
            reason=str(verdict.reason),
            gateway_version=__version__,
            captured_at=_utc_now(),
            upstream_request_id=record.upstream_request_id,
            model=bounded(record.model),
            status=record.status,
            content_type=bounded(tap.content_type) or "",
            finish_reasons={str(k): str(v) for k, v in verdict.finish_reasons.items()},
            events=verdict.events,
            options={"require_finish_reason": route.require_finish_reason},
            limits=self._limits,
            ending=tap.ending,
            truncated=tap.truncated,
            received_bytes=tap.received_bytes,
            received_chunks=tap.received_chunks,
            head_at=round(tap.head_at, 6),
            chunks=tap.chunks,  # raw until the writer thread redacts them
        )
        job = _Job(capture, route.capture_dir, route.capture_max_bytes, route.capture_max_files)
        if not self._writer.offer(job):  # full, or the thread has ended (after close)
            self._on_dropped(record.route, "queue_full")

    # -- the writer thread ------------------------------------------------------------

    def start(self) -> None:
        self._writer.start()

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), then stop the thread."""
        self._writer.close(timeout)

    def _handle(self, job: _Job) -> None:
        route = job.capture.route
        try:
            self._write(job)
        except Exception:
            self._on_dropped(route, "write_error")
            if self._failure_log.open():
                log.exception("could not write a capture for route %s", route)
            return
        self._on_written(route)

    @staticmethod
    def _write(job: _Job) -> None:
        capture = job.capture
        redactor = Redactor()
        redacted = redactor.redact(b"".join(data for _, data in capture.chunks), capture.protocol)
        chunks, offset = [], 0
        for at, data in capture.chunks:
            chunks.append((at, redacted[offset : offset + len(data)]))
            offset += len(data)
        capture.chunks = chunks
        text = dumps(capture, job.max_bytes)
        stamp = capture.captured_at.replace("-", "").replace(":", "").replace(".", "")
        name = f"{stamp}-{capture.route}-{capture.request_id}{SUFFIX}"
        directory = job.directory
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / f".{name}.tmp"
        temporary.write_text(text, encoding="ascii")
        os.replace(temporary, directory / name)
        _evict(directory, job.max_files)


def _utc_now() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _evict(directory: Path, keep: int) -> None:
    """Remove the oldest capture files beyond ``keep`` (only capture files)."""
    names = sorted(
        entry.name
        for entry in os.scandir(directory)
        if entry.name.endswith(SUFFIX) and not entry.name.startswith(".") and entry.is_file()
    )
    for name in names[: max(len(names) - keep, 0)]:
        (directory / name).unlink(missing_ok=True)  # another worker may have been first

"""The status page across workers: each worker's share of it, in the shared directory.

With ``--workers N`` each ``/status`` request reaches one worker, which knows
only its own requests. So each worker writes its share (its status board's
minute counts and last incomplete streams, its live streams and its active
streams per route) to ``gateway-status-<pid>.json`` in the multiprocess
metrics directory, once a second, atomically (a temporary file, then
``os.replace``); the worker that answers merges every live worker's share
with its own: counts summed, incomplete streams merged by time (the newest
``keep``), live streams side by side. A share is a few kilobytes at most
(the board is bounded); nothing is written per request or per chunk. A share
up to a second old is shown as it was written, live streams' ages advanced
to the page's time. The file of a worker that died is ignored (its pid is
gone) and removed at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any

from gateway.observe.runtime import alive
from gateway.observe.status import IncompleteStream, StatusBoard
from gateway.observe.status_page import LiveStream

__all__ = ["PREFIX", "Merged", "StatusShare", "remove_stale_shares"]

PREFIX = "gateway-status-"
_NAME = re.compile(rf"\A{PREFIX}(\d+)\.json\Z")
#: How often a worker writes its share.
INTERVAL_SECONDS = 1.0


def remove_stale_shares(directory: Path) -> None:
    """Remove a previous instance's shares (the command line, at start)."""
    for path in directory.glob(f"{PREFIX}*.json"):
        with contextlib.suppress(OSError):
            path.unlink()


class Merged:
    """What the page shows, from every worker's share."""

    def __init__(
        self,
        workers: int,
        started: float,
        counts: dict[tuple[str, str], Counter[str]],
        incomplete: list[IncompleteStream],
        live: list[LiveStream],
        active: list[tuple[str, int]],
    ) -> None:
        self.workers = workers
        self.started = started
        self.counts = counts
        self.incomplete = incomplete  # newest first
        self.live = live
        self.active = active


class StatusShare:
    """One worker's share: written on a timer, merged with the others' on demand.

    ``live`` and ``active`` are called for the worker's own live streams (ages as
    of now) and active streams per route.
    """

    def __init__(
        self,
        directory: Path,
        board: StatusBoard,
        live: Callable[[], Sequence[LiveStream]],
        active: Callable[[], Sequence[tuple[str, int]]],
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.board = board
        self._live = live
        self._active = active
        self.pid = os.getpid() if pid is None else pid
        self._clock = clock
        self.path = directory / f"{PREFIX}{self.pid}.json"
        self._task: asyncio.Task[None] | None = None

    # -- writing --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "pid": self.pid,
            "written": now,
            "started": self.board.started,
            "minutes": [
                [minute, [[*key, count] for key, count in bucket.items()]]
                for minute, bucket in self.board.minute_counts()
            ],
            "incomplete": [list(astuple(row)) for row in self.board.incomplete],
            "live": [list(astuple(stream)) for stream in self._live()],
            "active": [list(pair) for pair in self._active()],
        }

    def write(self) -> None:
        data = json.dumps(self.snapshot(), separators=(",", ":"))
        fd, temporary = tempfile.mkstemp(prefix=".status-", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(data)
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def start(self) -> None:
        """Write the share now and once a second from now on (call from the event loop)."""
        self._write_quietly()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_SECONDS)
            self._write_quietly()

    def _write_quietly(self) -> None:
        # A full disk must not stop the worker: the page then shows an older share.
        with contextlib.suppress(OSError):
            self.write()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(OSError):
            self.path.unlink()

    # -- reading ------------------------------------------------------------------------

    def others(self) -> list[dict[str, Any]]:
        """The shares of the other live workers (unreadable or half-written ones skipped)."""
        shares = []
        for path in self.directory.glob(f"{PREFIX}*.json"):
            match = _NAME.match(path.name)
            if match is None or int(match.group(1)) == self.pid:
                continue
            if not alive(int(match.group(1))):
                continue
            try:
                shares.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return shares

    def merged(self) -> Merged:
        """Every live worker's share, this one's as of now."""
        now = self._clock()
        shares = [self.snapshot(), *self.others()]
        oldest = int(now // 60) - self.board.minutes + 1
        counts: dict[tuple[str, str], Counter[str]] = {}
        incomplete: list[IncompleteStream] = []
        live: list[LiveStream] = []
        active: Counter[str] = Counter()
        order: list[str] = []
        for share in shares:
            for minute, entries in share["minutes"]:
                if minute < oldest:
                    continue
                for route, upstream, kind, count in entries:
                    counts.setdefault((route, upstream), Counter())[kind] += count
            incomplete.extend(IncompleteStream(*row) for row in share["incomplete"])
            behind = max(0.0, now - share["written"])
            for row in share["live"]:
                stream = LiveStream(*row)
                live.append(
                    LiveStream(
                        stream.request_id,
                        stream.route,
                        stream.model,
                        stream.age + behind,
                        stream.bytes_out,
                        stream.time_to_first_token,
                    )
                )
            for route, count in share["active"]:
                if route not in active:
                    order.append(route)
                active[route] += count
        incomplete.sort(key=lambda row: row.at, reverse=True)
        live.sort(key=lambda stream: -stream.age)
        return Merged(
            workers=len(shares),
            started=min(share["started"] for share in shares),
            counts=counts,
            incomplete=incomplete[: self.board.keep],
            live=live,
            active=[(route, active[route]) for route in order],
        )

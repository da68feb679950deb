"""The worker supervisor of ``gateway serve --workers N``: uvicorn's, plus the metrics of the dead.

uvicorn's ``Multiprocess`` restarts a worker that died (SIGKILL, the OOM
killer, a crash), but has no hook for it, and a worker that never ran its
own shutdown never took its live gauges (``gateway_active_streams``,
``gateway_upstream_active_streams``, in prometheus-client's ``livesum`` /
``livemax`` modes) out of the multiprocess aggregate: they stayed at what it
held when it died, until the gateway restarted. ``Supervisor`` notices each
worker it replaced and calls ``mark_process_dead`` for it, as every worker
does for itself when it stops cleanly.

What a killed worker had counted in its counters and histograms stays (its
files are kept, as prometheus-client does); the requests it had in flight
finish in no counter: they never ended in that process.
"""

from __future__ import annotations

import logging
import os
import signal

from uvicorn import Config
from uvicorn.supervisors import Multiprocess

__all__ = ["Supervisor", "run_workers"]

log = logging.getLogger("gateway")


class Supervisor(Multiprocess):
    """uvicorn's multiprocess supervisor; a worker it replaces leaves the live gauges."""

    #: The stop signal the supervisor took (SIGINT: the command exits 130).
    stopped_by: int | None = None

    def handle_int(self) -> None:
        self.stopped_by = self.stopped_by or signal.SIGINT
        super().handle_int()

    def handle_term(self) -> None:
        self.stopped_by = self.stopped_by or signal.SIGTERM
        super().handle_term()

    def keep_subprocess_alive(self) -> None:
        before = {process.pid for process in self.processes}
        super().keep_subprocess_alive()
        gone = before - {process.pid for process in self.processes}
        for pid in gone:
            if pid is not None:
                worker_died(pid)


def worker_died(pid: int) -> None:
    """Take worker ``pid``'s live gauges out of the multiprocess aggregate."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    except OSError as exc:  # a file another process removed first, a full disk
        log.warning("metrics of worker %d: %s", pid, exc)
        return
    log.warning(
        "worker process %d ended without its shutdown: its live gauges left the metrics; "
        "the requests it had in flight are counted nowhere",
        pid,
    )


def run_workers(config: Config) -> int | None:
    """``uvicorn.run`` for ``config.workers > 1``, with the ``Supervisor``; the stop signal
    it took, if any."""
    sock = config.bind_socket()
    supervisor = Supervisor(config, sockets=[sock])
    try:
        supervisor.run()
    except KeyboardInterrupt:
        return signal.SIGINT
    finally:
        if config.uds and os.path.exists(config.uds):
            os.remove(config.uds)
    return supervisor.stopped_by

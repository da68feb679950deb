"""Resumable streams on a request's way (a stage, ``gateway.proxy.stages``).

On a route with ``resume = true``: the feature's own requests (a resume, a
cancel, a Responses retrieve from the log) are answered here and go no further;
any other request goes on, and a guarded stream its answer starts gets a log
(``Resumes.record``) that the stream's end closes. Listed before the cache: a
resume is answered before the cache is asked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.guard import StreamGuard
from gateway.proxy.continuation import Rescuer
from gateway.proxy.exchange import Exchange
from gateway.proxy.stages import Next
from gateway.resume.service import Resumes

__all__ = ["ResumeStage"]


class ResumeStage:
    """Serves resumes, and logs the streams of a resumable route."""

    def __init__(self, resumes: Resumes) -> None:
        self.resumes = resumes

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        if not exchange.route.config.resume:
            await call_next(exchange)
            return
        resumes = self.resumes
        if resumes.owns(exchange) and await resumes.serve(exchange):
            return  # a resume, a cancel, a Responses retrieve from the log

        async def opened(
            guard: StreamGuard, content_type: str, rescuer: Rescuer | None
        ) -> Callable[[], Awaitable[None]] | None:
            stream_log = await resumes.record(exchange, guard, rescuer)
            return stream_log.close if stream_log is not None else None

        exchange.on_stream.append(opened)
        await call_next(exchange)

"""The ASGI application: routes, lifespan, health, metrics and the proxy dispatch.

``create_app(settings)`` builds a Starlette app. A request under a route's
prefix goes straight to the relay (a plain ASGI call); no
``BaseHTTPMiddleware`` anywhere (it hides client disconnects). The lifespan
creates the pooled upstream client (and, when ``simulator`` is set, an
in-process simulator on a free loopback port), and closes them at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from types import FrameType
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from gateway import __version__
from gateway.capture.writer import CaptureWriter
from gateway.edge import edge_state
from gateway.errors import error_body, error_headers, send_error
from gateway.headers import get_header, pick_request_id
from gateway.lifecycle import Lifecycle
from gateway.observe import AccessLog, Metrics, ModelLabels, Observer, Observers
from gateway.observe.metrics import CONTENT_TYPE_LATEST
from gateway.relay import Relay
from gateway.routing import Route as ProxyRoute
from gateway.routing import match_route
from gateway.settings import RouteConfig, Settings
from gateway.upstream import Upstream, create_upstream

__all__ = ["create_app"]

log = logging.getLogger("gateway")


class GatewayApp(Starlette):
    """Starlette, with proxied paths dispatched straight to the relay.

    Requests under a route prefix skip Starlette's router and middleware
    (two ``send`` wrappers per event on the hottest path); everything else
    (health, metrics, 404s) is plain Starlette.
    """

    gateway: _Gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = match_route(self.gateway.routes, scope["path"])
            if route is not None:
                relay = self.gateway.relay
                if relay is None:
                    await _not_ready(scope, send)
                    return
                await relay.handle(route, scope, receive, send)
                return
            await super().__call__(scope, receive, _with_request_id(scope, send))
            return
        await super().__call__(scope, receive, send)


_REQUEST_ID_KEY = "gateway.request_id"


def _with_request_id(scope: Scope, send: Send) -> Send:
    """Every response carries exactly one X-Request-ID, the gateway's own ones too."""
    request_id = pick_request_id(get_header(scope["headers"], b"x-request-id"))
    scope[_REQUEST_ID_KEY] = request_id
    value = request_id.encode()

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [
                (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
            ]
            headers.append((b"x-request-id", value))
            message = {**message, "headers": headers}
        await send(message)

    return send_with_id


class _Gateway:
    """Holds what the lifespan creates, for the routes to reach."""

    def __init__(
        self,
        settings: Settings,
        observers: Sequence[Observer] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.metrics = Metrics()
        self.lifecycle = Lifecycle(settings.drain_timeout)
        self.access_log = AccessLog(settings.access_log)
        self.captures = CaptureWriter.for_settings(
            settings,
            on_written=self.metrics.capture_written,
            on_dropped=self.metrics.capture_dropped,
        )
        # Each finished request goes to every observer; one's failure never reaches another.
        self.observers = Observers(
            [
                self.metrics,
                self.access_log,
                *([self.captures] if self.captures is not None else []),
                *observers,
            ],
            on_error=self.metrics.observer_failed,
        )
        self.access_log.on_error = self.observers.failed
        self.model_labels = ModelLabels(settings.model_labels, settings.max_model_labels)
        self.relay: Relay | None = None
        self.routes: list[ProxyRoute] = []
        for config in settings.effective_routes():
            self._add_route(
                ProxyRoute(
                    config=config,
                    timeouts=settings.route_timeouts(config),
                    credentials=settings.credentials.get(config.name, {}),
                )
            )

    def _add_route(self, route: ProxyRoute) -> None:
        self.routes.append(route)
        for endpoint in route.endpoints:
            self.metrics.upstream_declared(route.name, endpoint.name)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[dict[str, Any]]:
        simulator = None
        if self.settings.simulator:
            simulator = await self._start_simulator()
        upstream = (
            create_upstream(
                self.settings.upstream_transport,
                self.settings.upstream_max_connections,
                self.settings.timeouts.connect,
            )
            if self.transport is None
            else Upstream(self.transport, self.settings.timeouts.connect)
        )
        self.relay = Relay(
            settings=self.settings,
            upstream=upstream,
            metrics=self.metrics,
            observers=self.observers,
            model_labels=self.model_labels,
            lifecycle=self.lifecycle,
        )
        previous = _chain_sigterm(self.lifecycle.begin_drain)
        # What exists now lives as long as the process: keep it out of every GC pass.
        gc.freeze()
        self.lifecycle.ready = True
        try:
            # uvicorn hands this state to every connection: the edge reads its limits there.
            yield edge_state(self.settings.limits, self.settings.timeouts, self.metrics.reject)
        finally:
            self.lifecycle.ready = False
            self.lifecycle.stop_all()
            await self.lifecycle.wait_idle(5.0)
            if previous is not None:
                with contextlib.suppress(ValueError):
                    signal.signal(signal.SIGTERM, previous)
            await upstream.aclose()
            self.access_log.flush()
            if self.captures is not None:
                await asyncio.to_thread(self.captures.close)
            if simulator is not None:
                await simulator.stop()
            if self.metrics.multiprocess:
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    async def _start_simulator(self) -> Any:
        """``simulator`` is set: front the built-in simulator on a free loopback port."""
        from gateway.simulator import start_in_background

        running = await start_in_background("127.0.0.1", 0)
        upstream = f"http://127.0.0.1:{running.port}/v1"
        host, port = self.settings.host, self.settings.port
        gateway = (
            f"at http://{f'[{host}]' if ':' in host else host}:{port}/v1"
            if port
            else "under /v1 on the port uvicorn reports below"
        )
        log.info(
            "simulator: the built-in fake provider is at %s; the gateway serves it %s",
            upstream,
            gateway,
        )
        config = RouteConfig(name="simulator", prefix="/v1", upstream=upstream)
        self._add_route(ProxyRoute(config=config, timeouts=self.settings.timeouts))
        return running

    # -- endpoints of the gateway itself ----------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def readyz(self, request: Request) -> Response:
        if self.lifecycle.ready:  # begin_drain clears it
            return JSONResponse({"status": "ready"})
        state = "draining" if self.lifecycle.draining else "starting"
        return JSONResponse({"status": state}, status_code=503)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _chain_sigterm(begin_drain: Callable[[Callable[[], None]], None]) -> Any:
    """On SIGTERM drain first, then shut the server down; the process exits 0.

    uvicorn's own handler records the signal and raises it again once the
    server has stopped (``Server.capture_signals``), so that the process
    dies by SIGTERM (exit status 143). After a drain the signal has been
    handled: the server is told to exit through ``should_exit`` instead,
    the way a uvicorn ``Server`` is stopped from code. A second SIGTERM
    (or SIGINT, left to the server) stops at once, through uvicorn's handler.
    """
    try:
        previous = signal.getsignal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
    except (ValueError, RuntimeError):
        return None
    state = {"signalled": False}
    server = getattr(previous, "__self__", None)

    def handler(signum: int, frame: FrameType | None) -> None:
        def stop_now() -> None:
            if callable(previous):
                previous(signum, frame)

        def drained() -> None:
            if isinstance(server, uvicorn.Server):
                server.should_exit = True
            else:
                stop_now()

        if state["signalled"]:
            stop_now()
            return
        state["signalled"] = True
        loop.call_soon_threadsafe(begin_drain, drained)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. a test server in a thread)
        return None
    return previous


async def _not_ready(scope: Scope, send: Send) -> None:
    request_id = pick_request_id(get_header(scope["headers"], b"x-request-id"))
    await send_error(
        send, 503, "The gateway is starting.", "service_unavailable", "not_ready", request_id
    )


def create_app(
    settings: Settings,
    observers: Sequence[Observer] = (),
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Starlette:
    """Build the gateway's ASGI application from its settings.

    ``observers`` are handed each finished request after the gateway's own
    (metrics, access log, captures): ``gateway probe`` reads its verdicts so.
    ``transport`` replaces the upstream transport the settings choose (any httpx
    transport, e.g. ``httpx.MockTransport`` to drive the relay in-process in tests).
    """
    gateway = _Gateway(settings, observers, transport)
    routes: list[BaseRoute] = [
        Route("/healthz", gateway.healthz, methods=["GET", "HEAD"]),
        Route("/readyz", gateway.readyz, methods=["GET", "HEAD"]),
        Route("/metrics", gateway.metrics_endpoint, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        gateway.metrics.reject("no_route")
        request_id = str(request.scope.get(_REQUEST_ID_KEY) or pick_request_id(None))
        body = error_body(
            "No route for this path.", "invalid_request_error", "no_route", request_id
        )
        return Response(
            body,
            status_code=404,
            headers={k.decode(): v.decode() for k, v in error_headers(body, request_id)},
        )

    app = GatewayApp(
        routes=routes,
        lifespan=gateway.lifespan,
        exception_handlers={404: not_found},
    )
    app.gateway = gateway
    app.state.gateway = gateway
    return app


def create_worker_app() -> Starlette:
    """Factory for worker processes (``--workers N``): settings come from the parent."""
    from gateway.settings import settings_for_worker

    return create_app(settings_for_worker())

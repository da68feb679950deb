"""The ASGI application: routes, lifespan, health, metrics, status and the proxy dispatch.

``create_app(settings)`` builds a Starlette app. A request under a route's
prefix goes straight to the relay (a plain ASGI call); no
``BaseHTTPMiddleware`` anywhere (it hides client disconnects). The lifespan
creates the pooled upstream client (and, when ``simulator`` is set, an
in-process simulator on a free loopback port), and closes them at shutdown,
tracing's exporter last (bounded: a dead collector must not hold the exit).
It opens them in ``START_STEPS`` order on one ``contextlib.AsyncExitStack``,
so a step that fails closes what the steps before it opened, in reverse.

With ``tracing.enabled`` the OpenTelemetry hook (``gateway.observe.otel``,
imported only then) starts a span per request and ends it as an observer.
With ``status_page`` the status board observes every request and
``GET /status`` shows it, to loopback clients or with a global client key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import logging
import os
import platform
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from gateway import __version__
from gateway.cache import ResponseCache, build_cache
from gateway.cache.stage import CacheStages
from gateway.capture.writer import CaptureWriter
from gateway.keys.api import KeysApi
from gateway.keys.registry import Registry
from gateway.keys.setup import build_store
from gateway.keys.stage import KeyModels
from gateway.keys.store import StoreUnavailable
from gateway.lifecycle import Lifecycle
from gateway.limits import Limiter, build_limiter
from gateway.limits.status import client_use
from gateway.observe import AccessLog, Metrics, ModelLabels, Observer, Observers, TracingHook
from gateway.observe.accesslog import QUEUE_LINES
from gateway.observe.metrics import CONTENT_TYPE_LATEST
from gateway.observe.record import RequestRecord
from gateway.observe.status import StatusBoard
from gateway.observe.status_page import HEADERS as STATUS_HEADERS
from gateway.observe.status_page import LiveStream, StatusView, render
from gateway.observe.status_share import StatusShare
from gateway.policy.routing import Route as ProxyRoute
from gateway.policy.routing import match_route
from gateway.protocols import ANY_PATH, REGISTRY, detect
from gateway.proxy.admission import Admission, warn_uncredentialed
from gateway.proxy.ask_usage import AskUsage
from gateway.proxy.client_limits import ClientLimits
from gateway.proxy.connection import peer_of
from gateway.proxy.errors import error_body, error_headers, send_error
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import Forwarding, get_header, request_id_of
from gateway.proxy.partial import PartialEvents
from gateway.proxy.relay import Relay
from gateway.proxy.request_body import BodyParser
from gateway.proxy.rewrite import Rewriter
from gateway.proxy.schema_stage import SchemaStage
from gateway.proxy.slots import StreamSlots
from gateway.proxy.stages import Next, Stage
from gateway.proxy.upstream import Upstream, create_upstream
from gateway.proxy.websocket import WebSocketRelay, is_websocket_path
from gateway.redaction import redacted
from gateway.redisconn import RedisTarget, as_target
from gateway.resume import Resumes, build_resumes
from gateway.resume.stage import ResumeStage
from gateway.server.edge import EdgeRefusal, edge_state
from gateway.server.signals import install_drain_handlers, restore_handlers
from gateway.server.wsedge import WsEdge, ws_edge_state
from gateway.settings import ISSUED_AWS_KEYS, RouteConfig, Settings
from gateway.spend import build_spend, build_stage
from gateway.spend.stage import SpendStage, status_rows
from gateway.store import RedisConnection, StoreError, StreamStore
from gateway.store import build_store as build_stream_store

__all__ = ["create_app"]

log = logging.getLogger("gateway")


def _never(client: str) -> bool:
    """No client is charged what the provider reports (no client has limits)."""
    return False


def _releasing(stage: Stage, admission: Admission) -> Stage:
    """``stage`` for a request the relay does not run (a takeover's continuation): the
    body copies it holds (a strict cap's rewrite) are given back to the budget after it."""

    async def run(exchange: Exchange, call_next: Next) -> None:
        try:
            await stage(exchange, call_next)
        finally:
            admission.release(exchange.held_copies)
            exchange.held_copies = 0

    return run


def stream_store(settings: Settings) -> StreamStore | None:
    """The configured stream store when a route resumes or caches; else None."""
    if not any(route.resume or route.cache for route in settings.effective_routes()):
        return None
    target = settings.redis_target()
    timeout = settings.stream_store_timeout
    return build_stream_store(
        settings.stream_store,
        max_bytes=settings.stream_store_max_bytes,
        redis=store_connection(target, timeout) if settings.stream_store == "redis" and target
        else None,
        timeout=timeout,
    )  # fmt: skip


def store_connection(target: RedisTarget | str, timeout: float) -> RedisConnection:
    """The Redis store's clients, from the one client factory (the store imports nothing
    of the package: they are handed in)."""
    from gateway.redisconn.away import is_away  # redis only when used
    from gateway.redisconn.clients import async_client, sync_client
    from gateway.store.redis_store import MAX_CONNECTIONS

    where = as_target(target)
    client = async_client(
        where,
        socket_timeout=None,  # every call has its own bound (a blocking read is long)
        connect_timeout=timeout,
        max_connections=MAX_CONNECTIONS,
    )
    return RedisConnection(
        client, lambda: sync_client(where, timeout=timeout), is_away, where.mode == "cluster"
    )


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
                keys_api = self.gateway.keys_api
                if keys_api is not None and keys_api.owns(route, scope["path"]):
                    await keys_api.handle(route, scope, receive, send)
                    return
                await relay.handle(route, scope, receive, send)
                return
            await super().__call__(scope, receive, _with_request_id(scope, send))
            return
        if scope["type"] == "websocket":
            route = match_route(self.gateway.routes, scope["path"])
            ws_relay = self.gateway.ws_relay
            if (
                route is not None
                and ws_relay is not None
                and is_websocket_path(route, scope["path"][len(route.config.prefix) :])
            ):
                await ws_relay.handle(route, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _with_request_id(scope: Scope, send: Send) -> Send:
    """Every response carries exactly one X-Request-ID, the gateway's own ones too."""
    request_id = request_id_of(scope)
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
        access_log_stream: TextIO | None = None,
        access_log_queue_lines: int = QUEUE_LINES,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.metrics = Metrics(_longest_request(settings), _longest_first_byte(settings))
        self.lifecycle = Lifecycle(settings.drain_timeout)
        self.access_log = AccessLog(
            settings.access_log,
            stream=access_log_stream,
            on_dropped=self.metrics.access_log_lines_dropped,
            queue_lines=access_log_queue_lines,
        )
        self.captures = CaptureWriter.for_settings(
            settings,
            on_written=self.metrics.capture_written,
            on_dropped=self.metrics.capture_dropped,
        )
        gateway_observers: list[Observer] = [self.metrics, self.access_log]
        if self.captures is not None:
            gateway_observers.append(self.captures)
        self.tracing: TracingHook | None = None
        if settings.tracing.enabled:
            from gateway.observe.otel import OtelTracing

            self.tracing = OtelTracing(
                self._upstream_address if settings.tracing.upstream_host else None
            )
            gateway_observers.append(self.tracing)
        self.status_board: StatusBoard | None = None
        self.status_share: StatusShare | None = None
        if settings.status_page:
            self.status_board = StatusBoard()
            gateway_observers.append(self.status_board)
        self.forwarding = Forwarding(settings.trusted_proxies)
        # Each finished request goes to every observer; one's failure never reaches another.
        self.observers = Observers(
            [*gateway_observers, *observers], on_error=self.metrics.observer_failed
        )
        self.access_log.on_error = self.observers.failed
        self.model_labels = ModelLabels(settings.model_labels, settings.max_model_labels)
        self.relay: Relay | None = None
        #: Built with the relay (``_open_relay``): the named clients' limits and the
        #: stream store, each None when nothing uses it.
        self.limiter: Limiter | None = None
        self.store: StreamStore | None = None
        self.cache: ResponseCache | None = None
        #: Keys issued at run time (``keys.store``): the admin API and this process's copy.
        self.keys_api: KeysApi | None = None
        self.key_registry: Registry | None = None
        if settings.keys.store != "off":
            self.key_registry = Registry(
                build_store(settings),
                settings.keys.refresh_seconds,
                settings.keys.last_used_seconds,
            )
        #: Receipts and the spend report (``gateway.spend``); None without named clients.
        self.spend_stage: SpendStage | None = None
        self.ws_relay: WebSocketRelay | None = None
        #: What the lifespan holds open now (oldest first), and what it closed, in order.
        self.opened: list[str] = []
        self.closed: list[str] = []
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
        """Open what the gateway owns, one ``START_STEPS`` step after another, each
        registering its close on one ``AsyncExitStack`` the moment it exists: a step
        that fails closes what the ones before it opened, newest first, as the
        shutdown does (after Starlette's test client)."""
        async with contextlib.AsyncExitStack() as stack:
            for step in START_STEPS:
                await getattr(self, f"_open_{step}")(stack)
            # What exists now lives as long as the process: keep it out of every GC pass.
            gc.freeze()
            # uvicorn hands this state to every connection: the edge reads its limits there.
            yield {
                **edge_state(
                    self.settings.limits,
                    self.settings.timeouts,
                    self.metrics.reject,
                    self.edge_refused,
                ),
                **ws_edge_state(
                    WsEdge(
                        max_message_bytes=self.settings.max_ws_message_bytes,
                        ping_interval=self.settings.ws_ping_interval_seconds,
                        max_pings_per_second=self.settings.ws_max_client_messages_per_second,
                        client_send=self.settings.timeouts.client_send,
                    )
                ),
            }

    def _owns(self, stack: contextlib.AsyncExitStack, name: str, close: Any) -> None:
        """``name`` is open: ``close`` (a function, sync or async) runs when the stack
        unwinds. ``opened`` lists what is open now, oldest first; ``closed`` what
        was closed, in order."""
        self.opened.append(name)

        async def run() -> None:
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            finally:
                self.opened.remove(name)
                self.closed.append(name)

        stack.push_async_callback(run)

    # The start, in order; the stack closes in the reverse order.

    async def _open_process(self, stack: contextlib.AsyncExitStack) -> None:
        """What the process leaves last: its metrics files' liveness, then the traces."""
        if self.metrics.multiprocess:
            from prometheus_client import multiprocess

            pid = os.getpid()
            self._owns(stack, "metrics", lambda: multiprocess.mark_process_dead(pid))  # type: ignore[no-untyped-call]
        tracing = self.tracing
        if tracing is not None:  # bounded: a dead collector must not hold the exit
            self._owns(
                stack,
                "tracing",
                lambda: asyncio.to_thread(tracing.shutdown, _TRACING_SHUTDOWN_SECONDS),
            )

    async def _open_simulator(self, stack: contextlib.AsyncExitStack) -> None:
        if self.settings.simulator:
            simulator = await self._start_simulator()
            self._owns(stack, "simulator", simulator.stop)

    async def _open_writers(self, stack: contextlib.AsyncExitStack) -> None:
        captures = self.captures
        if captures is not None:
            self._owns(stack, "captures", lambda: asyncio.to_thread(captures.close))
        self.access_log.start()  # its writes leave the loop

        async def close_access_log() -> None:
            self.access_log.flush()
            await asyncio.to_thread(self.access_log.close)

        self._owns(stack, "access_log", close_access_log)

    async def _open_relay(self, stack: contextlib.AsyncExitStack) -> None:
        """The relay and every part it and its stages are handed, each one's close
        registered the moment it exists (the one place they are built)."""
        settings, metrics = self.settings, self.metrics
        upstream = (
            create_upstream(
                settings.upstream_transport,
                settings.upstream_max_connections,
                settings.timeouts.connect,
                settings.upstream_keepalive_seconds,
            )
            if self.transport is None
            else Upstream(self.transport, settings.timeouts.connect)
        )
        self._owns(stack, "upstream", upstream.aclose)
        self.spend_stage = build_stage(settings)
        if self.spend_stage is not None:
            self._owns(stack, "receipts", self.spend_stage.close)
        admission = Admission(
            settings.limits,
            settings.client_key_sha256,
            settings.effective_routes(),
            settings.clients,
            settings.credentials.get(ISSUED_AWS_KEYS),
        )
        warn_uncredentialed(settings, admission)
        bodies = BodyParser(count_input=bool(settings.clients))
        self._owns(stack, "bodies", bodies.close)  # the body parser's helper process
        #: The named clients' limits; None when no client has any (nothing to ask).
        self.limiter = limiter = build_limiter(
            settings, metrics.limit_backend_failed, metrics.budget
        )
        if limiter is not None:
            self._owns(stack, "limiter", limiter.close)  # before its start, which may fail
            await limiter.start()
        #: The stream store, shared by resumable streams and the response cache.
        self.store = store = stream_store(settings)
        if store is not None:
            self._owns(stack, "stream_store", store.close)
            try:
                await store.prepare()  # Redis: connect now
            except StoreError as exc:  # not fatal: resume and the cache wait for it
                log.warning(
                    "stream store not ready at start (%s): streams go without "
                    "resume and answers uncached until it answers",
                    exc,
                )
        #: What requests cost in money (``gateway.spend``): the limits reserve and settle it.
        spend = build_spend(settings)
        rewriter = Rewriter(bodies, admission)
        #: The named clients' limits (a stage); a takeover's continuation goes through it.
        client_limits = (
            ClientLimits(limiter, spend, rewriter, metrics) if settings.clients else None
        )
        charge = _releasing(client_limits, admission) if client_limits is not None else None
        resumes = build_resumes(settings, metrics, upstream, store, charge)
        self.cache = cache = build_cache(settings, metrics, bodies, store)
        if cache is not None:
            self._owns(stack, "cache", cache.close)
        log.info(
            "limits: backend %s, stream store %s, %d named clients (%d limited)",
            settings.limits_backend
            + ("" if limiter is not None else " (unused: no client has limits)"),
            settings.stream_store
            + ("" if store is not None else " (unused: no route resumes or caches)"),
            len(settings.clients),
            len(limiter.clients()) if limiter is not None else 0,
        )
        relay = Relay(
            settings=settings,
            upstream=upstream,
            metrics=metrics,
            observers=self.observers,
            model_labels=self.model_labels,
            lifecycle=self.lifecycle,
            admission=admission,
            bodies=bodies,
            forwarding=self.forwarding,
            partial=PartialEvents(
                settings.limits.max_partial_event_bytes, metrics.partial_event_refused
            ),
            tracer=self.tracing,
            stages=self._stages(rewriter, admission, client_limits, resumes, cache),
        )
        self.relay = relay
        self.ws_relay = WebSocketRelay(
            settings=self.settings,
            admission=admission,
            metrics=self.metrics,
            observers=self.observers,
            access_log=self.access_log,
            model_labels=self.model_labels,
            lifecycle=self.lifecycle,
            forwarding=self.forwarding,
            limiter=limiter,
            spend=spend,
            receipts=self.spend_stage,
        )

    async def _open_keys(self, stack: contextlib.AsyncExitStack) -> None:
        """Issued keys: this process's copy loaded (a store that does not answer yet is
        read again at the next poll), followed, and handed to the admission."""
        relay, registry = self.relay, self.key_registry
        if registry is None or relay is None:
            return
        from gateway.keys.service import KeyService
        from gateway.keys.setup import limiter_follows

        configured = frozenset(c.name for c in self.settings.clients)
        registry.configured = configured
        registry.on_change = limiter_follows(self.limiter, configured)
        self._owns(stack, "keys", registry.close)
        try:
            await registry.load()
        except StoreUnavailable as exc:
            log.warning("key store not ready at start (%s): issued keys wait for it", exc)
        registry.start()
        relay.admission.issued = registry  # the WebSocket relay's too: the same one
        service = KeyService(self.settings, registry.store, registry, self.metrics.key_changed)
        admins = frozenset(c.name for c in self.settings.clients if c.keys_admin)
        self.keys_api = KeysApi(service, relay.admission, admins)

    def _stages(
        self,
        rewriter: Rewriter,
        admission: Admission,
        client_limits: ClientLimits | None,
        resumes: Resumes | None,
        cache: ResponseCache | None,
    ) -> list[Stage]:
        """The optional features on a request's way, outermost first (gateway.proxy.stages):
        the one place their order is written. The rules it keeps: a resume is answered
        before the cache is asked; the cache looks a request up before the limits (a
        whole cached answer spends no tokens, but is counted as a request) and answers
        it after them and the stream slot; the limits settle last of all that."""
        metrics, limiter = self.metrics, self.limiter
        stages: list[Stage] = []
        if self.spend_stage is not None:  # outermost: a receipt for whatever happens within
            stages.append(self.spend_stage)
        if self.key_registry is not None:  # an issued key's models
            stages.append(KeyModels(self.key_registry))
        if resumes is not None:
            stages.append(ResumeStage(resumes))
        cached = CacheStages(cache) if cache is not None else None
        if cached is not None:
            stages.append(cached.lookup)
        stages.append(AskUsage(rewriter, limiter.limited if limiter is not None else _never))
        if client_limits is not None:  # (there are named clients)
            stages.append(client_limits)
        stages.append(StreamSlots(admission, metrics))
        if cached is not None:
            stages.append(cached.serve)
        # innermost: it reads the answer as relayed (a route's schema_check says what a
        # fault does); a request without a schema passes with one substring search
        stages.append(SchemaStage())
        return stages

    async def _open_signals(self, stack: contextlib.AsyncExitStack) -> None:
        previous = install_drain_handlers(self.lifecycle.begin_drain, self.lifecycle.stop_all)
        self._owns(stack, "signals", lambda: restore_handlers(previous))

    async def _open_status_share(self, stack: contextlib.AsyncExitStack) -> None:
        if self.status_board is None or self.metrics.multiprocess_dir is None:
            return
        share = StatusShare(
            Path(self.metrics.multiprocess_dir),
            self.status_board,
            self._live_streams,
            lambda: [(route.name, route.active) for route in self.routes],
        )
        self.status_share = share
        share.start()
        self._owns(stack, "status_share", share.stop)

    async def _open_ready(self, stack: contextlib.AsyncExitStack) -> None:
        """Ready: the first thing the shutdown undoes, then the streams' drain."""
        self.lifecycle.ready = True

        async def stop() -> None:
            self.lifecycle.ready = False
            self.lifecycle.stop_all()
            await self.lifecycle.wait_idle(5.0)

        self._owns(stack, "ready", stop)

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
        # Each protocol it serves under a prefix of its own (Gemini's /v1beta, Ollama's
        # /api, Bedrock's /model), as the probe fronts them: an SDK pointed at the gateway's
        # root (genai's base_url, ollama.Client(host=...)) finds it.
        for spec in REGISTRY:
            prefix = spec.requests.simulator_prefix if spec.requests is not None else "/v1"
            if prefix == "/v1":
                continue
            own_api = RouteConfig(
                name=f"simulator-{spec.name}",
                prefix=prefix,
                upstream=f"http://127.0.0.1:{running.port}{prefix}",
                protocol=spec.protocol,
            )
            self._add_route(ProxyRoute(config=own_api, timeouts=self.settings.timeouts))
            log.info("simulator: its %s API is served under %s", spec.name, prefix)
        return running

    def edge_refused(self, refusal: EdgeRefusal) -> None:
        """The access-log line of a request the client edge refused before the app saw it.

        Called by the connection's protocol: nothing may escape from here.
        """
        try:
            route = match_route(self.routes, refusal.path) if refusal.path is not None else None
            agent = get_header(refusal.headers, b"user-agent")
            record = RequestRecord(
                request_id=refusal.request_id,
                route=route.name if route is not None else "",
                method=refusal.method or "",
                path=refusal.path or "",
                started=0.0,
                client=self.forwarding.client(refusal.headers, refusal.peer),
                status=refusal.status,
                user_agent=agent.decode("latin-1") if agent is not None else None,
                duration=refusal.duration,
                rejected=refusal.reason,
            )
            self.access_log.write(record)
        except Exception:
            self.observers.failed(self.access_log.name)

    # -- endpoints of the gateway itself ----------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def readyz(self, request: Request) -> Response:
        limiter = self.limiter
        if self.lifecycle.ready and limiter is not None and not limiter.ready:
            # Ready means limited: not before the limits backend has answered once.
            return JSONResponse({"status": "limits_backend_unavailable"}, status_code=503)
        if self.lifecycle.ready:  # begin_drain clears it
            # A stream store or a limits backend that is away is said, not failed on:
            # streams are served all the same (without resume, uncached; limited ones as
            # on_backend_error says), by every replica alike.
            body: dict[str, object] = {"status": "ready"}
            store = self.store
            if store is not None and store.down_since is not None:
                down = round(time.monotonic() - store.down_since, 1)
                body |= {"stream_store": "unavailable", "stream_store_down_seconds": down}
            limits_down = limiter.backend_down_for if limiter is not None else None
            if limits_down is not None:
                body |= {"limits_backend": "unavailable",
                         "limits_backend_down_seconds": round(limits_down, 1)}  # fmt: skip
            return JSONResponse(body)
        state = "draining" if self.lifecycle.draining else "starting"
        return JSONResponse({"status": state}, status_code=503)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def _upstream_address(
        self, route_name: str, upstream_name: str | None
    ) -> tuple[str, int | None] | None:
        """Host and port of the upstream that served a request (for spans, when allowed)."""
        for route in self.routes:
            if route.name != route_name:
                continue
            for endpoint in route.endpoints:
                if endpoint.name == upstream_name or upstream_name is None:
                    url = httpx.URL(endpoint.url)
                    return url.host, url.port or {"https": 443, "http": 80}.get(url.scheme)
        return None

    # -- the status page --------------------------------------------------------------------

    async def status_page(self, request: Request) -> Response:
        relay, board = self.relay, self.status_board
        assert board is not None
        request_id = request_id_of(request.scope)
        if relay is None:
            return _json_error(503, "The gateway is starting.", "not_ready", request_id)
        refusal = self._status_refusal(relay, request.scope, request_id)
        if refusal is not None:
            return refusal
        view = dataclasses.replace(self._status_view(board), services=self._services(relay))
        if self.limiter is not None:
            view = dataclasses.replace(view, clients=await client_use(self.limiter))
        if self.spend_stage is not None:
            spend = await status_rows(self.spend_stage.ledger, time.time())
            view = dataclasses.replace(view, spend=spend)
        if self.key_registry is not None:
            view = dataclasses.replace(view, keys=self.key_registry.listing())
        return HTMLResponse(render(view), headers=STATUS_HEADERS)

    def _status_refusal(self, relay: Relay, scope: Scope, request_id: str) -> Response | None:
        """None when the client may see the page: it is on loopback (behind trusted
        proxies: the client they name), or presents a global client key."""
        client = self.forwarding.client(scope["headers"], peer_of(scope))
        if _is_loopback(client):
            return None
        if self.settings.client_key_sha256:
            if relay.admission.has_global_key(scope["headers"]):
                return None
            return _json_error(401, "Missing or invalid API key.", "unauthorized", request_id)
        return _json_error(
            403,
            "The status page is served to loopback clients only "
            "(or, with client_key_sha256 set, to clients with a key).",
            "forbidden",
            request_id,
        )

    def _services(self, relay: Relay) -> list[tuple[str, str]]:
        """The status page's rows for the cache, resume, the stream store, the limits
        backend and Redis: what is on, where, and (this process's view) how it is."""
        settings = self.settings

        def routes_with(flag: str) -> str:
            names = [r.name for r in self.routes if getattr(r.config, flag)]
            return "on for routes " + ", ".join(names) if names else "off (no route)"

        store, limiter = self.store, self.limiter
        held = (
            f"{store.size / 2**20:.1f} MiB of {settings.stream_store_max_bytes / 2**20:.0f} MiB "
            "held (this process's account)"
            if store is not None
            else "unused (no route resumes or caches)"
        )
        answers = (
            ("answers" if limiter.ready else "has not answered yet")
            if limiter is not None
            else "unused (no client has limits)"
        )
        redis = "not configured"
        if settings.redis_url:
            host = httpx.URL(settings.redis_url).host or "(socket)"
            redis = f"{settings.redis_mode} at {host}" + (
                f" (nodes: {', '.join(settings.redis_nodes)})" if settings.redis_nodes else ""
            )
        return [
            ("cache", routes_with("cache")),
            ("resume", routes_with("resume")),
            (f"stream store: {settings.stream_store}", held),
            (f"limits backend: {settings.limits_backend}", answers),
            ("Redis", redis),
        ]

    def _status_view(self, board: StatusBoard) -> StatusView:
        live = self._live_streams()
        active = [(route.name, route.active) for route in self.routes]
        started, counts, incomplete = (
            board.started,
            board.counts(),
            list(reversed(board.incomplete)),
        )
        merged_workers = None
        if self.status_share is not None:  # several workers: every worker's share
            merged = self.status_share.merged()
            live, active, started = merged.live, merged.active, merged.started
            counts, incomplete, merged_workers = merged.counts, merged.incomplete, merged.workers
        return StatusView(
            now=time.time(),
            version=__version__,
            python=f"{platform.python_implementation()} {platform.python_version()}",
            pid=os.getpid(),
            workers=self.settings.workers,
            started=started,
            tracing=self.tracing is not None,
            minutes=board.minutes,
            active=active,
            live=live,
            counts=counts,
            incomplete=incomplete,
            config=redacted(self.settings),
            merged_workers=merged_workers,
            pools=[
                (route.name, endpoint.name, endpoint.priority, str(route.pool.state(i)))
                for route in self.routes
                if len(route.endpoints) > 1
                for i, endpoint in enumerate(route.endpoints)
            ],
        )

    def _live_streams(self) -> list[LiveStream]:
        """This process's streams in flight, the oldest first."""
        live = []
        for key in self.lifecycle.inflight_keys():
            if isinstance(key, Exchange) and key.record.stream:
                record = key.record
                live.append(
                    LiveStream(
                        request_id=record.request_id,
                        route=record.route,
                        model=record.model,
                        age=time.monotonic() - record.started,
                        bytes_out=record.bytes_out,
                        time_to_first_token=record.time_to_first_token,
                    )
                )
        live.sort(key=lambda stream: -stream.age)
        return live


_TRACING_SHUTDOWN_SECONDS = 5.0

#: The lifespan's start, in order (``_Gateway._open_<step>``); the stop is its reverse.
START_STEPS = (
    "process",
    "simulator",
    "writers",
    "relay",
    "keys",
    "signals",
    "status_share",
    "ready",
)


def _longest_request(settings: Settings) -> float:
    """The longest total deadline of any route: the duration histogram's top bucket."""
    totals = [settings.route_timeouts(route).total for route in settings.effective_routes()]
    return max([settings.timeouts.total, *totals])


def _longest_first_byte(settings: Settings) -> float:
    """The longest first-byte deadline of any route or upstream: the time-to-first-token
    histograms' top bucket."""
    deadlines = [settings.timeouts.first_byte]
    for route in settings.effective_routes():
        deadlines.append(settings.route_timeouts(route).first_byte)
        deadlines += [u.timeouts.first_byte for u in route.pool() if u.timeouts.first_byte]
    return max(deadlines)


def _json_error(status: int, message: str, code: str, request_id: str) -> Response:
    type_ = {401: "authentication_error", 403: "permission_error"}.get(
        status, "service_unavailable"
    )
    body = error_body(None, status, message, type_, code, request_id)
    return Response(
        body,
        status_code=status,
        headers={k.decode(): v.decode() for k, v in error_headers(body, request_id)},
    )


def _is_loopback(address: str | None) -> bool:
    if address is None:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


async def _not_ready(scope: Scope, send: Send) -> None:
    request_id = request_id_of(scope)
    await send_error(
        send, None, 503, "The gateway is starting.", "service_unavailable", "not_ready", request_id
    )


def create_app(
    settings: Settings,
    observers: Sequence[Observer] = (),
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    access_log_stream: TextIO | None = None,
    access_log_queue_lines: int = QUEUE_LINES,
) -> Starlette:
    """Build the gateway's ASGI application from its settings.

    ``observers`` are handed each finished request after the gateway's own
    (metrics, access log, captures): ``gateway probe`` reads its verdicts so.
    ``transport`` replaces the upstream transport the settings choose (any httpx
    transport, e.g. ``httpx.MockTransport`` to drive the relay in-process in tests).
    ``access_log_stream`` (stdout when None) and ``access_log_queue_lines`` (the lines
    that may wait for the log's writer thread) let a test drive the log's bounds.
    """
    gateway = _Gateway(settings, observers, transport, access_log_stream, access_log_queue_lines)
    routes: list[BaseRoute] = [
        Route("/healthz", gateway.healthz, methods=["GET", "HEAD"]),
        Route("/readyz", gateway.readyz, methods=["GET", "HEAD"]),
        Route("/metrics", gateway.metrics_endpoint, methods=["GET"]),
    ]
    if settings.status_page:
        routes.append(Route("/status", gateway.status_page, methods=["GET", "HEAD"]))

    async def not_found(request: Request, exc: Exception) -> Response:
        gateway.metrics.reject("no_route")
        request_id = request_id_of(request.scope)
        # In the shape of the protocol the path names, so that its SDK shows the message
        # (google-genai showed only "404 Not Found" for OpenAI's shape); else OpenAI's.
        spec = detect(request.url.path)
        body = error_body(
            spec.protocol if spec is not ANY_PATH else None,
            404,
            "No route for this path.",
            "invalid_request_error",
            "no_route",
            request_id,
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
    from gateway.logsetup import configure_logging
    from gateway.server.memory import return_large_buffers
    from gateway.settings import settings_for_worker

    settings = settings_for_worker()
    configure_logging(settings.log_level, settings.log_format)
    return_large_buffers()
    return create_app(settings)

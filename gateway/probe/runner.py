"""Running a probe: the gateway in-process on a free loopback port, the checks sent through it.

The gateway is the real one (``create_app`` with the configuration's routes,
their credentials, timeouts, limits and captures, served by uvicorn with
httptools on 127.0.0.1), so a check goes through the same code path as live
traffic: admission, the relay, the guard and the protocol's contract, the
observers. Only what faces clients is set aside for the probe, its only
client: it listens on a free loopback port, with no client-key check and no
access log. A check's verdict is read from the gateway itself: an observer
of finished requests hands the probe the ``RequestRecord`` of each of its
requests (found by their ``X-Request-ID``).

Checks run one at a time, each bounded by the probe's ``timeout``; the
``interrupted`` check closes its connection once the guard (the same code,
fed what the client received) has seen the first content event.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import platform
import secrets
from collections.abc import Generator, Mapping
from typing import Any

import httpx
import uvicorn

from gateway import __version__
from gateway.app import create_app
from gateway.guard import StreamGuard
from gateway.observe import RequestRecord
from gateway.probe.checks import Cell, Observed, Target, build_request, judge
from gateway.probe.plan import Plan, simulator_routes
from gateway.probe.report import Matrix
from gateway.protocols import ContractOptions
from gateway.settings import RouteConfig, Settings

__all__ = ["run_plan"]

_STARTUP_SECONDS = 15.0
_RECORD_SECONDS = 15.0  # after the client is done, for the gateway to finish the request
_MAX_BODY = 1024 * 1024  # what the probe reads of an answer, at most


class _Verdicts:
    """An observer that hands the probe the record of each of its requests."""

    name = "probe"

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[RequestRecord]] = {}

    def expect(self, request_id: str) -> asyncio.Future[RequestRecord]:
        future: asyncio.Future[RequestRecord] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def observe(self, record: RequestRecord) -> None:
        future = self._waiting.pop(record.request_id, None)
        if future is not None and not future.done():
            future.set_result(record)


class _Server(uvicorn.Server):
    """uvicorn, leaving the probe's signal handling alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _probe_settings(settings: Settings, routes: list[RouteConfig]) -> Settings:
    """The configuration's routes, served to the probe alone on a loopback port."""
    return settings.model_copy(
        update={
            "host": "127.0.0.1",
            "port": 0,
            "workers": 1,
            "metrics_dir": None,
            "access_log": False,
            "uvicorn_access_log": False,
            "simulator": False,
            "upstream_url": None,
            "client_key_sha256": [],
            "routes": [r.model_copy(update={"client_key_sha256": None}) for r in routes],
        }
    )


@contextlib.asynccontextmanager
async def _serving(settings: Settings, verdicts: _Verdicts) -> Any:
    """The gateway on a free loopback port; yields its base URL."""
    app = create_app(settings, observers=[verdicts])
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        http="httptools",
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(), name="gateway-probe-server")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STARTUP_SECONDS
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the gateway stopped before it started")
        if loop.time() > deadline:
            server.should_exit = True
            raise RuntimeError("the gateway did not start in time")
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _send(
    client: httpx.AsyncClient, check: str, target: Target, headers: Mapping[str, str]
) -> Observed:
    request = build_request(check, target, headers)
    seen = Observed()
    async with client.stream(
        "POST", request.path, headers=request.headers, content=request.content()
    ) as response:
        seen.status = response.status_code
        media = response.headers.get("content-type")
        seen.media_type = media.split(";", 1)[0].strip().lower() if media else None
        if check == "interrupted":
            guard = StreamGuard(target.spec.new_contract(ContractOptions()))
            async for chunk in response.aiter_raw():
                guard.feed(chunk)
                if guard.content_events:
                    seen.closed_early = True
                    break  # leaving the block closes the connection mid-stream
            return seen
        body: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > _MAX_BODY:
                break
            body.append(chunk)
        if check == "usage":
            seen.body = b"".join(body)
    return seen


async def _run_one(
    client: httpx.AsyncClient,
    verdicts: _Verdicts,
    target: Target,
    check: str,
    request_id: str,
    headers: Mapping[str, str],
    seconds: float,
) -> Cell:
    started_at = _utc_now()
    waiting = verdicts.expect(request_id)
    try:
        async with asyncio.timeout(seconds):
            seen = await _send(client, check, target, {**headers, "x-request-id": request_id})
    except TimeoutError:
        seen = Observed(client_error=f"no answer within the probe's {seconds:g} s")
    except httpx.HTTPError as exc:
        seen = Observed(client_error=type(exc).__name__)
    record: RequestRecord | None = None
    with contextlib.suppress(TimeoutError):
        record = await asyncio.wait_for(waiting, _RECORD_SECONDS)
    return judge(check, target, started_at, seen, record)


async def run_plan(settings: Settings, plan: Plan, *, check_seconds: float = 60.0) -> Matrix:
    """Run every check of ``plan`` through an in-process gateway, each bounded by
    ``check_seconds``; the matrix of results."""
    started_at = _utc_now()
    simulator = None
    routes = plan.routes
    if plan.simulator:
        from gateway.simulator import start_in_background

        simulator = await start_in_background("127.0.0.1", 0)
        routes = simulator_routes(simulator.base_url)
    cells: list[Cell] = []
    try:
        verdicts = _Verdicts()
        async with (
            _serving(_probe_settings(settings, routes), verdicts) as base_url,
            httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=check_seconds) as client,
        ):
            run_id = secrets.token_hex(4)
            for number, (target, check) in enumerate(plan.runs, 1):
                request_id = f"probe-{run_id}-{number:03d}"
                headers = plan.headers.get(check, {})
                cells.append(
                    await _run_one(
                        client, verdicts, target, check, request_id, headers, check_seconds
                    )
                )
    finally:
        if simulator is not None:
            await simulator.stop()
    return Matrix(
        gateway_version=__version__,
        client={"python": platform.python_version(), "httpx": httpx.__version__},
        started_at=started_at,
        finished_at=_utc_now(),
        simulator=plan.simulator,
        cells=cells,
    )

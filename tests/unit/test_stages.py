"""The stage chain: the first stage listed is the outermost, each knows only the next."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx

from gateway.proxy.stages import Next, chain


class _Recording:
    def __init__(self, name: str, log: list[str], *, answer: bool = False) -> None:
        self.name, self.log, self.answer = name, log, answer

    async def __call__(self, exchange: Any, call_next: Next) -> None:
        self.log.append(f"{self.name} before")
        if not self.answer:
            await call_next(exchange)
        self.log.append(f"{self.name} after")


def _run(stages: list[_Recording], log: list[str]) -> None:
    async def last(exchange: Any) -> None:
        log.append("last")

    asyncio.run(chain(stages, last)(object()))  # type: ignore[arg-type]


def test_the_first_stage_listed_is_outermost() -> None:
    log: list[str] = []
    _run([_Recording("a", log), _Recording("b", log)], log)
    assert log == ["a before", "b before", "last", "b after", "a after"]


def test_a_stage_that_answers_stops_the_way() -> None:
    log: list[str] = []
    _run([_Recording("a", log), _Recording("b", log, answer=True), _Recording("c", log)], log)
    assert log == ["a before", "b before", "b after", "a after"]


def test_no_stages_is_the_last_step_alone() -> None:
    log: list[str] = []
    _run([], log)
    assert log == ["last"]


def _app_settings() -> Any:
    from gateway.settings import Settings

    key = hashlib.sha256(b"sk-team").hexdigest()
    return Settings(
        routes=[
            {
                "name": "v1",
                "prefix": "/v1",
                "upstream": "http://127.0.0.1:9/v1",
                "resume": True,
                "cache": True,
            }
        ],
        clients=[{"name": "team", "key_sha256": [key], "limits": {"tokens_per_day": 1000}}],
    )


def _names(stages: Any) -> list[str]:
    """Each stage's name: its class's, or a bound method's own (the cache's two)."""
    return [getattr(s, "__name__", type(s).__name__) for s in stages]


def test_the_app_writes_the_order_rules_once_as_the_list() -> None:
    """A resume is answered before the cache is asked; the cache looks a request up
    before the limits reserve (a hit spends no tokens) and answers it after them and
    the stream slot; the limits settle last of those (outermost of them)."""
    from gateway.app import create_app

    app = create_app(_app_settings())
    gateway = app.gateway  # type: ignore[attr-defined]

    async def run() -> list[str]:
        async with app.router.lifespan_context(app):
            return _names(gateway.relay.stages)

    names = asyncio.run(run())
    order = ["ResumeStage", "lookup", "AskUsage", "ClientLimits", "StreamSlots", "serve"]
    assert [n for n in names if n in order] == order


def test_a_resume_is_answered_before_the_cache_is_asked() -> None:
    """The resume stage answers its own paths: the cache is never asked about them,
    while any other request of the route is."""
    from gateway.app import create_app

    app = create_app(_app_settings())
    gateway = app.gateway  # type: ignore[attr-defined]
    headers = {"authorization": "Bearer sk-team"}
    asked: list[str] = []

    async def run() -> int:
        async with app.router.lifespan_context(app):
            cache = gateway.cache
            plan = cache.plan

            async def spy(exchange: Any, rest: str, request_json: Any) -> Any:
                asked.append(rest)
                return await plan(exchange, rest, request_json)

            cache.plan = spy
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                answer = await client.get("/v1/gateway/streams/nope", headers=headers)
                await client.get("/v1/models", headers=headers)  # (its upstream is down)
        return answer.status_code

    assert asyncio.run(run()) == 404
    assert asked == ["/models"]

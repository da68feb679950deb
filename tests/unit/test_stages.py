"""The stage chain: the first stage listed is the outermost, each knows only the next."""

from __future__ import annotations

import asyncio
from typing import Any

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

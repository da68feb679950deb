"""``Deadline`` does what ``asyncio.timeout_at`` does around one await, on a real loop.

Its own expiry is told apart from anyone else's cancellation (which passes
through), an await that ends in time is left alone, and it can be moved.
Driven by real timers with tiny deadlines; nothing asserts how long it took.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy.timer import Deadline


async def _bounded(coro_wait: asyncio.Future[None], when_from_now: float) -> str:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    deadline = Deadline(loop, task, loop.time() + when_from_now)
    try:
        await coro_wait
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        return "expired"
    finally:
        deadline.cancel()
    return "done"


def test_it_expires_and_the_task_goes_on() -> None:
    async def main() -> tuple[str, int]:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        result = await _bounded(never, 0.001)
        await asyncio.sleep(0)  # no cancellation left pending on the task
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert asyncio.run(main()) == ("expired", 0)


def test_an_await_that_ends_in_time_is_left_alone() -> None:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        soon: asyncio.Future[None] = loop.create_future()
        loop.call_soon(soon.set_result, None)
        result = await _bounded(soon, 30.0)
        await asyncio.sleep(0.002)
        return result

    assert asyncio.run(main()) == "done"


def test_someone_else_s_cancellation_passes_through() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[None] = loop.create_future()
        task = loop.create_task(_bounded(never, 30.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_both_at_once_is_a_cancellation_not_a_timeout() -> None:
    """Expired, and cancelled by someone else too: as asyncio.Timeout, the other
    cancellation wins (the exchange was stopped; it must not look like a timeout)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[None] = loop.create_future()
        task = loop.create_task(_bounded(never, 0.0))
        loop.call_soon(task.cancel)  # after the deadline's own timer, before the task runs
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_move_re_arms_it() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        seen = []
        deadline = Deadline(loop, task, loop.time() + 0.001)
        deadline.move(loop.time() + 30.0)  # later: the first phase must not expire
        try:
            await asyncio.sleep(0.01)
            seen.append("phase 1 done")
            deadline.move(loop.time() + 0.001)
            await loop.create_future()
        except asyncio.CancelledError:
            if not deadline.expired():
                raise
            seen.append("phase 2 expired")
        finally:
            deadline.cancel()
        return seen

    assert asyncio.run(main()) == ["phase 1 done", "phase 2 expired"]

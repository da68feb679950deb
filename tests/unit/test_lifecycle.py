"""The process lifecycle's named states: every allowed move, and a refusal for the rest."""

from __future__ import annotations

import asyncio

import pytest

from gateway.lifecycle import Lifecycle, LifecycleError, State


def test_starting_ready_draining_stopped() -> None:
    async def walk() -> list[tuple[State, bool, bool]]:
        life = Lifecycle(drain_timeout=1.0)
        seen = [(life.state, life.ready, life.draining)]
        life.ready = True
        seen.append((life.state, life.ready, life.draining))
        drained = asyncio.Event()
        life.begin_drain(drained.set)
        seen.append((life.state, life.ready, life.draining))
        await asyncio.wait_for(drained.wait(), 5)
        life.ready = False  # the server's end
        seen.append((life.state, life.ready, life.draining))
        return seen

    assert asyncio.run(walk()) == [
        (State.STARTING, False, False),
        (State.READY, True, False),
        (State.DRAINING, False, True),
        (State.STOPPED, False, True),
    ]


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ([State.READY, State.DRAINING], State.READY),
        ([State.STOPPED], State.READY),
        ([State.STOPPED], State.DRAINING),
        ([State.READY], State.STARTING),
    ],
)
def test_a_move_the_table_does_not_allow_is_refused(path: list[State], refused: State) -> None:
    life = Lifecycle(drain_timeout=1.0)
    for state in path:
        life.move(state)
    with pytest.raises(LifecycleError):
        life.move(refused)
    assert life.state is path[-1]


def test_a_second_drain_is_a_no_op() -> None:
    async def twice() -> State:
        life = Lifecycle(drain_timeout=1.0)
        life.ready = True
        life.begin_drain()
        life.begin_drain()
        await life.wait_idle(1.0)
        return life.state

    assert asyncio.run(twice()) is State.DRAINING

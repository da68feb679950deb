"""Which Redis errors say that a command did not run because Redis could not take it now
(its node away, its slots failing over, a master refusing writes until a replica is back),
as opposed to an answer of the command itself.

A standalone pipeline raises such an error for the whole batch; a cluster's pipeline
answers it per command (only the commands of the failing master's slots have it, among
replies that are good). Either way the command is to be sent again once Redis answers,
never taken as its answer: ``is_away`` says which.
"""

from __future__ import annotations

from redis.exceptions import (
    ClusterError,
    ConnectionError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["AWAY", "is_away"]

#: Errors raised (or answered) when the command never reached a master that could run it.
AWAY: tuple[type[BaseException], ...] = (
    ConnectionError,  # and BusyLoadingError (LOADING: a node that restarts)
    RedisTimeoutError,
    ClusterError,  # CLUSTERDOWN, MASTERDOWN
    RedisClusterException,  # no node for a slot, the slot map not refreshed
    ReadOnlyError,  # READONLY: a master demoted to replica, still asked
    TryAgainError,  # TRYAGAIN: a slot being moved
    OSError,
    TimeoutError,
)

#: Replies of a master that refuses writes for now: NOREPLICAS (``min-replicas-to-write``
#: and its replicas away or behind), the ones above by their code.
_CODES = frozenset({"NOREPLICAS", "CLUSTERDOWN", "MASTERDOWN", "LOADING", "READONLY", "TRYAGAIN"})


def is_away(error: object) -> bool:
    """Whether ``error`` (raised, or a pipeline's answer) says the command did not run
    for want of a master that takes it now."""
    if isinstance(error, AWAY):
        return True
    if isinstance(error, ResponseError):
        code = getattr(error, "status_code", None) or str(error).split(" ", 1)[0]
        return code in _CODES
    return False

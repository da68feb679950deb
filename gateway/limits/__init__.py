"""Client limits: the counters' backends (memory, Redis) and the limiter the relay asks.

The arithmetic (windows, estimates, costs) is ``gateway.policy.limits``; here
are the counters and the one object that reserves and settles against them.
"""

from gateway.limits.backend import Backend, BackendError, Reserved
from gateway.limits.limiter import Limiter, LimitRefused, Reservation, build_limiter

__all__ = [
    "Backend",
    "BackendError",
    "LimitRefused",
    "Limiter",
    "Reservation",
    "Reserved",
    "build_limiter",
]

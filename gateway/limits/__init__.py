"""Client limits: the counters' backends (memory, Redis) and the limiter the relay asks.

The arithmetic (what each limit is, windows, estimates, costs) is
``gateway.policy.quota``; here are the counters and the one object that reserves
and settles against them. The gateway's own byte and concurrency limits (the
``[limits]`` table) are ``gateway.settings.GatewayLimits``, enforced where the
bytes pass.
"""

from gateway.limits.backend import Backend, BackendError, Reserved
from gateway.limits.limiter import (
    Limiter,
    LimitRefused,
    Reservation,
    TooLarge,
    Uncapped,
    Unpriced,
    build_limiter,
)

__all__ = [
    "Backend",
    "BackendError",
    "LimitRefused",
    "Limiter",
    "Reservation",
    "Reserved",
    "TooLarge",
    "Uncapped",
    "Unpriced",
    "build_limiter",
]

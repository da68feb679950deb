"""Redis, in every mode: where it is (``target``), the one client factory every user of
Redis builds from (``clients``), the start-up question that names what was found
or says clearly what is wrong (``check``), and which errors say a command did not run
for want of a master (``away``): sent again, never taken as its answer."""

from __future__ import annotations

from gateway.redisconn.target import Mode, RedisTarget, as_target, parse_node

__all__ = ["Mode", "RedisTarget", "as_target", "parse_node"]

"""Redis, in every mode: where it is (``target``), the one client factory every user of
Redis builds from (``clients``), and the start-up question that names what was found
or says clearly what is wrong (``check``)."""

from __future__ import annotations

from gateway.redisconn.target import Mode, RedisTarget, as_target, parse_node

__all__ = ["Mode", "RedisTarget", "as_target", "parse_node"]

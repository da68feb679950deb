"""The Redis backend: counters shared by every worker and every replica.

Reserve and settle are one Lua script each: atomic, one round trip, so two
gateways can never both take the last unit of a limit. A window's counter is
a string key that expires at its window's end; a client's live streams are
a sorted set of request ids scored by the moment they are given up on (a
gateway that died mid-stream does not hold its streams for ever). All of a
client's keys share one hash tag, so each script touches one cluster slot.

Errors and slowness are the limiter's business (``limits_timeout``,
``on_backend_error``): here every failure is a ``BackendError``. The client
is redis-py's asyncio client (hiredis parses when installed), one pool per
worker, with its own retries off: the limiter's timeout is the only bound.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.limits.backend import BackendError, Reserved
from gateway.policy.limits import Check

__all__ = ["RedisBackend"]

#: KEYS: the counters. ARGV: now, member, then per key: kind (c or z), limit, amount,
#: expiry (epoch seconds). Returns {0, used...} or {index, used} for the one without room.
RESERVE = """
local now = tonumber(ARGV[1])
local member = ARGV[2]
local used = {}
for i, key in ipairs(KEYS) do
  local at = 3 + (i - 1) * 4
  local kind, limit, amount = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local n
  if kind == 'z' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    n = redis.call('ZCARD', key)
  else
    n = tonumber(redis.call('GET', key) or '0')
  end
  if n + amount > limit then
    return {i, n}
  end
  used[i] = n + amount
end
for i, key in ipairs(KEYS) do
  local at = 3 + (i - 1) * 4
  local kind, amount, expiry = ARGV[at], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  if kind == 'z' then
    redis.call('ZADD', key, expiry, member)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('EXPIREAT', key, math.ceil(tonumber(last[2])))
  else
    redis.call('INCRBY', key, amount)
    redis.call('EXPIREAT', key, expiry)
  end
end
table.insert(used, 1, 0)
return used
"""

#: KEYS: the counters. ARGV: delta, member, then per key its kind (c, t: tokens, z).
#: Returns each counter after (-1: gone, its window ended).
SETTLE = """
local delta = tonumber(ARGV[1])
local member = ARGV[2]
local after = {}
for i, key in ipairs(KEYS) do
  local kind = ARGV[2 + i]
  if kind == 'z' then
    redis.call('ZREM', key, member)
    after[i] = redis.call('ZCARD', key)
  elseif redis.call('EXISTS', key) == 1 then
    if kind == 't' and delta ~= 0 then
      local n = redis.call('INCRBY', key, delta)
      if n < 0 then
        redis.call('SET', key, 0, 'KEEPTTL')
        n = 0
      end
      after[i] = n
    else
      after[i] = tonumber(redis.call('GET', key))
    end
  else
    after[i] = -1
  end
end
return after
"""


class RedisBackend:
    remote = True

    def __init__(self, url: str, timeout: float, prefix: str = "gateway") -> None:
        self._redis: Any = Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._prefix = prefix
        self._reserve = self._redis.register_script(RESERVE)
        self._settle = self._redis.register_script(SETTLE)

    def _key(self, check: Check) -> str:
        client = check.scope.partition("/")[0]
        return f"{self._prefix}:{{{client}}}:{check.key}"

    async def reserve(
        self, checks: list[Check], reserved: int, member: str, now: float, hold: float
    ) -> Reserved:
        args: list[Any] = [repr(now), member]
        for check in checks:
            if check.expires is None:
                args += ["z", check.value, 1, repr(now + hold)]
            else:
                args += ["c", check.value, check.amount(reserved), check.expires]
        try:
            answer = await self._reserve(keys=[self._key(c) for c in checks], args=args)
        except (RedisError, OSError) as exc:
            raise BackendError(type(exc).__name__) from None
        first = int(answer[0])
        if first:
            return Reserved(first - 1, [int(answer[1])])
        return Reserved(None, [int(v) for v in answer[1:]])

    async def settle(self, checks: list[Check], delta: int, member: str) -> list[int | None]:
        kinds = ["z" if c.expires is None else "t" if c.tokens else "c" for c in checks]
        try:
            answer = await self._settle(
                keys=[self._key(c) for c in checks], args=[delta, member, *kinds]
            )
        except (RedisError, OSError) as exc:
            raise BackendError(type(exc).__name__) from None
        return [None if int(v) < 0 else int(v) for v in answer]

    async def read(self, checks: list[Check], now: float) -> list[int]:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for check in checks:
                    key = self._key(check)
                    if check.expires is None:
                        pipe.zcount(key, repr(now), "+inf")
                    else:
                        pipe.get(key)
                values = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise BackendError(type(exc).__name__) from None
        return [int(v or 0) for v in values]

    async def prepare(self) -> None:
        """Connect and load both scripts now, so that the first request pays neither."""
        try:
            for script in (self._reserve, self._settle):
                script.sha = await self._redis.script_load(script.script)
        except (RedisError, OSError) as exc:
            raise BackendError(type(exc).__name__) from None

    async def close(self) -> None:
        await self._redis.aclose()

"""The Redis backend: counters shared by every worker and every replica.

Reserve and settle are one Lua script each: atomic, so two gateways can
never both take the last unit of a limit. A window's counter is a string key
that expires at its window's end; a client's live streams are a sorted set
of reservation ids scored by the moment they are given up on (a gateway that
died mid-stream does not hold its streams for ever). All of a client's keys
share one hash tag, so each script touches one cluster slot.

No phantom charges. Each reservation has its own id and its own key
(``…:id:<member>``, expiring with its request): the reservation writes the
tokens it reserved there; the settlement reads it, replaces that amount by
the cost (or, when the reservation never counted, charges the whole cost
and nothing else) and marks the id closed. A reservation that Redis runs
after its id was closed (a command the gateway gave up on, run when a
paused Redis resumed) counts nothing. So whatever order a timed-out
reservation and its settlement or cancellation run in, the counters end at
what was served.

The calls go through ``redis_link`` (a thread, batched, the deadline on the
socket); every failure is a ``BackendError`` and the limiter's business.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from gateway.limits.backend import Ask, BackendError, Bill, Reserved
from gateway.limits.redis_link import RedisLink, Script
from gateway.policy.quota import Check
from gateway.redisconn import RedisTarget, as_target

__all__ = ["RedisBackend"]

#: How long a reservation's id outlives its hold (a settlement retried meanwhile, and a
#: late reservation refused by its closed id).
ID_MARGIN = 300

#: KEYS: the id, then the counters. ARGV: now, member, the id's ttl, input, output, strict
#: (1/0), input money, output pico-dollars a token, then per counter: kind (c: requests,
#: t: tokens, m: money, z: streams), limit, expiry.
#: Returns {0, output, money, used...} admitted, {index, output, money, used...} refused at
#: a counter (1-based; used before), {-1} when the id was closed already. A reservation of
#: no tokens (a cache hit) fits every token counter, even one over its limit.
RESERVE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {-1}
end
local now = tonumber(ARGV[1])
local input, output = tonumber(ARGV[4]), tonumber(ARGV[5])
local input_money, output_pico = tonumber(ARGV[7]), tonumber(ARGV[8])
local used = {}
for i = 2, #KEYS do
  local at = 9 + (i - 2) * 3
  if ARGV[at] == 'z' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    used[i - 1] = redis.call('ZCARD', KEYS[i])
  else
    used[i - 1] = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
end
if ARGV[6] == '1' and output > 0 then
  for i = 2, #KEYS do
    local at = 9 + (i - 2) * 3
    local room = nil
    if ARGV[at] == 't' then
      room = tonumber(ARGV[at + 1]) - used[i - 1] - input
    elseif ARGV[at] == 'm' and output_pico > 0 then
      room = math.floor((tonumber(ARGV[at + 1]) - used[i - 1] - input_money) * 1000 / output_pico)
    end
    if room ~= nil and room < output then
      output = math.max(room, 1)
    end
  end
end
local amount = input + output
local money = input_money + math.ceil(output * output_pico / 1000)
for i = 2, #KEYS do
  local at = 9 + (i - 2) * 3
  local step = 1
  if ARGV[at] == 't' then
    step = amount
  elseif ARGV[at] == 'm' then
    step = money
  end
  if step > 0 and used[i - 1] + step > tonumber(ARGV[at + 1]) then
    return {i - 1, output, money, unpack(used)}
  end
end
for i = 2, #KEYS do
  local at = 9 + (i - 2) * 3
  local kind, expiry = ARGV[at], tonumber(ARGV[at + 2])
  if kind == 'z' then
    redis.call('ZADD', KEYS[i], expiry, ARGV[2])
    local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    redis.call('EXPIREAT', KEYS[i], math.ceil(tonumber(last[2])))
    used[i - 1] = used[i - 1] + 1
  else
    local step = 1
    if kind == 't' then
      step = amount
    elseif kind == 'm' then
      step = money
    end
    used[i - 1] = redis.call('INCRBY', KEYS[i], string.format('%.0f', step))
    redis.call('EXPIREAT', KEYS[i], expiry)
  end
end
redis.call('SET', KEYS[1], string.format('%.0f:%.0f', amount, money), 'EX', ARGV[3])
return {0, output, money, unpack(used)}
"""

#: KEYS: the id, then per counter two keys: the one reserved in, the one of now.
#: ARGV: member, the id's ttl, cost, served (1/0), money cost, then per counter: kind, the
#: current window's expiry. The id holds "tokens:money" reserved. Returns {0, current
#: values...}, or {-1} when settled already.
SETTLE = """
local state = redis.call('GET', KEYS[1])
if state == 'x' then
  return {-1}
end
local cost = tonumber(ARGV[3])
local money_cost = tonumber(ARGV[5])
local served = ARGV[4] == '1'
local counted = state ~= false
local delta, money_delta = cost, money_cost
if counted then
  local sep = string.find(state, ':', 1, true)
  if sep then
    delta = cost - tonumber(string.sub(state, 1, sep - 1))
    money_delta = money_cost - tonumber(string.sub(state, sep + 1))
  else
    delta = cost - tonumber(state)
  end
end
local after = {0}
for j = 1, (#KEYS - 1) / 2 do
  local rk, ck = KEYS[2 * j], KEYS[2 * j + 1]
  local kind, expiry = ARGV[4 + 2 * j], tonumber(ARGV[5 + 2 * j])
  if kind == 'z' then
    redis.call('ZREM', rk, ARGV[1])
    after[j + 1] = redis.call('ZCARD', rk)
  else
    local d = delta
    if kind == 'm' then
      d = money_delta
    end
    if kind == 'c' then
      if counted and not served and redis.call('EXISTS', rk) == 1 then
        local n = redis.call('DECR', rk)
        if n < 0 then
          redis.call('SET', rk, 0, 'KEEPTTL')
        end
      elseif served and not counted then
        redis.call('INCR', ck)
        redis.call('EXPIREAT', ck, expiry)
      end
    elseif counted and rk == ck then
      if redis.call('EXISTS', rk) == 1 and d ~= 0 then
        local n = redis.call('INCRBY', rk, string.format('%.0f', d))
        if n < 0 then
          redis.call('SET', rk, 0, 'KEEPTTL')
        end
      end
    elseif d > 0 then
      redis.call('INCRBY', ck, string.format('%.0f', d))
      redis.call('EXPIREAT', ck, expiry)
    end
    after[j + 1] = tonumber(redis.call('GET', ck) or '0')
  end
end
redis.call('SET', KEYS[1], 'x', 'EX', ARGV[2])
return after
"""


class RedisBackend:
    remote = True

    def __init__(self, target: RedisTarget | str, timeout: float, prefix: str = "gateway") -> None:
        self._link = RedisLink(as_target(target), timeout, (RESERVE, SETTLE))
        self._prefix = prefix

    @property
    def ready(self) -> bool:
        return self._link.ready

    @property
    def down_for(self) -> float | None:
        return self._link.down_for

    def _tag(self, check: Check) -> str:
        return f"{self._prefix}:{{{check.tag or check.scope.partition('/')[0]}}}:"

    def _key(self, check: Check) -> str:
        return self._tag(check) + check.key

    def _id(self, checks: list[Check], member: str) -> str:
        return f"{self._tag(checks[0])}id:{member}"

    async def reserve(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        args: list[Any] = [
            repr(now),
            ask.member,
            _ttl(ask.hold),
            ask.input,
            ask.output,
            1 if ask.strict else 0,
            ask.input_money,
            ask.output_pico,
        ]
        for check in checks:
            if check.expires is None:
                args += ["z", check.value, repr(now + ask.hold)]
            else:
                args += [_kind(check), check.value, check.expires]
        keys = [self._id(checks, ask.member), *(self._key(c) for c in checks)]
        (answer,) = await self._link.call([Script(0, keys, args)])
        first = int(answer[0])
        if first < 0:
            raise BackendError("reservation id closed already")
        used = [int(v) for v in answer[3:]]
        return Reserved(first - 1 if first else None, used, int(answer[1]), int(answer[2]))

    def _settlement(
        self,
        checks: list[Check],
        current: list[Check],
        ask: Ask,
        cost: int,
        served: bool,
        money: int = 0,
    ) -> Script:
        keys = [self._id(checks, ask.member)]
        args: list[Any] = [ask.member, _ttl(ask.hold), cost, 1 if served else 0, money]
        for check, now_check in zip(checks, current, strict=True):
            keys += [self._key(check), self._key(now_check)]
            kind = "z" if check.expires is None else _kind(check)
            args += [kind, now_check.expires or 0]
        return Script(1, keys, args)

    async def settle(
        self, checks: list[Check], current: list[Check], ask: Ask, bill: Bill
    ) -> list[int | None]:
        """What was reserved is Redis's to know (the id's key holds it): a reservation that
        never counted is charged the whole cost."""
        if not checks:
            return []
        script = self._settlement(checks, current, ask, bill.cost, bill.served, bill.cost_money)
        (answer,) = await self._link.call([script], durable_for=ask.hold + 60)
        if int(answer[0]) < 0:
            return [None] * len(checks)
        return [int(v) for v in answer[1:]]

    def cancel(self, checks: list[Check], ask: Ask) -> None:
        """Take back a reservation the gateway gave up on and refused (it may run late, or
        have run): sent without waiting, and again until Redis answers."""
        if checks:
            script = self._settlement(checks, checks, ask, 0, False)
            self._link.send([script], durable_for=ask.hold + 60)

    async def read(self, checks: list[Check], now: float) -> list[int]:
        commands: list[Any] = []
        for check in checks:
            key = self._key(check)
            if check.expires is None:
                commands.append(("ZCOUNT", key, repr(now), "+inf"))
            else:
                commands.append(("GET", key))
        values = await self._link.call(commands)
        return [int(v or 0) for v in values]

    async def prepare(self) -> None:
        """Connect and load both scripts now, so that the first request pays neither."""
        await self._link.call([("PING",)])

    async def close(self) -> None:
        await asyncio.to_thread(self._link.close)


def _kind(check: Check) -> str:
    """A windowed counter's kind in the scripts: tokens, money, or requests."""
    return "t" if check.tokens else "m" if check.money else "c"


def _ttl(hold: float) -> int:
    return math.ceil(hold) + ID_MARGIN

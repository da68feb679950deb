"""Issued keys in Redis: documents in one hash, a version, a channel that tells each change.

Every key of the store shares the hash tag ``{gateway-keys}``: one slot, so
each script's keys are in one slot on a Cluster too. A change is one script
that writes the document, increments the version and publishes
``"<version> <id>"`` on ``gateway-keys:changed``, atomically: a replica that
receives the message reads a document at least that new. A replica that
missed messages (its subscription dropped) sees the version ahead of its own
at its next poll and reads everything again. The client comes from the one
factory (``gateway.redisconn``): standalone, Sentinel or Cluster alike (a
cluster client has no pub/sub here: the poll alone keeps replicas within
``keys.refresh_seconds``).

Nothing here holds a secret: documents carry digests. Keys are never given a
TTL, so a ``volatile-*`` eviction policy never drops one; the shipped compose
file and Kubernetes manifests run Redis with ``appendonly yes`` so they
survive its restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from redis.exceptions import RedisError

from gateway.keys.record import IssuedKey
from gateway.keys.store import Conflict, DigestTaken, NameTaken, StoreFull, StoreUnavailable
from gateway.redisconn.clients import async_client
from gateway.redisconn.target import RedisTarget

__all__ = ["CHANNEL", "RedisKeyStore"]

_TAG = "gateway:{gateway-keys}"
DOCS, NAMES, DIGESTS, VERSION, USED = (
    f"{_TAG}:docs",
    f"{_TAG}:names",
    f"{_TAG}:digests",
    f"{_TAG}:version",
    f"{_TAG}:used",
)
CHANNEL = "gateway-keys:changed"


def _save(claim: int, version: int, channel: int) -> str:
    """The end of every write (Lua): the id (``ARGV[1]``) claims ``ARGV[claim]`` in
    ``KEYS[2]`` unless empty, its document (``ARGV[3]``) is saved in ``KEYS[1]``, and the
    new version is published as ``"<version> <id>"`` (what ``changes`` reads)."""
    return f"""
if ARGV[{claim}] ~= '' then redis.call('HSET', KEYS[2], ARGV[{claim}], ARGV[1]) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local v = redis.call('INCR', KEYS[{version}])
redis.call('PUBLISH', ARGV[{channel}], v .. ' ' .. ARGV[1])
return v
"""


#: A new key: its name (``ARGV[2]``) and digests (``ARGV[7:]``) must be free.
_CREATE = """
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then return -3 end
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return -1 end
for i = 7, #ARGV do
  if redis.call('HEXISTS', KEYS[3], ARGV[i]) == 1 then return -2 end
end
for i = 7, #ARGV do redis.call('HSET', KEYS[3], ARGV[i], ARGV[1]) end""" + _save(2, 4, 6)

#: A changed key, at the revision it was read at; a new digest (``ARGV[4]``) is claimed.
_REPLACE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return -4 end
if cjson.decode(current)['rev'] ~= tonumber(ARGV[2]) then return -4 end""" + _save(4, 3, 5)

_LOAD = """
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2])}
"""

_TOUCH = """
for i = 1, #ARGV, 2 do
  local old = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > old then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 0
"""

_REFUSED: dict[int, type[Exception]] = {
    -1: NameTaken,
    -2: DigestTaken,
    -3: StoreFull,
    -4: Conflict,
}


class RedisKeyStore:
    """The keys of every replica on one Redis (standalone, Sentinel or Cluster alike)."""

    def __init__(self, target: RedisTarget, timeout: float = 2.0) -> None:
        self._redis: Any = async_client(target, socket_timeout=None, connect_timeout=timeout)
        self.timeout = timeout
        self._load: Any = self._redis.register_script(_LOAD)
        self._create: Any = self._redis.register_script(_CREATE)
        self._replace: Any = self._redis.register_script(_REPLACE)
        self._touch: Any = self._redis.register_script(_TOUCH)

    async def _call(self, coroutine: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout):
                return await coroutine
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None

    async def load(self) -> tuple[int, dict[str, IssuedKey]]:
        version, flat = await self._call(self._load(keys=[VERSION, DOCS]))
        keys = {flat[i].decode(): IssuedKey.from_json(flat[i + 1]) for i in range(0, len(flat), 2)}
        return int(version), keys

    async def get(self, ids: list[str]) -> dict[str, IssuedKey | None]:
        if not ids:
            return {}
        docs = await self._call(self._redis.hmget(DOCS, ids))
        return {i: IssuedKey.from_json(d) if d else None for i, d in zip(ids, docs, strict=True)}

    async def create(self, key: IssuedKey, claim_name: bool, max_keys: int) -> int:
        args: list[str | int] = [
            key.id,
            key.client if claim_name else "",
            key.to_json(),
            "",
            max_keys,
            CHANNEL,
            *(digest for digest, _ in key.digests),
        ]
        return self._answer(
            await self._call(self._create(keys=[DOCS, NAMES, DIGESTS, VERSION], args=args))
        )

    async def replace(self, key: IssuedKey, new_digest: str | None) -> int:
        args: list[str | int] = [key.id, key.rev - 1, key.to_json(), new_digest or "", CHANNEL]
        return self._answer(
            await self._call(self._replace(keys=[DOCS, DIGESTS, VERSION], args=args))
        )

    @staticmethod
    def _answer(result: Any) -> int:
        value = int(result)
        if value < 0:
            raise _REFUSED[value]
        return value

    async def version(self) -> int:
        return int(await self._call(self._redis.get(VERSION)) or 0)

    async def touch(self, used: Mapping[str, float]) -> None:
        if used:
            args = [part for key_id, when in used.items() for part in (key_id, repr(when))]
            await self._call(self._touch(keys=[USED], args=args))

    async def last_used(self) -> dict[str, float]:
        found = await self._call(self._redis.hgetall(USED))
        return {k.decode(): float(v) for k, v in found.items()}

    async def changes(self) -> AsyncIterator[tuple[int, str]]:
        """The changes as they are published, ``(version, id)``; ends when the
        subscription fails (the caller subscribes again)."""
        if not hasattr(self._redis, "pubsub"):  # a cluster client: the poll alone
            await asyncio.Event().wait()
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(CHANNEL)
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                version, _, key_id = message["data"].decode().partition(" ")
                yield int(version), key_id
        except (RedisError, OSError):
            return
        finally:
            await pubsub.aclose()

    async def close(self) -> None:
        await self._redis.aclose()

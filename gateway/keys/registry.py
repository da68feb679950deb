"""This process's copy of the issued keys: the lookup a request makes, kept current.

A request's key is found with no call to the store: ``find`` looks the
presented key's digest up in a local table (a dict keyed by the digest, so
its cost does not grow with the number of keys) and compares the digest it
found (or a fixed stand-in when none is found) with the presented one by
``hmac.compare_digest``: an unknown key, a revoked one, an expired one and a
rotated secret past its overlap go the same way (one lookup, one constant-time
comparison, then the verdict), so none answers faster than another.

Kept current by ``follow``: the store's change messages (Redis pub/sub:
``"<version> <id>"``, the changed documents read at once) and, as the
fallback for a message lost, the store's version read every
``keys.refresh_seconds`` (ahead of this copy's: everything read again). A
change made by this process is applied at once (``apply``).

``last_used``: a request records its key's use in a dict (no I/O); every
``keys.last_used_seconds`` the uses are written to the store in one call, so
the write cost is at most one write per key per interval, whatever the
traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.keys.record import IssuedKey
from gateway.keys.store import KeyStore, StoreUnavailable

__all__ = ["Registry"]

log = logging.getLogger("gateway")

#: The digest compared when the table has none for the presented key.
_STAND_IN = hashlib.sha256(b"gateway: no such key").digest()
_Entry = tuple[bytes, str, float | None]
_NONE: _Entry = (_STAND_IN, "", None)
#: The key an unknown digest is judged with: revoked, as a revoked key is judged.
_REVOKED = IssuedKey(
    id="",
    client="-",
    digests=[(_STAND_IN.hex(), None)],
    created_at=0.0,
    created_by="-",
    revoked_at=0.0,
)
_NEVER = float("inf")
#: How long a failed subscription waits before it subscribes again.
_RESUBSCRIBE_SECONDS = 0.5


@dataclass(eq=False)
class Registry:
    """The issued keys by digest and by id, with what changed told to ``on_change``."""

    store: KeyStore
    refresh_seconds: float = 0.5
    last_used_seconds: float = 60.0
    clock: Callable[[], float] = time.time
    #: (old, new) of each key that changed (None: absent); the limiter's rules follow
    on_change: Callable[[IssuedKey | None, IssuedKey | None], None] | None = None
    #: the configured clients' names: a key that claims one without ``existing_client``
    #: (the file gained that client after the key was issued) is never honoured
    configured: frozenset[str] = frozenset()
    _clashes: set[str] = field(init=False, default_factory=set)
    version: int = field(init=False, default=0)
    keys: dict[str, IssuedKey] = field(init=False, default_factory=dict)
    #: digest -> (digest, key id, refused after: None while it is the current one)
    _by_digest: dict[bytes, _Entry] = field(init=False, default_factory=dict)
    _used: dict[str, float] = field(init=False, default_factory=dict)
    #: the uses this process wrote last (the status page's, between writes)
    _written: dict[str, float] = field(init=False, default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(init=False, default_factory=list)

    # -- the request's lookup -------------------------------------------------------------

    def find(self, digest: bytes) -> IssuedKey | None:
        """The usable key whose digest is ``digest``, or None; the same steps for every
        key, known or not (see the module's docstring)."""
        expected, key_id, until = self._by_digest.get(digest, _NONE)
        same = hmac.compare_digest(expected, digest)
        key = self.keys.get(key_id, _REVOKED)
        now = self.clock()
        # no short cut: every kind of key runs each step (``&``, not ``and``)
        usable = same & (key.state(now) == "active") & (now < (_NEVER if until is None else until))
        if not usable:
            return None
        self._used[key_id] = now
        return key

    def last_used(self, key_id: str) -> float | None:
        """This process's latest use of the key not yet written (or the last written)."""
        return self._used.get(key_id, self._written.get(key_id))

    def listing(self) -> list[tuple[str, str, str, str, float | None]]:
        """(id, client, team, state, last use) of every key, oldest first (status page)."""
        now = self.clock()
        keys = sorted(self.keys.values(), key=lambda k: (k.created_at, k.id))
        return [(k.id, k.client, k.team or "", k.state(now), self.last_used(k.id)) for k in keys]

    # -- keeping the copy current ---------------------------------------------------------

    async def load(self) -> None:
        version, keys = await self.store.load()
        self._replace_all(version, keys)

    def apply(self, key: IssuedKey, version: int | None = None) -> None:
        """A key written by this process (or read after a change message)."""
        old = self.keys.get(key.id)
        if old is not None and old.rev > key.rev:
            return  # an older read than what is held
        if old is not None:
            for digest, _ in old.digests:
                self._by_digest.pop(bytes.fromhex(digest), None)
        self.keys[key.id] = key
        self._index(key)
        if version is not None and version == self.version + 1:
            self.version = version
        if self.on_change is not None:
            self.on_change(old, key)

    def _index(self, key: IssuedKey) -> None:
        if not key.existing_client and key.client in self.configured:
            if key.id not in self._clashes:
                self._clashes.add(key.id)
                log.warning(
                    "issued key %s is client %s, which the configuration now names too: "
                    "it is refused until it is revoked or the configured client renamed",
                    key.id,
                    key.client,
                )
            return
        for digest, until in key.digests:
            raw = bytes.fromhex(digest)
            self._by_digest[raw] = (raw, key.id, until)

    def _replace_all(self, version: int, keys: dict[str, IssuedKey]) -> None:
        before = self.keys
        self.keys = keys
        self._by_digest = {}
        for key in keys.values():
            self._index(key)
        self.version = version
        if self.on_change is not None:
            for key_id in before.keys() | keys.keys():
                old, new = before.get(key_id), keys.get(key_id)
                if old is None or new is None or old.rev != new.rev:
                    self.on_change(old, new)

    def start(self) -> None:
        """Follow the store's changes, poll its version, and write the uses, until
        ``close``."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._poll()),
            loop.create_task(self._write_uses()),
        ]
        changes = getattr(self.store, "changes", None)
        if changes is not None:
            self._tasks.append(loop.create_task(self._follow(changes)))

    async def _follow(self, changes: Callable[[], Any]) -> None:
        while True:
            async for version, key_id in changes():
                if version <= self.version:
                    continue
                try:
                    if version == self.version + 1:
                        found = (await self.store.get([key_id])).get(key_id)
                        if found is not None:
                            self.apply(found, version)
                            continue
                    await self.load()  # a gap: some change was missed
                except StoreUnavailable:
                    pass  # the poll reads everything once the store answers
            await asyncio.sleep(_RESUBSCRIBE_SECONDS)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            with contextlib.suppress(StoreUnavailable):
                if await self.store.version() > self.version:
                    await self.load()

    async def _write_uses(self) -> None:
        while True:
            await asyncio.sleep(self.last_used_seconds)
            await self.flush_uses()

    async def flush_uses(self) -> None:
        used, self._used = self._used, {}
        try:
            await self.store.touch(used)
            self._written.update(used)
        except StoreUnavailable:
            for key_id, when in used.items():  # kept for the next interval
                self._used[key_id] = max(when, self._used.get(key_id, 0.0))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush_uses(), 2.0)
        await self.store.close()

"""Where issued keys are kept: the store's interface, its refusals, and the memory store.

A store keeps documents (``IssuedKey`` as JSON), a version that every change
increments, and each key's last use. ``create`` claims the new client's name
and the digest (a name or a digest taken is refused, never overwritten);
``replace`` writes a document only over the revision it was read at (another
writer in between: ``Conflict``, read again). The memory store is one
process's: what it holds is lost at restart (``keys.store = "memory"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gateway.keys.record import IssuedKey

__all__ = [
    "Conflict",
    "DigestTaken",
    "KeyStore",
    "MemoryKeyStore",
    "NameTaken",
    "StoreFull",
    "StoreUnavailable",
]


class NameTaken(Exception):
    """Another issued key is that client already."""


class DigestTaken(Exception):
    """Another issued key has that digest."""


class StoreFull(Exception):
    """The store holds ``keys.max_keys`` keys."""


class Conflict(Exception):
    """The document changed since it was read (or is gone)."""


class StoreUnavailable(Exception):
    """The store did not answer."""


class KeyStore(Protocol):
    async def load(self) -> tuple[int, dict[str, IssuedKey]]:
        """The version and every document, as of one moment."""
        ...

    async def get(self, ids: list[str]) -> dict[str, IssuedKey | None]: ...

    async def create(self, key: IssuedKey, claim_name: bool, max_keys: int) -> int:
        """Store a new key; its version. NameTaken, DigestTaken or StoreFull."""
        ...

    async def replace(self, key: IssuedKey, new_digest: str | None) -> int:
        """Store ``key`` (its ``rev`` one more than the stored one's); the version.
        Conflict when the stored revision is not ``key.rev - 1``."""
        ...

    async def version(self) -> int: ...

    async def touch(self, used: Mapping[str, float]) -> None:
        """Record the keys' last use (the latest wins)."""
        ...

    async def last_used(self) -> dict[str, float]: ...

    async def close(self) -> None: ...


class MemoryKeyStore:
    """One process's keys, lost at restart."""

    def __init__(self) -> None:
        self._docs: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._digests: dict[str, str] = {}
        self._used: dict[str, float] = {}
        self._version = 0

    async def load(self) -> tuple[int, dict[str, IssuedKey]]:
        return self._version, {k: IssuedKey.from_json(v) for k, v in self._docs.items()}

    async def get(self, ids: list[str]) -> dict[str, IssuedKey | None]:
        return {i: IssuedKey.from_json(self._docs[i]) if i in self._docs else None for i in ids}

    async def create(self, key: IssuedKey, claim_name: bool, max_keys: int) -> int:
        if len(self._docs) >= max_keys:
            raise StoreFull
        if claim_name and key.client in self._names:
            raise NameTaken
        if any(d in self._digests for d, _ in key.digests):
            raise DigestTaken
        if claim_name:
            self._names[key.client] = key.id
        for digest, _ in key.digests:
            self._digests[digest] = key.id
        self._docs[key.id] = key.to_json()
        self._version += 1
        return self._version

    async def replace(self, key: IssuedKey, new_digest: str | None) -> int:
        stored = self._docs.get(key.id)
        if stored is None or IssuedKey.from_json(stored).rev != key.rev - 1:
            raise Conflict
        if new_digest is not None:
            self._digests[new_digest] = key.id
        self._docs[key.id] = key.to_json()
        self._version += 1
        return self._version

    async def version(self) -> int:
        return self._version

    async def touch(self, used: Mapping[str, float]) -> None:
        for key_id, when in used.items():
            self._used[key_id] = max(when, self._used.get(key_id, 0.0))

    async def last_used(self) -> dict[str, float]:
        return dict(self._used)

    async def close(self) -> None:
        return None

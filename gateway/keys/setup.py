"""What the app and the CLI build issued keys from: the store the settings name, and the
limiter following the keys' limits.

The Redis client comes from the shared factory (``gateway.redisconn``), for standalone,
Sentinel or Cluster alike.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.keys.record import IssuedKey
from gateway.keys.store import KeyStore, MemoryKeyStore
from gateway.limits.limiter import Limiter
from gateway.settings import Settings

__all__ = ["build_store", "limiter_follows"]


def build_store(settings: Settings) -> KeyStore:
    """The key store ``keys.store`` names (``"memory"``: this process's, lost at restart)."""
    if settings.keys.store == "redis":
        from gateway.keys.redis_store import RedisKeyStore

        target = settings.redis_target()
        assert target is not None
        return RedisKeyStore(target)
    return MemoryKeyStore()


def limiter_follows(
    limiter: Limiter | None, configured: frozenset[str] = frozenset()
) -> Callable[[IssuedKey | None, IssuedKey | None], None] | None:
    """The registry's change callback that gives the limiter each issued client's own
    limits (a key of a configured client has that client's, from the file, and never
    replaces them)."""
    if limiter is None:
        return None

    def changed(old: IssuedKey | None, new: IssuedKey | None) -> None:
        key = new if new is not None else old
        if key is None or key.existing_client or key.client in configured:
            return
        limiter.put_client(key.client, new.as_client() if new is not None else None)

    return changed

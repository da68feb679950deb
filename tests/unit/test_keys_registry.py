"""The local copy of issued keys (gateway.keys.registry) over the memory store: the
per-request lookup's one constant-time comparison whatever the key, expiry, rotation's
overlap, revocation, the copy kept current by the store's version, and last use."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from typing import Any

import pytest

from gateway.keys.record import IssuedKey, digest_of
from gateway.keys.registry import Registry
from gateway.keys.store import Conflict, DigestTaken, MemoryKeyStore, NameTaken, StoreFull


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _key(client: str, secret: str, **fields: Any) -> IssuedKey:
    return IssuedKey(
        id=f"key_{client}",
        client=client,
        digests=[(digest_of(secret), None)],
        created_at=1.0,
        created_by="ops",
        **fields,
    )


def _raw(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def test_find_makes_one_comparison_of_equal_lengths_for_every_kind_of_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    registry = Registry(MemoryKeyStore(), clock=clock)
    registry.apply(_key("live", "s-live"))
    registry.apply(_key("gone", "s-gone", revoked_at=500.0))
    registry.apply(_key("old", "s-old", expires_at=900.0))
    rotated = _key("turned", "s-new")
    rotated.digests = [(digest_of("s-prev"), 990.0), (digest_of("s-new"), None)]
    registry.apply(rotated)
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr("gateway.keys.registry.hmac.compare_digest", spy)
    found = {s: registry.find(_raw(s)) for s in ("s-live", "s-new", "s-unknown", "s-gone")}
    found |= {s: registry.find(_raw(s)) for s in ("s-old", "s-prev")}
    assert calls == [(32, 32)] * 6
    assert found["s-live"] is not None
    assert found["s-new"] is not None
    assert [found[s] for s in ("s-unknown", "s-gone", "s-old", "s-prev")] == [None] * 4


def test_a_rotated_secret_works_until_its_overlap_ends() -> None:
    clock = Clock()
    registry = Registry(MemoryKeyStore(), clock=clock)
    key = _key("turned", "s-new")
    key.digests = [(digest_of("s-prev"), 1_010.0), (digest_of("s-new"), None)]
    registry.apply(key)
    assert registry.find(_raw("s-prev")) is not None
    clock.now = 1_010.0
    assert registry.find(_raw("s-prev")) is None
    assert registry.find(_raw("s-new")) is not None


def test_an_older_revision_never_replaces_a_newer_one() -> None:
    registry = Registry(MemoryKeyStore())
    registry.apply(_key("k", "s", rev=2, revoked_at=5.0))
    registry.apply(_key("k", "s", rev=1))
    assert registry.find(_raw("s")) is None


def test_the_memory_store_refuses_a_taken_name_digest_a_full_store_and_a_stale_write() -> None:
    async def run() -> None:
        store = MemoryKeyStore()
        assert await store.create(_key("a", "s-a"), True, 2) == 1
        with pytest.raises(NameTaken):
            await store.create(_key("a", "s-other"), True, 2)
        with pytest.raises(DigestTaken):
            await store.create(_key("b", "s-a"), True, 2)
        await store.create(_key("b", "s-b"), True, 2)
        with pytest.raises(StoreFull):
            await store.create(_key("c", "s-c"), True, 2)
        stale = _key("a", "s-a", rev=5)
        with pytest.raises(Conflict):
            await store.replace(stale, None)
        assert await store.replace(_key("a", "s-a", rev=1, revoked_at=1.0), None) == 3

    asyncio.run(run())


def test_the_poll_reads_everything_again_when_the_store_is_ahead() -> None:
    async def run() -> None:
        store = MemoryKeyStore()
        registry = Registry(store, refresh_seconds=0.01, last_used_seconds=0.01)
        changed: list[str] = []
        registry.on_change = lambda old, new: changed.append((new or old).client)  # type: ignore[union-attr]
        await registry.load()
        registry.start()
        try:
            await store.create(_key("late", "s-late"), True, 10)  # written by "another replica"
            for _ in range(500):
                if registry.find(_raw("s-late")) is not None:
                    break
                await asyncio.sleep(0.01)
            assert registry.find(_raw("s-late")) is not None
            assert changed == ["late"]
            for _ in range(500):
                if "key_late" in await store.last_used():
                    break
                await asyncio.sleep(0.01)
            assert "key_late" in await store.last_used()
        finally:
            await registry.close()

    asyncio.run(run())


def test_a_key_whose_client_the_file_now_configures_is_refused_and_leaves_its_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gateway.keys.setup import limiter_follows
    from gateway.limits.limiter import Limiter
    from gateway.limits.memory import MemoryBackend
    from gateway.settings import ClientConfig

    configured = ClientConfig(
        name="team-a", key_sha256=[digest_of("s-file")], limits={"requests_per_minute": 5}
    )
    limiter = Limiter([configured], MemoryBackend())
    registry = Registry(MemoryKeyStore(), configured=frozenset({"team-a"}))
    registry.on_change = limiter_follows(limiter, frozenset({"team-a"}))
    with caplog.at_level(logging.WARNING, logger="gateway"):
        registry.apply(_key("team-a", "s-clash", limits={"requests_per_minute": 500}))
    assert registry.find(_raw("s-clash")) is None
    assert "configuration now names too" in caplog.text
    assert [r.limits for r in limiter.rules_of("team-a")] == [
        r.limits for r in Limiter([configured], MemoryBackend()).rules_of("team-a")
    ]
    registry.apply(_key("team-b", "s-own", existing_client=False))
    registry.apply(
        IssuedKey(
            id="key_of_a",
            client="team-a",
            existing_client=True,
            digests=[(digest_of("s-mine"), None)],
            created_at=1.0,
            created_by="ops",
        )
    )
    assert registry.find(_raw("s-mine")) is not None

"""Microbenchmark: what an issued key costs a request, and that it costs no store call.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_keys.py [--calls N]

1. ``Registry.find`` (the per-request lookup) with 1, 1,000 and 100,000 issued keys in
   this process's copy: ns a call for a right key, an unknown one, a revoked one and a
   rotated secret past its overlap. The lookup is a dict keyed by the digest and one
   ``hmac.compare_digest``: its cost must not grow with the number of keys, and the
   unknown and revoked kinds must cost the same (they take the same steps).
2. ``Admission.check_key`` on a route (the SHA-256 of the presented key included): a key
   of the configuration, an issued key, an unknown key; µs a call.
3. The store calls the lookups made: none (the copy is local; the store is read when a
   change is published, once a ``keys.refresh_seconds`` for its version, and written
   once a ``keys.last_used_seconds``).

The machine's other load disturbs the numbers: run it on a quiet machine, twice.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from gateway.keys.record import IssuedKey, digest_of  # noqa: E402
from gateway.keys.registry import Registry  # noqa: E402
from gateway.keys.store import MemoryKeyStore  # noqa: E402
from gateway.policy.routing import Route  # noqa: E402
from gateway.proxy.admission import Admission  # noqa: E402
from gateway.settings import ClientConfig, GatewayLimits, RouteConfig, Timeouts  # noqa: E402


class CountingStore(MemoryKeyStore):
    """The memory store, counting every call made to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        if name in ("load", "get", "create", "replace", "version", "touch", "last_used"):
            object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
        return object.__getattribute__(self, name)


def _registry(count: int, store: MemoryKeyStore) -> Registry:
    registry = Registry(store, clock=lambda: 1_000.0)
    for index in range(count):
        registry.apply(
            IssuedKey(
                id=f"key_{index}",
                client=f"c{index}",
                digests=[(digest_of(f"secret-{index}"), None)],
                created_at=1.0,
                created_by="bench",
            )
        )
    revoked = IssuedKey(
        id="key_revoked",
        client="revoked",
        digests=[(digest_of("secret-revoked"), None)],
        created_at=1.0,
        created_by="bench",
        revoked_at=2.0,
    )
    rotated = IssuedKey(
        id="key_rotated",
        client="rotated",
        digests=[(digest_of("secret-old"), 500.0), (digest_of("secret-new"), None)],
        created_at=1.0,
        created_by="bench",
    )
    registry.apply(revoked)
    registry.apply(rotated)
    return registry


def _ns_per_call(call: Any, argument: Any, calls: int) -> float:
    rounds = []
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(calls):
            call(argument)
        rounds.append((time.perf_counter_ns() - started) / calls)
    return statistics.median(rounds)


def bench_find(calls: int) -> None:
    print("1. Registry.find, ns a call (median of 5 rounds)")
    print(f"   {'keys':>8} {'right':>8} {'unknown':>8} {'revoked':>8} {'past overlap':>13}")
    for count in (1, 1_000, 100_000):
        registry = _registry(count, MemoryKeyStore())
        kinds = ["secret-0", "secret-unknown", "secret-revoked", "secret-old"]
        digests = [hashlib.sha256(s.encode()).digest() for s in kinds]
        assert registry.find(digests[0]) is not None
        assert all(registry.find(d) is None for d in digests[1:])
        row = [_ns_per_call(registry.find, d, calls) for d in digests]
        print(f"   {count:>8} " + " ".join(f"{v:>8.0f}" for v in row[:3]) + f" {row[3]:>13.0f}")


def bench_admission(calls: int) -> None:
    configured = "sk-configured-0123"
    client = ClientConfig(name="file", key_sha256=[digest_of(configured)])
    config = RouteConfig(name="chat", prefix="/v1", upstream="http://127.0.0.1:9/v1")
    route = Route(config=config, timeouts=Timeouts())
    admission = Admission(GatewayLimits(), [], [config], [client])
    store = CountingStore()
    admission.issued = _registry(1_000, store)
    before = store.calls

    def check(key: str) -> Any:
        headers = [(b"authorization", b"Bearer " + key.encode())]
        try:
            return admission.check_key(route, headers)
        except Exception as exc:
            return exc

    print("2. Admission.check_key, µs a call (the key's SHA-256 included), 1,000 issued keys")
    for label, key in (
        ("a configured key", configured),
        ("an issued key", "secret-7"),
        ("an unknown key", "secret-unknown"),
        ("a revoked key", "secret-revoked"),
    ):
        print(f"   {label:<18} {_ns_per_call(check, key, calls) / 1000:.2f}")
    print(f"3. store calls made by {5 * 4 * calls} lookups: {store.calls - before}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    bench_find(args.calls)
    bench_admission(args.calls // 10)


if __name__ == "__main__":
    main()

"""What a Redis failover loses, measured: a master SIGKILLed under traffic, on a Sentinel
set and on a Cluster, with and without ``min-replicas-to-write``.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/failover_loss.py [--runs 1] [--lag 2] [--only sentinel]

Each run starts a deployment (real ``redis-server`` processes on loopback ports: a
master, two replicas and three sentinels; or six cluster nodes, three masters with a
replica each), two ``gateway serve`` processes in front of the simulator, and traffic
over both: limited, priced streamed requests of one client (four at a time: each
reserves and settles its tokens, and leaves a receipt) and issued keys created one after
another through the admin API. Every write of the three Redis users under test (the
client's counters, the issued keys, the receipts) is on the master that is killed (on
the cluster, the client's name is chosen so that its hash tag is on that master).

Two scenarios, each with the masters' defaults and then with
``min-replicas-to-write 1`` and ``min-replicas-max-lag 1``:

- ``kill``: the master SIGKILLed while its replicas are in sync (a crash);
- ``lag``: the replicas SIGSTOPped ``--lag`` seconds first (a replica link that stalls:
  the master goes on acknowledging writes no replica has), then the master SIGKILLed
  and the replicas let go: a replica that missed those seconds is promoted.

``on_backend_error = "allow"``: what is served in the gap is settled when Redis answers.
After the failover (and two seconds more of traffic) the script waits for the kept
settlements, then compares what the new master holds with what the gateways answered:

- counters: the tokens of every answer served (their usage) against the client's
  ``tokens_per_day`` counter;
- keys: every key whose creation was answered 201 against the keys in Redis (what a
  gateway started after the failover honours);
- receipts: every answered request's receipt, looked up in Redis.

and what ``min-replicas-to-write`` cost: the requests refused or failed, the limited
requests served a second before the kill, and the keys refused. It ends with the cost
of Redis's ``WAIT 1 <ms>`` after a write (which the gateway does not send), measured on
the Sentinel set's master: 2,000 script calls with and without it.

Every process is stopped by its PID; each run is bounded (about 40 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from gateway.redisconn import RedisTarget  # noqa: E402
from gateway.redisconn.clients import sync_client  # noqa: E402
from tests.conftest import free_port, gateway_process  # noqa: E402
from tests.integration.helpers import metric_value  # noqa: E402
from tests.integration.redis_sets import (  # noqa: E402
    PASSWORD,
    ClusterSet,
    SentinelSet,
    cluster_target,
    sentinel_target,
    wait_for,
)

ADMIN = "sk-loss-admin-0001"
STEADY = "sk-loss-steady-0002"
MIN_REPLICAS = {"min-replicas-to-write": "1", "min-replicas-max-lag": "1"}


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _config(upstream: str, redis: str, client: str) -> str:
    return f"""
access_log = false
limits_backend = "redis"
{redis}
limits_timeout = 1.0
on_backend_error = "allow"
[keys]
store = "redis"
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{upstream}"
[[clients]]
name = "ops"
key_sha256 = ["{_sha(ADMIN)}"]
keys_admin = true
[[clients]]
name = "{client}"
key_sha256 = ["{_sha(STEADY)}"]
[clients.limits]
tokens_per_day = 1000000000
usd_per_day = "1000"
"""


def _usage(body: bytes) -> int:
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
    return 0


@dataclass
class Traffic:
    """Limited requests four at a time and key creations one at a time, until stopped."""

    urls: list[str]
    #: (start, end, status, tokens, request id)
    answers: list[tuple[float, float, int, int, str]] = field(default_factory=list)
    #: (start, end, status, key id)
    keys: list[tuple[float, float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(self._limited(client, w) for w in range(4)), self._keys(client))

    async def _limited(self, client: httpx.AsyncClient, worker: int) -> None:
        n = worker
        headers = {"authorization": f"Bearer {STEADY}", "x-sim-tokens": "8"}
        while not self.stop.is_set():
            body = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": f"question {n}"}]}  # fmt: skip
            started = time.monotonic()
            try:
                url = self.urls[n % 2] + "/v1/chat/completions"
                response = await client.post(url, json=body, headers=headers)
                status, content = response.status_code, response.content
                request_id = response.headers.get("x-request-id", "")
            except httpx.HTTPError:
                status, content, request_id = 0, b"", ""
            self.answers.append((started, time.monotonic(), status, _usage(content), request_id))
            n += 4
            if status != 200:
                await asyncio.sleep(0.02)

    async def _keys(self, client: httpx.AsyncClient) -> None:
        n = 0
        headers = {"authorization": f"Bearer {ADMIN}"}
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                url = self.urls[n % 2] + "/v1/gateway/keys"
                response = await client.post(url, json={"client": f"k{n}"}, headers=headers)
                status = response.status_code
                key_id = response.json().get("id", "") if status == 201 else ""
            except (httpx.HTTPError, ValueError):
                status, key_id = 0, ""
            self.keys.append((started, time.monotonic(), status, key_id))
            n += 1
            if status != 201:
                await asyncio.sleep(0.02)


@dataclass
class Outcome:
    deployment: str
    scenario: str
    setting: str
    gap: float
    served: int
    counted: int
    keys_created: int
    keys_lost: int
    receipts: int
    receipts_lost: int
    refused: int
    keys_refused: int
    backend_errors: int
    rate_before: float

    def row(self) -> str:
        return (
            f"| {self.deployment} | {self.scenario} | {self.setting} | {self.gap:.1f} s | "
            f"{self.served - self.counted} of {self.served} | {self.keys_lost} of "
            f"{self.keys_created} | {self.receipts_lost} of {self.receipts} | {self.refused} "
            f"| {self.backend_errors} | {self.keys_refused} | {self.rate_before:.0f}/s |"
        )


class Deployment:
    """What a run needs of a Sentinel set or a Cluster, one face."""

    def __init__(self, kind: str, directory: Path, data: dict[str, str]) -> None:
        self.kind = kind
        self.set: Any = (
            SentinelSet(directory, PASSWORD, data=data)
            if kind == "sentinel"
            else ClusterSet(directory, PASSWORD, data=data)
        )

    def __enter__(self) -> Deployment:
        self.set.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.set.stop()

    @property
    def target(self) -> RedisTarget:
        return sentinel_target(self.set) if self.kind == "sentinel" else cluster_target(self.set)

    @property
    def settings(self) -> str:
        where = [f'redis_url = "{self.set.url}"', f'redis_mode = "{self.kind}"',
                 f"redis_nodes = {json.dumps(self.set.nodes)}"]  # fmt: skip
        if self.kind == "sentinel":
            where.append(f'redis_service = "{self.set.service}"')
        return "\n".join(where)

    def _owner(self, key: str) -> int:
        """The port of the master that owns ``key``'s slot (every range of each)."""
        live = next(n for n in self.set.nodes_ if n.proc is not None and n.proc.poll() is None)
        slot = int(self.set.ask(live, "CLUSTER", "KEYSLOT", key).strip())
        for line in self.set.ask(live, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(parts[1].split(":")[1].split("@")[0])
        raise AssertionError(f"no master owns slot {slot}")

    def gather(self) -> None:
        """Cluster: the receipts' slot (empty yet) moved to the master of the issued
        keys' slot, so that one kill puts all three users' writes at risk."""
        if self.kind == "sentinel":
            return
        victim = self._owner("gateway:{gateway-keys}:x")
        if self._owner("gateway:{spend}:x") == victim:
            return
        target = self.node(victim)
        slot = self.set.ask(target, "CLUSTER", "KEYSLOT", "gateway:{spend}:x").strip()
        me = self.set.ask(target, "CLUSTER", "MYID").strip()
        for node in self.set.nodes_:
            self.set.ask(node, "CLUSTER", "SETSLOT", slot, "NODE", me)
        wait_for(lambda: self._owner("gateway:{spend}:x") == victim, 30,
                 "the receipts' slot on the keys' master")  # fmt: skip
        self.set.wait_ok()

    def client_name(self) -> str:
        """A client whose hash tag is on the master that holds the keys and receipts."""
        if self.kind == "sentinel":
            return "steady"
        victim = self.victim()
        assert self._owner("gateway:{spend}:x") == victim, "receipts on another master"
        names = (f"steady{i}" for i in range(1000))
        return next(n for n in names if self._owner(f"gateway:{{{n}}}:x") == victim)

    def victim(self) -> int:
        if self.kind == "sentinel":
            return int(self.set.master_port())
        return self._owner("gateway:{gateway-keys}:x")

    def replicas(self, master: int) -> list[Any]:
        """The nodes that replicate ``master`` now."""
        nodes = self.set.data_nodes if self.kind == "sentinel" else self.set.nodes_
        return [
            n
            for n in nodes
            if n.port != master
            and f"master_port:{master}" in self.set.ask(n, "INFO", "replication")
        ]

    def node(self, port: int) -> Any:
        nodes = self.set.data_nodes if self.kind == "sentinel" else self.set.nodes_
        return next(n for n in nodes if n.port == port)

    def kill(self, port: int) -> None:
        self.node(port).kill()

    def wait_failed_over(self, old: int) -> None:
        if self.kind == "sentinel":
            self.set.wait_promoted(old, 60)
        else:
            self.set.wait_failed_over(old, 60)


def _one_run(
    kind: str, scenario: str, setting: str, lag: float, upstream: str, directory: Path
) -> Outcome:
    data = MIN_REPLICAS if setting != "default" else {}
    with Deployment(kind, directory / "redis", data) as redis:
        redis.gather()
        client = redis.client_name()
        config = directory / "gateway.toml"
        config.write_text(_config(upstream, redis.settings, client))
        with (
            gateway_process(["--config", str(config)]) as a,
            gateway_process(["--config", str(config)]) as b,
        ):
            traffic = Traffic([a.url, b.url])
            runner = threading.Thread(target=traffic.run, daemon=True)
            runner.start()
            wait_for(lambda: sum(1 for x in traffic.answers if x[2] == 200) >= 40, 60,
                     "traffic admitted")  # fmt: skip
            time.sleep(1.0)
            victim = redis.victim()
            replicas = redis.replicas(victim)
            assert replicas, "the master's replicas"
            stalled = time.monotonic()
            if scenario == "lag":
                # the replicas stalled and their links cut: what the master acknowledges
                # from now on reaches no replica (what was on the way before is in their
                # sockets, and is read when they go on)
                for node in replicas:
                    node.proc.send_signal(signal.SIGSTOP)
                redis.set.ask(redis.node(victim), "CLIENT", "KILL", "TYPE", "replica")
                time.sleep(lag)
            killed = time.monotonic()
            redis.kill(victim)
            if scenario == "lag":
                for node in replicas:
                    node.proc.send_signal(signal.SIGCONT)
            redis.wait_failed_over(victim)
            failed_over = time.monotonic() - killed
            # the killed node started again (as an orchestrator would), empty: it comes
            # back as the new master's replica (with min-replicas-to-write, a cluster's new
            # master has no other and refuses writes until it does)
            redis.node(victim).start()
            redis.node(victim).wait_listening()
            time.sleep(2.0)
            traffic.stop.set()
            runner.join(60)
            errors = sum(_backend_errors(gw.url) for gw in (a, b))
        # what the new master holds, after the kept settlements were sent again
        reader = sync_client(redis.target, timeout=5.0)
        try:
            served = sum(x[3] for x in traffic.answers if x[2] == 200)

            pattern = f"gateway:{{{client}}}:*tokens_per_day*"

            def counted() -> int:
                keys = reader.scan_iter(match=pattern, count=1000)
                return sum(int(reader.get(k) or 0) for k in keys)

            with contextlib.suppress(AssertionError):
                wait_for(lambda: counted() >= served, 15, "settlements sent")
            total = counted()
            created = [x[3] for x in traffic.keys if x[2] == 201]
            held = {k.decode() for k in reader.hkeys("gateway:{gateway-keys}:docs")}
            answered = [x[4] for x in traffic.answers if x[2] == 200 and x[4]]

            def receipts() -> int:
                return sum(int(reader.exists(f"gateway:{{spend}}:receipt:{r}")) for r in answered)

            with contextlib.suppress(AssertionError):  # the kept ones written again
                wait_for(lambda: receipts() == len(answered), 15, "receipts written")
            found = receipts()
        finally:
            reader.close()
    before = [x for x in traffic.answers if stalled - 1.0 <= x[1] < stalled]
    return Outcome(
        kind,
        scenario,
        setting,
        failed_over,
        served,
        total,
        len(created),
        len(set(created) - held),
        len(answered),
        len(answered) - found,
        sum(1 for x in traffic.answers if x[2] != 200),
        sum(1 for x in traffic.keys if x[2] != 201),
        errors,
        sum(1 for x in before if x[2] == 200) / 1.0,
    )


def _backend_errors(url: str) -> int:
    """The gateway's failed limits calls (-1: its /metrics did not answer in 30 s)."""
    try:
        text = httpx.get(url + "/metrics", timeout=30).text
    except httpx.HTTPError:
        return -1
    return int(metric_value(text, "gateway_limit_backend_errors_total"))


def _wait_cost(directory: Path, count: int) -> tuple[float, float, float, float]:
    """p50 and p99 (ms) of a script call alone, then followed by ``WAIT 1 1000``."""
    with Deployment("sentinel", directory, {}) as redis:
        client = sync_client(redis.target, timeout=5.0)
        script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        try:
            results = []
            for wait in (False, True):
                took = []
                for _ in range(count):
                    started = time.perf_counter()
                    script(keys=["gateway:{wait}:n"], args=[1])
                    if wait:
                        client.execute_command("WAIT", 1, 1000)
                    took.append((time.perf_counter() - started) * 1000)
                took.sort()
                results += [statistics.median(took), took[int(len(took) * 0.99)]]
        finally:
            client.close()
    return results[0], results[1], results[2], results[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--lag", type=float, default=2.0)
    parser.add_argument("--only", choices=["sentinel", "cluster"])
    args = parser.parse_args()
    kinds = [args.only] if args.only else ["sentinel", "cluster"]
    sim_port = free_port()
    simulator = subprocess.Popen(
        [sys.executable, "-m", "gateway", "simulate", "--port", str(sim_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _all(args, kinds, f"http://127.0.0.1:{sim_port}/v1")
    finally:
        simulator.terminate()
        simulator.wait(10)


def _all(args: argparse.Namespace, kinds: list[str], upstream: str) -> None:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        wait_for(lambda: httpx.get(upstream[:-3] + "/healthz").status_code < 500, 30,
                 "the simulator")  # fmt: skip
        n = 0
        for _ in range(args.runs):
            for kind in kinds:
                for scenario in ("kill", "lag"):
                    for setting in ("default", "min-replicas-to-write 1"):
                        n += 1
                        outcome = _one_run(
                            kind, scenario, setting, args.lag, upstream, Path(tmp) / str(n)
                        )
                        print(outcome.row(), flush=True)
                        outcomes.append(outcome)
        alone50, alone99, wait50, wait99 = _wait_cost(Path(tmp) / "wait", 2000)
    print(
        "\n| deployment | scenario | masters | failover (kill to the new master seen) "
        "| tokens served and not counted | keys answered 201 and lost | receipts lost "
        "| requests not 200 "
        "| limits calls failed (served unreserved) | keys refused | limited requests/s in "
        "the last second before the stall or kill |\n" + "|---" * 11 + "|"
    )
    for outcome in outcomes:
        print(outcome.row())
    print(
        f"\nWAIT 1 1000 after each script call (2,000 calls on the Sentinel set's master): "
        f"p50 {alone50:.2f} -> {wait50:.2f} ms, p99 {alone99:.2f} -> {wait99:.2f} ms"
    )


if __name__ == "__main__":
    main()

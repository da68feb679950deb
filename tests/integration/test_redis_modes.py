"""Redis in each mode, for real: a six-node Cluster and a Sentinel set on loopback.

The limits' scripts run on every master's slots (a burst of many clients in one
pipeline: a command that touched two slots would be CROSSSLOT); the start-up
question names the mode and the nodes it found; bad input (a dead seed, a wrong
password, an unknown service, a Sentinel naming a master that does not answer)
is one clear sentence and exit 2 from ``check-config`` and ``serve``, within
seconds, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.limits.backend import Ask, Bill
from gateway.limits.redis_backend import RedisBackend
from gateway.policy.quota import Limit, Rule, checks_for
from gateway.redisconn import RedisTarget
from gateway.redisconn.check import RedisUnusable, inspect
from gateway.redisconn.clients import async_client
from tests.cli import run_cli, run_cli_process
from tests.conftest import free_port
from tests.integration.redis_sets import (
    PASSWORD,
    SERVICE,
    ClusterSet,
    SentinelSet,
    _Node,
    cluster_target,
    redis_cluster,  # noqa: F401 (a fixture)
    redis_sentinel,  # noqa: F401 (a fixture)
    sentinel_target,
)

NOW = float(int(time.time()) // 60 * 60 + 3630)


def _target(request: pytest.FixtureRequest, mode: str) -> RedisTarget:
    if mode == "cluster":
        return cluster_target(request.getfixturevalue("redis_cluster"))
    return sentinel_target(request.getfixturevalue("redis_sentinel"))


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_the_limits_scripts_run_on_every_slot(request: pytest.FixtureRequest, mode: str) -> None:
    """60 clients (60 hash tags: every master of the cluster) reserve 3 each against a
    limit of 2 in one burst, then settle: each is admitted exactly twice, and what each
    counter holds is what was served."""
    target = _target(request, mode)
    prefix = f"modes{time.monotonic_ns()}"
    teams = [f"team{i}" for i in range(60)]
    rules = {
        t: Rule(t, {Limit.REQUESTS_PER_MINUTE: 2, Limit.TOKENS_PER_MINUTE: 10_000}) for t in teams
    }

    async def main() -> tuple[list[Any], list[list[int | None]], list[list[int]]]:
        backend = RedisBackend(target, timeout=2.0, prefix=prefix)
        try:
            await backend.prepare()
            asks = [(t, Ask(f"{t}-{n}", 90, 10, False, 600.0)) for t in teams for n in range(3)]
            answers = await asyncio.gather(
                *(backend.reserve(checks_for([rules[t]], True, NOW), a, NOW) for t, a in asks)
            )
            settled = await asyncio.gather(
                *(
                    backend.settle(
                        checks_for([rules[t]], True, NOW),
                        checks_for([rules[t]], True, NOW),
                        a,
                        Bill(100, 40),
                    )
                    for (t, a), answer in zip(asks, answers, strict=True)
                    if answer.refused is None
                )
            )
            read = [await backend.read(checks_for([rules[t]], True, NOW), NOW) for t in teams]
            return answers, settled, read
        finally:
            await backend.close()

    answers, settled, read = asyncio.run(main())
    admitted = [a for a in answers if a.refused is None]
    assert len(admitted) == 2 * len(teams)
    assert all(s[0] is not None for s in settled)
    assert read == [[2, 80]] * len(teams)


def test_a_clusters_keys_fall_on_every_master(redis_cluster: ClusterSet) -> None:  # noqa: F811
    """The hash tags of the limits' clients and of the streams spread over all masters
    (so the cluster tests above and the store's exercise every node)."""
    owners = {redis_cluster.owner(f"gateway:{{team{i}}}:x") for i in range(60)}
    assert owners == set(redis_cluster.masters())


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_the_start_up_names_the_mode_and_the_nodes(
    request: pytest.FixtureRequest, mode: str
) -> None:
    target = _target(request, mode)
    found = asyncio.run(inspect(target))
    assert found.startswith(f"redis: {mode}")
    if mode == "cluster":
        deployment: Any = request.getfixturevalue("redis_cluster")
        for port in deployment.masters():
            assert f"127.0.0.1:{port}" in found
    else:
        deployment = request.getfixturevalue("redis_sentinel")
        assert f"master 127.0.0.1:{deployment.master_port()}" in found
        assert all(
            f"127.0.0.1:{r.port}" in found
            for r in deployment.data_nodes
            if r.port != deployment.master_port()
        )


def _env(target: RedisTarget, password: str | None = None) -> dict[str, str]:
    env = {
        "GATEWAY_UPSTREAM_URL": "http://127.0.0.1:9",
        "GATEWAY_STREAM_STORE": "redis",
        "GATEWAY_REDIS_URL": target.url,
        "GATEWAY_REDIS_MODE": target.mode,
        "GATEWAY_REDIS_NODES": json.dumps([f"{h}:{p}" for h, p in target.nodes]),
    }
    if target.service:
        env["GATEWAY_REDIS_SERVICE"] = target.service
    return env


def _bad_inputs(
    request: pytest.FixtureRequest, tmp_path: Path
) -> dict[str, tuple[RedisTarget, str]]:
    cluster: ClusterSet = request.getfixturevalue("redis_cluster")
    sentinel: SentinelSet = request.getfixturevalue("redis_sentinel")
    dead = f"127.0.0.1:{free_port()}"
    return {
        "a seed list with a dead node": (
            RedisTarget.build("cluster", cluster.url, [*cluster.nodes[1:3], dead]),
            f"cluster seed {dead} does not answer",
        ),
        "a wrong password (cluster)": (
            RedisTarget.build("cluster", cluster.url.replace(PASSWORD, "wrong"), []),
            "the password (or user) is refused",
        ),
        "a wrong password (sentinel)": (
            RedisTarget.build(
                "sentinel", sentinel.url.replace(PASSWORD, "wrong"), sentinel.nodes, SERVICE
            ),
            "the password (or user) is refused",
        ),
        "an unknown service": (
            RedisTarget.build("sentinel", sentinel.url, sentinel.nodes, "nope"),
            "knows no service 'nope'",
        ),
        "a seed that is not a cluster node": (
            RedisTarget.build(
                "cluster",
                sentinel.url.replace("127.0.0.1/", f"127.0.0.1:{sentinel.master_port()}/"),
                [],
            ),
            "is not a cluster node",
        ),
    }


@pytest.fixture(scope="module")
def orphan_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A sentinel watching a master that does not answer (nothing on its port)."""
    node = _Node(
        tmp_path_factory.mktemp("orphan"),
        "sentinel",
        {"sentinel monitor": f"{SERVICE} 127.0.0.1 {free_port()} 1",
         "sentinel down-after-milliseconds": f"{SERVICE} 60000"},
        sentinel=True,
    )  # fmt: skip
    node.start()
    try:
        node.wait_listening()
        yield RedisTarget.build("sentinel", "redis://x/0", [f"127.0.0.1:{node.port}"], SERVICE)
    finally:
        node.stop()


def test_a_sentinel_naming_a_master_that_does_not_answer_is_an_error(
    orphan_sentinel: RedisTarget,
) -> None:
    with pytest.raises(
        RedisUnusable,
        match=r"the master 127\.0\.0\.1:\d+ the sentinels name for 'gw' does not answer",
    ):
        asyncio.run(inspect(orphan_sentinel, bound=2.0))
    result = run_cli("check-config", env=_env(orphan_sentinel))
    assert result.returncode == 2
    assert "does not answer" in result.stderr


@pytest.mark.parametrize(
    "case",
    [
        "a seed list with a dead node",
        "a wrong password (cluster)",
        "a wrong password (sentinel)",
        "an unknown service",
        "a seed that is not a cluster node",
    ],
)
def test_bad_input_is_a_clear_error_in_check_config(
    request: pytest.FixtureRequest, tmp_path: Path, case: str
) -> None:
    target, says = _bad_inputs(request, tmp_path)[case]
    started = time.monotonic()
    result = run_cli("check-config", env=_env(target))
    assert result.returncode == 2, result.stderr
    assert f"gateway: redis ({target.mode}): " in result.stderr
    assert says in result.stderr
    assert time.monotonic() - started < 30  # bounded: never a hang


def test_bad_input_stops_serve_at_start(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The real process: exit 2 and the sentence, before it listens."""
    target, says = _bad_inputs(request, tmp_path)["a seed list with a dead node"]
    result = run_cli_process("serve", "--port", str(free_port()), env=_env(target), timeout=60)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_check_config_names_what_it_found(redis_sentinel: SentinelSet) -> None:  # noqa: F811
    result = run_cli("check-config", env=_env(sentinel_target(redis_sentinel)))
    assert result.returncode == 0, result.stderr
    assert (
        f"gateway: redis: sentinel, service 'gw': master 127.0.0.1:{redis_sentinel.master_port()}"
        in result.stderr
    )


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_the_factorys_client_reads_and_writes(request: pytest.FixtureRequest, mode: str) -> None:
    """The one client every user builds: a key written is read back, a stream read with
    XREAD BLOCK wakes at the XADD."""
    target = _target(request, mode)

    async def main() -> Any:
        client = async_client(target, socket_timeout=None, connect_timeout=2.0)
        reader = async_client(target, socket_timeout=None, connect_timeout=2.0)
        try:
            key = f"t:{{{mode}}}:log"
            waiting = asyncio.ensure_future(reader.xread({key: "0-0"}, block=5000))
            await client.xadd(key, {"e": b"x"}, id="0-1")
            async with asyncio.timeout(10):
                return await waiting
        finally:
            await client.aclose()
            await reader.aclose()

    got = asyncio.run(main())
    assert got[0][1][0][1] == {b"e": b"x"}


def test_the_compose_ha_profile_makes_a_working_sentinel_set(tmp_path: Path) -> None:
    """compose.yaml's ``ha`` profile, its very commands run on loopback (names made
    127.0.0.1, each node on a free port): the gateway finds the master and both replicas."""
    import subprocess

    import yaml

    from tests.integration.redis_server import _binary
    from tests.integration.redis_sets import wait_for

    root = Path(__file__).resolve().parents[2]
    services = yaml.safe_load((root / "compose.yaml").read_text())["services"]
    names = ["redis-master", "redis-replica-1", "redis-replica-2"]
    ports = {name: free_port() for name in [*names, "sentinel-1", "sentinel-2", "sentinel-3"]}
    procs: list[subprocess.Popen[bytes]] = []

    def local(text: str) -> str:
        for name in ports:
            text = text.replace(name, "127.0.0.1")
        return text

    try:
        for name in names:
            command = [local(part) for part in services[name]["command"]]
            if "--replicaof" in command:
                command[command.index("--replicaof") + 2] = str(ports["redis-master"])
            command[0] = _binary()
            extra = ["--port", str(ports[name]), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
            procs.append(subprocess.Popen([*command, *extra], stdout=subprocess.DEVNULL))
        for i in (1, 2, 3):
            script = services[f"sentinel-{i}"]["command"][2]
            script = script.replace("redis-master 6379", f"127.0.0.1 {ports['redis-master']}")
            script = script.replace(
                "'port 26379'", f"'port {ports[f'sentinel-{i}']}' 'bind 127.0.0.1'"
            )
            script = local(script).replace("/tmp/sentinel.conf", str(tmp_path / f"s{i}.conf"))
            script = script.replace("exec redis-server", f"exec {_binary()}")
            procs.append(subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL))
        sentinels = [f"127.0.0.1:{ports[f'sentinel-{i}']}" for i in (1, 2, 3)]
        target = RedisTarget.build("sentinel", "redis://127.0.0.1/0", sentinels, "gateway")
        found: list[str] = []

        def both_replicas() -> bool:
            found[:] = [asyncio.run(inspect(target, bound=1.0))]
            return all(f"127.0.0.1:{ports[n]}" in found[0] for n in names[1:])

        wait_for(both_replicas, 30, "the sentinels know the master and both replicas")
        assert f"master 127.0.0.1:{ports['redis-master']}" in found[0]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_pub_sub_through_the_factorys_client(request: pytest.FixtureRequest, mode: str) -> None:
    """A message published by one client reaches another's subscription (issued keys'
    changes go this way): on a cluster, through the cluster bus, whatever nodes the two
    clients picked."""
    target = _target(request, mode)

    async def main() -> Any:
        publisher = async_client(target, socket_timeout=None, connect_timeout=2.0)
        listener = async_client(target, socket_timeout=None, connect_timeout=2.0)
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe("t:changes")
            async with asyncio.timeout(10):
                while True:  # published until the subscription has it (it may lag)
                    await publisher.publish("t:changes", b"v1")
                    message = await pubsub.get_message(timeout=0.2)
                    if message is not None:
                        return message["data"]
        finally:
            await pubsub.aclose()
            await publisher.aclose()
            await listener.aclose()

    assert asyncio.run(main()) == b"v1"


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
def test_receipts_and_issued_keys_on_each_mode(request: pytest.FixtureRequest, mode: str) -> None:
    """The spend ledger's transaction (a receipt and its day's totals, one hash tag) and
    the issued keys' scripts run on the factory's client in each mode: a command that
    touched two slots would fail on the cluster."""
    from gateway.keys.redis_store import RedisKeyStore
    from gateway.spend.ledger import Entry, RedisLedger, Row

    target = _target(request, mode)
    request_id = f"req-{time.monotonic_ns()}"
    day = int(time.time()) // 86400

    async def main() -> tuple[Any, Any, Any, Any]:
        ledger = RedisLedger(target, 2.0, 600, 30, prefix=f"modes{time.monotonic_ns()}")
        keys = RedisKeyStore(target, 2.0)
        try:
            row = Row(day, "alice", "team", "sim-model", "v1", "reported")
            # a WebSocket response's: its resp_ id an alias, in the same transaction
            await ledger.keep(Entry(request_id, "alice", {"cost": 1}, row, 1500, ("resp_1@alice",)))
            found = None
            for _ in range(200):  # written by the ledger's own task: polled, 10 s at most
                found = await ledger.receipt(request_id)
                if found is not None:
                    break
                await asyncio.sleep(0.05)
            alias = await ledger.receipt("resp_1@alice")
            return found, alias, await ledger.totals(day, day), await keys.load()
        finally:
            await ledger.close()
            await keys._redis.aclose()

    receipt, alias, totals, loaded = asyncio.run(main())
    assert receipt == alias == ("alice", {"cost": 1})
    assert [(t.row.client, t.nanos, t.requests) for t in totals] == [("alice", 1500, 1)]
    version, issued = loaded
    assert version >= 0
    assert isinstance(issued, dict)


def test_a_tls_cluster_with_a_password(tmp_path: Path) -> None:
    """rediss:// on a cluster whose nodes speak TLS only (clients, replication, bus): the
    start-up question, the limits' scripts and a stream log go through it."""
    from gateway.app import store_connection
    from gateway.store import End
    from gateway.store.redis_store import RedisStore
    from tests.integration.redis_sets import cluster_set

    with cluster_set(tmp_path, password=PASSWORD, tls=True) as deployment:
        target = RedisTarget.build("cluster", deployment.url, deployment.nodes)
        assert target.tls
        found = asyncio.run(inspect(target))
        assert found.startswith("redis: cluster, masters")
        rule = Rule("tls", {Limit.REQUESTS_PER_MINUTE: 1})
        checks = checks_for([rule], True, NOW)

        async def main() -> tuple[Any, Any, Any]:
            backend = RedisBackend(target, timeout=2.0, prefix="tls")
            store = RedisStore(store_connection(target, 5.0), 5.0, 1 << 20, prefix="tls")
            try:
                await backend.prepare()
                first = await backend.reserve(checks, Ask("a", 1, 1, False, 60.0), NOW)
                second = await backend.reserve(checks, Ask("b", 1, 1, False, 60.0), NOW)
                await store.prepare()
                writer = await store.open("alice", {}, max_bytes=1 << 16, ttl=30, lease=3)
                assert writer is not None
                writer.append(b"data: 1\n\n")
                await writer.finish(End(b": end\n\n"))
                return first, second, await store.read(writer.id, 0)
            finally:
                await backend.close()
                await store.close()

        first, second, batch = asyncio.run(main())
        assert first.refused is None
        assert second.refused == 0  # the limit of one held, over TLS
        assert batch.events == [b"data: 1\n\n"]


@pytest.mark.parametrize("which", ["port", "bus port"])
def test_a_cluster_starts_though_a_nodes_port_was_taken_meanwhile(
    tmp_path: Path, which: str
) -> None:
    """A port chosen free can be taken before its node binds it (an outgoing connection's
    ephemeral port, another test's server): the node exits at start, and is started again
    on fresh ports, rather than awaited until a deadline (the flake "node3 not within
    20 s" of a loaded machine)."""
    import socket

    deployment = ClusterSet(tmp_path, replicas=0)
    node = deployment.nodes_[1]
    taken = node.port if which == "port" else node.bus
    assert taken is not None
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            deployment.start()
            assert taken not in (node.port, node.bus)
            assert "cluster_state:ok" in deployment.ask(node, "CLUSTER", "INFO")
            assert len(deployment.masters()) == 3
        finally:
            deployment.stop()


def test_a_tls_sentinel_set_with_a_password(tmp_path: Path) -> None:
    """rediss:// on a Sentinel set whose every node (the master, its replicas, the
    sentinels, and replication between them) speaks TLS only: the start-up question
    asks the sentinels and the master over TLS, and the limits' scripts and a stream log
    go through the master they name; plain redis:// is refused at start."""
    from gateway.app import store_connection
    from gateway.store import End
    from gateway.store.redis_store import RedisStore
    from tests.integration.redis_sets import sentinel_set

    with sentinel_set(tmp_path, password=PASSWORD, tls=True) as deployment:
        target = sentinel_target(deployment)
        assert target.tls
        found = asyncio.run(inspect(target))
        assert found.startswith(
            f"redis: sentinel, service 'gw': master 127.0.0.1:{deployment.master_port()}"
        )
        rule = Rule("tls", {Limit.REQUESTS_PER_MINUTE: 1})
        checks = checks_for([rule], True, NOW)

        async def main() -> tuple[Any, Any, Any]:
            backend = RedisBackend(target, timeout=2.0, prefix="tls")
            store = RedisStore(store_connection(target, 5.0), 5.0, 1 << 20, prefix="tls")
            try:
                await backend.prepare()
                first = await backend.reserve(checks, Ask("a", 1, 1, False, 60.0), NOW)
                second = await backend.reserve(checks, Ask("b", 1, 1, False, 60.0), NOW)
                await store.prepare()
                writer = await store.open("alice", {}, max_bytes=1 << 16, ttl=30, lease=3)
                assert writer is not None
                writer.append(b"data: 1\n\n")
                await writer.finish(End(b": end\n\n"))
                return first, second, await store.read(writer.id, 0)
            finally:
                await backend.close()
                await store.close()

        first, second, batch = asyncio.run(main())
        assert first.refused is None
        assert second.refused == 0  # the limit of one held, over TLS
        assert batch.events == [b"data: 1\n\n"]
        # what a master the sentinels named holds, read over TLS on its own
        assert "role:master" in deployment.ask(deployment.master, "INFO", "replication")
        plain = RedisTarget.build(
            "sentinel", deployment.url.replace("rediss://", "redis://").split("?")[0],
            deployment.nodes, SERVICE,
        )  # fmt: skip
        with pytest.raises(RedisUnusable, match="does not answer"):
            asyncio.run(inspect(plain, bound=2.0))
        result = run_cli("check-config", env=_env(target))
        assert result.returncode == 0, result.stderr
        assert "gateway: redis: sentinel, service 'gw': master" in result.stderr

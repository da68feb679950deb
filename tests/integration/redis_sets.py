"""Real Redis deployments on free loopback ports: a Sentinel set (one master, two
replicas, three sentinels) and a six-node Cluster (three masters, each with a replica).

Started from Debian's ``redis-server`` (``--sentinel`` for the sentinels) and
``redis-cli --cluster create`` (redis-tools); nothing kept on disk but each node's
own config in the directory given; every process stopped by its PID. Failure
detection is set short (a second) so that a failover under test takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.redisconn import RedisTarget
from tests.conftest import free_port
from tests.integration.redis_server import _binary

__all__ = [
    "ClusterServer",
    "ClusterSet",
    "SentinelSet",
    "cluster_set",
    "cluster_target",
    "redis_cluster",
    "redis_sentinel",
    "sentinel_set",
    "sentinel_target",
    "wait_for",
]

SERVICE = "gw"
#: The shared deployments' password (each mode is driven with one).
PASSWORD = "s3cret-pw"


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``check`` until it holds, at most ``seconds`` (then fail naming ``what``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what}")


def _cli() -> str:
    found = shutil.which("redis-cli", path="/usr/bin:/usr/sbin:/usr/local/bin")
    if found is None:
        if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
            pytest.fail("redis-cli is not installed (.ci/run installs redis-tools)")
        pytest.skip("redis-cli is not installed (apt-get install redis-tools)")
    return found


def _ask(port: int, *command: str, password: str | None = None, ca: Path | None = None) -> str:
    """One command through redis-cli, its reply as text ("" when the node is away)."""
    auth = ["--no-auth-warning", "-a", password] if password else []
    tls = ["--tls", "--cacert", str(ca)] if ca else []
    done = subprocess.run(
        [_cli(), "-h", "127.0.0.1", "-p", str(port), *auth, *tls, *command],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.stdout.decode()


#: How long a node may take to listen, a set to agree, on a busy two-core machine
#: (every wait polls its condition: the deadline is only met by a failure).
READY_SECONDS = 90.0
#: Starts of one node on fresh ports after its port was taken meanwhile, at most.
PORT_RETRIES = 5


class NodeExited(Exception):
    """A node's process exited while it was awaited (its log's last lines say why)."""


class _Node:
    """One ``redis-server`` process. Its port (and its cluster bus port, ``bus``) are
    chosen free; a port taken by another process between that choice and the bind (an
    outgoing connection's ephemeral port, another test's server) makes the node exit at
    start: ``wait_listening`` then starts it again on fresh ports, as long as nothing
    was told its port yet (``movable``)."""

    def __init__(
        self,
        directory: Path,
        name: str,
        options: dict[str, str],
        sentinel: bool = False,
        *,
        bus: bool = False,
        tls: bool = False,
    ):
        self.port = free_port()
        self.bus = free_port() if bus else None
        self.tls = tls
        self.name = name
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.options = options
        self.sentinel = sentinel
        self.movable = True
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        base = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.dir),
            "daemonize": "no",
            "loglevel": "warning",
            "logfile": str(self.dir / "log"),
        }
        ports = {"port": "0", "tls-port": str(self.port)} if self.tls else {}
        if self.bus is not None:
            ports["cluster-port"] = str(self.bus)
        lines = [f"{k} {v}" for k, v in (base | self.options | ports).items()]
        config = self.dir / "redis.conf"
        if not config.exists() or not self.sentinel:  # a sentinel rewrites its own
            config.write_text("\n".join(lines) + "\n")
        args = [_binary(), str(config)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return " | ".join((self.dir / "log").read_text().strip().splitlines()[-3:])
        return "(no log)"

    def _exited(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise NodeExited(f"{self.name} exited at start: {self.log_tail()}")

    def _listening(self) -> bool:
        """It answers PING: a port that accepts a connection is not enough (the port of
        a node is bound before its bus port, whose bind may fail and end it)."""
        self._exited()
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
            ca = self.options.get("tls-ca-cert-file")
            password = None if self.sentinel else self.options.get("requirepass")
            with contextlib.suppress(subprocess.TimeoutExpired):
                answer = _ask(self.port, "PING", password=password, ca=Path(ca) if ca else None)
                self._exited()
                return answer.strip() == "PONG"
        return False

    def wait_listening(self, seconds: float = READY_SECONDS) -> None:
        """Poll until the node accepts connections; started again on fresh ports when
        its port was taken (while ``movable``); NodeExited at once for any other exit."""
        deadline = time.monotonic() + seconds
        for attempt in range(PORT_RETRIES + 1):
            try:
                while not self._listening():
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"not within {seconds} s: {self.name} listening on {self.port}"
                        )
                    time.sleep(0.05)
                self.movable = False
                return
            except NodeExited:
                taken = "Address already in use" in self.log_tail()
                if not (taken and self.movable and attempt < PORT_RETRIES):
                    raise
                self.port = free_port()
                self.bus = free_port() if self.bus is not None else None
                (self.dir / "redis.conf").unlink(missing_ok=True)
                (self.dir / "log").unlink(missing_ok=True)
                self.start()
        raise AssertionError("unreachable")

    def kill(self) -> None:
        """SIGKILL: no goodbye to its replicas or clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _data_options(password: str | None) -> dict[str, str]:
    # a replica's first sync at once (not after the 5 s a diskless sync waits by default)
    options = {"save": '""', "appendonly": "no", "repl-diskless-sync-delay": "0"}
    if password:
        options |= {"requirepass": password, "masterauth": password}
    return options


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made in ``directory``."""
    ca, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [*("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
         *("-keyout", str(key), "-out", str(ca), "-subj", "/CN=127.0.0.1"),
         *("-addext", "subjectAltName=IP:127.0.0.1")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return ca, key


def _tls_options(ca: Path, key: Path) -> dict[str, str]:
    return {
        "tls-cert-file": str(ca),
        "tls-key-file": str(key),
        "tls-ca-cert-file": str(ca),
        "tls-auth-clients": "no",
        "tls-replication": "yes",
    }


class SentinelSet:
    """A master, two replicas and three sentinels watching service ``gw`` (quorum 2).

    With ``tls``, every node (clients, replication, the sentinels' own links) speaks
    TLS only, with a self-signed certificate for 127.0.0.1 (``ca``), and ``url`` is a
    ``rediss://`` URL. Each node's port is told to the others only once it listens (a
    replica's ``replicaof``, a sentinel's ``monitor``), so a taken port is chosen again."""

    def __init__(
        self,
        directory: Path,
        password: str | None = None,
        tls: bool = False,
        data: dict[str, str] | None = None,
    ) -> None:
        self.password = password
        self.ca: Path | None = None
        extra: dict[str, str] = {}
        if tls:
            self.ca, key = _certificate(directory)
            extra = _tls_options(self.ca, key)
        #: more options of the data nodes (``min-replicas-to-write``...); not the sentinels'
        data_extra = extra | (data or {})
        self.master = _Node(directory, "master", _data_options(password) | data_extra, tls=tls)
        self.replicas = [
            _Node(directory, f"replica{i}", _data_options(password) | data_extra, tls=tls)
            for i in (1, 2)
        ]
        self.sentinels: list[_Node] = []
        for i in (1, 2, 3):
            options = {
                "sentinel down-after-milliseconds": f"{SERVICE} 1000",
                "sentinel failover-timeout": f"{SERVICE} 5000",
                "sentinel parallel-syncs": f"{SERVICE} 2",
            }
            if password:
                options["sentinel auth-pass"] = f"{SERVICE} {password}"
            self.sentinels.append(
                _Node(directory, f"sentinel{i}", extra | options, sentinel=True, tls=tls)
            )
        self.service = SERVICE

    @property
    def data_nodes(self) -> list[_Node]:
        return [self.master, *self.replicas]

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.ca is not None:
            return f"rediss://{auth}127.0.0.1/0?ssl_ca_certs={self.ca}"
        return f"redis://{auth}127.0.0.1/0"

    def start(self) -> SentinelSet:
        self.master.start()
        self.master.wait_listening()
        for node in self.replicas:
            node.options["replicaof"] = f"127.0.0.1 {self.master.port}"
            node.start()
        for node in self.replicas:
            node.wait_listening()
        wait_for(
            lambda: all("master_link_status:up" in self.ask(r, "INFO", "replication")
                        for r in self.replicas),
            READY_SECONDS, "replicas in sync",
        )  # fmt: skip
        # the monitor line first: a sentinel's config lists the master before its options
        monitor = {"sentinel monitor": f"{SERVICE} 127.0.0.1 {self.master.port} 2"}
        for node in self.sentinels:
            node.options = monitor | node.options
            node.start()
        for node in self.sentinels:
            node.wait_listening()

        def agreed() -> bool:
            for s in self.sentinels:
                state = self._ask_sentinel(s, "SENTINEL", "MASTER", SERVICE)
                if "num-other-sentinels\n2" not in state or "num-slaves\n2" not in state:
                    return False
            return True

        wait_for(agreed, READY_SECONDS, "sentinels know each other and both replicas")
        return self

    def _ask_sentinel(self, sentinel: _Node, *command: str) -> str:
        return _ask(sentinel.port, *command, ca=self.ca)

    def ask(self, node: _Node, *command: str) -> str:
        return _ask(node.port, *command, password=self.password, ca=self.ca)

    def master_port(self) -> int:
        """The master the sentinels name now."""
        reply = self._ask_sentinel(
            self.sentinels[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        return int(reply.split()[1])

    def node_at(self, port: int) -> _Node:
        return next(n for n in self.data_nodes if n.port == port)

    def kill_master(self) -> int:
        """SIGKILL the current master; its port."""
        port = self.master_port()
        self.node_at(port).kill()
        return port

    def wait_promoted(self, old: int, seconds: float = 30) -> int:
        """Poll until the sentinels name a new master that says it is one; its port."""

        def promoted() -> bool:
            port = self.master_port()
            return port != old and "role:master" in self.ask(
                self.node_at(port), "INFO", "replication"
            )

        wait_for(promoted, seconds, "a replica promoted")
        return self.master_port()

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data_nodes]:
            node.stop()


class ClusterSet:
    """Three masters, each with ``replicas`` replicas (one: six nodes), made by
    ``redis-cli --cluster create``."""

    def __init__(
        self,
        directory: Path,
        password: str | None = None,
        tls: bool = False,
        replicas: int = 1,
        data: dict[str, str] | None = None,
    ) -> None:
        self.password = password
        self.replicas = replicas
        #: With ``tls``, every node (clients, replication, the bus) speaks TLS only, with a
        #: self-signed certificate for 127.0.0.1 (``ca``), and ``url`` is ``rediss://``.
        self.ca: Path | None = None
        options = _data_options(password) | {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "1000",
            "cluster-replica-validity-factor": "0",
        }
        if tls:
            self.ca, key = _certificate(directory)
            options |= _tls_options(self.ca, key) | {"tls-cluster": "yes"}
        options |= data or {}  # more options (``min-replicas-to-write``...)
        # each node's bus port is chosen free too (port + 10000 may be taken or past 65535)
        self.nodes_ = [
            _Node(directory, f"node{i}", dict(options), bus=True, tls=tls)
            for i in range(3 * (1 + replicas))
        ]

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes_]

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.ca is not None:
            return f"rediss://{auth}127.0.0.1:{self.nodes_[0].port}/0?ssl_ca_certs={self.ca}"
        return f"redis://{auth}127.0.0.1:{self.nodes_[0].port}/0"

    def ask(self, node: _Node, *command: str) -> str:
        return _ask(node.port, *command, password=self.password, ca=self.ca)

    def start(self) -> ClusterSet:
        for node in self.nodes_:
            node.start()
        for node in self.nodes_:
            node.wait_listening()
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        if self.ca is not None:
            auth += ["--tls", "--cacert", str(self.ca)]
        subprocess.run(
            [_cli(), *auth, "--cluster", "create", *self.nodes, "--cluster-replicas",
             str(self.replicas), "--cluster-yes"],
            capture_output=True, timeout=READY_SECONDS, check=True,
        )  # fmt: skip
        self.wait_ok()

        def synced() -> bool:  # a replica not yet in sync would fail over empty
            infos = [self.ask(n, "INFO", "replication") for n in self.nodes_]
            replicas = [i for i in infos if "role:slave" in i]
            return len(replicas) == 3 * self.replicas and all(
                "master_link_status:up" in i for i in replicas
            )

        wait_for(synced, READY_SECONDS, "every replica in sync with its master")
        return self

    def restart(self) -> None:
        """Start every stopped node again on its port (its ``nodes.conf`` kept: the same
        cluster, its data gone) and poll until the cluster is ok."""
        for node in self.nodes_:
            if node.proc is None or node.proc.poll() is not None:
                node.start()
        for node in self.nodes_:
            node.wait_listening()
        self.wait_ok()

    def wait_ok(self, seconds: float = READY_SECONDS) -> None:
        """Every live node says cluster_state:ok and every master has a replica in sync."""

        def ok() -> bool:
            live = [n for n in self.nodes_ if n.proc is not None and n.proc.poll() is None]
            return all("cluster_state:ok" in self.ask(n, "CLUSTER", "INFO") for n in live)

        wait_for(ok, seconds, "cluster_state:ok on every node")

    def masters(self) -> dict[int, tuple[int, int]]:
        """Port of each live master -> its first slot range."""
        found: dict[int, tuple[int, int]] = {}
        for line in self.ask(self._live(), "CLUSTER", "NODES").splitlines():
            parts = line.split()
            flags = parts[2].split(",")
            if "master" in flags and "fail" not in flags and len(parts) > 8:
                low, _, high = parts[8].partition("-")
                found[int(parts[1].split(":")[1].split("@")[0])] = (int(low), int(high or low))
        return found

    def _live(self) -> _Node:
        return next(n for n in self.nodes_ if n.proc is not None and n.proc.poll() is None)

    def owner(self, key: str) -> int:
        slot = int(self.ask(self._live(), "CLUSTER", "KEYSLOT", key).strip())
        return next(p for p, (lo, hi) in self.masters().items() if lo <= slot <= hi)

    def kill(self, port: int) -> None:
        next(n for n in self.nodes_ if n.port == port).kill()

    def wait_failed_over(self, port: int, seconds: float = 30) -> None:
        """Poll until the killed master's slots are another live master's, and ok."""
        wait_for(lambda: port not in self.masters() and len(self.masters()) == 3, seconds,
                 f"the slots of {port} taken over")  # fmt: skip
        self.wait_ok(seconds)

    def stop(self) -> None:
        for node in self.nodes_:
            node.stop()


@contextlib.contextmanager
def sentinel_set(
    directory: Path, password: str | None = None, tls: bool = False
) -> Iterator[SentinelSet]:
    deployment = SentinelSet(directory, password, tls)
    try:
        yield deployment.start()
    finally:
        deployment.stop()


@contextlib.contextmanager
def cluster_set(
    directory: Path,
    password: str | None = None,
    tls: bool = False,
    replicas: int = 1,
    data: dict[str, str] | None = None,
) -> Iterator[ClusterSet]:
    deployment = ClusterSet(directory, password, tls, replicas, data)
    try:
        yield deployment.start()
    finally:
        deployment.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    """One six-node cluster per test process (a test that kills a node starts its own)."""
    with cluster_set(tmp_path_factory.mktemp("cluster"), password=PASSWORD) as deployment:
        yield deployment


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """One Sentinel set per test process (a test that kills its master starts its own)."""
    with sentinel_set(tmp_path_factory.mktemp("sentinel"), password=PASSWORD) as deployment:
        yield deployment


def cluster_target(deployment: ClusterSet) -> RedisTarget:
    return RedisTarget.build("cluster", deployment.url, deployment.nodes)


def sentinel_target(deployment: SentinelSet) -> RedisTarget:
    return RedisTarget.build("sentinel", deployment.url, deployment.nodes, deployment.service)


class ClusterServer:
    """A cluster of three masters (no replicas) in the place of the one ``redis-server``
    of the Redis-backed tests (``redis_server(mode="cluster")``, or every such test with
    ``TEST_REDIS_MODE=cluster``): the same face as ``RedisServer`` (its settings, a
    client, stopped and started again, killed, paused), so that every test of a Redis
    user runs against a cluster too, where a command that touched two slots fails
    (``CROSSSLOT``) and one sent to a node that does not own its slot is redirected."""

    mode = "cluster"

    def __init__(self, directory: Path) -> None:
        self.cluster = ClusterSet(directory, replicas=0)
        self.started = False

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def port(self) -> int:
        return self.cluster.nodes_[0].port

    @property
    def target(self) -> RedisTarget:
        return cluster_target(self.cluster)

    @property
    def settings(self) -> dict[str, Any]:
        """The gateway's settings naming it (``redis_url``, ``redis_mode``, the seeds)."""
        return {"redis_url": self.url, "redis_mode": "cluster", "redis_nodes": self.cluster.nodes}

    @property
    def toml(self) -> str:
        return "\n".join(f"{k} = {json.dumps(v)}" for k, v in self.settings.items())

    def client(self, **options: Any) -> Any:
        """A blocking client that follows the slots (``redis.cluster.RedisCluster``)."""
        import redis.cluster

        client = redis.cluster.RedisCluster(host="127.0.0.1", port=self.port, **options)
        # what a test asks of "the" Redis, asked of every master (not one picked at random)
        for command in ("DBSIZE", "KEYS"):
            client.command_flags[command] = client.PRIMARIES
        return client

    def calls(self, *commands: str) -> int:
        """How many times the masters ran these commands (``INFO commandstats``)."""
        client = self.client()
        try:
            stats = client.info("commandstats", target_nodes=client.PRIMARIES)
        finally:
            client.close()
        return sum(
            int(node.get(f"cmdstat_{c}", {}).get("calls", 0))
            for node in stats.values()
            for c in commands
        )

    def start(self) -> ClusterServer:
        if self.started:
            self.cluster.restart()
        else:
            self.cluster.start()
            self.started = True
        return self

    def stop(self) -> None:
        self.cluster.stop()

    def kill(self) -> None:
        """Every node at once, as a crash would."""
        for node in self.cluster.nodes_:
            node.kill()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Every node stopped (SIGSTOP) for the block: connections open, nothing answered."""
        nodes = [n for n in self.cluster.nodes_ if n.proc is not None]
        for node in nodes:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for node in nodes:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)

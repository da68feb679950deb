"""Real Redis deployments on free loopback ports: a Sentinel set (one master, two
replicas, three sentinels) and a six-node Cluster (three masters, each with a replica).

Started from Debian's ``redis-server`` (``--sentinel`` for the sentinels) and
``redis-cli --cluster create`` (redis-tools); nothing kept on disk but each node's
own config in the directory given; every process stopped by its PID. Failure
detection is set short (a second) so that a failover under test takes seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.redisconn import RedisTarget
from tests.conftest import free_port
from tests.integration.redis_server import _binary

__all__ = [
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


class _Node:
    def __init__(self, directory: Path, name: str, options: dict[str, str], sentinel: bool = False):
        self.port = free_port()
        self.name = name
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.options = options
        self.sentinel = sentinel
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
        lines = [f"{k} {v}" for k, v in (base | self.options).items()]
        config = self.dir / "redis.conf"
        if not config.exists() or not self.sentinel:  # a sentinel rewrites its own
            config.write_text("\n".join(lines) + "\n")
        args = [_binary(), str(config)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_listening(self) -> None:
        def up() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, f"{self.name} exited"
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True

        wait_for(up, 20, f"{self.name} listening on {self.port}")

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


class SentinelSet:
    """A master, two replicas and three sentinels watching service ``gw`` (quorum 2)."""

    def __init__(self, directory: Path, password: str | None = None) -> None:
        self.password = password
        self.master = _Node(directory, "master", _data_options(password))
        replica = _data_options(password) | {"replicaof": f"127.0.0.1 {self.master.port}"}
        self.replicas = [_Node(directory, f"replica{i}", dict(replica)) for i in (1, 2)]
        self.sentinels: list[_Node] = []
        for i in (1, 2, 3):
            options = {
                "sentinel monitor": f"{SERVICE} 127.0.0.1 {self.master.port} 2",
                "sentinel down-after-milliseconds": f"{SERVICE} 1000",
                "sentinel failover-timeout": f"{SERVICE} 5000",
                "sentinel parallel-syncs": f"{SERVICE} 2",
            }
            if password:
                options["sentinel auth-pass"] = f"{SERVICE} {password}"
            self.sentinels.append(_Node(directory, f"sentinel{i}", options, sentinel=True))
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
        return f"redis://{auth}127.0.0.1/0"

    def start(self) -> SentinelSet:
        for node in self.data_nodes:
            node.start()
        for node in self.data_nodes:
            node.wait_listening()
        wait_for(
            lambda: all("master_link_status:up" in self.ask(r, "INFO", "replication")
                        for r in self.replicas),
            20, "replicas in sync",
        )  # fmt: skip
        for node in self.sentinels:
            node.start()
        for node in self.sentinels:
            node.wait_listening()
        wait_for(
            lambda: all(
                "num-other-sentinels\n2" in _ask(s.port, "SENTINEL", "MASTER", SERVICE)
                and "num-slaves\n2" in _ask(s.port, "SENTINEL", "MASTER", SERVICE)
                for s in self.sentinels
            ),
            30,
            "sentinels know each other and both replicas",
        )
        return self

    def ask(self, node: _Node, *command: str) -> str:
        return _ask(node.port, *command, password=self.password)

    def master_port(self) -> int:
        """The master the sentinels name now."""
        reply = _ask(self.sentinels[0].port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
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
    """Six nodes, three masters with a replica each (``redis-cli --cluster create``)."""

    def __init__(self, directory: Path, password: str | None = None, tls: bool = False) -> None:
        self.password = password
        #: With ``tls``, every node (clients, replication, the bus) speaks TLS only, with a
        #: self-signed certificate for 127.0.0.1 (``ca``), and ``url`` is ``rediss://``.
        self.ca: Path | None = None
        options = _data_options(password) | {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "1000",
            "cluster-replica-validity-factor": "0",
        }
        # each node's bus port is chosen free too (port + 10000 may be taken or past 65535)
        self.nodes_ = [
            _Node(directory, f"node{i}", options | {"cluster-port": str(free_port())})
            for i in range(6)
        ]
        if tls:
            self.ca = directory / "cert.pem"
            key = directory / "key.pem"
            subprocess.run(
                [*("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                 *("-keyout", str(key), "-out", str(self.ca), "-subj", "/CN=127.0.0.1"),
                 *("-addext", "subjectAltName=IP:127.0.0.1")],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            for node in self.nodes_:
                node.options |= {
                    "port": "0",
                    "tls-port": str(node.port),
                    "tls-cert-file": str(self.ca),
                    "tls-key-file": str(key),
                    "tls-ca-cert-file": str(self.ca),
                    "tls-auth-clients": "no",
                    "tls-cluster": "yes",
                    "tls-replication": "yes",
                }

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
            [_cli(), *auth, "--cluster", "create", *self.nodes, "--cluster-replicas", "1",
             "--cluster-yes"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        self.wait_ok()

        def synced() -> bool:  # a replica not yet in sync would fail over empty
            infos = [self.ask(n, "INFO", "replication") for n in self.nodes_]
            replicas = [i for i in infos if "role:slave" in i]
            return len(replicas) == 3 and all("master_link_status:up" in i for i in replicas)

        wait_for(synced, 30, "every replica in sync with its master")
        return self

    def wait_ok(self, seconds: float = 30) -> None:
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
def sentinel_set(directory: Path, password: str | None = None) -> Iterator[SentinelSet]:
    deployment = SentinelSet(directory, password)
    try:
        yield deployment.start()
    finally:
        deployment.stop()


@contextlib.contextmanager
def cluster_set(
    directory: Path, password: str | None = None, tls: bool = False
) -> Iterator[ClusterSet]:
    deployment = ClusterSet(directory, password, tls)
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

"""The container image, built from the Dockerfile and served: ``make image-test``.

What runs, for real:

- the local base (tests/image/base.py: Debian's python3 of the default base's release
  and minor version, made with debootstrap once, then cached in podman's image store);
- ``podman build`` of the Dockerfile as it is, with ``--build-arg BASE_IMAGE=`` that
  base (the builder stage fetches gcc from Debian and the dependencies from PyPI,
  compiles the guard with mypyc and checks that the installed guard is the compiled
  one);
- the image started as the Dockerfile's ``USER`` with its ``CMD`` and environment: with
  ``podman run`` where this machine allows it, else (no cgroups or rlimits for a
  container runtime, as in a container without the rights) its file system, exported
  from the image, under ``chroot --userspec`` in a private mount namespace;
- a stream through it to the built-in simulator (``GATEWAY_SIMULATOR=true``): it ends
  ``outcome=complete``, and ``gateway_build_info{guard="compiled"}`` is 1;
- SIGTERM while a stream is in flight: the stream still completes (the drain), and the
  process exits 0.

Skipped unless ``GATEWAY_IMAGE_TEST=1`` (``make image-test`` sets it): a first run
makes the base (about 2 minutes) and builds the image (about 2-4 minutes on two cores),
which ``make test`` does not spend. ``.ci/run`` runs ``make image-test``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.image.base import default_base, ensure_base, run

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/llm-stream-gateway:image-test"

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("GATEWAY_IMAGE_TEST") != "1",
        reason="builds and runs the container image: `make image-test`",
    ),
    # the first build (debootstrap, pip, mypyc) takes minutes on a busy two-core machine
    pytest.mark.timeout(3600),
]

# Loopback only, never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CHAT = {"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def say(line: str) -> None:
    print(f"[image-test] {line}", file=sys.stderr, flush=True)


def podman() -> str:
    found = shutil.which("podman")
    if found is None:
        pytest.fail("podman not found: apt-get install podman")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    """The image built from the Dockerfile on the local base; its configuration."""
    tool = podman()
    started = time.monotonic()
    base = ensure_base(tool, default_base(REPO / "Dockerfile"), say)
    isolation = os.environ.get("BUILDAH_ISOLATION", "chroot")  # no cgroups needed
    build = [tool, "build", "--isolation", isolation, "--network", "host"]
    build += ["--build-arg", f"BASE_IMAGE={base}", "--tag", IMAGE, "--file", "Dockerfile", "."]
    say(f"podman build --build-arg BASE_IMAGE={base} (isolation {isolation})")
    built = time.monotonic()
    run(build, cwd=REPO, timeout=3000)
    say(f"built {IMAGE} in {time.monotonic() - built:.0f} s")
    (inspected,) = json.loads(run([tool, "image", "inspect", IMAGE]).stdout)
    config: dict[str, Any] = inspected["Config"]
    say(f"base and image ready after {time.monotonic() - started:.0f} s")
    return config


class Served:
    """One started image: the process that serves, its port, how to stop it."""

    def __init__(self, how: str, pid: int, port: int) -> None:
        self.how, self.pid, self.port = how, pid, port
        self.url = f"http://127.0.0.1:{port}"

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists()

    def terminate(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float) -> int:
        raise NotImplementedError

    def logs(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class PodmanRun(Served):
    def __init__(self, tool: str, name: str, port: int) -> None:
        pid = int(run([tool, "inspect", "--format", "{{.State.Pid}}", name]).stdout)
        super().__init__("podman run", pid, port)
        self.tool, self.name = tool, name

    def terminate(self) -> None:
        run([self.tool, "kill", "--signal", "TERM", self.name])

    def wait(self, timeout: float) -> int:
        return int(run([self.tool, "wait", self.name], timeout=timeout).stdout.strip())

    def logs(self) -> str:
        done = subprocess.run([self.tool, "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def close(self) -> None:
        subprocess.run([self.tool, "rm", "--force", self.name], capture_output=True)


class Chroot(Served):
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, root: Path, port: int) -> None:
        super().__init__("chroot --userspec", proc.pid, port)
        self.proc, self.log, self.root = proc, log, root

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        # /dev and /proc were mounted in the process's own mount namespace, gone with it;
        # never remove a tree that still has a mount in this one.
        if not any(os.path.ismount(self.root / d) for d in ("dev", "proc")):
            shutil.rmtree(self.root, ignore_errors=True)


def _environment(config: dict[str, Any], port: int) -> dict[str, str]:
    """The image's own environment, listening on a free loopback port, fronting its
    built-in simulator."""
    env = dict(entry.split("=", 1) for entry in config["Env"])
    env.update(GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=str(port), GATEWAY_SIMULATOR="true")
    return env


def _podman_run(tool: str, config: dict[str, Any], port: int) -> PodmanRun | str:
    """``podman run`` as the image says (its USER, CMD): the container, or why not."""
    name = f"gateway-image-test-{os.getpid()}"
    env = _environment(config, port)
    argv = [tool, "run", "--detach", "--name", name, "--network", "host"]
    for key in ("GATEWAY_HOST", "GATEWAY_PORT", "GATEWAY_SIMULATOR"):
        argv += ["--env", f"{key}={env[key]}"]
    done = subprocess.run([*argv, IMAGE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        subprocess.run([tool, "rm", "--force", name], capture_output=True)
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return PodmanRun(tool, name, port)


def _chroot(tool: str, config: dict[str, Any], port: int, work: Path) -> Chroot:
    """The image's file system (``podman export``) run as the image says: its USER with
    ``chroot --userspec``, its WORKDIR, environment and CMD; /dev and /proc mounted in
    a private mount namespace of its own (``unshare --mount``)."""
    root = work / "rootfs"
    root.mkdir()
    container = run([tool, "create", IMAGE]).stdout.strip()
    try:
        export = subprocess.Popen([tool, "export", container], stdout=subprocess.PIPE)
        assert export.stdout is not None
        run(["tar", "-x", "-C", str(root)], stdin=export.stdout, timeout=600)
        export.stdout.close()
        assert export.wait(timeout=60) == 0
    finally:
        subprocess.run([tool, "rm", "--force", container], capture_output=True)
    user = config["User"]
    assert re.fullmatch(r"\d+:\d+", user), user
    # The WORKDIR with nothing in it is no directory of the image: a container runtime
    # makes it when it starts the container, and so does this.
    (root / config["WorkingDir"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = [f"{k}={v}" for k, v in _environment(config, port).items()]
    script = (
        'root=$1 user=$2 dir=$3; shift 3; mount --rbind /dev "$root/dev" '
        '&& mount -t proc proc "$root/proc" '
        '&& exec chroot --userspec="$user" "$root" /usr/bin/env -i -C "$dir" "$@"'
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    argv += [str(root), user, config["WorkingDir"], *env, *config["Cmd"]]
    log = work / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Chroot(proc, log, root, port)


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stream(url: str, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(CHAT).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    with _OPENER.open(request, timeout=120) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body


@contextlib.contextmanager
def started(config: dict[str, Any], work: Path) -> Iterator[Served]:
    tool = podman()
    port = free_port()
    container = _podman_run(tool, config, port)
    served: Served
    if isinstance(container, str):
        say(f"podman run is not possible on this machine ({container})")
        say("so the image's file system runs under chroot --userspec instead")
        served = _chroot(tool, config, port, work)
    else:
        served = container
    say(f"serving with {served.how} on 127.0.0.1:{port}, pid {served.pid}")
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(served.url + "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or not served.alive():
                pytest.fail(f"the image never got ready:\n{served.logs()[-4000:]}")
            time.sleep(0.2)
        yield served
    finally:
        served.close()


def _uids(pid: int) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("Uid:")]
    return [int(uid) for uid in line.split()[1:]]


def test_the_image_serves_a_verified_stream_as_its_own_user_and_drains_on_sigterm(
    image: dict[str, Any], tmp_path: Path
) -> None:
    user = int(image["User"].split(":")[0])
    assert user != 0
    with started(image, tmp_path) as served:
        # as the image's own non-root user: real, effective, saved and file-system uid
        assert _uids(served.pid) == [user] * 4
        cmdline = Path(f"/proc/{served.pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmdline, cmdline

        body = _stream(served.url)
        trailer = rb"data: \[DONE\]\n\n: gateway outcome=complete reason=stop \S+\n$"
        assert re.search(trailer, body), body[-300:]
        status, metrics = _get(served.url + "/metrics")
        assert status == 200
        info = re.findall(rb"^gateway_build_info\{([^}]*)\} (\S+)$", metrics, re.M)
        assert len(info) == 1, info
        labels, value = info[0]
        assert b'guard="compiled"' in labels, labels
        assert float(value) == 1.0

        # SIGTERM with a stream in flight (30 deltas at 10 a second): the drain lets it
        # finish, readiness turns 503, then the process exits 0.
        result: dict[str, bytes | BaseException] = {}

        def slow_stream() -> None:
            try:
                result["body"] = _stream(served.url, {"x-sim-tokens": "30", "x-sim-tps": "10"})
            except BaseException as exc:
                result["error"] = exc

        client = threading.Thread(target=slow_stream)
        client.start()
        deadline = time.monotonic() + 30
        active = re.compile(rb"^gateway_active_streams\{[^}]*\} 1\.0$", re.M)
        while not active.search(_get(served.url + "/metrics")[1]):
            assert time.monotonic() < deadline, "the slow stream never started"
            time.sleep(0.05)
        served.terminate()
        code = served.wait(timeout=120)
        client.join(timeout=60)
        logs = served.logs()
        assert code == 0, logs[-4000:]
        assert "error" not in result, (result, logs[-4000:])
        slow = result["body"]
        assert isinstance(slow, bytes)
        assert b"\n: gateway outcome=complete reason=stop " in slow, slow[-300:]
        assert slow.count(b'"content":') >= 30
        assert "Finished server process" in logs, logs[-4000:]

"""The local base image `make image-test` builds the Dockerfile on.

No container registry is reachable here, so the Dockerfile's default base
(``ARG BASE_IMAGE=python:3.13.9-slim-trixie``) cannot be pulled. Its stand-in is made
with ``debootstrap`` from Debian's own packages, in the Debian release that the default
base names (``-slim-trixie``: Debian 13), with that release's ``python3`` and what the
official image has beside it (pip, venv, the C headers the guard's mypyc build needs,
``python`` as a command). Its Python must have the default base's minor version (Debian
13's python3 is 3.13, as is the default base's): otherwise the image built here would
not be the one shipped, and :func:`ensure_base` refuses to make it.

Where this machine trusts certificate authorities of its own (a TLS-inspecting proxy's, in
``/usr/local/share/ca-certificates``), the base trusts them too, and pip is pointed at
the system's list (``PIP_CERT``): the builder stage fetches from PyPI, as pip here does.

It is made once and kept in podman's image store as
``localhost/llm-stream-gateway-base:python<minor>-<release>``; a later run finds it there
and skips debootstrap. ``podman rmi`` that image to make it again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What the official slim image has and the Dockerfile uses: ``python`` (not only
#: ``python3``), ``python -m pip``, ``python -m venv``, the headers to compile against.
PACKAGES = (
    "python3",
    "python3-venv",
    "python3-dev",
    "python3-pip",
    "python-is-python3",
    "ca-certificates",
)
BASE_REPOSITORY = "localhost/llm-stream-gateway-base"
LOCAL_AUTHORITIES = Path("/usr/local/share/ca-certificates")
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class BaseMismatch(RuntimeError):
    """The Debian release's python3 is not the default base's Python."""


@dataclass(frozen=True)
class DefaultBase:
    """The Dockerfile's default base image, and what a stand-in must match."""

    image: str  # python:3.13.9-slim-trixie
    python: str  # 3.13
    release: str  # trixie

    @property
    def local_tag(self) -> str:
        return f"{BASE_REPOSITORY}:python{self.python}-{self.release}"


def default_base(dockerfile: Path) -> DefaultBase:
    """``ARG BASE_IMAGE=python:X.Y.Z-slim-RELEASE`` of the Dockerfile."""
    text = dockerfile.read_text(encoding="utf-8")
    match = re.search(r"^ARG BASE_IMAGE=(python:(\d+\.\d+)\.\d+-slim-([a-z]+))$", text, re.M)
    if match is None:
        raise ValueError(f"{dockerfile}: no ARG BASE_IMAGE=python:X.Y.Z-slim-<release>")
    return DefaultBase(image=match[1], python=match[2], release=match[3])


def run(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end; a failure raises with the end of its output."""
    done: subprocess.CompletedProcess[str] = subprocess.run(
        argv, capture_output=True, text=True, check=False, **options
    )
    if done.returncode != 0:
        output = (done.stdout or "") + (done.stderr or "")
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{output[-4000:]}")
    return done


def _trust_local_authorities(root: Path) -> list[str]:
    """This machine's own certificate authorities (``/usr/local/share/ca-certificates``,
    where a TLS-inspecting proxy's CA goes) trusted in the base as on the machine, so
    that pip in the build reaches PyPI the way pip here does; the names of those added.
    Where there are none, the base trusts Debian's list alone, as the official image does.
    """
    local = sorted(LOCAL_AUTHORITIES.glob("*.crt"))
    if not local:
        return []
    target = root / LOCAL_AUTHORITIES.relative_to("/")
    target.mkdir(parents=True, exist_ok=True)
    for path in local:
        shutil.copy(path, target / path.name)
    run(["chroot", str(root), "update-ca-certificates"])
    return [path.name for path in local]


def exists(podman: str, image: str) -> bool:
    return subprocess.run([podman, "image", "exists", image], check=False).returncode == 0


def ensure_base(podman: str, base: DefaultBase, say: Callable[[str], None] = print) -> str:
    """The local base image's tag: found in podman's store, or made now with debootstrap."""
    tag = base.local_tag
    if exists(podman, tag):
        say(f"base image {tag}: cached in podman's image store")
        return tag
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise RuntimeError("debootstrap not found: apt-get install debootstrap")
    started = time.monotonic()
    # /var/tmp: a root file system of about 370 MB, which a tmpfs /tmp may not hold.
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="gateway-base-") as work:
        root = Path(work) / "rootfs"
        argv = [debootstrap, "--variant=minbase", "--include=" + ",".join(PACKAGES)]
        argv += [base.release, str(root)]
        mirror = os.environ.get("DEBOOTSTRAP_MIRROR")  # else debootstrap's own default
        if mirror:
            argv.append(mirror)
        say(f"base image {tag}: debootstrap {base.release} (Debian's packages)")
        run(argv, timeout=1800)
        minor = "import sys; print('%d.%d' % sys.version_info[:2])"
        version = run(["chroot", str(root), "python3", "-c", minor]).stdout.strip()
        if version != base.python:
            raise BaseMismatch(
                f"Debian {base.release}'s python3 is {version}, but the Dockerfile's default "
                f"base {base.image} has Python {base.python}: an image built on it would not "
                "be the one shipped"
            )
        changes = ["ENV LANG=C.UTF-8", 'CMD ["python3"]']
        if _trust_local_authorities(root):
            # the venv's pip (ensurepip's) reads its own CA list unless told otherwise
            changes.append(f"ENV PIP_CERT={SYSTEM_BUNDLE}")
        run(["chroot", str(root), "apt-get", "clean"])
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            run(
                [podman, "import", *(f"--change={c}" for c in changes), "-", tag],
                stdin=tar.stdout,
                timeout=600,
            )
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(timeout=60)
    say(f"base image {tag}: made in {time.monotonic() - started:.0f} s (Python {version})")
    return tag

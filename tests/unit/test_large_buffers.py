"""gateway/server/memory.py: large buffers go back to the system when freed.

The glibc threshold is fixed in a child process (it is the process's own
allocator setting), and a freed buffer of a size the moving threshold would
have kept in the heap then leaves the resident set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gateway.server.memory import return_large_buffers

_CHILD = """
import sys
from gateway.server.memory import return_large_buffers
set_it = sys.argv[1] == "1"
if set_it:
    assert return_large_buffers()

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024

blocks = [bytearray(20 * 1024 * 1024) for _ in range(1)]
del blocks  # freed: glibc now keeps buffers up to 20 MiB in the heap, unless fixed
base = rss()
held = [bytes(bytearray(b"x" * (8 * 1024 * 1024))) for _ in range(6)]
del held[0:5]  # five of six freed, the last one still holds the heap's top
print(rss() - base)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


@glibc
def test_freed_large_buffers_leave_the_resident_set() -> None:
    def grown(set_it: str) -> int:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, set_it], env=env, capture_output=True, check=True
        )
        return int(out.stdout)

    mib = 1024 * 1024
    assert grown("0") > 30 * mib  # the moving threshold: freed buffers stay resident
    assert grown("1") < 20 * mib  # fixed: only what is still held


def test_an_operators_own_threshold_is_left_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert return_large_buffers() is False

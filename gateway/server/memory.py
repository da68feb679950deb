"""Large buffers go back to the operating system when they are freed.

A stream carrying a large event (up to ``limits.max_event_bytes``) makes a few
buffers of that event's size while the guard joins, decodes and judges it.
glibc's malloc serves a buffer that large from ``mmap`` at first, but each one
freed raises its threshold for the next (up to 32 MiB), so the next ones come
from the heap, and a heap keeps what it was given: twenty streams carrying a
15 MiB event each left a worker's peak about 190 to 250 MiB above its rest,
where the buffers alive at once were worth about 120. A fixed threshold
(``mallopt(M_MMAP_THRESHOLD)``, what ``MALLOC_MMAP_THRESHOLD_`` sets) keeps
every buffer over 128 KiB in ``mmap``, given back when freed, so a worker's
memory follows what its streams hold (docs/deployment.md, "Memory"). Ordinary
streams allocate nothing that large. An operator's own ``MALLOC_MMAP_THRESHOLD_``
is left as set; on a C library other than glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["LARGE_BUFFER_BYTES", "return_large_buffers"]

#: Buffers at least this large are mapped on their own and unmapped when freed
#: (glibc's own default before its threshold starts to move).
LARGE_BUFFER_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def return_large_buffers(threshold: int = LARGE_BUFFER_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; True when set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False

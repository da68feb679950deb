"""Reading a log from a cursor to its end, with the live tail.

``follow`` yields the log's batches in order, waiting for more while its writer
is still writing; every ``wait`` seconds without news it yields an empty batch,
so that its caller can look at the writer (a lease that ran out: an orphan) or
give up. It ends after the batch that carries the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.store.api import Batch, StreamStore

__all__ = ["Vanished", "follow"]


class Vanished(Exception):
    """The log expired or was deleted while it was being read."""


async def follow(
    store: StreamStore, stream_id: str, after: int, *, wait: float = 1.0
) -> AsyncIterator[Batch]:
    """Batches after event ``after`` until the end (``Gone``/``BeyondEnd`` as ``read``)."""
    while True:
        batch = await store.read(stream_id, after, wait=wait)
        if batch is None:
            raise Vanished(stream_id)
        yield batch
        if batch.end is not None:
            return
        after += len(batch.events)

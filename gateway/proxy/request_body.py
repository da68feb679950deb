"""A request body's JSON: read for what the gateway decides on, never kept whole, never on the
loop when it is large.

The relay needs a few top-level members of a JSON body (``model``,
``stream``, ``stream_options``, scalars such as ``max_tokens``), and
sometimes a rewritten body (usage injection, an upstream's ``models`` map).
Keeping the parsed document for the life of the request cost more memory
than the body itself (a string as large again; many small objects several
times its size), so ``summary`` keeps only the small members: scalars,
short strings, and small objects of those (``Summary``); lists (``messages``,
``input``, ``tools``) never; a string ``model`` always, whatever its length.
``rewrite`` parses the body again and changes
top-level members (an object member is merged into the client's, so a
``stream_options`` the summary left out keeps its other keys).

Parsing a large body holds the event loop for as long as it takes (27 MB of
small objects: 0.6 s idle, 2.5 s under load, and every stream of the worker
waits), and a thread would not help: the parsers hold the interpreter lock
throughout. A body over ``OFF_LOOP_BYTES`` is therefore parsed in a helper
process (one per worker, started at the first such body, with the same
standard of JSON as ``gateway.guard.jsonparse``); the loop only waits for
its answer. A body on which the helper died (its memory bound can end it
outside Python's reach) is forwarded unparsed, never parsed on the loop
instead, and the next one gets a new helper.

The helper's memory is bounded: its data (heap and private mappings,
``RLIMIT_DATA``) may grow by at most ``PARSE_BUDGET`` beyond what it holds at
rest. A document of many small values takes far more than its text (30 MB
of ``{}`` values: 800 MiB of Python objects), so a body whose document would
pass the budget is, to the gateway, a body it cannot parse, like one nested
too deep: forwarded unchanged, and logged (at most once a minute); its
top-level scalars (``model``, ``stream``...) are read from its bytes by ijson's
event parser, without building the document (``top_scalars``), so the log, the
model map and the stream count still know them. docs/deployment.md's memory table counts
the budget in the helper's figure.

Whatever its content type says, and behind a UTF-8 BOM: an upstream may read
it as JSON all the same.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.guard import Protocol
from gateway.guard.joint import dumps_utf8
from gateway.guard.jsonparse import loads
from gateway.logsetup import LogGate
from gateway.policy.quota import (
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    estimate_from,
    estimate_input,
    input_bound,
    measure_input,
)
from gateway.protocols.continuation import ContinuationStyle, continuation_request

__all__ = [
    "OFF_LOOP_BYTES",
    "PARSE_BUDGET",
    "BodyParser",
    "Summary",
    "continuation_body",
    "input_estimate",
    "rewrite",
    "strict_input",
    "summary",
    "top_scalars",
]

log = logging.getLogger("gateway")

#: Bodies larger than this are parsed in the helper process.
OFF_LOOP_BYTES = 1024 * 1024
#: The most the helper's data may grow beyond its rest while it parses one body.
#: (224 MiB: a continuation of the largest admitted body, 32 MiB of long turns, is parsed,
#: changed and written here: measured to need 192.)
PARSE_BUDGET = 224 * 1024 * 1024
#: How often the helper checks that the gateway process that started it still runs.
PARENT_WATCH_SECONDS = 0.5
#: The longest the helper may take over one body: past it the body goes on unparsed (as
#: one too complex to parse) and the helper is killed and replaced, so that no body
#: holds the ones queued behind it. (A 30 MB body is parsed in about a second; a helper
#: was seen spinning over 30 s in the kernel near its memory budget.)
HELPER_SECONDS = 10.0
#: What the helper answers for a body whose parse would pass ``PARSE_BUDGET``.
_TOO_COMPLEX = "too complex"


class Summary(dict[str, Any]):
    """The top-level members of a JSON object body that the gateway keeps (see
    ``summary``), and, where named clients are configured, the input tokens the
    whole document's text is estimated at (``policy.quota.estimate_input``: its
    messages are not kept, so the estimate is made while they are at hand)."""

    __slots__ = ("input_bound", "input_tokens")

    def __init__(
        self, members: dict[str, Any], input_tokens: int | None, input_bound: int | None = None
    ) -> None:
        super().__init__(members)
        self.input_tokens = input_tokens
        #: the strict upper bound of the input (``policy.quota.input_bound``)
        self.input_bound = input_bound

    def __reduce__(self) -> tuple[Any, ...]:  # across the helper process
        return (Summary, (dict(self), self.input_tokens, self.input_bound))


_BOM = b"\xef\xbb\xbf"
_FIRST = (b"{", b" ", b"\n", b"\r", b"\t")
_MAX_STRING = 4096  # characters of a string member kept
_MAX_MEMBERS = 64  # members of an object member kept
T = TypeVar("T")


def _document(body: bytes) -> dict[str, Any] | None:
    if body[:3] == _BOM:
        body = body[3:]
    if not body or body[:1] not in _FIRST:
        return None
    try:
        obj = loads(body)
    except (ValueError, RecursionError):
        # Anything the gateway cannot parse is "not JSON": forwarded unchanged.
        return None
    return obj if isinstance(obj, dict) else None


def _small(value: object, depth: int = 0) -> bool:
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, str):
        return len(value) <= _MAX_STRING
    if isinstance(value, dict) and depth == 0 and len(value) <= _MAX_MEMBERS:
        return all(_small(v, 1) for v in value.values())
    return False


def summary(body: bytes, count_input: bool = False) -> Summary | None:
    """The small top-level members of a JSON object body (with ``count_input``, and its
    input estimate); None when it is not one."""
    doc = _document(body)
    if doc is None:
        return None
    members = {key: value for key, value in doc.items() if _small(value)}
    model = doc.get("model")
    if isinstance(model, str):
        # Whatever its length: the model map, the per-model cool-down and the log need it
        # (the log and the labels cut it, ``observe``).
        members["model"] = model
    if not count_input:
        return Summary(members, None)
    size, messages = measure_input(doc, len(body))
    return Summary(
        members,
        estimate_from(size, messages),
        size + MESSAGE_OVERHEAD * messages + REQUEST_OVERHEAD,
    )


def top_scalars(body: bytes) -> Summary | None:
    """The top-level scalar members of a JSON object body (``model``, ``stream``,
    ``max_tokens``...), read by ijson's event parser without building the document: for
    a body too complex to parse within the budget. The rest is not kept (no input
    estimate); None when it names none, or is no JSON object as far as it was read."""
    import ijson

    if body[:3] == _BOM:
        body = body[3:]
    members: dict[str, Any] = {}
    try:
        for prefix, event, value in ijson.parse(body, use_float=True):
            if prefix == "" and event not in ("start_map", "map_key", "end_map"):
                return None  # not an object
            if "." not in prefix and prefix and event in _SCALAR_EVENTS:
                members.setdefault(prefix, value)
                if "model" in members and "stream" in members:
                    break  # what the gateway decides on: no need to read further
    except ijson.JSONError:
        return None
    model = members.get("model")
    kept = {k: v for k, v in members.items() if _small(v) or k == "model"}
    if isinstance(model, str) or kept:
        return Summary(kept, None)
    return None


_SCALAR_EVENTS = frozenset({"string", "number", "boolean", "null"})


def rewrite(body: bytes, changes: dict[str, Any]) -> bytes | None:
    """The body with its top-level ``changes`` (object members merged); None when the
    body is not a JSON object."""
    doc = _document(body)
    if doc is None:
        return None
    for key, value in changes.items():
        old = doc.get(key)
        doc[key] = {**old, **value} if isinstance(value, dict) and isinstance(old, dict) else value
    return _written(doc, body)


def strict_input(request: dict[str, Any] | None, body_size: int) -> int:
    """A request's input tokens at most: the bound its summary made of the whole document,
    else (not JSON, or made without) ``input_bound`` of what there is."""
    if isinstance(request, Summary) and request.input_bound is not None:
        return request.input_bound
    return input_bound(request, body_size)


def continuation_body(
    body: bytes,
    protocol: Protocol,
    style: ContinuationStyle,
    partial: str,
    model: str | None,
) -> tuple[bytes, str] | None:
    """A continuation request's bytes (``gateway.protocols.continuation``) and the text
    its answer repeats at the start, built from a fresh parse of the admitted body
    (changed in place: never a copy), ``model`` set when the upstream maps it; None
    when the body cannot be continued."""
    doc = _document(body)
    if doc is None:
        return None
    if model is not None:
        doc["model"] = model
    request = continuation_request(protocol, style, doc, partial, fresh=True)
    if request is None:
        return None
    return _written(request.body, body), request.skip


def _written(doc: Any, body: bytes) -> bytes:
    """``doc`` as compact JSON in UTF-8, non-ASCII characters as they came. orjson writes
    the bytes at once (no text copy beside them: a 32 MiB document fits the helper's
    budget); what it cannot write as the standard library would (a lone surrogate, an
    integer beyond 64 bits, the NaN or Infinity the parser took in) goes the slow way."""
    if b"NaN" not in body and b"Infinity" not in body:
        try:
            return orjson.dumps(doc)
        except orjson.JSONEncodeError:
            pass
    return dumps_utf8(doc)


def input_estimate(request: dict[str, Any] | None, body_size: int) -> int:
    """A request's input tokens: the estimate its summary made of the whole document,
    else (not JSON, or made without) ``estimate_input`` of what there is."""
    if isinstance(request, Summary) and request.input_tokens is not None:
        return request.input_tokens
    return estimate_input(request, body_size)


def _bound_memory(budget: int) -> None:
    """The helper's start: its data may grow by ``budget`` bytes beyond what it holds now
    (Linux: ``VmData`` and ``RLIMIT_DATA``; elsewhere it is not bounded)."""
    try:
        import resource

        status = Path("/proc/self/status").read_text()
        rest = next(int(line.split()[1]) for line in status.splitlines() if line[:7] == "VmData:")
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = rest * 1024 + budget
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ImportError, OSError, ValueError, StopIteration):
        return


def _helper_start(budget: int, parent: int) -> None:
    """The helper's start: its memory bounded (``_bound_memory``), and a watch on the
    gateway process that started it: when that process is gone (SIGKILLed, or exited
    without stopping its pool), the helper ends too, never left behind holding memory
    and the gateway's output pipes."""
    # The watch first: its thread's stack is part of the rest the budget is counted from.
    threading.Thread(target=_end_with, args=(parent,), name="parent-watch", daemon=True).start()
    _bound_memory(budget)


def _end_with(parent: int) -> None:
    """End this process once its parent is no longer ``parent`` (it was re-parented)."""
    while os.getppid() == parent:
        time.sleep(PARENT_WATCH_SECONDS)
    os._exit(0)


def _in_helper(work: Callable[..., T], body: bytes, *args: Any) -> T | str:
    """``work`` in the helper: ``_TOO_COMPLEX`` when its memory passed the budget (what it
    had built is freed as the error unwinds)."""
    try:
        return work(body, *args)
    except MemoryError:
        return _TOO_COMPLEX


def _kill_helpers(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's helper processes (Python 3.14 has ``kill_workers``; before it, the
    pool's own map of them)."""
    processes: dict[int, Any] = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        process.kill()


@dataclass(eq=False)
class BodyParser:
    """``summary`` and ``rewrite`` for the relay: on the loop for small bodies, in the
    helper process for large ones."""

    off_loop_bytes: int = OFF_LOOP_BYTES
    _: KW_ONLY
    #: Estimate each body's input tokens (named clients are charged for them).
    count_input: bool = False
    parse_budget: int = PARSE_BUDGET
    helper_seconds: float = HELPER_SECONDS
    _too_complex_log: LogGate = field(default_factory=LogGate, init=False, repr=False)
    _pool: ProcessPoolExecutor | None = field(default=None, init=False, repr=False)

    async def summary(self, body: bytes) -> Summary | None:
        found = await self._run(summary, body, self.count_input)
        if found is None and len(body) > self.off_loop_bytes:
            # Too complex to parse within the budget (or its helper died): the top-level
            # scalars its bytes name (its model for the log and the model map, its stream
            # flag), read without building the document.
            found = await self._run(top_scalars, body)
        return found

    async def rewrite(self, body: bytes, changes: dict[str, Any]) -> bytes | None:
        return await self._run(rewrite, body, changes)

    async def document(self, body: bytes) -> dict[str, Any] | None:
        """The whole JSON object body, parsed again when asked, never kept by the relay."""
        return await self._run(_document, body)

    async def continuation(
        self,
        body: bytes,
        protocol: Protocol,
        style: ContinuationStyle,
        partial: str,
        model: str | None,
    ) -> tuple[bytes, str] | None:
        """``continuation_body``, in the helper process for a large body: the document is
        parsed, changed and written there, and only bytes come back to the loop. A
        ``regenerate`` request without a model to map is the body itself, unparsed."""
        if style is ContinuationStyle.REGENERATE and model is None and partial:
            return body, ""
        return await self._run(continuation_body, body, protocol, style, partial, model)

    async def run(self, work: Callable[..., T], body: bytes, *args: Any) -> T | None:
        """``work(body, *args)``: on the loop for a small body, in the helper process for a
        large one (``work`` must be a module-level function: it crosses processes); None
        when its memory would pass the helper's budget."""
        return await self._run(work, body, *args)

    async def _run(self, work: Callable[..., T | None], body: bytes, *args: Any) -> T | None:
        if len(body) <= self.off_loop_bytes:
            return work(body, *args)
        pool = self._pool
        if pool is None:
            # spawn: a fresh interpreter, never a fork of a process with a loop and threads
            pool = self._pool = ProcessPoolExecutor(
                1,
                multiprocessing.get_context("spawn"),
                initializer=_helper_start,
                initargs=(self.parse_budget, os.getpid()),
            )
        try:
            answer = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(pool, _in_helper, work, body, *args),
                self.helper_seconds,
            )
        except TimeoutError:
            log.warning(
                "the body parser's helper process took over %g s on a body of %d bytes: "
                "forwarded unparsed; a new one is started",
                self.helper_seconds,
                len(body),
            )
            # Killed, not shut down: the bodies queued on it see it broken (answered
            # None just below), never cancelled; the next body starts a new pool.
            _kill_helpers(pool)
            if self._pool is pool:
                self._pool = None
            return None
        except BrokenProcessPool:
            # Died on this body (its memory bound can end it outside Python's reach): the
            # body is one it cannot parse, never parsed on the loop instead.
            log.warning(
                "the body parser's helper process died on a body of %d bytes: forwarded "
                "unparsed; a new one is started",
                len(body),
            )
            # Only the pool that broke: each body waiting on it sees it broken, and a
            # new pool another request started meanwhile is left alone.
            pool.shutdown(wait=False, cancel_futures=True)
            if self._pool is pool:
                self._pool = None
            return None
        if isinstance(answer, str) and answer == _TOO_COMPLEX:
            if self._too_complex_log.open():
                log.warning(
                    "a request body of %d bytes would take more than the body parser's "
                    "%d MiB to parse: forwarded unparsed, as a body that is not JSON",
                    len(body),
                    self.parse_budget >> 20,
                )
            return None
        return answer  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the helper process, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

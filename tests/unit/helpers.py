"""Shared helpers of the guard's unit tests: partitions, a reference decoder, chat fixtures,
and the block tables, drivers and case builders of the contract tests (Responses,
Messages, Gemini): one module every test imports, as h11's ``tests/helpers.py``.

The reference decoder is the HTML Standard's algorithm ("Parsing an event
stream" / "Interpreting an event stream") transcribed literally on *text*:
the whole stream is UTF-8 decoded first (U+FFFD for errors, one leading BOM
dropped), split on CRLF / CR / LF, and interpreted line by line. It shares no
code with ``gateway.guard.sse`` and knows nothing about chunks, so it is an
independent oracle for what the incremental byte decoder must produce.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import strategies as st

from gateway.guard import (
    Contract,
    Event,
    Outcome,
    Reason,
    SSEDecoder,
    StreamGuard,
    Usage,
    Verdict,
)

# -- partitions -------------------------------------------------------------------


def cut(data: bytes, *offsets: int) -> list[bytes]:
    """``data`` split at the given offsets (empty pieces kept: they must be harmless)."""
    bounds = [0, *offsets, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def two_chunk_splits(data: bytes) -> Iterator[list[bytes]]:
    """Every way to cut ``data`` into two chunks (including an empty first or last one)."""
    for i in range(len(data) + 1):
        yield [data[:i], data[i:]]


def all_partitions(data: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """Whole, every two-chunk split, and one byte at a time, each with a label."""
    yield "whole", [data]
    for i in range(len(data) + 1):
        yield f"split@{i}", [data[:i], data[i:]]
    yield "bytewise", bytewise(data)


# -- running the decoder and the guard ---------------------------------------------


def decode(chunks: Iterable[bytes], decoder: SSEDecoder | None = None) -> list[Event]:
    """Every event of a whole body fed in ``chunks`` (``close()`` included)."""
    decoder = decoder if decoder is not None else SSEDecoder()
    events: list[Event] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def with_offsets(events: Iterable[Event]) -> list[tuple[str, str, str, int | None, int, int]]:
    """Events as plain tuples *including* start/end (Event equality ignores them)."""
    return [(e.event, e.data, e.id, e.retry, e.start, e.end) for e in events]


@dataclass
class GuardRun:
    output: bytes  # every byte feed() returned, concatenated
    verdict: Verdict
    guard: StreamGuard
    pieces: list[bytes]  # what each feed() call returned

    def annotated(self, request_id: str = "req-1") -> bytes:
        return self.output + self.guard.annotation(request_id)


def run_guard(
    contract: Contract,
    chunks: Iterable[bytes],
    *,
    decoder: SSEDecoder | None = None,
    max_stream_bytes: int | None = None,
    eof: bool = True,
) -> GuardRun:
    """Feed ``chunks`` the way the relay does: stop reading once the verdict is final."""
    guard = StreamGuard(contract, decoder, max_stream_bytes=max_stream_bytes)
    pieces: list[bytes] = []
    for chunk in chunks:
        pieces.append(guard.feed(chunk))
        if guard.done:
            break
    if eof and not guard.done:
        guard.eof()
    verdict = guard.verdict
    assert verdict is not None
    return GuardRun(b"".join(pieces), verdict, guard, pieces)


# -- the reference decoder -----------------------------------------------------------

_LINE_END = re.compile(r"\r\n|\r|\n")


def reference_events(stream: bytes) -> list[tuple[str, str, str, int | None]]:
    """(type, data, last event id, retry of the block) of every dispatched event."""
    text = stream.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = _LINE_END.split(text)
    lines.pop()  # after the last line end: an unterminated line, discarded at EOF
    out: list[tuple[str, str, str, int | None]] = []
    data_buffer = ""
    event_type = ""
    last_id = ""
    block_retry: int | None = None
    for line in lines:
        if line == "":
            # dispatch the event
            if data_buffer:
                if data_buffer.endswith("\n"):
                    data_buffer = data_buffer[:-1]
                out.append((event_type or "message", data_buffer, last_id, block_retry))
            data_buffer = ""
            event_type = ""
            block_retry = None
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            name, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            name, value = line, ""
        if name == "event":
            event_type = value
        elif name == "data":
            data_buffer += value + "\n"
        elif name == "id":
            if "\0" not in value:
                last_id = value
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            block_retry = int(value)
    return out


def plain(events: Iterable[Event]) -> list[tuple[str, str, str, int | None]]:
    return [(e.event, e.data, e.id, e.retry) for e in events]


# -- chat completion fixtures -----------------------------------------------------------

CHAT_ID = "chatcmpl-9xYzAbCdEfGhIjKlMnOpQrStUv"
MODEL = "gpt-4o-mini-2024-07-18"


def sse(payload: Any, *, event: str | None = None, eol: str = "\n") -> bytes:
    """One SSE block: optional ``event:`` line, one ``data:`` line, a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"event: {event}{eol}" if event else ""
    return f"{head}data: {data}{eol}{eol}".encode()


DONE = b"data: [DONE]\n\n"


def chunk(
    choices: Sequence[dict[str, Any]] | None = None,
    *,
    usage: dict[str, Any] | None = None,
    include_usage_null: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object as OpenAI sends it."""
    obj: dict[str, Any] = {
        "id": CHAT_ID,
        "object": "chat.completion.chunk",
        "created": 1732890000,
        "model": MODEL,
        "system_fingerprint": "fp_0ba0d124f1",
        "choices": list(choices) if choices is not None else [],
    }
    if usage is not None:
        obj["usage"] = usage
    elif include_usage_null:
        obj["usage"] = None
    obj.update(extra)
    return obj


def choice(
    index: int = 0,
    finish: str | None = None,
    *,
    logprobs: Any = None,
    **delta: Any,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def text_chunk(text: str, index: int = 0) -> bytes:
    return sse(chunk([choice(index, content=text)]))


def role_chunk(index: int = 0) -> bytes:
    return sse(chunk([choice(index, role="assistant", content="", refusal=None)]))


def finish_chunk(reason: str = "stop", index: int = 0) -> bytes:
    return sse(chunk([choice(index, reason)]))


USAGE = {
    "prompt_tokens": 19,
    "completion_tokens": 10,
    "total_tokens": 29,
    "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 2, "audio_tokens": 0},
}


def usage_chunk(usage: dict[str, Any] | None = None) -> bytes:
    return sse(chunk([], usage=USAGE if usage is None else usage))


def join(*parts: bytes) -> bytes:
    return b"".join(parts)


def guard_outcome(
    make_contract: Callable[[], Contract], partition: list[bytes], **kw: Any
) -> tuple[bytes, str, str, bytes]:
    """What a client would see for one partition: output, outcome, reason, annotation."""
    run = run_guard(make_contract(), partition, **kw)
    return (
        run.output,
        str(run.verdict.outcome),
        str(run.verdict.reason),
        run.guard.annotation("req-p"),
    )


# -- block tables (the Responses and Messages contract tests) ---------------------------

#: The reasons a table case expects to end ``complete``.
_COMPLETE = {Reason.STOP, Reason.LENGTH, Reason.TOOL_CALLS, Reason.CONTENT_FILTER, Reason.OTHER}

Drive = Callable[..., tuple[bytes, Verdict, StreamGuard]]


ContractT = TypeVar("ContractT", bound=Contract)


def driver(make: Callable[..., Contract]) -> Drive:
    """The contract tests' ``drive(stream, chunks=None, *, decoder=None, keep_text=False)``
    for the contract ``make(keep_text=...)`` builds: the guard's output, verdict and
    guard for ``stream`` (in one chunk, or in ``chunks``)."""

    def drive(
        stream: bytes,
        chunks: Iterable[bytes] | None = None,
        *,
        decoder: SSEDecoder | None = None,
        keep_text: bool = False,
    ) -> tuple[bytes, Verdict, StreamGuard]:
        run = run_guard(
            make(keep_text=keep_text), [stream] if chunks is None else chunks, decoder=decoder
        )
        return run.output, run.verdict, run.guard

    return drive


def contract_of(guard: StreamGuard, kind: type[ContractT]) -> ContractT:
    """The guard's contract, checked to be a ``kind``."""
    assert isinstance(guard.contract, kind)
    return guard.contract


def whole(name: str, blocks: list[bytes], reason: Reason, **kw: Any) -> BlockCase:
    """A case whose every block reaches the client."""
    return BlockCase(name, blocks, len(blocks), reason, **kw)


def rejected(name: str, blocks: list[bytes], at: int, reason: Reason, **kw: Any) -> BlockCase:
    """A case whose ``blocks[at]`` is the event the contract rejects."""
    return BlockCase(name, blocks, at, reason, **kw)


def raw_block(event: str | None, data: str) -> bytes:
    """One SSE block whose data line is ``data`` as given (valid JSON or not)."""
    return sse(data, event=event)


def inserted(base: list[bytes], at: int, extra: bytes) -> list[bytes]:
    return [*base[:at], extra, *base[at:]]


@dataclass
class BlockCase:
    """One row of a contract table: a stream as SSE blocks and what the guard must make of it."""

    name: str
    blocks: list[bytes]
    forwarded: int  # how many leading blocks reach the client
    reason: Reason
    tail: bytes = b""  # bytes after the last block (an unfinished event)
    usage: Usage | None = None
    raw_finish: dict[int, str] = field(default_factory=dict)
    content_events: int | None = None
    tool_calls: int = 0

    @property
    def outcome(self) -> Outcome:
        return Outcome.COMPLETE if self.reason in _COMPLETE else Outcome.INCOMPLETE

    @property
    def stream(self) -> bytes:
        return b"".join(self.blocks) + self.tail

    @property
    def expected(self) -> bytes:
        return b"".join(self.blocks[: self.forwarded])


def case_ids(cases: list[BlockCase]) -> list[str]:
    return [case.name for case in cases]


def rejected_cases(cases: list[BlockCase]) -> list[BlockCase]:
    """The cases whose stream stops at an event the contract rejects."""
    return [
        c for c in cases if c.reason is not Reason.UPSTREAM_ERROR and c.forwarded < len(c.blocks)
    ]


def upstream_error_cases(cases: list[BlockCase]) -> list[BlockCase]:
    return [c for c in cases if c.reason is Reason.UPSTREAM_ERROR]


def check_verdict_and_forwarded(case: BlockCase, drive: Drive) -> None:
    out, verdict, guard = drive(case.stream)
    assert verdict.outcome is case.outcome
    assert verdict.reason is case.reason
    assert out == case.expected
    assert guard.forwarded_bytes == len(case.expected)
    assert verdict.usage == case.usage
    if case.raw_finish:
        assert verdict.raw_finish_reasons == case.raw_finish
    if case.content_events is not None:
        assert guard.content_events == case.content_events
    assert verdict.tool_calls == case.tool_calls
    if verdict.complete:
        assert verdict.detail == ""
    else:
        assert verdict.detail


def check_stops_before_the_rejected_event(case: BlockCase, drive: Drive) -> None:
    out, _, _ = drive(case.stream)
    assert out == case.expected
    # the relay stopped exactly before the rejected event
    assert case.stream[len(out) :].startswith(case.blocks[case.forwarded])


def check_every_partition(
    stream: bytes, drive: Drive, also: Callable[[StreamGuard], object] = lambda guard: None
) -> None:
    """One chunk and one byte at a time give the same output, verdict and annotation
    (and the same ``also(guard)``). Arbitrary partitions are each contract's property
    test (``check_random_partition``), run over its whole case table."""
    out, verdict, guard = drive(stream)
    annotation = guard.annotation("req-1")
    extra = also(guard)
    got, got_verdict, got_guard = drive(stream, bytewise(stream))
    assert got == out
    assert got_verdict == verdict
    assert also(got_guard) == extra
    assert got_guard.annotation("req-1") == annotation


def random_partition(data: st.DataObject, stream: bytes, max_cuts: int = 8) -> list[bytes]:
    """``stream`` cut at up to ``max_cuts`` offsets hypothesis draws (repeats allowed)."""
    offsets = data.draw(st.lists(st.integers(0, len(stream)), max_size=max_cuts), "cuts")
    return cut(stream, *sorted(offsets))


def check_random_partition(
    data: st.DataObject,
    stream: bytes,
    drive: Drive,
    also: Callable[[StreamGuard], object] = lambda guard: None,
) -> None:
    """A partition hypothesis draws gives the one-chunk output, verdict and annotation."""
    out, verdict, guard = drive(stream)
    got, got_verdict, got_guard = drive(stream, random_partition(data, stream))
    assert got == out
    assert got_verdict == verdict
    assert also(got_guard) == also(guard)
    assert got_guard.annotation("req-1") == guard.annotation("req-1")

"""The access log's writer thread, over a real pipe: a stalled reader never blocks a flush.

The gateway as a process with a stdout nobody reads is in
tests/integration/test_hostile_input.py; these drive the parts of it one at a time.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
from collections.abc import Iterator

import pytest

from gateway.observe.accesslog import AccessLog
from gateway.observe.record import RequestRecord

# A pipe holds 64 KiB: a few hundred lines fill it.
_PIPE_FILLING_LINES = 400


def _record(n: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{n}", route="r", method="POST", path="/v1/x", started=0.0, client="c"
    )


class Pipe:
    """A real OS pipe whose ends are closed once (a descriptor number closed twice may
    by then be someone else's)."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()
        self._open = {self.read, self.write}

    def close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    ends = Pipe()
    yield ends
    ends.close(ends.read)
    ends.close(ends.write)


def _read_lines(fd: int, last_id: str) -> list[str]:
    out = b""
    while f'"request_id":"{last_id}"'.encode() not in out:
        chunk = os.read(fd, 65536)
        assert chunk, "the pipe closed"
        out += chunk
    return out.decode("ascii").splitlines()


def test_flushes_into_a_full_pipe_return_and_count_what_the_queue_cannot_hold(
    pipe: Pipe,
) -> None:
    read, write = pipe.read, pipe.write
    stream = os.fdopen(write, "w", encoding="ascii", closefd=False)
    dropped: list[int] = []
    log = AccessLog(stream=stream, on_dropped=dropped.append, queue_lines=2)
    log.start()
    # No loop runs here: every write flushes its line. The thread blocks on the full
    # pipe and two batches wait; every later one is dropped, and no write ever blocks.
    for n in range(_PIPE_FILLING_LINES):
        log.write(_record(n))
    assert sum(dropped) > 0
    # Read again: the thread writes what it was handed (close() waits for it), whole.
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(iter(lambda: os.read(read, 65536), b"")))
    reader.start()
    log.close(timeout=30)
    stream.close()
    pipe.close(write)
    reader.join(30)
    lines = b"".join(out).decode("ascii").splitlines()
    assert len(lines) + sum(dropped) == _PIPE_FILLING_LINES
    ids = [int(json.loads(line)["request_id"][1:]) for line in lines]
    assert ids[0] == 0
    assert ids == sorted(ids)


def test_close_gives_up_on_a_stalled_stdout(pipe: Pipe) -> None:
    write = pipe.write
    stream = os.fdopen(write, "w", encoding="ascii", closefd=False)
    # The thread stays blocked until the pipe goes, then fails: nothing to report.
    log = AccessLog(stream=stream, queue_lines=2, on_error=lambda name: None)
    log.start()
    for n in range(_PIPE_FILLING_LINES):
        log.write(_record(n))
    done = threading.Event()

    def close() -> None:
        log.close(timeout=0.2)
        done.set()

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    assert done.wait(30), "close() waited on a stdout nobody reads"


def test_a_write_that_fails_in_the_thread_is_reported(pipe: Pipe) -> None:
    read, write = pipe.read, pipe.write
    pipe.close(read)  # every write now fails (EPIPE)
    stream = os.fdopen(write, "w", encoding="ascii", closefd=False)
    failed = threading.Event()
    names: list[str] = []

    def on_error(name: str) -> None:
        names.append(name)
        failed.set()

    log = AccessLog(stream=stream, on_error=on_error)
    log.start()
    log.write(_record(1))
    assert failed.wait(30)
    assert names == ["access_log"]
    log.close(timeout=5)


def test_the_thread_writes_to_stdouts_descriptor(
    pipe: Pipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a stream of its own it writes to stdout's file descriptor, not through
    ``sys.stdout`` (a thread blocked there would hold the lock the exit waits for)."""
    read, write = pipe.read, pipe.write
    stdout = os.fdopen(write, "w", encoding="ascii", closefd=False)
    monkeypatch.setattr("sys.stdout", stdout)
    stdout.write("before\n")  # buffered in sys.stdout: start() flushes it first
    log = AccessLog()
    log.start()
    log.write(_record(7))
    log.flush()
    lines = _read_lines(read, "r7")
    log.close(timeout=5)
    assert lines[0] == "before"
    assert '"request_id":"r7"' in lines[1]
    stdout.close()


def test_a_stdout_replaced_after_start_gets_the_lines(
    pipe: Pipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sys.stdout swapped while the gateway runs (pytest's capsys does): lines go where it
    points now, not to the descriptor taken at start."""
    stdout = os.fdopen(pipe.write, "w", encoding="ascii", closefd=False)
    monkeypatch.setattr("sys.stdout", stdout)
    log = AccessLog()
    log.start()
    replaced = io.StringIO()
    monkeypatch.setattr("sys.stdout", replaced)
    log.write(_record(8))
    log.close(timeout=5)
    assert '"request_id":"r8"' in replaced.getvalue()
    stdout.close()


def _stalled(pipe: Pipe, **options: object) -> tuple[AccessLog, list[int], io.TextIOWrapper]:
    """A started log whose stream is a pipe nobody reads yet."""
    stream = os.fdopen(pipe.write, "w", encoding="ascii", closefd=False)
    dropped: list[int] = []
    log = AccessLog(stream=stream, on_dropped=dropped.append, **options)  # type: ignore[arg-type]
    log.start()
    return log, dropped, stream


def _drain(pipe: Pipe, log: AccessLog, stream: io.TextIOWrapper) -> list[str]:
    """Read the pipe while the log closes; every line it wrote."""
    out: list[bytes] = []
    reader = threading.Thread(
        target=lambda: out.extend(iter(lambda: os.read(pipe.read, 65536), b""))
    )
    reader.start()
    log.close(timeout=30)
    stream.close()
    pipe.close(pipe.write)
    reader.join(30)
    return b"".join(out).decode("ascii").splitlines()


def test_what_waits_is_bounded_in_lines_not_batches(pipe: Pipe) -> None:
    # Batches of ten lines (flushed by hand inside a loop, as the 0.1 s timer would):
    # a bound of 50 lines keeps five of them waiting, where one of 50 batches would
    # keep 500 lines.
    log, dropped, stream = _stalled(pipe, queue_lines=50)

    async def batches() -> None:
        for n in range(_PIPE_FILLING_LINES * 2):
            log.write(_record(n))
            if n % 10 == 9:
                log.flush()

    asyncio.run(batches())
    lines = _drain(pipe, log, stream)
    assert len(lines) + sum(dropped) == _PIPE_FILLING_LINES * 2
    assert set(dropped) == {10}
    # What the pipe held (64 KiB), the batch the thread was writing, and 50 lines.
    assert len(lines) <= 65536 // min(len(line) for line in lines) + 10 + 50


def test_a_late_flush_never_makes_a_batch_the_queue_cannot_take(pipe: Pipe) -> None:
    """On a loaded machine the 0.1 s flush timer fires late, and more lines than the
    queue holds may gather before it does: a batch is handed over once it is as long as
    the queue, never longer (a longer one was refused whole, every line dropped while
    the writer thread sat idle: the loaded suite's test_hostile_input saw 40 of 40)."""
    log, dropped, stream = _stalled(pipe, queue_lines=8, flush_interval=3600.0)

    async def late() -> None:  # the timer never fires during the test: as late as it gets
        for n in range(20):
            log.write(_record(n))

    asyncio.run(late())
    log.flush()
    lines = _drain(pipe, log, stream)
    assert len(lines) + sum(dropped) == 20
    assert len(lines) >= 8, (len(lines), dropped)  # the thread took the first full batch


def test_a_flush_while_closing_is_written_not_lost(pipe: Pipe) -> None:
    log, dropped, stream = _stalled(pipe)
    log.write(_record(1))
    closing = threading.Thread(target=log.close, kwargs={"timeout": 30})
    # The thread holds a line it cannot write yet (nobody reads); close() waits for it.
    for n in range(2, _PIPE_FILLING_LINES):
        log.write(_record(n))
    closing.start()
    closing.join(0.2)  # close() has begun: the writer takes nothing more
    reader_out: list[bytes] = []
    reader = threading.Thread(
        target=lambda: reader_out.extend(iter(lambda: os.read(pipe.read, 65536), b""))
    )
    reader.start()
    log.write(_record(-1))  # after close began: written here, after what the thread held
    closing.join(30)
    stream.close()
    pipe.close(pipe.write)
    reader.join(30)
    lines = b"".join(reader_out).decode("ascii").splitlines()
    assert len(lines) + sum(dropped) == _PIPE_FILLING_LINES
    assert '"request_id":"r-1"' in lines[-1]


def test_a_non_blocking_stdout_gets_every_line_whole(
    pipe: Pipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone made stdout non-blocking: a write that would block is waited on, never
    cut short (a torn batch would glue the next line onto a half one)."""
    os.set_blocking(pipe.write, False)
    stdout = os.fdopen(pipe.write, "w", encoding="ascii", closefd=False)
    monkeypatch.setattr("sys.stdout", stdout)
    log = AccessLog(max_buffered=100)
    log.start()
    for n in range(_PIPE_FILLING_LINES):  # one batch of 100 lines at a time
        log.write(_record(n))
    lines = _drain(pipe, log, stdout)
    assert [json.loads(line)["request_id"] for line in lines] == [
        f"r{n}" for n in range(_PIPE_FILLING_LINES)
    ]


def test_a_failing_write_without_on_error_leaves_the_thread_writing(
    pipe: Pipe, caplog: pytest.LogCaptureFixture
) -> None:
    class Flaky(io.StringIO):
        fail = True

        def write(self, text: str) -> int:
            if Flaky.fail:
                Flaky.fail = False
                raise OSError("disk full")
            return super().write(text)

    stream = Flaky()
    log = AccessLog(stream=stream)  # no on_error: the thread logs what it raised
    log.start()
    log.write(_record(1))
    log.write(_record(2))
    log.close(timeout=30)
    assert '"request_id":"r2"' in stream.getvalue()
    assert "gateway-access-log failed" in caplog.text

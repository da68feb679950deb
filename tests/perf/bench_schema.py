"""The schema check's cost per content event, side by side with the check off, one run.

Run it as a script (no network)::

    .venv/bin/python tests/perf/bench_schema.py [--rounds 7] [--events 2000]

A Chat stream of ``--events`` content events (four characters of a JSON answer
each, as a model streams a structured answer) is judged by the guard three
ways, interleaved round by round so that the machine's drift hits all alike:

- ``plain``: the guard alone, no reader (a request without a schema: what
  every stream pays today);
- ``off``: the guard with a reader of whole events that does nothing (the
  per-event hand-out every reader costs, schema or not);
- ``schema``: the guard with the schema stage's reader, the check on.

It also prints what the stage costs a request without a schema (its way past:
the route's mode and the protocol's markers searched in a 1 KiB body).

It prints the median CPU per content event of each and the difference
``schema - plain``: the added CPU per content event with a schema (the
issue's bound: 1.5 us).

On a loaded machine CPU time drifts with what else runs; ``--instructions``
counts instructions instead (``valgrind --tool=callgrind``, load-independent)::

    .venv/bin/python tests/perf/bench_schema.py --instructions --events 2000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.guard import Event, Refusal, StreamGuard, WholeEvents
from gateway.protocols import spec_for
from gateway.schema import Bounds, StreamCheck
from gateway.schema.reader import Reader

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 0},
                    "ok": {"type": "boolean"},
                },
                "required": ["name", "qty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
}


def stream(events: int) -> tuple[bytes, int]:
    """A Chat stream of about ``events`` four-character deltas of a valid answer."""
    doc = {"items": [{"name": f"item {i}", "qty": i, "ok": True} for i in range(events)]}
    # cut to ``events`` deltas, then closed, so that the answer stays whole and valid
    whole = json.dumps(doc)
    cut = whole[: events * 4 - 4]
    cut = cut[: cut.rfind("}") + 1]
    whole = cut + "]}"
    text = whole
    deltas = [text[i : i + 4] for i in range(0, len(text), 4)]
    out = []
    for delta in deltas:
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}],
        }
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    end = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    out.append(b"data: " + json.dumps(end).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out), len(deltas)


class _Nothing:
    def check(self, piece: bytes, event: Event) -> Refusal | None:
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        pass


def run_once(data: bytes, way: str, *, counted: bool = False) -> float:
    """CPU seconds to judge ``data`` in 4 KiB reads, one way (``counted``: the judging
    alone inside a call of ``sorted``, for callgrind to count)."""
    spec = spec_for("chat")
    structured = spec.structured
    assert structured is not None
    guard = StreamGuard(spec.new_contract(_options()))
    reader = None
    if way != "plain":
        whole = WholeEvents()
        whole.streaming = True
        if way == "off":
            whole.add(_Nothing())
        else:
            check = StreamCheck(structured.schemas({"response_format": _format()}), Bounds())
            check.prepare()
            reader = Reader(check, structured.parts, ends=True, whole=whole)
            whole.add(reader)
        guard.whole = whole

    def judge(_: object = None) -> int:
        for at in range(0, len(data), 4096):
            guard.feed(data[at : at + 4096])
        guard.eof()
        if reader is not None:
            verdicts = reader.verdicts()
            assert [str(v.result) for v in verdicts] == ["valid"], verdicts
        return 0

    start = time.process_time()
    if counted:  # callgrind counts only inside ``sorted`` (``--toggle-collect``)
        sorted([0], key=judge)
    else:
        judge()
    spent = time.process_time() - start
    assert guard.verdict is not None
    assert guard.verdict.complete, guard.verdict
    return spent


def _format() -> dict[str, object]:
    return {"type": "json_schema", "json_schema": {"name": "items", "schema": SCHEMA}}


def _options() -> object:
    from gateway.protocols import ContractOptions

    return ContractOptions()


def no_schema_cost(rounds: int = 200_000) -> float:
    """CPU microseconds the schema stage adds to a request without a schema: its way
    past (the route's mode, the protocol's markers searched in a 1 KiB Chat body)."""
    import asyncio
    from types import SimpleNamespace

    from gateway.proxy.schema_stage import SchemaStage

    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 900}]}
    exchange: Any = SimpleNamespace(
        route=SimpleNamespace(config=SimpleNamespace(schema_check="record")),
        spec=spec_for("chat"),
        record=SimpleNamespace(stream=True),
        request_json={},
        body=json.dumps(chat).encode(),
        scope={"headers": []},
    )

    async def last(exchange: Any) -> None:
        return None

    async def both() -> tuple[float, float]:
        stage = SchemaStage()
        start = time.process_time()
        for _ in range(rounds):
            await last(exchange)
        bare = time.process_time() - start
        start = time.process_time()
        for _ in range(rounds):
            await stage(exchange, last)
        return bare, time.process_time() - start

    bare, staged = asyncio.run(both())
    return (staged - bare) / rounds * 1e6


def _instructions(way: str, events: int) -> int:
    """Instructions callgrind counts while this script judges the stream once one way
    (after a first time uncounted): the judging alone, inside ``sorted``. With
    pymalloc (Python turns it off under valgrind, which would count the system
    allocator instead) and a fixed hash seed: the same count run after run."""
    env = {**os.environ, "PYTHONMALLOC": "pymalloc", "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=builtin_sorted",
            sys.executable,
            __file__,
            "--events",
            str(events),
            "--way",
            way,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    assert found is not None, out.stderr[-500:]
    return int(found.group(1))


def instructions(requested: int) -> None:
    """Instructions per content event of each way, load-independent
    (``valgrind --tool=callgrind``, counting only the judging): the slope between a
    stream of ``requested`` events and one of a fifth as many, so that what a stream
    costs once (the first call of each path, the end check) is left out."""
    small = max(50, requested // 5)
    counts = {n: stream(n)[1] for n in (small, requested)}
    per: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for way in ("plain", "off", "schema"):
            runs = {n: pool.submit(_instructions, way, n) for n in counts}
            spread = runs[requested].result() - runs[small].result()
            per[way] = spread / (counts[requested] - counts[small])
            print(f"{way:7s} {per[way]:8.0f} instructions per content event")
    print(f"added by the schema check: {per['schema'] - per['plain']:.0f} instructions per event")
    print(f"added by the check alone (schema - off): {per['schema'] - per['off']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per event under callgrind instead of timing CPU",
    )
    parser.add_argument("--way", choices=("plain", "off", "schema"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    data, events = stream(args.events)
    if args.way is not None:  # one way, under callgrind (``--instructions``)
        run_once(data, args.way)
        run_once(data, args.way, counted=True)
        return
    if args.instructions:
        instructions(args.events)
        return
    results: dict[str, list[float]] = {"plain": [], "off": [], "schema": []}
    for way in results:  # warm up
        run_once(data, way)
    for _ in range(args.rounds):
        for way in results:
            results[way].append(run_once(data, way) / events * 1e6)
    medians = {way: statistics.median(values) for way, values in results.items()}
    for way, median in medians.items():
        print(f"{way:7s} {median:6.2f} us CPU per content event ({events} events)")
    print(f"added by the schema check: {medians['schema'] - medians['plain']:.2f} us per event")
    print(f"added by the check alone (schema - off): {medians['schema'] - medians['off']:.2f} us")
    print(f"a request without a schema: the stage adds {no_schema_cost():.2f} us")


if __name__ == "__main__":
    main()

"""Microbenchmark: the gateway's SSE decoder against two reference decoders, in one run.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_sse.py [--events N] [--chunk BYTES] [--repeat N]

It builds an OpenAI-style Chat Completions stream of 10,000 events (role
chunk, content chunks with ASCII, CJK and emoji text, a finish chunk, a usage
chunk and ``data: [DONE]``), cuts it into 4 KiB chunks like a socket would,
and decodes it with

* ``gateway.guard.sse.SSEDecoder`` (ours: bytes in, events with offsets out),
* a naive byte-by-byte WHATWG decoder written below (the spec's algorithm, one
  Python loop iteration per byte), and
* httpx-sse's ``SSEDecoder`` fed line by line, each line stripped as
  ``EventSource.iter_sse`` does, with UTF-8 decoding and line splitting done
  the way httpx does it (its internal incremental ``TextDecoder`` and
  ``LineDecoder``; a codecs incremental decoder and ``splitlines`` if those
  are not importable). This is a tight loop, without the generators that
  ``iter_sse`` runs through, so it flatters httpx-sse a little; the real
  ``EventSource(response).iter_sse()`` over an ``httpx.Response`` is timed
  too, for information.

Every decoder must produce the same event data. The runs are interleaved
(one of each per round) and each decoder's best round counts, timed in
process CPU time so that other processes on the machine disturb it less;
reported as events/s, with the ratios. It exits 1 if ours is less than 8x the
naive decoder or less than 2x httpx-sse, 2 if httpx-sse is not installed
(``.venv/bin/pip install httpx-sse``, or the ``perf`` extra).
"""

from __future__ import annotations

import argparse
import codecs
import gc
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.guard.sse import Event, SSEDecoder

MIN_RATIO_NAIVE = 8.0
MIN_RATIO_HTTPX_SSE = 2.0

_WORDS = [
    "The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
    "\n\n",
    " 你好",
    "世界",
    " ",
    "🙂",
    " naïve",
    " café",
    ' "quoted"',
    " \\ backslash",
    " 1234",
]


def build_stream(n_events: int) -> bytes:
    """An OpenAI Chat Completions stream with exactly ``n_events`` events.

    Non-ASCII text is sent as raw UTF-8 (not ``\\u`` escapes), as the OpenAI
    API does, so chunk boundaries fall inside multibyte characters.
    """
    head = {
        "id": "chatcmpl-AbCdEf0123456789",
        "object": "chat.completion.chunk",
        "created": 1732890000,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0123456789",
    }

    def chunk(choices: list[object], **extra: object) -> bytes:
        body = json.dumps(
            {**head, "choices": choices, **extra}, separators=(",", ":"), ensure_ascii=False
        )
        return b"data: " + body.encode() + b"\n\n"

    def choice(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    parts = [chunk([choice({"role": "assistant", "content": "", "refusal": None})])]
    for i in range(n_events - 4):
        parts.append(chunk([choice({"content": _WORDS[i % len(_WORDS)]})]))
    parts.append(chunk([choice({}, "stop")]))
    usage = {"prompt_tokens": 17, "completion_tokens": n_events - 4, "total_tokens": n_events + 13}
    parts.append(chunk([], usage=usage))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def split(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


# -- (a) naive byte-by-byte WHATWG decoder ----------------------------------------


class NaiveDecoder:
    """The spec's parsing algorithm, transcribed literally: one loop iteration per byte."""

    def __init__(self) -> None:
        self.line = bytearray()
        self.after_cr = False
        self.bom_checked = False
        self.data = bytearray()
        self.event_type = ""
        self.last_id = ""

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        for byte in chunk:
            if self.after_cr:
                self.after_cr = False
                if byte == 0x0A:
                    continue
            if byte == 0x0D:
                self.after_cr = True
                self.end_line(out)
            elif byte == 0x0A:
                self.end_line(out)
            else:
                self.line.append(byte)
        return out

    def end_line(self, out: list[str]) -> None:
        raw = bytes(self.line)
        self.line.clear()
        if not self.bom_checked:
            self.bom_checked = True
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
        if not raw:
            if self.data:
                data = self.data[:-1] if self.data.endswith(b"\n") else self.data
                out.append(bytes(data).decode("utf-8", "replace"))
            self.data.clear()
            self.event_type = ""
            return
        if raw[0] == 0x3A:
            return
        name, colon, value = raw.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self.data += value
            self.data.append(0x0A)
        elif name == b"event":
            self.event_type = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            self.last_id = value.decode("utf-8", "replace")


def run_naive(chunks: list[bytes]) -> list[str]:
    decoder = NaiveDecoder()
    out: list[str] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


# -- (b) httpx-sse, with httpx's text decoding and line splitting ----------------


def httpx_sse_runner() -> tuple[Callable[[list[bytes]], list[Any]], str] | None:
    try:
        from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
    except ImportError:
        return None

    text_decoder_factory: Callable[[], Callable[[bytes], str]]
    try:
        from httpx._decoders import TextDecoder

        def text_decoder_factory() -> Callable[[bytes], str]:
            return TextDecoder("utf-8").decode

        text_name = "httpx TextDecoder"
    except ImportError:

        def text_decoder_factory() -> Callable[[bytes], str]:
            return codecs.getincrementaldecoder("utf-8")(errors="replace").decode

        text_name = "codecs incremental decoder"

    line_decoder_factory: Callable[[], Callable[[str], list[str]]]
    try:
        from httpx._decoders import LineDecoder

        def line_decoder_factory() -> Callable[[str], list[str]]:
            return LineDecoder().decode

        line_name = "httpx LineDecoder"
    except ImportError:
        line_decoder_factory = _splitlines_decoder
        line_name = "splitlines"

    def run(chunks: list[bytes]) -> list[Any]:
        decode_text = text_decoder_factory()
        decode_lines = line_decoder_factory()
        decoder = HttpxSSEDecoder()
        out: list[Any] = []
        for chunk in chunks:
            for line in decode_lines(decode_text(chunk)):
                # exactly what EventSource.iter_sse does with each line
                sse = decoder.decode(line.rstrip("\n"))
                if sse is not None:
                    out.append(sse)
        return out

    return run, f"{text_name} + {line_name}"


def _splitlines_decoder() -> Callable[[str], list[str]]:
    pending = [""]

    def decode(text: str) -> list[str]:
        lines = (pending[0] + text).splitlines(keepends=True)
        pending[0] = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        return [line.rstrip("\r\n") for line in lines]

    return decode


def iter_sse_runner() -> Callable[[list[bytes]], list[Any]] | None:
    """httpx-sse as applications run it: ``EventSource(response).iter_sse()``."""
    try:
        import httpx
        from httpx_sse import EventSource
    except ImportError:
        return None

    def run(chunks: list[bytes]) -> list[Any]:
        headers = {"content-type": "text/event-stream"}
        response = httpx.Response(200, headers=headers, content=iter(chunks))
        return list(EventSource(response).iter_sse())

    return run


# -- ours --------------------------------------------------------------------------


def run_ours(chunks: list[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    out: list[Event] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


# -- timing ------------------------------------------------------------------------


def time_once(fn: Callable[[list[bytes]], object], chunks: list[bytes]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        fn(chunks)
        return time.process_time() - t0
    finally:
        gc.enable()


def best_times(
    runners: dict[str, Callable[[list[bytes]], object]],
    chunks: list[bytes],
    repeat: int,
    limited: dict[str, int],
) -> dict[str, float]:
    """Best of ``repeat`` runs each, interleaved so that machine noise hits all alike."""
    best = dict.fromkeys(runners, float("inf"))
    for round_ in range(repeat):
        for name, fn in runners.items():
            if round_ < limited.get(name, repeat):
                best[name] = min(best[name], time_once(fn, chunks))
    return best


def check_same(results: Iterable[tuple[str, list[str]]]) -> None:
    items = list(results)
    reference_name, reference = items[0]
    for name, got in items[1:]:
        if got != reference:
            raise SystemExit(f"{name} decoded different events than {reference_name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=4096, help="chunk size in bytes")
    parser.add_argument("--repeat", type=int, default=30, help="best of N runs")
    parser.add_argument(
        "--naive-repeat", type=int, default=3, help="best of N runs of the slow naive decoder"
    )
    args = parser.parse_args(argv)

    stream = build_stream(args.events)
    chunks = split(stream, args.chunk)
    httpx_sse = httpx_sse_runner()
    if httpx_sse is None:
        print("httpx-sse is not installed: .venv/bin/pip install httpx-sse", file=sys.stderr)
        return 2
    run_httpx_sse, pipeline = httpx_sse

    runners: dict[str, Callable[[list[bytes]], list[Any]]] = {
        "ours": run_ours,
        "naive": run_naive,
        "httpx-sse": run_httpx_sse,
    }
    run_iter_sse = iter_sse_runner()
    if run_iter_sse is not None:
        runners["iter_sse"] = run_iter_sse

    # Every decoder returns a list of its own event objects; same data, or no benchmark.
    ours = [event.data for event in run_ours(chunks)]
    check_same(
        [
            ("ours", ours),
            ("naive", run_naive(chunks)),
            *[
                (name, [sse.data for sse in fn(chunks)])
                for name, fn in runners.items()
                if name not in ("ours", "naive")
            ],
        ]
    )
    n_events = len(ours)
    if n_events != args.events:
        raise SystemExit(f"expected {args.events} events, decoded {n_events}")

    best = best_times(runners, chunks, args.repeat, {"naive": args.naive_repeat})
    t_ours, t_naive, t_httpx = best["ours"], best["naive"], best["httpx-sse"]

    print(f"python {sys.version.split()[0]}")
    print(
        f"stream: {n_events} events, {len(stream)} bytes, "
        f"{len(chunks)} chunks of {args.chunk} bytes; best of {args.repeat} "
        f"(naive: best of {args.naive_repeat})"
    )
    print(f"httpx-sse pipeline: {pipeline}")
    rows = [
        ("gateway SSEDecoder", t_ours),
        ("naive byte-by-byte", t_naive),
        ("httpx-sse", t_httpx),
    ]
    if "iter_sse" in best:  # for information: the same decoder behind its generators
        rows.append(("httpx-sse iter_sse", best["iter_sse"]))
    for name, seconds in rows:
        print(
            f"  {name:<20} {n_events / seconds:>14,.0f} events/s "
            f"{len(stream) / seconds / 1e6:>9.1f} MB/s  {seconds * 1e3:9.2f} ms"
        )
    ratio_naive = t_naive / t_ours
    ratio_httpx = t_httpx / t_ours
    print(f"ours / naive     = {ratio_naive:6.2f}x  (required >= {MIN_RATIO_NAIVE:g}x)")
    print(f"ours / httpx-sse = {ratio_httpx:6.2f}x  (required >= {MIN_RATIO_HTTPX_SSE:g}x)")
    if "iter_sse" in best:
        print(f"ours / iter_sse  = {best['iter_sse'] / t_ours:6.2f}x  (information only)")
    ok = ratio_naive >= MIN_RATIO_NAIVE and ratio_httpx >= MIN_RATIO_HTTPX_SSE
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Deterministic, seeded answer text and tool-call arguments.

The same seed always gives the same pieces, so two requests with the same
knobs produce the same body bytes. One delta in three is a multibyte word
(CJK, emoji, accented Latin), so a partition of the stream splits UTF-8
characters somewhere. JSON is always written with ``ensure_ascii=False``:
those characters travel as raw UTF-8, not ``\\u`` escapes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Final

__all__ = [
    "expected_text",
    "filler",
    "invalid_tool_arguments",
    "split_arguments",
    "text_deltas",
    "tool_arguments",
]

_WORDS: Final = (
    "stream",
    "token",
    "gateway",
    "river",
    "signal",
    "answer",
    "model",
    "byte",
    "event",
    "window",
    "quiet",
    "bright",
    "north",
    "value",
    "delta",
    "echo",
    "harbor",
    "lantern",
    "orbit",
    "meadow",
)
_MULTI: Final = (
    "你好",
    "世界",
    "数据流",
    "日本語",
    "こんにちは",
    "한국어",
    "🚀",
    "🌍",
    "✨",
    "👩‍💻",
    "😀",
    "café",
    "naïve",
    "Ωmega",
    "€5",
)
_FILLER_UNIT: Final = "lorem ipsum dolor sit amet consectetur adipiscing elit "
_LOCATIONS: Final = ("東京都 🗼", "Zürich", "São Paulo", "Reykjavík", "Kraków")


def filler(size: int) -> str:
    """``size`` bytes of ASCII filler (one byte per character)."""
    if size <= 0:
        return ""
    unit = _FILLER_UNIT
    return (unit * (size // len(unit) + 1))[:size]


#: ``surrogate=True``: the second delta is this lone high surrogate (valid JSON as an
#: escape, ``"\\ud83d"``, with no UTF-8 form), as a provider cutting an emoji in two sends.
LONE_SURROGATE: Final = "\ud83d"


def text_deltas(
    count: int, *, seed: int = 0, choice: int = 0, chunk_bytes: int = 0, surrogate: bool = False
) -> Iterator[str]:
    """The ``count`` content deltas of choice ``choice``, lazily.

    With ``chunk_bytes`` each delta is padded with ASCII filler to at least
    that many UTF-8 bytes, so a long stream costs no more memory than one delta.
    """
    rng = random.Random(f"text:{seed}:{choice}")
    pad = filler(chunk_bytes)
    for index in range(count):
        word = rng.choice(_MULTI) if index % 3 == 1 else rng.choice(_WORDS)
        if surrogate and index % 3 == 1:
            word = LONE_SURROGATE + word
        piece = (word.capitalize() if index == 0 else word) + " "
        if pad:
            size = len(piece.encode())
            if size < chunk_bytes:
                piece += pad[: chunk_bytes - size]
        yield piece


def expected_text(
    count: int, *, seed: int = 0, choice: int = 0, chunk_bytes: int = 0, surrogate: bool = False
) -> str:
    """The full text of ``count`` deltas, as a client assembling the stream sees it."""
    return "".join(
        text_deltas(count, seed=seed, choice=choice, chunk_bytes=chunk_bytes, surrogate=surrogate)
    )


def tool_arguments(seed: int = 0) -> str:
    """Valid JSON arguments for the scripted tool call (includes multibyte text)."""
    rng = random.Random(f"tool:{seed}")
    args = {
        "location": rng.choice(_LOCATIONS),
        "unit": rng.choice(("celsius", "fahrenheit")),
        "days": rng.randint(1, 7),
        "note": " ".join(rng.choice(_WORDS) for _ in range(4)),
    }
    return json.dumps(args, ensure_ascii=False)


def invalid_tool_arguments(seed: int = 0) -> str:
    """Arguments that are not valid JSON: the object is cut after a key."""
    return tool_arguments(seed)[:-1] + ', "extra": '


def split_arguments(arguments: str, *, seed: int = 0) -> list[str]:
    """Split tool arguments into many small pieces (1 to 6 characters each)."""
    rng = random.Random(f"split:{seed}")
    pieces: list[str] = []
    pos = 0
    while pos < len(arguments):
        size = rng.randint(1, 6)
        pieces.append(arguments[pos : pos + size])
        pos += size
    return pieces


#: The schema the simulator's structured answers are written against (``x-sim-structured``).
STRUCTURED_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


def structured_answer(shape: str) -> str:
    """The structured answer of ``shape`` (``gateway.simulator._knobs.SHAPES``)."""
    doc: dict[str, object] = {"name": "Ada Lovelace", "age": 36, "role": "admin"}
    if shape == "wrong_type":
        doc["age"] = "thirty-six"
    elif shape == "forbidden_member":
        doc["extra"] = True
    elif shape == "enum":
        doc["role"] = "root"
    elif shape == "missing_required":
        del doc["role"]
    text = json.dumps(doc, ensure_ascii=False)
    if shape == "prose_first":
        return "Sure! Here is the JSON: " + text
    if shape == "cut_mid_object":
        return text[: len(text) // 2]
    return text


def structured_arguments(shape: str, seed: int = 0) -> str:
    """A tool call's arguments: off the tool's schema (``days`` a string) for
    ``tool_off_schema``, else the usual valid ones."""
    if shape != "tool_off_schema":
        return tool_arguments(seed)
    args = json.loads(tool_arguments(seed))
    args["days"] = "three"
    return json.dumps(args, ensure_ascii=False)

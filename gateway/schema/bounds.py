"""Bounds on what a schema may ask of the checker, and the walk that enforces them.

A client's schema is untrusted input: nested 10,000 deep, a 1 MB ``enum``, a
``pattern`` that backtracks catastrophically, ``$ref`` chains that go round.
``admit`` walks a schema once, iteratively (no recursion, so no depth can
overflow the stack), within ``Bounds``, and answers either None (it may be
checked) or the reason it is not (its verdict is then ``unchecked``, never
``valid``). Worst case O(n) in the schema's nodes, stopping at ``max_nodes``.

Patterns are judged by their parse tree (``re``'s own parser): a repeat inside
an unbounded repeat, an alternation under an unbounded repeat, or a
backreference can backtrack exponentially, so such a pattern is refused;
what is left matches in time polynomial of low degree in the string's length,
and strings are bounded by the answer's size bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Bounds", "admit", "only_ref", "resolve", "safe_pattern"]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one request's schemas and answer may cost (``[schema]`` settings)."""

    max_depth: int = 64  # nesting of the schema, and of the answer
    #: Schema objects and arrays in all: the end check's compile costs about 0.35 ms a
    #: node (done once per schema, off the loop, then cached).
    max_nodes: int = 5_000
    max_enum: int = 1_000  # members of one ``enum``
    max_pattern: int = 1_000  # characters of one ``pattern``
    max_refs: int = 32  # ``$ref`` hops in a row without reaching a schema
    max_answer_bytes: int = 1 << 20  # the structured part the end check holds


def admit(schema: object, bounds: Bounds) -> str | None:
    """None when ``schema`` may be checked within ``bounds``, else the reason not."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return "the schema is not a JSON object"
    nodes = 0
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > bounds.max_nodes:
            return f"the schema has over {bounds.max_nodes} nodes"
        if depth > bounds.max_depth:
            return f"the schema is nested over {bounds.max_depth} deep"
        if isinstance(node, dict):
            reason = _keywords(node, schema, bounds)
            if reason is not None:
                return reason
            stack.extend((value, depth + 1) for value in node.values() if _container(value))
        else:
            stack.extend((value, depth + 1) for value in node if _container(value))
    return None


def _container(value: object) -> bool:
    return isinstance(value, (dict, list))


def _keywords(node: dict[str, Any], root: dict[str, Any], bounds: Bounds) -> str | None:
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > bounds.max_enum:
        return f"an enum has over {bounds.max_enum} members"
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        reason = safe_pattern(pattern, bounds)
        if reason is not None:
            return reason
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        for key in patterns:
            reason = safe_pattern(str(key), bounds)
            if reason is not None:
                return reason
    ref = node.get("$ref")
    if isinstance(ref, str):
        return _ref_chain(ref, root, bounds)
    return None


#: Keywords that say nothing about a value: a ``$ref`` beside only these is a pure ref.
ANNOTATIONS = frozenset(
    ("$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description")
)


def only_ref(node: dict[str, Any]) -> bool:
    """``node`` is a ``$ref`` and annotations only (the ref says all about the value)."""
    return all(key in ANNOTATIONS for key in node)


def resolve(ref: str, root: dict[str, Any]) -> Any:
    """The schema a local ``$ref`` (``#`` or ``#/a/b``) names, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _ref_chain(ref: str, root: dict[str, Any], bounds: Bounds) -> str | None:
    """A ``$ref`` must reach, within ``max_refs`` hops, a schema that is not only a ref."""
    seen: set[str] = set()
    while True:
        if not ref.startswith("#"):
            return f"a $ref leaves the schema ({ref[:64]})"
        if ref in seen:
            return "a $ref cycle that reaches no schema"
        if len(seen) >= bounds.max_refs:
            return f"a $ref chain over {bounds.max_refs} hops"
        seen.add(ref)
        target = resolve(ref, root)
        if target is None:
            return f"a $ref names nothing in the schema ({ref[:64]})"
        nxt = target.get("$ref") if isinstance(target, dict) else None
        if not isinstance(nxt, str) or not only_ref(target):
            return None
        ref = nxt


try:  # re's own parser: private, so its absence leaves every pattern unchecked
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python without it
    _sre_parse = None

_UNBOUNDED = 65535  # sre's MAXREPEAT as the parser reports it (or above)


def safe_pattern(pattern: str, bounds: Bounds) -> str | None:
    """None when ``pattern`` compiles and cannot backtrack exponentially, else why not."""
    if len(pattern) > bounds.max_pattern:
        return f"a pattern over {bounds.max_pattern} characters"
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return "a pattern that does not compile"
    if _sre_parse is None:  # pragma: no cover
        return "patterns cannot be judged here"
    try:
        tree = _sre_parse.parse(pattern)
    except Exception:  # pragma: no cover - compiled above
        return "a pattern that does not compile"
    if _risky(tree, under_star=False):
        return "a pattern that can backtrack catastrophically"
    return None


def _risky(items: Any, *, under_star: bool) -> bool:
    """A nested unbounded repeat, alternation or backreference under one (iterative)."""
    stack: list[tuple[Any, bool]] = [(items, under_star)]
    while stack:
        seq, star = stack.pop()
        for op, arg in seq:
            name = str(op)
            if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, sub = arg
                unbounded = high >= _UNBOUNDED or high - low > 32
                if star and (unbounded or high > 1):
                    return True
                stack.append((sub, star or (unbounded and name != "POSSESSIVE_REPEAT")))
            elif name == "SUBPATTERN":
                stack.append((arg[-1], star))
            elif name == "BRANCH":
                if star:
                    return True
                stack.extend((branch, star) for branch in arg[1])
            elif name in ("GROUPREF", "GROUPREF_EXISTS"):
                return True
            elif name in ("ASSERT", "ASSERT_NOT"):
                stack.append((arg[1], star))
            elif name == "ATOMIC_GROUP":
                stack.append((arg, False))
    return False

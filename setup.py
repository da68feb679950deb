"""Build hook: the guard (``gateway/guard/``) compiled with mypyc when it can be.

The guard runs on every event of every stream; compiled, it costs about half
as much CPU (docs/performance.md). The schema check's walker
(``gateway/schema/incremental.py``, the bounds it reads, the check and the
reader that feed it) runs on every event of a checked answer, and is
compiled with it: about half its CPU too (``tests/perf/bench_schema.py``).
Everything else is declared in pyproject.toml. The compiled modules are
optional: without a C compiler the build warns and installs the pure-Python
guard, which behaves the same (the test suite runs against whichever is
installed). ``PURE_PYTHON_GUARD=1`` skips the compilation.
"""

from __future__ import annotations

import os

from setuptools import setup

#: The schema check's modules compiled with the guard (sans-IO, like it).
SCHEMA_WALKER = [
    "gateway/schema/incremental.py",
    "gateway/schema/bounds.py",
    "gateway/schema/check.py",
    "gateway/schema/reader.py",
]


def _compiled_guard() -> list[object]:
    if os.environ.get("PURE_PYTHON_GUARD") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # no mypy in the build environment
        return []
    # Its own mypy options: the project's config loads plugins (pydantic) the build lacks;
    # ijson (the walker's push parser) ships no type hints, as the config says.
    extensions = mypycify(
        [
            "--config-file=",
            "--strict",
            "--disable-error-code=import-untyped",
            "gateway/guard",
            *SCHEMA_WALKER,
        ],
        opt_level="3",
        debug_level="0",
        group_name="gateway_guard",
    )
    for extension in extensions:
        extension.optional = True  # a failed compile leaves the pure-Python guard
    return extensions


setup(ext_modules=_compiled_guard())

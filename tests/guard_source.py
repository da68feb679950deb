"""Which guard the tests run: the compiled one the install built, or its Python source.

setup.py compiles ``gateway/guard/`` (and the schema check's walker with it) with
mypyc when it can; the compiled
modules sit beside their ``.py`` files and Python imports them first. So that
no test ever runs a guard older than its source, a compiled module older than
its ``.py`` stops the run (``make test`` rebuilds it). With
``PURE_PYTHON_GUARD=1`` the guard is loaded from its ``.py`` files even
where compiled modules are installed (``make test-guard-python``), so the
pure-Python fallback is tested too.

Loaded by tests/conftest.py before anything imports the gateway.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

GUARD = Path(__file__).resolve().parents[1] / "gateway" / "guard"
#: The schema check's walker, compiled with the guard (setup.py's ``SCHEMA_WALKER``).
SCHEMA = GUARD.parent / "schema"
WALKER = ("incremental", "bounds", "check", "reader")
PURE = os.environ.get("PURE_PYTHON_GUARD") == "1"


def stale_compiled_modules() -> list[str]:
    """Compiled guard (and walker) modules older than their source."""
    stale = []
    sources = [*GUARD.glob("*.py"), *(SCHEMA / f"{name}.py" for name in WALKER)]
    for source in sources:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            compiled = source.with_name(source.stem + suffix)
            if compiled.exists() and compiled.stat().st_mtime < source.stat().st_mtime:
                stale.append(compiled.name)
    return stale


class _GuardFromSource(importlib.abc.MetaPathFinder):
    """Finds ``gateway.guard`` and its modules as source files, never as extensions."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "gateway.guard":
            return importlib.util.spec_from_file_location(
                fullname, GUARD / "__init__.py", submodule_search_locations=[str(GUARD)]
            )
        if fullname.startswith("gateway.guard."):
            source = GUARD / (fullname.rpartition(".")[2] + ".py")
            if source.exists():
                return importlib.util.spec_from_file_location(fullname, source)
        if fullname in _WALKER_MODULES:
            return importlib.util.spec_from_file_location(
                fullname, SCHEMA / (fullname.rpartition(".")[2] + ".py")
            )
        return None


_WALKER_MODULES = frozenset(f"gateway.schema.{name}" for name in WALKER)


def install() -> None:
    """Apply the choice; call before the gateway is imported."""
    if PURE:
        assert "gateway.guard" not in sys.modules, "the guard was imported too early"
        sys.meta_path.insert(0, _GuardFromSource())

"""The tests run the guard the install built: compiled where setup.py compiled it, else source.

``make test`` runs the compiled guard (when the machine has a C compiler),
``make test-guard-python`` its Python source; both must pass the same tests.
"""

from __future__ import annotations

import importlib.machinery
import re
import sys
from pathlib import Path

import gateway.guard
from gateway import guard_build
from tests import guard_source


def _guard_modules() -> dict[str, str]:
    return {
        name: getattr(module, "__file__", "") or ""
        for name, module in sys.modules.items()
        if name == "gateway.guard" or name.startswith("gateway.guard.")
    }


def test_every_guard_module_comes_from_one_kind_of_build() -> None:
    files = _guard_modules()
    assert "gateway.guard.sse" in files
    kinds = {"python" if path.endswith(".py") else "compiled" for path in files.values()}
    assert kinds == {guard_build()}, files


def test_the_build_is_the_one_installed_or_the_source_when_asked() -> None:
    guard = Path(gateway.guard.__path__[0])
    compiled = any(
        (guard / ("sse" + suffix)).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )
    expected = "compiled" if compiled and not guard_source.PURE else "python"
    assert guard_build() == expected


def test_no_compiled_module_is_older_than_its_source() -> None:
    assert guard_source.PURE or guard_source.stale_compiled_modules() == []


def test_the_schema_walker_comes_from_the_same_build_as_the_guard() -> None:
    """setup.py compiles the schema check's walker with the guard (``SCHEMA_WALKER``)."""
    import gateway.schema.bounds
    import gateway.schema.check
    import gateway.schema.incremental
    import gateway.schema.reader

    modules = (
        gateway.schema.incremental,
        gateway.schema.bounds,
        gateway.schema.check,
        gateway.schema.reader,
    )
    kinds = {"python" if (m.__file__ or "").endswith(".py") else "compiled" for m in modules}
    assert kinds == {guard_build()}, [m.__file__ for m in modules]


def test_setup_the_makefile_and_the_tests_name_the_same_compiled_schema_modules() -> None:
    """setup.py compiles them, the Makefile reinstalls when one changes, and
    ``make test-guard-python`` loads them from source: the three lists agree."""
    root = Path(__file__).resolve().parents[2]
    setup = (root / "setup.py").read_text()
    compiled = set(re.findall(r'"gateway/schema/(\w+)\.py"', setup))
    makefile = (root / "Makefile").read_text()
    listed = re.search(r"^SCHEMA_WALKER := (.+)$", makefile, re.M)
    assert listed is not None
    assert compiled == {name.removesuffix(".py") for name in listed.group(1).split()}
    assert compiled == set(guard_source.WALKER)

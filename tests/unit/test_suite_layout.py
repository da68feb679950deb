"""The test suite's own layout: files named for what they test, one contract-test helper.

A file named after a review round (``test_edge_round3.py``) says when its tests
were written, not what they hold: each test file is named for its subject. The
contract tests share their driver and case builders through
``tests/unit/helpers.py`` (as h11's ``tests/helpers.py``), never a copy each.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
#: Names that say when a file was written, not what it tests.
_WHEN = re.compile(r"round\d*|(^|_)r\d+($|_)|review|pass\d+|again|more_|_new$|misc", re.I)
_SHARED = {"drive", "contract_of", "whole", "rejected"}


def test_no_test_file_is_named_after_a_review_round() -> None:
    named_for_when = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if _WHEN.search(path.stem.removeprefix("test_"))
    ]
    assert named_for_when == []


@pytest.mark.parametrize(
    "path", sorted(TESTS.glob("unit/test_*_contract.py")), ids=lambda path: path.stem
)
def test_a_contract_test_defines_no_copy_of_the_shared_helpers(path: Path) -> None:
    tree = ast.parse(path.read_text())
    defined = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert defined & _SHARED == set()


def test_an_integration_module_configures_its_gateway_and_defines_none() -> None:
    """The integration ``gateway`` fixtures live in tests/integration/conftest.py; a module
    gives its settings (``gateway_settings``), never a ``gateway`` fixture of its own."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "integration"
    own = [
        f"{path.name}:{node.lineno}"
        for path in sorted(folder.glob("test_*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name in {"gateway", "strict_gateway"}
    ]
    assert not own, own


def test_every_test_of_the_shared_redis_is_marked_for_the_cluster_run() -> None:
    """A test module that uses the shared Redis (``redis_server()`` or the ``redis``
    fixture) marks its tests ``redis``: ``make test-redis-cluster`` runs the marked
    tests against a cluster, and an unmarked one would never meet one."""
    unmarked = [
        path.name
        for path in sorted(TESTS.glob("integration/test_*.py"))
        if re.search(r"redis_server\(\)|\bredis: RedisServer\b", path.read_text())
        and "pytest.mark.redis" not in path.read_text()
    ]
    assert unmarked == []

"""Hypothesis profiles (tests/conftest.py): chosen by environment, never overridden per test."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


@given(st.just(None))
def test_a_slow_example_is_no_failure(value: None) -> None:
    """One example over hypothesis's default 200 ms deadline (a loaded machine) passes."""
    time.sleep(0.25)


def _profile(env: dict[str, str]) -> list[str]:
    code = (
        "import tests.conftest; from hypothesis import settings as s; d = s.default; "
        "print(d.max_examples, d.deadline, d.derandomize)"
    )
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PURE_PYTHON_GUARD": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def test_the_profile_is_chosen_by_environment() -> None:
    assert _profile({"CI": "true"}) == ["200", "None", "True"]
    dev = _profile({})
    assert dev[1:] == ["None", "False"]
    assert int(dev[0]) < 200
    assert _profile({"CI": "true", "HYPOTHESIS_PROFILE": "dev"}) == dev


def test_the_loaded_profile_has_no_deadline() -> None:
    assert hypothesis_settings.default.deadline is None


def test_no_test_overrides_the_profiles() -> None:
    overrides = re.compile(r"\b(max_examples|deadline)\s*=")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != "conftest.py" and path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if overrides.search(line) and "hypothesis" in path.read_text()
    ]
    assert found == []

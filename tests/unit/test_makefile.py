"""The Makefile's recipes, read through ``make -n`` in a copy of the files it looks at.

``make -n`` prints what it would run and runs nothing: no venv is made, nothing is
installed. The copy has no ``.venv``, so it is what a fresh clone's make would do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("fresh-clone")
    for name in ("Makefile", "pyproject.toml", "setup.py", "tests/node_sdks.py"):
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "gateway" / "guard", where / "gateway" / "guard")
    return where


def _dry(clone: Path, *args: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "MAKE"))}
    done = subprocess.run(
        ["make", "-n", *args],
        cwd=clone,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line and " -e " in line]


def test_make_run_installs_the_guard_as_pure_python(clone: Path) -> None:
    lines = _dry(clone, "run")
    installs = _installs(lines)
    assert len(installs) == 1, lines
    assert installs[0].startswith("PURE_PYTHON_GUARD=1 "), installs
    # a compiled guard left from an earlier install must not shadow newer source
    assert any(line.startswith("rm -f gateway/guard/*.so") for line in lines), lines


@pytest.mark.parametrize("target", ["test", "compiled-guard", "test-guard-python"])
def test_the_test_install_and_compiled_guard_compile_it(clone: Path, target: str) -> None:
    installs = _installs(_dry(clone, target))
    compiling = [line for line in installs if "PURE_PYTHON_GUARD" not in line]
    assert len(compiling) == 1, installs


def _extra(name: str) -> list[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    requirements: list[str] = extras[name]
    return requirements


def _pip_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line]


@pytest.mark.parametrize(("target", "extra"), [("examples", "examples"), ("docs", "docs")])
def test_make_examples_and_docs_install_their_extra_only(
    clone: Path, target: str, extra: str
) -> None:
    """`make examples` and `make docs` install their extra's requirements and nothing
    else: no install of the project (which, without PURE_PYTHON_GUARD=1, compiles the
    guard: about 3 minutes), and for the docs not the test toolchain."""
    lines = _dry(clone, target)
    installs = _pip_installs(lines)
    pip = ".venv/bin/python -m pip install --quiet -r"
    assert installs == [f"{pip} .venv/requirements-{extra}.txt"]
    assert not any("setup.py" in line or " -e " in line for line in lines), lines
    # the file pip reads: the extra's requirements, as the recipe writes them
    (write,) = [line for line in lines if f"> .venv/requirements-{extra}.txt" in line]
    command = write.split(" > ")[0].replace(".venv/bin/python", sys.executable, 1)
    done = subprocess.run(
        command, shell=True, cwd=clone, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == _extra(extra)


#: The distribution a documented example's top-level import comes from.
_DISTRIBUTIONS = {"google": "google-genai", "boto3": "boto3"}
#: Imported by examples and installed with the gateway itself (its own dependencies).
_INSTALLED = {"gateway", "httpx", "json", "os", "pydantic"}


def test_make_examples_installs_every_sdk_a_documented_example_imports() -> None:
    """Issue 45 item 11: docs/bedrock.md's boto3 example needed a package no extra held."""
    imported: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            imported |= set(re.findall(r"^\s*(?:import|from) ([a-z_0-9]+)", block, re.M))
    wanted = {_DISTRIBUTIONS.get(name, name) for name in imported - _INSTALLED}
    extra = {spec.split(">")[0].split("=")[0] for spec in _extra("examples")}
    assert wanted >= {"openai", "anthropic", "google-genai", "ollama", "boto3"}
    assert wanted <= extra, wanted - extra


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ("", {}, "serve --simulator"),
        ("--port 8090", {}, "serve --simulator --port 8090"),
        ("--host 0.0.0.0 --workers 2", {}, "serve --simulator --host 0.0.0.0 --workers 2"),
        ("--upstream https://api.openai.com/v1", {}, "serve --upstream https://api.openai.com/v1"),
        ("--config=c.toml --port 1", {}, "serve --config=c.toml --port 1"),
        ("--port 8090", {"GATEWAY_UPSTREAM_URL": "http://x/v1"}, "serve --port 8090"),
        ("", {"GATEWAY_CONFIG": "c.toml"}, "serve"),
        ("", {"GATEWAY_ROUTES": "[]"}, "serve"),
    ],
)
def test_make_run_keeps_the_simulator_unless_told_what_to_front(
    clone: Path, args: str, env: dict[str, str], expected: str
) -> None:
    last = _dry(clone, "run", f"ARGS={args}", **env)[-1]
    assert " ".join(last.split()) == f".venv/bin/gateway {expected}"


def test_make_image_test_runs_the_image_tests_and_ci_runs_it(clone: Path) -> None:
    """`make image-test` runs tests/image with GATEWAY_IMAGE_TEST=1 (without it they skip,
    as in `make test`), and .ci/run runs it."""
    last = _dry(clone, "image-test")[-1]
    assert last.startswith("GATEWAY_IMAGE_TEST=1 .venv/bin/python -m pytest "), last
    assert last.split()[-1] == "tests/image", last
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make image-test" in steps
    assert steps.index("make image-test") > steps.index("make test")


def test_make_test_redis_cluster_runs_the_redis_tests_on_a_cluster_and_ci_runs_it(
    clone: Path,
) -> None:
    """`make test-redis-cluster` runs the tests marked ``redis`` with TEST_REDIS_MODE=cluster
    (their Redis a cluster), and .ci/run runs it after `make test`."""
    lines = _dry(clone, "test-redis-cluster")
    joined = " ".join(" ".join(lines).replace("\\", " ").split())
    last = joined[joined.index("TEST_REDIS_MODE") :]
    assert last.startswith("TEST_REDIS_MODE=cluster .venv/bin/python -m pytest "), last
    assert "-m redis tests/integration" in last, last
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert steps.index("make test-redis-cluster") > steps.index("make test")

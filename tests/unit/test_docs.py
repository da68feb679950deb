"""The user-facing documentation stays short where it must, complete where it claims to be,
and free of the project's internal bookkeeping.

- The README fits on a few screens; the reference lives in the MkDocs site (``docs/``),
  whose strict build (``make docs``, run by ``make test``) catches broken links and anchors.
- Every page of ``docs/`` is in the site's navigation, and every page the navigation
  names exists.
- The architecture page names every folder and top-level module of the package, and the
  simulator page every fault and per-request knob.
- No user-facing text points at tracker issues, internal design notes or pass/fail marks
  against internal targets.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
USER_FACING = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", *DOCS.glob("*.md")]
)


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {nav!r}")


def test_the_readme_fits_in_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move reference material to docs/"


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is twice in the navigation"
    assert {path.name for path in DOCS.glob("*.md")} == set(nav)


def test_the_architecture_page_names_every_folder_and_top_level_module() -> None:
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    package = ROOT / "gateway"
    names = [f"gateway/{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()]
    names += [
        f"gateway/{p.name}" for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")
    ]
    missing = [name for name in sorted(names) if f"`{name}`" not in page]
    assert not missing, f"docs/architecture.md does not describe {missing}"


INTERNAL = re.compile(
    r"\bissues? #?\d+"  # a tracker issue
    r"|\bDESIGN\.md\b"  # the internal design notes
    r"|\bnot met\b"  # a mark against an internal target
    r"|\bthis (?:2-vCPU |two-core |2-core |shared )?machine\b",  # the measuring machine
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", USER_FACING, ids=[p.name for p in USER_FACING])
def test_no_internal_references_in_user_facing_text(path: Path) -> None:
    if not path.is_file():
        pytest.fail(f"{path.name} is missing")
    found = INTERNAL.findall(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def _first_column(section: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def test_the_simulator_page_describes_every_fault_and_knob() -> None:
    import dataclasses

    from gateway.simulator._knobs import FAULTS, Knobs, knob_header

    page = (DOCS / "simulator.md").read_text(encoding="utf-8")
    faults = page.split("\n## Faults\n", 1)[1].split("\n## ", 1)[0]
    rows = _first_column(faults)
    assert len(rows) == len(set(rows)), rows
    assert set(rows) == set(FAULTS), set(rows) ^ set(FAULTS)
    control = page.split("\n## Per-request control\n", 1)[1].split("\n## ", 1)[0]
    headers = {row.split(":", 1)[0] for row in _first_column(control)}
    assert headers == {knob_header(field.name) for field in dataclasses.fields(Knobs)}

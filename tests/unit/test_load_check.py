"""``tests/load_check.sh`` (CONTRIBUTING: the suite beside two CPU hogs) ends its hogs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "load_check.sh"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of an ended child still answers: read its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_zero_runs_start_two_hogs_and_end_them_by_pid() -> None:
    done = subprocess.run(["sh", str(SCRIPT), "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = re.search(r"CPU hogs (\d+) and (\d+)", done.stdout)
    assert found is not None, done.stdout
    assert "0 run(s) green under load" in done.stdout
    assert not any(_alive(int(pid)) for pid in found.groups())

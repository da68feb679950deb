"""Every capture in ``tests/captures/`` replays to the verdict it records.

A capture from production becomes a regression test by copying its file
into that folder (docs/captures-and-probe.md, "When a provider cuts streams"). If the gateway
judged that stream wrongly, the copy's ``verdict`` is edited to what it
should have been, and this test fails until the guard agrees.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.capture import SUFFIX, load, replay

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
FILES = sorted(CAPTURES.glob("*" + SUFFIX))


def test_the_folder_holds_captures_of_every_kind_of_ending() -> None:
    endings = {load(path).ending for path in FILES}
    assert endings >= {"eof", "transport_error", "stopped", "open"}


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_a_capture_replays_to_its_recorded_verdict(path: Path) -> None:
    capture = load(path)
    result = replay(capture)
    assert result.result == "same", (
        f"{path.name}: replayed {result.replayed}, recorded {result.recorded}"
    )
    assert result.bytes == sum(len(data) for _, data in capture.chunks)

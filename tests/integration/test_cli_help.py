"""``gateway serve --help``: every flag says what it means and its default."""

from __future__ import annotations

import re

import pytest

from gateway.settings import Settings, Timeouts
from tests.cli import run_cli

DRAIN = Settings.model_fields["drain_timeout"].default


@pytest.fixture(scope="module")
def help_text() -> str:
    result = run_cli("serve", "--help", env={"COLUMNS": "100"})
    assert result.returncode == 0
    return " ".join(result.stdout.split())  # argparse wraps: compare as one line


@pytest.mark.parametrize(
    ("flag", "key", "default", "meaning"),
    [
        ("--connect-timeout", "timeouts.connect", Timeouts().connect, "TCP/TLS connection"),
        ("--first-byte-timeout", "timeouts.first_byte", Timeouts().first_byte, "first byte"),
        ("--idle-timeout", "timeouts.idle", Timeouts().idle, "silence between two chunks"),
        ("--total-timeout", "timeouts.total", Timeouts().total, "a whole request"),
        (
            "--drain-timeout",
            "drain_timeout",
            Settings.model_fields["drain_timeout"].default,
            "Ctrl-C",
        ),
    ],
)
def test_each_timeout_flag_gives_its_meaning_default_and_setting(
    help_text: str, flag: str, key: str, default: float, meaning: str
) -> None:
    entry = help_text.split(f"{flag} SECONDS ", 1)[1].split(" --", 1)[0]
    assert meaning in entry, entry
    assert f"(default {default:g}; the setting {key})" in entry, entry


def test_no_flag_help_is_a_bare_unit(help_text: str) -> None:
    assert not re.search(r"SECONDS seconds\b", help_text), help_text

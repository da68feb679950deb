"""docs/rescue.md stays true to the code: its primary + fallback configuration is
accepted as it is written, and means what the page says."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from gateway.policy.routing import Route
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "rescue.md").read_text(encoding="utf-8")


def _example() -> dict[str, Any]:
    """The configuration under "A primary and a fallback tier"."""
    section = DOC[DOC.index("## A primary and a fallback tier") :]
    match = re.search(r"```toml\n(.*?)```", section, flags=re.S)
    assert match is not None
    return tomllib.loads(match.group(1))


def test_the_documented_tiers_are_a_valid_configuration() -> None:
    settings = Settings(**_example())
    (config,) = settings.routes
    route = Route(config, settings.timeouts.model_copy(update={"total": 30.0}))
    primary, fallback = route.endpoints
    assert (primary.priority, fallback.priority) == (0, 1)
    assert primary.timeouts.first_byte == 10.0
    assert fallback.models == {"*": "openai/gpt-4o"}
    assert route.pool.pick() is not None
    assert route.pool.pick().index == 0  # type: ignore[union-attr]  # the primary tier serves
    assert config.continue_after_cut
    assert "first_byte_timeout" in config.retry_on


def test_a_route_of_a_protocol_that_is_never_continued_refuses_continue_after_cut() -> None:
    import pytest
    from pydantic import ValidationError

    route = {"name": "r", "prefix": "/v1", "upstream": "http://127.0.0.1:9/v1"}
    for protocol in ("responses", "gemini", "ollama"):
        with pytest.raises(ValidationError, match="never continued"):
            Settings(routes=[{**route, "protocol": protocol, "continue_after_cut": True}])
    for protocol in ("chat", "messages", "auto"):
        Settings(routes=[{**route, "protocol": protocol, "continue_after_cut": True}])


def test_the_recipe_sets_idle_below_total_and_brings_a_primary_back_within_30_s() -> None:
    settings = Settings(**_example())
    (config,) = settings.routes
    route = Route(config, settings.route_timeouts(config))
    primary, fallback = route.endpoints
    total = route.timeouts.total
    assert primary.timeouts.idle < total
    assert fallback.timeouts.idle < total
    assert config.eject_max_seconds < 30.0  # the longest ejection, then the probe
    assert config.max_attempts >= 3


def test_a_route_that_continues_halves_an_idle_deadline_not_below_its_total() -> None:
    # Only `total` set (the default idle is 120 s): a stall would run into the total
    # deadline and could never be continued.
    example = _example()
    example["routes"][0]["timeouts"] = {"total": 30.0}
    settings = Settings(**example)
    (config,) = settings.routes
    route = Route(config, settings.route_timeouts(config))
    assert {e.timeouts.idle for e in route.endpoints} == {15.0}
    # a route that does not continue keeps its deadlines as set
    example["routes"][0]["continue_after_cut"] = False
    settings = Settings(**example)
    (config,) = settings.routes
    route = Route(config, settings.route_timeouts(config))
    assert {e.timeouts.idle for e in route.endpoints} == {120.0}

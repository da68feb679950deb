"""The integration tests' gateways: one fixture each, configured by the module that uses it.

A module says what its gateway is by defining ``gateway_settings`` (and, for a
second gateway with stricter deadlines, ``strict_gateway_settings``): a
module-scoped fixture that returns the settings (it may read the simulator's
or its own fake upstream's URL). ``gateway`` and ``strict_gateway`` here start
a real gateway (uvicorn, its edge) with those settings, once per module, and
stop it after the module's last test. Without a module's own settings,
``gateway`` is one ``/v1`` route to the simulator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"upstream_url": simulator.url + "/v1"}


@pytest.fixture(scope="module")
def gateway(gateway_settings: dict[str, Any]) -> Iterator[ServerThread]:
    with gateway_for("", **gateway_settings) as server:
        yield server


@pytest.fixture(scope="module")
def strict_gateway(strict_gateway_settings: dict[str, Any]) -> Iterator[ServerThread]:
    with gateway_for("", **strict_gateway_settings) as server:
        yield server

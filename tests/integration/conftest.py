"""The integration tests' gateways: one fixture each, configured by the module that uses it.

A module says what its gateway is by defining ``gateway_settings`` (and, for a
second gateway with stricter deadlines, ``strict_gateway_settings``): a
module-scoped fixture that returns the settings (it may read the simulator's
or its own fake upstream's URL). ``gateway`` and ``strict_gateway`` here start
a real gateway (uvicorn, its edge) with those settings, once per module, and
stop it after the module's last test. Without a module's own settings,
``gateway`` is one ``/v1`` route to the simulator. A module whose ``clients_issued``
is true gets its named clients (``clients`` in its settings) issued at run time
through the admin API instead (``gateway_with_clients``): parametrized, each test of
named clients runs against configured clients and against issued keys.

``redis`` is the Redis of a Redis-backed test: one ``redis-server`` of its own, or a
cluster of three masters (``TEST_REDIS_MODE=cluster``, or the ``cluster`` param of a
test marked ``also_on_a_cluster``: a representative of each Redis user runs on a
cluster in every ``make test``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for, gateway_with_clients
from tests.integration.redis_server import redis_server, suite_mode


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"upstream_url": simulator.url + "/v1"}


@pytest.fixture(scope="module")
def clients_issued() -> bool:
    return False


@pytest.fixture(scope="module")
def gateway(gateway_settings: dict[str, Any], clients_issued: bool) -> Iterator[ServerThread]:
    settings = dict(gateway_settings)
    clients = settings.pop("clients", [])
    with gateway_with_clients("", clients_issued, clients, **settings) as server:
        yield server


@pytest.fixture(scope="module")
def strict_gateway(strict_gateway_settings: dict[str, Any]) -> Iterator[ServerThread]:
    with gateway_for("", **strict_gateway_settings) as server:
        yield server


@pytest.fixture
def redis(request: pytest.FixtureRequest) -> Iterator[Any]:
    mode = getattr(request, "param", None)
    if mode == "cluster" and suite_mode() == "cluster":
        pytest.skip("the suite's own Redis is a cluster: this test runs on one already")
    with redis_server(mode=mode) as server:
        yield server

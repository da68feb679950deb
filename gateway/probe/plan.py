"""What a probe will do: which routes, in which protocols, with which models and checks.

Every mistake is a configuration error (``ProbeConfigError``, exit status 2)
found before anything starts: an unknown route, check or protocol, a route
no client protocol can be spoken on, no model to ask for, a malformed
``--inject``.

A route fixed to a protocol is probed in it. A route with ``protocol =
"auto"`` serves whatever its paths say, so the probe asks ``--protocol``;
without it, it takes the first protocol of the registry that uses the
route's credential style (``chat`` for a bearer key, ``messages`` for
``x-api-key``, ``gemini`` for ``x-goog-api-key``). With the simulator
(``--simulator``) the probe fronts it by routes of its own: ``simulator``
(``/v1``: chat, completions, responses and messages) and one per protocol the
simulator serves elsewhere (``ClientRequests.simulator_prefix``):
``simulator-gemini`` (``/v1beta``), ``simulator-ollama`` (``/api``) and
``simulator-bedrock`` (``/model``), with the model ``sim-model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gateway.policy.routing import credential_style
from gateway.probe.checks import CHECKS, Target, checks_for
from gateway.protocols import REGISTRY, ProtocolSpec, spec_for
from gateway.settings import RouteConfig, Settings

__all__ = [
    "SIMULATOR_MODEL",
    "Plan",
    "ProbeConfigError",
    "make_plan",
    "parse_inject",
    "simulator_routes",
]

SIMULATOR_MODEL: Final = "sim-model"
#: What the simulator's ``/v1`` route speaks (the others have routes of their own).
_ANY_PATH: Final = "/v1"
#: With the simulator, the interrupted check asks for a paced answer, so that the
#: probe's leaving is seen before the answer is whole.
_SIMULATOR_HEADERS: Final = {
    "interrupted": {"x-sim-tps": "50"},
    "schema": {"x-sim-structured": "valid"},  # the simulator answers the schema's shape
}


class ProbeConfigError(ValueError):
    """The probe cannot run as asked (exit status 2)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The runs of a probe, in order, and the routes the in-process gateway serves."""

    routes: list[RouteConfig]
    runs: list[tuple[Target, str]]
    simulator: bool
    #: check -> extra request headers (``--inject``, and the simulator's pacing).
    headers: dict[str, dict[str, str]] = field(default_factory=dict)


def simulator_routes(base_url: str) -> list[RouteConfig]:
    """The probe's routes in front of a simulator at ``base_url`` (``http://host:port``):
    ``simulator`` for any path below ``/v1``, and one fixed to each protocol the
    simulator serves elsewhere (``ClientRequests.simulator_prefix``)."""
    routes = [RouteConfig(name="simulator", prefix=_ANY_PATH, upstream=base_url + _ANY_PATH)]
    for spec in REGISTRY:
        prefix = spec.requests.simulator_prefix if spec.requests is not None else _ANY_PATH
        if prefix != _ANY_PATH:
            routes.append(
                RouteConfig(
                    name=f"simulator-{spec.name}",
                    prefix=prefix,
                    upstream=base_url + prefix,
                    protocol=spec.protocol,
                )
            )
    return routes


def parse_inject(values: Sequence[str]) -> dict[str, dict[str, str]]:
    """``CHECK:HEADER=VALUE`` items (a testing aid: simulator knobs per check)."""
    headers: dict[str, dict[str, str]] = {}
    for item in values:
        check, _, rest = item.partition(":")
        name, eq, value = rest.partition("=")
        name = name.strip().lower()
        if check not in CHECKS or not eq or not name.startswith("x-sim-"):
            raise ProbeConfigError(
                f"--inject {item!r}: expected CHECK:x-sim-NAME=VALUE with CHECK one of "
                + ", ".join(CHECKS)
            )
        headers.setdefault(check, {})[name] = value.strip()
    return headers


def _default_protocol(settings: Settings, config: RouteConfig) -> ProtocolSpec:
    # A route for any path: probe it in the protocol of its (first) upstream's style.
    upstream = config.pool()[0]
    style = credential_style(upstream.credential_style, config.protocol, upstream.url)
    return next(s for s in REGISTRY if s.credential is style and s.requests is not None)


def make_plan(
    settings: Settings,
    *,
    routes: Sequence[str] = (),
    models: Sequence[str] = (),
    protocols: Sequence[str] = (),
    checks: Sequence[str] = (),
    inject: Sequence[str] = (),
) -> Plan:
    """The plan for ``settings`` as the command line narrows it (ProbeConfigError)."""
    simulator = settings.simulator
    configs = simulator_routes("http://127.0.0.1") if simulator else settings.effective_routes()
    known = {c.name: c for c in configs}
    unknown = [name for name in routes if name not in known]
    if unknown:
        raise ProbeConfigError(
            f"no route named {', '.join(unknown)} (routes: {', '.join(known) or 'none'})"
        )
    wanted = [known[name] for name in dict.fromkeys(routes)] or configs
    try:
        asked = [spec_for(p) for p in dict.fromkeys(protocols)]
    except ValueError:
        names = ", ".join(s.name for s in REGISTRY if s.requests is not None)
        raise ProbeConfigError(f"--protocol: one of {names}") from None
    bad_checks = [c for c in checks if c not in CHECKS]
    if bad_checks:
        raise ProbeConfigError(
            f"no check named {', '.join(bad_checks)} (checks: {', '.join(CHECKS)})"
        )
    models = list(dict.fromkeys(models)) or ([SIMULATOR_MODEL] if simulator else [])
    if not models:
        raise ProbeConfigError("no model to probe: name one or more with --model")
    headers = parse_inject(inject)
    if simulator:
        for check, extra in _SIMULATOR_HEADERS.items():
            headers[check] = {**extra, **headers.get(check, {})}

    runs: list[tuple[Target, str]] = []
    for config in wanted:
        if config.protocol != "auto":
            specs = [spec_for(config.protocol)]
            if asked and specs[0] not in asked:
                continue
        elif simulator:  # the simulator's /v1 route: what it speaks, as asked
            specs = [
                s
                for s in REGISTRY
                if s.requests is not None and s.requests.simulator_prefix == _ANY_PATH
            ]
            specs = [spec for spec in specs if not asked or spec in asked]
        elif asked:
            specs = asked
        else:
            specs = [_default_protocol(settings, config)]
        for spec in specs:
            if spec.requests is None:
                if config.name in routes:
                    raise ProbeConfigError(
                        f"route {config.name} speaks {spec.name}: no client protocol to probe"
                    )
                continue
            for model in models:
                target = Target(config.name, config.prefix, spec, model)
                runs += [(target, c) for c in checks_for(spec) if not checks or c in checks]
    if not runs:
        raise ProbeConfigError("nothing to probe: no route, protocol and check match")
    return Plan(routes=configs, runs=runs, simulator=simulator, headers=headers)

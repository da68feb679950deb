"""``gateway keys create|list|show|rotate|revoke``: the admin API's changes from a shell.

It talks to the key store directly with the gateway's own configuration (the
same ``--config`` and ``GATEWAY_*``), for an operator with no admin key at
hand; every gateway on that Redis honours a change within a second. It sees
every key, whoever issued it, and its changes are audited as ``by=cli``. A
secret is printed once (create, rotate), in the JSON on stdout. With
``keys.store = "memory"`` the keys live inside the gateway process: the CLI
cannot reach them (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError

from gateway.keys.record import KeyRequest
from gateway.keys.service import Invalid, KeyService, NameClash, NotFound, TooLarge
from gateway.keys.setup import build_store
from gateway.keys.store import Conflict, StoreFull, StoreUnavailable
from gateway.settings import ClientLimits, Settings

__all__ = ["add_commands", "run"]


def add_commands(keys: argparse.ArgumentParser) -> None:
    """The ``keys`` subcommands on ``keys`` (its settings flags are added by the caller)."""
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = actions.add_parser("create", help="issue a key (its secret printed once)")
    create.add_argument("--client", required=True, help="the client it authenticates as")
    create.add_argument(
        "--existing-client",
        action="store_true",
        help="the client is one configured in the file (its limits apply)",
    )
    create.add_argument("--team", help="the team it belongs to")
    create.add_argument("--route", action="append", dest="routes", help="a route it may use")
    create.add_argument("--model", action="append", dest="models", help="a model it may use")
    create.add_argument("--expires-in", type=float, metavar="SECONDS", help="it stops then")
    create.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"one of its own limits ({', '.join(ClientLimits.model_fields)})",
    )
    create.add_argument("--strict", action="store_true", help='budget_enforcement = "strict"')
    create.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="owner, purpose..."
    )
    create.add_argument(
        "--key-sha256",
        action="append",
        help="take over this digest (a key from the file) instead of a new secret",
    )
    actions.add_parser("list", help="every issued key (never a secret)")
    for name, text in (("show", "one key"), ("revoke", "refuse a key from now on")):
        actions.add_parser(name, help=text).add_argument("id")
    rotate = actions.add_parser("rotate", help="a new secret (printed once)")
    rotate.add_argument("id")
    rotate.add_argument(
        "--overlap", type=float, metavar="SECONDS", help="how long the old secret still works"
    )


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise Invalid(flag, f"{flag} takes NAME=VALUE, not {item!r}")
        pairs[name] = value
    return pairs


def _request(args: argparse.Namespace) -> KeyRequest:
    body: dict[str, Any] = {
        "client": args.client,
        "existing_client": args.existing_client,
        "team": args.team,
        "routes": args.routes,
        "models": args.models,
        "expires_in_seconds": args.expires_in,
        "limits": _pairs(args.limit, "--limit"),
        "metadata": _pairs(args.metadata, "--metadata"),
        "key_sha256": args.key_sha256 or None,
    }
    if args.strict:
        body["budget_enforcement"] = "strict"
    return KeyRequest.model_validate(body)


async def _run(settings: Settings, args: argparse.Namespace) -> Any:
    store = build_store(settings)
    service = KeyService(settings, store)
    try:
        command = args.keys_command
        if command == "create":
            view, secret = await service.create(_request(args), None)
            return {**view, "key": secret or None}
        if command == "list":
            return {"object": "list", "data": await service.list(None)}
        if command == "show":
            return await service.show(args.id, None)
        if command == "rotate":
            view, secret = await service.rotate(args.id, args.overlap, None)
            return {**view, "key": secret}
        return await service.revoke(args.id, None)
    finally:
        await store.close()


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``keys`` command: JSON on stdout and 0, or a message on stderr and 1 (2: the
    configuration has no shared store)."""
    if settings.keys.store != "redis":
        print(
            f'gateway keys: keys.store is "{settings.keys.store}": the CLI works on the '
            'shared store only (keys.store = "redis", redis_url); a memory store lives in '
            "the gateway process (use its admin API, {prefix}/gateway/keys)",
            file=sys.stderr,
        )
        return 2
    try:
        result = asyncio.run(_run(settings, args))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        return _fail(f"{field}: {error['msg']}")
    except (Invalid, NameClash, TooLarge) as exc:
        return _fail(str(exc))
    except NotFound:
        return _fail(f"no key {args.id}")
    except StoreFull:
        return _fail("the key store is full (keys.max_keys)")
    except Conflict:
        return _fail("the key changed meanwhile; try again")
    except StoreUnavailable as exc:
        return _fail(f"the key store did not answer ({exc})")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _fail(message: str) -> int:
    print(f"gateway keys: {message}", file=sys.stderr)
    return 1

"""The end check: the whole document against its schema, with a maintained validator.

What only the end can show (``required`` members, ``anyOf`` / ``oneOf`` /
``not``, an object ``enum``, ...) is judged here, once, by fastjsonschema,
chosen by measurement against jsonschema (tests/perf/schema_parsers.py: an
8 KiB answer validated in 0.23 ms against 8.2 ms; its compile, about 0.35 ms a
schema node, is paid once per distinct schema, off the loop, and kept in a
bounded cache). A schema it cannot compile is ``unchecked`` with the reason,
never ``valid``; ``gateway.schema.bounds`` has already refused the schemas
that could make it or the check run long.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import fastjsonschema
import orjson

__all__ = ["EndCheck", "Unusable", "end_check"]

Validator = Callable[[Any], Any]

_CACHE: OrderedDict[bytes, Validator | str] = OrderedDict()
_CACHE_SIZE = 256
#: One compile at a time: streams that ask for the same new schema at once wait for the
#: first one's compile instead of each doing its own (threads blocked here hold no GIL).
_COMPILING = threading.Lock()


def _refuse(uri: str) -> Any:
    raise Unusable("a $ref outside the schema")


#: The validator never fetches a remote ``$ref`` (``bounds.admit`` refuses them first).
_NO_FETCH = {scheme: _refuse for scheme in ("http", "https", "file", "ftp", "urn")}


class Unusable(Exception):
    """The validator cannot judge with this schema: the reason."""


class EndCheck:
    """A compiled schema: ``check(document)`` returns None or (pointer, what failed)."""

    __slots__ = ("_validate",)

    def __init__(self, validate: Validator) -> None:
        self._validate = validate

    def check(self, document: Any) -> tuple[str, str] | None:
        try:
            self._validate(document)
        except fastjsonschema.JsonSchemaValueException as exc:
            path = [str(part) for part in (exc.path or [])[1:]]
            pointer = "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)
            return pointer, str(exc.message).replace("data", "the value", 1)[:200]
        except RecursionError:
            raise Unusable("the answer nests too deeply for the validator") from None
        return None


def cached(schema: Any) -> EndCheck | str | None:
    """The end check of ``schema`` if it was compiled already (the reason it cannot be,
    if that is known), else None: cheap, for a caller on the event loop."""
    found = _CACHE.get(_key(schema))
    return EndCheck(found) if found is not None and not isinstance(found, str) else found


def _key(schema: Any) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


def end_check(schema: Any) -> EndCheck:
    """The compiled end check of ``schema`` (cached by its text); raises ``Unusable``."""
    key = _key(schema)
    found = _CACHE.get(key)
    if found is None:
        with _COMPILING:
            found = _CACHE.get(key)
            if found is None:
                found = _compile(schema, key)
    else:
        _CACHE.move_to_end(key)
    if isinstance(found, str):
        raise Unusable(found)
    return EndCheck(found)


def _compile(schema: Any, key: bytes) -> Validator | str:
    found: Validator | str
    try:
        found = fastjsonschema.compile(
            schema, handlers=_NO_FETCH, use_default=False, use_formats=False
        )
    except Unusable as exc:
        found = str(exc)
    except (fastjsonschema.JsonSchemaDefinitionException, RecursionError) as exc:
        found = f"the validator cannot compile the schema ({_short(exc)})"
    except Exception as exc:  # its generated code: anything it raises is the schema's
        found = f"the validator cannot compile the schema ({type(exc).__name__})"
    _CACHE[key] = found
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]

"""The provider SDKs the tests drive, imported when a test first uses one.

Every xdist worker imports every test module to collect it, and importing the SDKs
costs CPU that most workers never need: ``anthropic`` about 3 s, ``openai`` about 1 s,
``google.genai`` half a second, on every worker, while all of them start at once on
two cores. ``from tests.sdk import anthropic`` gives a stand-in whose first attribute
access (``anthropic.Anthropic``, ``anthropic.APIError``) imports the real module and
returns the real attribute; nothing else about the SDKs changes.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["anthropic", "genai", "genai_errors", "genai_types", "ollama", "openai"]


class _OnFirstUse:
    """A module, imported on its first attribute access."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # pytest's collection probes (__test__, _pytest...)
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


anthropic: Any = _OnFirstUse("anthropic")
openai: Any = _OnFirstUse("openai")
ollama: Any = _OnFirstUse("ollama")
genai: Any = _OnFirstUse("google.genai")
genai_errors: Any = _OnFirstUse("google.genai.errors")
genai_types: Any = _OnFirstUse("google.genai.types")

"""LLM streaming gateway: a reverse proxy that verifies every streamed answer ended properly."""

__version__ = "0.1.0"


def guard_build() -> str:
    """How the guard runs: ``"compiled"`` (mypyc extension modules, see setup.py) or
    ``"python"`` (its source, when the build had no C compiler)."""
    from gateway.guard import stream

    return "python" if (stream.__file__ or "").endswith(".py") else "compiled"

"""LLM streaming gateway: a reverse proxy that verifies every streamed answer ended properly."""

__version__ = "0.1.0"

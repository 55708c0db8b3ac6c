"""The ``mcp-token-otel`` command line: ``main`` parses and dispatches; one module per command family."""

from .main import main

__all__ = ["main"]

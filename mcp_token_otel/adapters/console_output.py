"""Console exporters off a stdio server's protocol stream.

OpenTelemetry's console exporters (``OTEL_TRACES_EXPORTER=console`` and its metrics and logs siblings, as
``opentelemetry-instrument`` with opentelemetry-distro builds them) write to standard output. Once this process
serves MCP over stdio, standard output is the protocol stream and every span printed there is a corrupt message
to the client. So from the moment the SDK's ``stdio_server()`` starts on the process's own standard output, a
console exporter that writes to standard output writes to standard error instead, for the rest of the process
(spans exported at exit, after the server stopped, included). Other processes keep their console output as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from typing import Any

#: The SDK function that serves MCP on this process's standard input and output, by the name it has everywhere.
STDIO_SERVER = "stdio_server"

#: (module, class) of the OpenTelemetry SDK's console exporters; each has ``out`` and ``export``.
CONSOLE_EXPORTERS = (
    ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
    ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
    ("opentelemetry.sdk._logs.export", "ConsoleLogRecordExporter"),
)

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


def console_exporter_classes() -> list[type]:
    """The console exporter classes of the installed SDK (a part that is missing is skipped)."""
    found = []
    for module_name, name in CONSOLE_EXPORTERS:
        with contextlib.suppress(ImportError):
            cls = getattr(importlib.import_module(module_name), name, None)
            if isinstance(cls, type):
                found.append(cls)
    return found


def _writes_to_stdout(out: Any) -> bool:
    if out is sys.stdout or out is sys.__stdout__:
        return True
    try:
        return bool(out.fileno() == 1)
    except (AttributeError, OSError, ValueError):
        return False


class ConsoleGuard:
    """Knows whether this process serves stdio; moves console exporters to standard error once it does."""

    def __init__(self) -> None:
        self.serving = False

    def serving_stdio(self, wrapper: Wrapper) -> Wrapper:
        """``wrapper`` (a hook on ``stdio_server``) that first notes a server on the process's own stdout."""

        def hook(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if (args[1] if len(args) > 1 else kwargs.get("stdout")) is None:  # no stream of its own: stdout
                self.serving = True
            return wrapper(wrapped, instance, args, kwargs)

        return hook

    def export(self, wrapped: Any, exporter: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A hook on a console exporter's ``export``."""
        if self.serving and _writes_to_stdout(getattr(exporter, "out", None)):
            exporter.out = sys.stderr
        return wrapped(*args, **kwargs)

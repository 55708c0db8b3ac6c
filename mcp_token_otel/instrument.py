"""The former home of ``instrument()``: ``from mcp_token_otel.instrument import instrument`` keeps working.

Importing this module makes the package attribute ``mcp_token_otel.instrument`` this module (Python binds
a submodule over a package attribute of the same name), so the module itself is callable: either way,
``mcp_token_otel.instrument(config)`` instruments.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .instrumentation import (
    McpTokenInstrumentor,
    detect_adapter,
    instrument,
    instrument_server,
    metrics_app,
    prometheus_service,
    uninstrument,
)


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return instrument(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "McpTokenInstrumentor",
    "detect_adapter",
    "instrument",
    "instrument_server",
    "metrics_app",
    "prometheus_service",
    "uninstrument",
]

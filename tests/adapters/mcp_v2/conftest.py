"""Fixtures for the mcp 2.x adapter tests; the test_v2_*.py modules are not collected when mcp 1.x is installed.

The ``otel`` and ``instrumented`` fixtures are tests/conftest.py's: spans from the global tracer provider (the
SDK's own spans, which the shim enriches, use it), fresh metrics per test.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# Re-exported for the test modules, which import them from here.
from tests.helpers.support import Otel, free_port, make_config, mcp_version, named

__all__ = ["UNTRACED_META", "Otel", "free_port", "make_config", "named"]

IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None
if not IS_MCP_V2:
    collect_ignore_glob = ["test_v2_*.py"]

# The ``_meta`` of a request the SDK sends with no trace context to carry: mcp < 2.3 writes an empty one, 2.3 none.
UNTRACED_META: dict[str, Any] | None = None if mcp_version() >= (2, 3) else {}

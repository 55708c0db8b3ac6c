"""Fixtures for the shim tests: one global tracer provider per session, fresh metrics per test.

The SDK's own spans (server side, JSONRPCDispatcher) use the GLOBAL tracer provider, which can be set
only once per process, so it is set here once and its in-memory exporter is cleared around each test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

# Re-exported for the test modules, which import them from here.
from ..support import (
    Otel,
    free_port,
    global_tracer_provider,
    instrumented_session,
    make_config,
    mcp_version,
    otel_session,
)

__all__ = ["UNTRACED_META", "Otel", "free_port", "make_config", "named"]

IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None
if not IS_MCP_V2:
    collect_ignore_glob = ["test_v2_*.py"]

# The ``_meta`` of a request the SDK sends with no trace context to carry: mcp < 2.3 writes an empty one, 2.3 none.
UNTRACED_META: dict[str, Any] | None = None if mcp_version() >= (2, 3) else {}

EXPORTER = InMemorySpanExporter()


TRACER_PROVIDER = global_tracer_provider(EXPORTER)


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from otel_session(EXPORTER, TRACER_PROVIDER)


@pytest.fixture
def instrumented(otel: Otel) -> Iterator[Any]:
    """instrument() with chars/4 and the test providers; uninstrument() afterwards."""
    yield from instrumented_session(otel)


def named(span: Any, name: str) -> bool:
    """``span`` is the MCP span ``name``: a CLIENT span over JSON-RPC is the SDK's own, enriched by the shim, so
    it keeps the SDK's name (``MCP send {name}``); in process (no SDK span) the shim's is ``{name}``."""
    return span.name == name or (span.kind is SpanKind.CLIENT and span.name == f"MCP send {name}")

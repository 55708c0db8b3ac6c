"""Fixtures for the mcp 1.x adapter tests; the whole directory is skipped when mcp 2.x is installed.

mcp 1.x emits no spans of its own, so every span comes from the tracer provider handed to
``instrument()``: a module-level provider with an in-memory exporter, cleared around each test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# The streamable HTTP client was named streamablehttp_client before mcp 1.24 (kept as an alias since).
try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client  # type: ignore[no-redef]

# Re-exported for the test modules, which import them from here.
from tests.helpers.support import (
    Otel,
    free_port,
    instrumented_session,
    make_config,
    mcp_version,
    no_usage_attributes,
    otel_session,
    scrape,
)

__all__ = ["MCP_VERSION", "Otel", "free_port", "make_config", "no_usage_attributes", "streamable_http_client"]

# The installed SDK's release as ints, e.g. (1, 30, 0), for tests whose expectation follows the SDK.
MCP_VERSION = mcp_version()

# Feature detection, as instrument() does it: the dispatcher package exists only in mcp 2.x.
IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None
if IS_MCP_V2:
    # The test modules import mcp 1.x names (FastMCP, McpError...): never collect them on 2.x.
    collect_ignore_glob = ["test_v1_*.py"]

EXPORTER = InMemorySpanExporter()
TRACER_PROVIDER = TracerProvider()
TRACER_PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from otel_session(EXPORTER, TRACER_PROVIDER)


@pytest.fixture
def instrumented(otel: Otel) -> Iterator[Any]:
    """instrument() with chars/4 and the test providers; uninstrument() afterwards."""
    yield from instrumented_session(otel)


def samples(recorder: Any, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` on ``recorder``'s /metrics whose labels include ``labels``."""
    return scrape(recorder).pick(name, **labels)

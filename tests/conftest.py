"""Fixtures shared by the suites of several folders (tests/README.md says how the tree is laid out)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_token_otel.core.measure import Policy
from tests.helpers.redis_server import RedisServer
from tests.helpers.support import (
    Otel,
    _missing,
    fresh_otel_globals,
    global_tracer_provider,
    instrumented_session,
    otel_session,
)

# The SDK's own spans (mcp 2.x: server side, JSONRPCDispatcher) use the GLOBAL tracer provider, which can be set
# only once per process: it is set here once, and its in-memory exporter is cleared around each test that reads it.
EXPORTER = InMemorySpanExporter()
TRACER_PROVIDER = global_tracer_provider(EXPORTER)


def chars4(text: str) -> int:
    """A transparent estimator for arithmetic checks: ceil(len / 4)."""
    return math.ceil(len(text) / 4)


@pytest.fixture
def chars4_policy() -> Policy:
    return Policy(estimator=chars4, estimator_name="chars/4")


@pytest.fixture
def otel() -> Iterator[Otel]:
    """The global tracer provider's spans and a fresh meter provider for one test."""
    yield from otel_session(EXPORTER, TRACER_PROVIDER)


@pytest.fixture
def instrumented(otel: Otel) -> Iterator[Any]:
    """instrument() with chars/4 and the test providers; uninstrument() afterwards."""
    yield from instrumented_session(otel)


@pytest.fixture
def otel_globals() -> Iterator[None]:
    """Unset global tracer and meter providers for one test (restored after it): no fresh interpreter needed."""
    with fresh_otel_globals():
        yield


def _require_redis_client() -> None:
    try:
        import redis  # noqa: F401
    except ImportError:
        _missing("the redis package (the test extra)")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the module's tests; each test isolates itself with its own key prefix."""
    _require_redis_client()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (the test may kill, restart or slow it)."""
    _require_redis_client()
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()

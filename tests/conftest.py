"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_token_otel.core.measure import Policy

from .redis_server import RedisServer
from .support import _missing, fresh_otel_globals


def chars4(text: str) -> int:
    """A transparent estimator for arithmetic checks: ceil(len / 4)."""
    return math.ceil(len(text) / 4)


@pytest.fixture
def chars4_policy() -> Policy:
    return Policy(estimator=chars4, estimator_name="chars/4")


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

"""Fixtures of the budget store tests: a budget section with a key prefix of its own, a RedisStore closed after the
test (the redis-server fixtures, ``redis_server`` and ``own_redis``, are tests/conftest.py's)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mcp_token_otel.config import BudgetConfig, config_from_dict
from tests.helpers.redis_server import RedisServer

_prefixes = itertools.count()


@pytest.fixture
def budget_for(request: pytest.FixtureRequest) -> Callable[..., BudgetConfig]:
    """``budget_for(server, **keys)``: a budget section on ``server`` with a key prefix no other test uses. Its
    deadline is generous (a loaded machine must not turn a test into an outage); the deadline's own test sets
    one."""
    prefix = f"t{next(_prefixes)}-{request.node.name[:40]}:"

    def make(server: RedisServer, **budget: Any) -> BudgetConfig:
        section = {"store": server.url, "store_prefix": prefix, "context_window": 1000, "store_timeout": 5.0,
                   **budget}
        return config_from_dict({"budget": section}).budget

    return make


@pytest.fixture
def open_redis() -> Iterator[Callable[..., Any]]:
    """``open_redis(budget, **options)``: a RedisStore closed at the end of the test."""
    from mcp_token_otel.store.redis_store import RedisStore

    stores: list[RedisStore] = []

    def make(budget: BudgetConfig, **options: Any) -> RedisStore:
        store = RedisStore(budget, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()

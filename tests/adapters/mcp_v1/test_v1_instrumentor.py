"""mcp 1.x: hooks that leave other libraries' wrappers alone. Another library's wrapt wrapper on an SDK function we
hook, added after ours or before it, survives our ``uninstrument()``. The entry points (``instrument()`` and
``McpTokenInstrumentor``) in any order, alike on both majors: tests/adapters/scenarios/test_instrumentor.py (helpers
in tests/adapters/scenarios/entry_points.py; the hooked attributes in tests/adapters/mcp_v1/driver.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mcp.shared.memory as shared_memory
import pytest
import wrapt
from mcp.shared.session import BaseSession, RequestResponder

import mcp_token_otel
from mcp_token_otel.instrumentation import McpTokenInstrumentor
from tests.adapters.scenarios.entry_points import measured, on

from .conftest import Otel

# A method, a module function the SDK looks up at call time, and an __init__: each runs on every call below.
TARGETS = [(BaseSession, "send_request"), (shared_memory, "create_client_server_memory_streams"),
           (RequestResponder, "__init__")]
IDS = ["BaseSession.send_request", "memory.create_client_server_memory_streams", "RequestResponder.__init__"]


@pytest.fixture(autouse=True)
def _left_uninstrumented() -> Iterator[None]:
    yield
    mcp_token_otel.uninstrument()
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry


class Counting:
    """Another library's wrapt wrapper: counts the calls it sees."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        return wrapped(*args, **kwargs)


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_after_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    on("function", otel)
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    assert measured(otel) and counting.calls >= 1
    mcp_token_otel.uninstrument()
    assert vars(owner)[name] is theirs and theirs.__wrapped__ is original
    seen = counting.calls
    assert not measured(otel)
    assert counting.calls > seen
    wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_before_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    try:
        on("class", otel)
        assert vars(owner)[name] is not theirs
        assert measured(otel) and counting.calls >= 1
        McpTokenInstrumentor().uninstrument()
        assert vars(owner)[name] is theirs
        seen = counting.calls
        assert not measured(otel)
        assert counting.calls > seen
    finally:
        wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original

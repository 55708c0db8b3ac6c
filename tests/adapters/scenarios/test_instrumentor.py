"""One owner of the instrumentation state, under either SDK major: ``mcp_token_otel.instrument()`` /
``uninstrument()`` and ``McpTokenInstrumentor().instrument()`` / ``.uninstrument()`` drive the same instance, in
any order: after every step the SDK is either hooked (a real in-memory call is measured) or restored exactly (it
is not). The helpers are in entry_points.py; what each adapter's hooks do beside (other libraries' wrappers, a
failed hook, a bad configuration): tests/adapters/mcp_v2/test_instrumentor.py, test_instrumentor_wrappers.py and
tests/adapters/mcp_v1/test_v1_instrumentor.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mcp_token_otel
from mcp_token_otel.instrumentation import McpTokenInstrumentor
from tests.helpers.support import Otel

from .entry_points import assert_hooked, assert_restored, off, on


@pytest.fixture(autouse=True)
def _left_uninstrumented() -> Iterator[None]:
    yield
    mcp_token_otel.uninstrument()
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry


def test_one_instance() -> None:
    assert McpTokenInstrumentor() is McpTokenInstrumentor()


@pytest.mark.parametrize(
    ("first", "second"), [("function", "function"), ("class", "function"), ("function", "class"), ("class", "class")]
)
def test_any_order_of_entry_points_is_consistent(otel: Otel, first: str, second: str) -> None:
    assert_restored(otel)
    recorder = on(first, otel)
    assert_hooked(otel)
    assert recorder is McpTokenInstrumentor().recorder
    off(second)
    assert_restored(otel)
    on(first, otel)  # hooked again (the class entry point used to think it still was)
    assert_hooked(otel)
    active = McpTokenInstrumentor().recorder
    on(second, otel)  # a no-op: nothing hooked twice, the same recorder
    assert McpTokenInstrumentor().recorder is active
    if second == "function":
        assert on(second, otel) is active
    assert_hooked(otel)
    off(first)
    assert_restored(otel)
    mcp_token_otel.uninstrument()  # a no-op
    assert_restored(otel)

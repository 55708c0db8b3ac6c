"""mcp 2.x: the instrumentation state beside the entry points' order. instrument() twice measures a call once; a
bad configuration and a failed hook leave the SDK restored; a second instrument() on the same MeterProvider reports
the new recorder. The entry points in any order, alike on both majors: tests/adapters/scenarios/test_instrumentor.py
(helpers in tests/adapters/scenarios/entry_points.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import IS_MCP_V2, Otel, make_config

if not IS_MCP_V2:
    pytest.skip("mcp 2.x only", allow_module_level=True)

import mcp.shared.jsonrpc_dispatcher as jrd

import mcp_token_otel
from mcp_token_otel.config import ConfigError
from mcp_token_otel.instrumentation import McpTokenInstrumentor
from tests.adapters.scenarios.entry_points import ORIGINAL, assert_hooked, assert_restored, measured, off, on

from .driver import HOOKED


@pytest.fixture(autouse=True)
def _left_uninstrumented() -> Iterator[None]:
    yield
    mcp_token_otel.uninstrument()
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry


def test_instrument_twice_measures_each_call_once(otel: Otel) -> None:
    first = mcp_token_otel.instrument(make_config(), tracer_provider=otel.tracer_provider,
                                      meter_provider=otel.meter_provider)
    McpTokenInstrumentor().instrument()
    assert mcp_token_otel.instrument() is first
    assert measured(otel)
    points = [p for p in otel.metrics()["mcp_token.message.tokens"]
              if p.attributes.get("gen_ai.tool.name") == "echo" and p.attributes["mcp_token.side"] == "client"]
    assert [(p.attributes["mcp_token.direction"], p.count) for p in points] == [("output", 1)]


def test_a_bad_configuration_is_logged_by_the_class_and_raised_by_the_function(
    otel: Otel, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setenv("MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW", "lots")
    assert McpTokenInstrumentor().instrument() is None
    assert "not instrumenting, bad configuration: config key 'budget.context_window'" in caplog.text
    assert_restored(otel)
    with pytest.raises(ConfigError, match=r"'budget\.context_window'"):
        mcp_token_otel.instrument()
    assert_restored(otel)
    monkeypatch.delenv("MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW")
    on("class", otel)  # nothing was counted as instrumented: a later call hooks the SDK
    assert_hooked(otel)


def test_a_failed_hook_is_not_counted_as_instrumented(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        patched.delattr(jrd, "otel_span")  # as if a release renamed the private hook
        assert on("class", otel) is None
        assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
        assert [vars(owner).get(name) for owner, name in HOOKED[:3]] == ORIGINAL[:3]  # undone
    on("class", otel)
    assert_hooked(otel)


def _output_tokens(otel: Otel) -> float:
    points = otel.metrics().get("mcp_token.tokens", [])
    wanted = {"mcp_token.direction": "output", "mcp_token.side": "server"}
    return sum(p.value for p in points if wanted.items() <= dict(p.attributes).items())


def test_instrumenting_again_on_the_same_meter_provider_reports_the_new_recorder(otel: Otel) -> None:
    """The SDK hands back an existing instrument for a name it has seen (and drops the new callbacks): the
    observable counters of a second instrument() on the same MeterProvider must report its calls, not the
    first recorder's frozen totals."""
    on("function", otel)
    assert measured(otel)
    one_call = _output_tokens(otel)
    assert one_call > 0
    off("function")
    gc.collect()  # the recorder is gone: its totals must not be
    assert not measured(otel)
    assert _output_tokens(otel) == one_call  # an uninstrumented recorder's totals stay, frozen
    on("class", otel)
    assert measured(otel) and measured(otel)
    assert _output_tokens(otel) == 2 * one_call  # the second recorder's two calls, the first one's replaced
    off("class")
    assert not measured(otel)
    assert _output_tokens(otel) == 2 * one_call

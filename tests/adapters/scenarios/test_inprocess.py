"""In process, client and server instrumented, under either SDK major (JSON-RPC over memory streams). The spans and
errors of in-process calls, whose names, scopes and protocol versions follow the SDK:
tests/adapters/mcp_v2/test_v2_inprocess.py and tests/adapters/mcp_v1/test_v1_inprocess.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from mcp_token_otel.instrumentation import instrument, uninstrument
from tests.helpers.support import Otel, make_config, named, no_usage_attributes

from .sdk import Driver


def make_server(sdk: Driver) -> Any:
    server = sdk.server("demo")

    @server.tool()
    def big(n: int) -> str:
        """Return n characters."""
        return "x" * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    return server


def by_name(spans: list[ReadableSpan], name: str, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if named(s, name) and s.kind is kind]


@pytest.fixture
def small_budget(otel: Otel) -> Iterator[Any]:
    recorder = instrument(
        make_config(budget={"context_window": 2000}),
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
    )
    yield recorder
    uninstrument()


def test_budget_transitions_and_session_end(otel: Otel, small_budget: Any, sdk: Driver) -> None:
    async def main() -> None:
        async with sdk.connect(make_server(sdk), sdk.jsonrpc_mode) as client:
            await client.call_tool("big", {"n": 3000})
            await client.call_tool("big", {"n": 3000})
            # Both sessions are live until the connection closes.
            assert small_budget.states()["client"]["exhausted"] == 1

    anyio.run(main)
    spans = otel.spans()
    client_spans = by_name(spans, "tools/call big", SpanKind.CLIENT)
    budget_events = [e for s in client_spans for e in s.events if e.name == "mcp_token.budget"]
    assert [e.attributes["mcp_token.session.state"] for e in budget_events] == ["warning", "exhausted"]
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        calls = by_name(spans, "tools/call big", kind)
        # Once per state per session, on whichever message crossed the line (the implicit tools/list too).
        events = [e for s in spans if s.kind is kind for e in s.events if e.name == "mcp_token.budget"]
        assert [e.attributes["mcp_token.session.state"] for e in events] == ["warning", "exhausted"]  # type: ignore[index]
        assert calls[-1].attributes["mcp_token.session.state"] == "exhausted"
        assert calls[-1].attributes["mcp_token.session.utilization"] > 1
    points = otel.metrics()
    states = {
        (p.attributes["mcp_token.side"], p.attributes["mcp_token.session.state"]): p.value
        for p in points["mcp_token.session.transitions"]
    }
    for side in ("client", "server"):
        assert states[(side, "warning")] == 1 and states[(side, "exhausted")] == 1
    # Leaving `async with` ended both sessions (not garbage collection): utilization observed once per side.
    ends = {p.attributes["mcp_token.side"]: p for p in points["mcp_token.session.utilization"]}
    assert ends["client"].count == 1 and ends["server"].count == 1
    assert ends["client"].sum > 1
    assert small_budget.states() == {
        "client": {"ok": 0, "warning": 0, "exhausted": 0},
        "server": {"ok": 0, "warning": 0, "exhausted": 0},
        "proxy": {"ok": 0, "warning": 0, "exhausted": 0},
    }
    for metric_points in points.values():
        for p in metric_points:
            assert "mcp.session.id" not in p.attributes and "mcp_token.session.id" not in p.attributes
            assert no_usage_attributes(p.attributes)

"""RED metrics through real mcp 1.x sessions: durations, errors by type, server names, tool definitions."""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from opentelemetry.trace import SpanKind

from mcp_token_otel.catalog import DURATION_BUCKETS
from mcp_token_otel.instrumentation import instrument, uninstrument

from .conftest import Otel, make_config, samples

SERVER = "red-v1"


def make_server() -> FastMCP:
    server = FastMCP(SERVER)

    @server.tool()
    async def sleepy() -> str:
        """Sleep 50 ms."""
        await anyio.sleep(0.05)
        return "rested"

    @server.tool()
    def failing() -> str:
        raise ValueError("tool failed")

    @server.resource("res://one")
    def one() -> str:
        return "resource text"

    return server


def test_v1_durations_errors_and_server_names(otel: Otel) -> None:
    recorder = instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    listed: list[Any] = []
    try:

        async def main() -> None:
            async with create_connected_server_and_client_session(make_server()._mcp_server) as session:
                listed.extend((await session.list_tools()).tools)
                await session.call_tool("sleepy", {})
                result = await session.call_tool("failing", {})
                assert result.isError
                await session.read_resource("res://one")  # type: ignore[arg-type]

        anyio.run(main)
    finally:
        uninstrument()
    for side in ("client", "server"):
        labels = {"side": side, "server": SERVER, "method": "tools/call", "tool": "sleepy"}
        ((_, total),) = samples(recorder, "mcp_token_operation_duration_seconds_sum", **labels)
        assert total >= 0.05
        rows = samples(recorder, "mcp_token_operation_duration_seconds_bucket", **labels)
        buckets = {lab["le"]: v for lab, v in rows}
        for bound in DURATION_BUCKETS:
            assert buckets[str(bound)] == (1 if bound >= total else 0)
        errors = samples(recorder, "mcp_token_call_errors_total", side=side, server=SERVER, tool="failing")
        assert [(lab["error_type"], v) for lab, v in errors] == [("tool_error", 1.0)]
        ((_, sessions),) = samples(recorder, "mcp_token_session_duration_seconds_count", side=side, server=SERVER)
        assert sessions == 1
    ((_, definitions),) = samples(recorder, "mcp_token_tool_definitions_tokens", server=SERVER)
    assert definitions > 0 and len(listed) == 2
    reads = [s for s in otel.spans() if s.name == "resources/read"]
    assert {s.kind for s in reads} == {SpanKind.CLIENT, SpanKind.SERVER}
    assert all(s.attributes["mcp.resource.uri"] == "res://one" for s in reads)
    points = otel.metrics()
    (server_point,) = [p for p in points["mcp.server.operation.duration"]
                       if p.attributes.get("gen_ai.tool.name") == "sleepy"]
    assert server_point.sum >= 0.05 and server_point.attributes["mcp_token.server.name"] == SERVER

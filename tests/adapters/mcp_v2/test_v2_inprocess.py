"""mcp 2.x in process: Client(server) in direct (auto) and legacy mode, client and server instrumented. Budget
transitions in process, alike on both majors: tests/adapters/scenarios/test_inprocess.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from tests.helpers.support import assert_client_call_recorded_once

from .conftest import Otel, named

MODES = ("auto", "legacy")


def make_server() -> MCPServer:
    server = MCPServer("demo")

    @server.tool()
    def big(n: int) -> str:
        """Return n characters."""
        return "x" * n

    @server.tool()
    def boom() -> str:
        raise ValueError("tool failed")

    @server.tool()
    def mcp_err() -> str:
        raise MCPError(code=-32042, message="custom failure")

    return server


def by_name(spans: list[ReadableSpan], name: str, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if named(s, name) and s.kind is kind]


def run(coro: Any) -> Any:
    return anyio.run(coro)


@pytest.mark.parametrize("mode", MODES)
def test_client_and_server_spans(otel: Otel, instrumented: Any, mode: str) -> None:
    server = make_server()

    async def main() -> None:
        async with Client(server, mode=mode) as client:
            result = await client.call_tool("big", {"n": 40_000})
            assert result.content[0].text == "x" * 40_000

    run(main)
    spans = otel.spans()
    (client,) = by_name(spans, "tools/call big", SpanKind.CLIENT)
    (srv,) = by_name(spans, "tools/call big", SpanKind.SERVER)
    # One CLIENT span: over JSON-RPC the SDK's own, enriched; in process (no SDK span) the shim's.
    assert [s.name for s in spans if s.kind is SpanKind.CLIENT and s.name.endswith("tools/call big")] == [client.name]
    sdk_span = mode == "legacy"
    assert client.name == ("MCP send tools/call big" if sdk_span else "tools/call big")
    assert client.instrumentation_scope.name == ("mcp-python-sdk" if sdk_span else "mcp_token_otel")
    assert srv.context.trace_id == client.context.trace_id
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    for span in (client, srv):
        a = span.attributes
        assert a["mcp.method.name"] == "tools/call"
        assert a["gen_ai.tool.name"] == "big"
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["mcp.protocol.version"] == ("2026-07-28" if mode == "auto" else "2025-11-25")
        assert a["mcp_token.input_tokens"] > 0
        assert a["mcp_token.output_tokens"] >= 10_000
        assert a["mcp_token.overhead_tokens"] > 0  # structuredContent duplicates the text
        assert 0 < a["mcp_token.overhead_ratio"] < 1
        assert a["mcp_token.risk_tier"] == "critical"
        assert a["mcp_token.estimator"] == "chars/4"
        assert a["mcp_token.session.state"] == "ok"
        assert a["mcp_token.session.tokens"] >= a["mcp_token.output_tokens"]
        assert a["mcp_token.session.utilization"] > 0
        assert "network.transport" not in a  # in-memory has no OTel value
        assert "mcp.session.id" not in a  # no protocol session in memory
        assert not any(k.startswith("gen_ai.usage") for k in a)
        assert not any(k.startswith("gen_ai.tool.call.") for k in a)
        assert [e.name for e in span.events] == ["mcp_token.risk"]
    if mode == "legacy":
        assert client.attributes["jsonrpc.request.id"] == srv.attributes["jsonrpc.request.id"]
    assert srv.attributes["jsonrpc.request.id"]
    # non-tool methods carry no gen_ai.operation.name
    (listing,) = by_name(spans, "tools/list", SpanKind.CLIENT)
    assert "gen_ai.operation.name" not in listing.attributes


@pytest.mark.parametrize("mode", MODES)
def test_errors(otel: Otel, instrumented: Any, mode: str) -> None:
    server = make_server()

    async def main() -> None:
        async with Client(server, mode=mode) as client:
            result = await client.call_tool("boom", {})
            assert result.is_error
            with pytest.raises(MCPError) as info:
                await client.call_tool("mcp_err", {})
            assert info.value.error.code == -32042

    run(main)
    spans = otel.spans()
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        (tool_error,) = by_name(spans, "tools/call boom", kind)
        assert tool_error.attributes["error.type"] == "tool_error"
        assert tool_error.status.status_code is StatusCode.ERROR
        (rpc_error,) = by_name(spans, "tools/call mcp_err", kind)
        assert rpc_error.attributes["error.type"] == "-32042"
        assert rpc_error.status.status_code is StatusCode.ERROR
        assert rpc_error.attributes["mcp_token.output_tokens"] > 0


def test_client_only(otel: Otel) -> None:
    """A server built before instrument() and never passed to instrument_server: client spans only."""
    from mcp_token_otel.instrumentation import instrument, uninstrument

    server = make_server()
    instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:

        async def main() -> None:
            async with Client(server, mode="legacy") as client:
                await client.call_tool("big", {"n": 10})

        run(main)
    finally:
        uninstrument()
    spans = otel.spans()
    (client,) = by_name(spans, "tools/call big", SpanKind.CLIENT)
    (srv,) = by_name(spans, "tools/call big", SpanKind.SERVER)  # the SDK's own, not enriched
    assert "mcp_token.output_tokens" in client.attributes
    assert not any(k.startswith("mcp_token.") for k in srv.attributes)
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id


def test_server_only_via_instrument_server(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server built before instrument() and added with instrument_server(); the client left alone."""
    from mcp_token_otel.adapters import mcp_v2
    from mcp_token_otel.instrumentation import instrument, instrument_server, uninstrument

    server = make_server()
    original_session_init = ClientSession.__init__
    instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:
        instrument_server(server)
        monkeypatch.setattr(ClientSession, "__init__", original_session_init)  # client not instrumented

        async def main() -> None:
            async with Client(server, mode="legacy") as client:
                assert not isinstance(client.session._dispatcher, mcp_v2.DispatcherProxy)
                await client.call_tool("big", {"n": 10})

        run(main)
    finally:
        monkeypatch.undo()
        uninstrument()
    spans = otel.spans()
    (sdk_client,) = by_name(spans, "MCP send tools/call big", SpanKind.CLIENT)
    (srv,) = by_name(spans, "tools/call big", SpanKind.SERVER)
    assert srv.attributes["mcp_token.output_tokens"] > 0
    assert srv.parent is not None and srv.parent.span_id == sdk_client.context.span_id
    assert not any(k.startswith("mcp_token.") for k in sdk_client.attributes)


def test_own_server_span_without_sdk_middleware(otel: Otel, instrumented: Any) -> None:
    """If the SDK's OpenTelemetryMiddleware is removed, the shim opens the SERVER span itself."""
    server = make_server()
    low = server._lowlevel_server
    low.middleware[:] = [m for m in low.middleware if type(m).__name__ != "OpenTelemetryMiddleware"]

    async def main() -> None:
        async with Client(server, mode="legacy") as client:
            await client.call_tool("big", {"n": 10})

    run(main)
    (client,) = by_name(otel.spans(), "tools/call big", SpanKind.CLIENT)
    (srv,) = by_name(otel.spans(), "tools/call big", SpanKind.SERVER)
    assert srv.instrumentation_scope.name == "mcp_token_otel"
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.attributes["mcp_token.output_tokens"] > 0


def test_uninstrument_restores_sdk(otel: Otel) -> None:
    import mcp.client.stdio as client_stdio
    import mcp.server.stdio as server_stdio
    import mcp.shared.jsonrpc_dispatcher as jrd
    from mcp.client.streamable_http import StreamableHTTPTransport

    from mcp_token_otel.adapters import mcp_v2
    from mcp_token_otel.instrumentation import instrument, uninstrument

    before = {
        "server": Server.__dict__["__init__"],
        "session": ClientSession.__dict__["__init__"],
        "http": StreamableHTTPTransport.__dict__["__init__"],
        "otel_span": jrd.otel_span,
        "spawn": client_stdio._create_platform_compatible_process,
        "stdio_server": server_stdio.stdio_server,
    }
    early = make_server()
    chain_before = [type(m).__name__ for m in early.middleware]
    instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    instrument()  # idempotent
    from mcp_token_otel.instrumentation import instrument_server

    instrument_server(early)
    instrument_server(early)
    late = make_server()
    assert [type(m).__name__ for m in early.middleware].count("TokenMiddleware") == 1
    assert [type(m).__name__ for m in late.middleware].count("TokenMiddleware") == 1
    assert ClientSession.__init__ is not before["session"]
    uninstrument()
    uninstrument()  # idempotent
    assert Server.__dict__["__init__"] is before["server"]
    assert ClientSession.__dict__["__init__"] is before["session"]
    assert StreamableHTTPTransport.__dict__["__init__"] is before["http"]
    assert jrd.otel_span is before["otel_span"]
    assert client_stdio._create_platform_compatible_process is before["spawn"]
    assert server_stdio.stdio_server is before["stdio_server"]
    assert [type(m).__name__ for m in early.middleware] == chain_before
    assert [type(m).__name__ for m in late.middleware] == chain_before

    async def main() -> None:
        async with Client(make_server(), mode="legacy") as client:
            assert not isinstance(client.session._dispatcher, mcp_v2.DispatcherProxy)
            await client.call_tool("big", {"n": 10})

    count_before = len(otel.spans())
    run(main)
    new = otel.spans()[count_before:]
    assert next(s.name for s in new if s.kind is SpanKind.CLIENT).startswith("MCP send")
    assert not any(k.startswith("mcp_token.") for s in new for k in s.attributes)


def test_double_instrument_one_set(otel: Otel) -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    from .conftest import make_config

    first = instrument(
        make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    second = instrument(
        make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider
    )
    assert first is second
    try:

        async def main() -> None:
            async with Client(make_server(), mode="legacy") as client:
                await client.call_tool("big", {"n": 100})

        run(main)
    finally:
        uninstrument()
    (client,) = by_name(otel.spans(), "tools/call big", SpanKind.CLIENT)
    assert len([e for e in client.events]) == 0
    assert_client_call_recorded_once(otel, "big", client)


def test_a_handler_crash_is_measured_as_the_error_the_client_receives(otel: Otel, instrumented: Any) -> None:
    from mcp.server.lowlevel.server import Server
    from mcp.shared.exceptions import MCPError

    async def list_tools(ctx: Any, params: Any) -> Any:
        raise RuntimeError("database unavailable")

    server = Server("crashy", on_list_tools=list_tools)

    async def main() -> int:
        async with Client(server, mode="legacy") as client:
            try:
                await client.list_tools()
            except MCPError as exc:
                return exc.error.code
        return 0

    code = run(main)
    assert code == 0  # the SDK's JSON-RPC dispatcher answers an uncaught exception with code 0
    (srv,) = by_name(otel.spans(), "tools/list", SpanKind.SERVER)
    # The SDK's own middleware (outside ours) names the exception class on its span; ours measured the answer.
    assert srv.attributes["error.type"] == "RuntimeError"
    assert srv.attributes["mcp_token.output_tokens"] > 0  # "database unavailable" entered the context
    assert srv.attributes["mcp_token.risk_tier"] == "low"

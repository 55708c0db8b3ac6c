"""mcp 1.x over real transports: a stdio subprocess (our server, and mcp-server-time) and streamable HTTP."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.fastmcp import FastMCP
from opentelemetry.trace import SpanKind, StatusCode

from .conftest import Otel, free_port, make_config, no_usage_attributes, streamable_http_client

SERVER_SCRIPT = Path(__file__).parent / "servers" / "stdio_server.py"


def stdio_params(spans_file: Path) -> StdioServerParameters:
    env = {"MCP_TOKEN_TEST_INSTRUMENT": "1", "MCP_TOKEN_TEST_SPANS": str(spans_file)}
    return StdioServerParameters(command=sys.executable, args=[str(SERVER_SCRIPT)], env=env)


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.parametrize("instrument_client", [True, False], ids=["both", "server-only"])
@pytest.mark.slow
def test_stdio_subprocess(otel: Otel, tmp_path: Path, instrument_client: bool) -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    spans_file = tmp_path / "server_spans.jsonl"
    if instrument_client:  # a peer in another process: propagating trace context is opt-in (handlers see it)
        config = make_config(spans={"propagate_context": "always"})
        instrument(config, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    tracer = otel.tracer_provider.get_tracer("test")
    try:

        async def main() -> None:
            with anyio.fail_after(30):
                async with stdio_client(stdio_params(spans_file)) as (read, write), ClientSession(read, write) as s:
                    await s.initialize()
                    with tracer.start_as_current_span("agent-step"):
                        result = await s.call_tool("big", {"n": 5000})
                    assert text_of(result) == "x" * 5000
                    assert (await s.call_tool("boom", {})).isError

        anyio.run(main)
    finally:
        uninstrument()
    server_spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    (srv,) = [s for s in server_spans if s["name"] == "tools/call big"]
    assert srv["kind"] == "SERVER"
    a = srv["attributes"]
    assert a["network.transport"] == "pipe"
    assert a["mcp_token.output_tokens"] >= 1250
    assert a["mcp_token.risk_tier"] == "medium"
    assert a["mcp_token.estimator"] == "chars/4"
    assert a["mcp.protocol.version"] == types.LATEST_PROTOCOL_VERSION
    assert a["jsonrpc.request.id"]
    assert "mcp.session.id" not in a  # stdio has no protocol session id
    assert no_usage_attributes(a)
    (boom,) = [s for s in server_spans if s["name"] == "tools/call boom"]
    assert boom["attributes"]["error.type"] == "tool_error" and boom["status"] == "ERROR"
    (step,) = [s for s in otel.spans() if s.name == "agent-step"]
    if instrument_client:
        (client,) = [s for s in otel.spans() if s.name == "tools/call big" and s.kind is SpanKind.CLIENT]
        assert client.attributes["network.transport"] == "pipe"
        assert client.attributes["mcp_token.output_tokens"] == a["mcp_token.output_tokens"]
        assert client.attributes["jsonrpc.request.id"] == a["jsonrpc.request.id"]
        # Across processes: the server span's parent is the client span, carried in params._meta.
        assert srv["trace_id"] == f"{client.context.trace_id:032x}"
        assert srv["parent_id"] == f"{client.context.span_id:016x}"
        assert client.parent is not None and client.parent.span_id == step.context.span_id
    else:
        # No client shim, so nothing injects trace context: mcp 1.x has no propagation of its own.
        assert srv["trace_id"] != f"{step.context.trace_id:032x}"
        assert [s.name for s in otel.spans()] == ["agent-step"]


@pytest.mark.slow
def test_mcp_server_time_stdio(otel: Otel, instrumented: Any) -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"])

    async def main() -> None:
        with anyio.fail_after(30):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("get_current_time", {"timezone": "UTC"})
                assert not result.isError and "UTC" in text_of(result)
                bad = await session.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
                assert bad.isError

    anyio.run(main)
    spans = [s for s in otel.spans() if s.kind is SpanKind.CLIENT]
    assert not [s for s in otel.spans() if s.kind is SpanKind.SERVER]  # the server is not ours
    ok, bad = [s for s in spans if s.name == "tools/call get_current_time"]
    assert ok.attributes["network.transport"] == "pipe"
    assert ok.attributes["gen_ai.tool.name"] == "get_current_time"
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["mcp_token.output_tokens"] > 0
    assert ok.attributes["mcp_token.risk_tier"] == "low"
    assert ok.attributes["mcp.protocol.version"]
    assert ok.attributes["jsonrpc.request.id"]
    assert "error.type" not in ok.attributes and ok.status.status_code is StatusCode.UNSET
    assert bad.attributes["error.type"] == "tool_error" and bad.status.status_code is StatusCode.ERROR
    assert "rpc.response.status_code" not in bad.attributes
    (init,) = [s for s in spans if s.name == "initialize"]
    assert init.attributes["network.transport"] == "pipe"
    assert "mcp.session.id" not in init.attributes


def http_server() -> FastMCP:
    server = FastMCP("http-test", host="127.0.0.1")

    @server.tool()
    def echo(text: str) -> str:
        return text

    return server


async def serve(tg: Any, app: Any, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    tg.start_soon(server.serve)
    with anyio.fail_after(10):
        while not server.started:
            await anyio.sleep(0.02)
    return server


def test_streamable_http(otel: Otel) -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    # Over HTTP the peer could be another process: trace context is sent only with "always" (here the server
    # is in this process, so its shim takes the context out of _meta again before the handler runs).
    config = make_config(spans={"propagate_context": "always"})
    instrumented = instrument(config, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert instrumented is not None
    port = free_port()
    app = http_server().streamable_http_app()
    ids: list[str | None] = []

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                server = await serve(tg, app, port)
                try:
                    async with (
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, get_session_id),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        assert text_of(await session.call_tool("echo", {"text": "hi" * 100})) == "hi" * 100
                        ids.append(get_session_id())
                finally:
                    server.should_exit = True

    try:
        anyio.run(main)
    finally:
        uninstrument()
    (session_id,) = ids
    assert session_id
    spans = otel.spans()
    (client,) = [s for s in spans if s.name == "tools/call echo" and s.kind is SpanKind.CLIENT]
    (srv,) = [s for s in spans if s.name == "tools/call echo" and s.kind is SpanKind.SERVER]
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.context.trace_id == client.context.trace_id
    for span in (client, srv):
        assert span.attributes["network.transport"] == "tcp"
        assert span.attributes["mcp.session.id"] == session_id
        assert span.attributes["mcp_token.output_tokens"] > 0
        assert span.attributes["mcp.protocol.version"] == types.LATEST_PROTOCOL_VERSION
        assert span.attributes["jsonrpc.request.id"]
    assert client.attributes["jsonrpc.request.id"] == srv.attributes["jsonrpc.request.id"]
    assert client.attributes["server.address"] == "127.0.0.1" and client.attributes["server.port"] == port
    assert client.attributes["network.protocol.name"] == "http"
    assert srv.attributes["server.address"] == "127.0.0.1" and srv.attributes["server.port"] == port
    assert srv.attributes["network.protocol.version"] == "1.1"
    # The server knows the id on initialize already (from its transport); the client once the response set it.
    (init_client,) = [s for s in spans if s.name == "initialize" and s.kind is SpanKind.CLIENT]
    (init_srv,) = [s for s in spans if s.name == "initialize" and s.kind is SpanKind.SERVER]
    assert init_srv.attributes["mcp.session.id"] == session_id
    assert init_client.attributes["mcp.session.id"] == session_id
    assert init_srv.attributes["network.transport"] == "tcp"
    metrics = otel.metrics()
    for points in metrics.values():
        for p in points:
            assert "mcp.session.id" not in p.attributes
    # Both sessions ended when their receive loops stopped (client exit; server termination/shutdown).
    assert instrumented.states() == {
        "client": {"ok": 0, "warning": 0, "exhausted": 0},
        "server": {"ok": 0, "warning": 0, "exhausted": 0},
        "proxy": {"ok": 0, "warning": 0, "exhausted": 0},
    }
    ends = {p.attributes["mcp_token.side"]: p.count for p in metrics["mcp_token.session.utilization"]}
    assert ends == {"client": 1, "server": 1}

"""mcp 2.x over real transports: a stdio subprocess (our server, and mcp-server-time) and streamable HTTP."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from opentelemetry.trace import SpanKind, StatusCode
from packaging.requirements import Requirement

from .conftest import Otel, free_port, make_config, named

SERVER_SCRIPT = Path(__file__).parent / "servers" / "stdio_server.py"


def stdio_params(spans_file: Path | None) -> StdioServerParameters:
    env = {"MCP_TOKEN_TEST_INSTRUMENT": "1", "MCP_TOKEN_TEST_SPANS": str(spans_file)} if spans_file else {}
    return StdioServerParameters(command=sys.executable, args=[str(SERVER_SCRIPT)], env=env or None)


@pytest.mark.parametrize("instrument_client", [True, False], ids=["both", "server-only"])
@pytest.mark.slow
def test_stdio_subprocess(otel: Otel, tmp_path: Path, instrument_client: bool) -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    spans_file = tmp_path / "server_spans.jsonl"
    if instrument_client:
        instrument(make_config(), tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    try:

        async def main() -> None:
            with anyio.fail_after(30):
                async with Client(stdio_client(stdio_params(spans_file)), mode="legacy") as client:
                    result = await client.call_tool("big", {"n": 5000})
                    assert result.content[0].text == "x" * 5000
                    assert (await client.call_tool("boom", {})).is_error

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
    assert a["mcp.protocol.version"] == "2025-11-25"
    assert "mcp.session.id" not in a  # stdio has no protocol session id
    (boom,) = [s for s in server_spans if s["name"] == "tools/call boom"]
    assert boom["attributes"]["error.type"] == "tool_error" and boom["status"] == "ERROR"
    client_spans = [s for s in otel.spans() if s.kind is SpanKind.CLIENT]
    if instrument_client:
        # The SDK's own client span, enriched by the shim (one span: name and scope kept).
        (client,) = [s for s in client_spans if named(s, "tools/call big")]
        assert client.name == "MCP send tools/call big" and client.instrumentation_scope.name == "mcp-python-sdk"
        assert client.attributes["network.transport"] == "pipe"
        assert client.attributes["mcp_token.output_tokens"] == a["mcp_token.output_tokens"]
        assert srv["trace_id"] == f"{client.context.trace_id:032x}"
        assert srv["parent_id"] == f"{client.context.span_id:016x}"
    else:
        (client,) = [s for s in client_spans if s.name == "MCP send tools/call big"]
        assert srv["parent_id"] == f"{client.context.span_id:016x}"


def unfit_server(dist: str) -> str | None:
    """Why the installed release of the MCP server package ``dist`` cannot run on the installed mcp 2.x, or None.

    Its declared requirement on ``mcp`` says which SDK it was written for: one that admits mcp 1.x (e.g.
    ``mcp>=1.23.0``) imports mcp 1.x's API, which mcp 2.x removed. pip installs such a release when no release
    written for mcp 2.x accepts the installed mcp (mcp-server-time 2026.10.19 requires mcp>=2.3)."""
    mcp = importlib.metadata.version("mcp")
    wants = [Requirement(r) for r in importlib.metadata.requires(dist) or []]
    (spec,) = [r.specifier for r in wants if r.name == "mcp" and not r.marker]
    release = f"{dist} {importlib.metadata.version(dist)}"
    if not spec.contains(mcp, prereleases=True):
        return f"{release} requires mcp{spec}, not mcp {mcp}"
    if spec.contains("1.9999", prereleases=True):
        return f"{release} was written for mcp 1.x (it requires mcp{spec}): it cannot run on mcp {mcp}"
    return None


@pytest.mark.slow
def test_mcp_server_time_stdio(otel: Otel, instrumented: Any) -> None:
    if reason := unfit_server("mcp-server-time"):
        pytest.skip(reason)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
    )

    async def main() -> None:
        with anyio.fail_after(30):
            async with Client(stdio_client(params), mode="legacy") as client:
                result = await client.call_tool("get_current_time", {"timezone": "UTC"})
                assert not result.is_error and "UTC" in result.content[0].text
                bad = await client.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
                assert bad.is_error

    anyio.run(main)
    spans = [s for s in otel.spans() if s.kind is SpanKind.CLIENT]
    ok, bad = [s for s in spans if named(s, "tools/call get_current_time")]
    assert ok.attributes["network.transport"] == "pipe"
    assert ok.attributes["gen_ai.tool.name"] == "get_current_time"
    assert ok.attributes["mcp_token.output_tokens"] > 0
    assert ok.attributes["mcp_token.risk_tier"] == "low"
    assert ok.attributes["mcp.protocol.version"]
    assert ok.attributes["jsonrpc.request.id"]
    assert bad.attributes["error.type"] == "tool_error" and bad.status.status_code is StatusCode.ERROR


def http_server() -> MCPServer:
    server = MCPServer("http-test")

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


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_streamable_http(otel: Otel, instrumented: Any, mode: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    app = http_server().streamable_http_app()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                server = await serve(tg, app, port)
                try:
                    async with Client(url, mode=mode) as client:
                        assert (await client.call_tool("echo", {"text": "hi" * 100})).content[0].text
                finally:
                    server.should_exit = True

    anyio.run(main)
    spans = otel.spans()
    (client,) = [s for s in spans if named(s, "tools/call echo") and s.kind is SpanKind.CLIENT]
    (srv,) = [s for s in spans if s.name == "tools/call echo" and s.kind is SpanKind.SERVER]
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.context.trace_id == client.context.trace_id
    for span in (client, srv):
        assert span.attributes["network.transport"] == "tcp"
        assert span.attributes["mcp_token.output_tokens"] > 0
        assert span.attributes["jsonrpc.request.id"]
        # Where the transport knows them: the address and port reached, the protocol (issue 11).
        assert span.attributes["server.address"] == "127.0.0.1" and span.attributes["server.port"] == port
        assert span.attributes["network.protocol.name"] == "http"
    assert srv.attributes["network.protocol.version"] == "1.1"  # from the request (uvicorn's h11)
    if mode == "legacy":  # stateful session: the same mcp-session-id on both sides
        assert client.attributes["mcp.session.id"]
        assert client.attributes["mcp.session.id"] == srv.attributes["mcp.session.id"]
    else:  # 2026-07-28 is sessionless
        assert "mcp.session.id" not in client.attributes and "mcp.session.id" not in srv.attributes
    for points in otel.metrics().values():
        for p in points:
            assert "mcp.session.id" not in p.attributes


def test_streamable_http_client_session(otel: Otel, instrumented: Any) -> None:
    """streamable_http_client + ClientSession (the manual path) also gets the session id and tcp."""
    port = free_port()
    app = http_server().streamable_http_app()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                server = await serve(tg, app, port)
                try:
                    async with (
                        streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        await session.call_tool("echo", {"text": "x"})
                finally:
                    server.should_exit = True

    anyio.run(main)
    spans = otel.spans()
    (init,) = [s for s in spans if named(s, "initialize") and s.kind is SpanKind.CLIENT]
    (client,) = [s for s in spans if named(s, "tools/call echo") and s.kind is SpanKind.CLIENT]
    (srv_init,) = [s for s in spans if s.name == "initialize" and s.kind is SpanKind.SERVER]
    assert init.attributes["mcp.session.id"] == client.attributes["mcp.session.id"]
    assert srv_init.attributes["mcp.session.id"] == client.attributes["mcp.session.id"]
    assert init.attributes["mcp.protocol.version"] == "2025-11-25"


def test_sse(otel: Otel, instrumented: Any) -> None:
    """The SSE transport (GET /sse + POST /messages/): one trace across client and server, both measured."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client

    port = free_port()
    app = http_server().sse_app()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                server = await serve(tg, app, port)
                try:
                    async with sse_client(f"http://127.0.0.1:{port}/sse") as (read, write), ClientSession(
                        read, write
                    ) as session:
                        await session.initialize()
                        result = await session.call_tool("echo", {"text": "sse" * 200})
                        assert result.content[0].text == "sse" * 200
                finally:
                    server.should_exit = True

    anyio.run(main)
    spans = otel.spans()
    (client,) = [s for s in spans if named(s, "tools/call echo") and s.kind is SpanKind.CLIENT]
    (srv,) = [s for s in spans if s.name == "tools/call echo" and s.kind is SpanKind.SERVER]
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.context.trace_id == client.context.trace_id
    assert srv.attributes["network.transport"] == "tcp"
    for span in (client, srv):
        assert span.attributes["mcp_token.output_tokens"] >= 150  # 600 chars at chars/4, plus framing
        assert span.attributes["mcp_token.input_tokens"] > 0
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"

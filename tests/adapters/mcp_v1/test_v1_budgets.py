"""mcp 1.x: the budget of one client session accumulates across its calls on every transport; stateless
HTTP keeps no server budget (no per-call session is made up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from opentelemetry.trace import SpanKind

from .conftest import Otel, free_port, streamable_http_client
from .test_v1_transports import serve, stdio_params

TOKENS = "mcp_token.session.tokens"


def echo_server(**settings: Any) -> FastMCP:
    server = FastMCP("budget-test", **settings)

    @server.tool()
    def echo(text: str) -> str:
        return text

    return server


def session_tokens(otel: Otel, kind: SpanKind) -> list[int]:
    spans = sorted((s for s in otel.spans() if s.kind is kind and s.name == "tools/call echo"),
                   key=lambda s: s.start_time or 0)
    return [s.attributes[TOKENS] for s in spans if TOKENS in (s.attributes or {})]


def assert_grows(values: list[int]) -> None:
    assert len(values) == 3 and values[0] < values[1] < values[2], values


async def three_calls(session: ClientSession) -> None:
    for i in range(3):
        await session.call_tool("echo", {"text": f"call {i} " * 50})


def test_in_memory(otel: Otel, instrumented: Any) -> None:
    async def main() -> None:
        with anyio.fail_after(30):
            async with create_connected_server_and_client_session(echo_server()._mcp_server) as client:
                await three_calls(client)

    anyio.run(main)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


@pytest.mark.slow
def test_stdio(otel: Otel, instrumented: Any, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"

    async def main() -> None:
        with anyio.fail_after(30):
            async with stdio_client(stdio_params(spans_file)) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                for n in (100, 200, 300):
                    await s.call_tool("big", {"n": n})

    anyio.run(main)
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert_grows([s["attributes"][TOKENS] for s in spans if s["name"] == "tools/call big"])


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
def test_http_transports(otel: Otel, instrumented: Any, transport: str) -> None:
    port = free_port()
    server = echo_server()
    app = server.sse_app() if transport == "sse" else server.streamable_http_app()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                uv = await serve(tg, app, port)
                try:
                    if transport == "sse":
                        async with sse_client(f"http://127.0.0.1:{port}/sse") as (read, write), ClientSession(
                            read, write
                        ) as s:
                            await s.initialize()
                            await three_calls(s)
                    else:
                        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (
                            read,
                            write,
                            _,
                        ), ClientSession(read, write) as s:
                            await s.initialize()
                            await three_calls(s)
                finally:
                    uv.should_exit = True

    anyio.run(main)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


def test_stateless_http_keeps_no_server_budget(otel: Otel, instrumented: Any) -> None:
    port = free_port()
    app = echo_server(stateless_http=True).streamable_http_app()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                uv = await serve(tg, app, port)
                try:
                    async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (
                        read,
                        write,
                        _,
                    ), ClientSession(read, write) as s:
                        await s.initialize()
                        await three_calls(s)
                finally:
                    uv.should_exit = True

    anyio.run(main)
    assert session_tokens(otel, SpanKind.SERVER) == []
    assert_grows(session_tokens(otel, SpanKind.CLIENT))
    live = otel.metrics().get("mcp_token.sessions", [])
    assert all(p.value == 0 for p in live if p.attributes.get("mcp_token.side") == "server")

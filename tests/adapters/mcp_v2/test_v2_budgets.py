"""mcp 2.x: the budget of one client session accumulates across its calls, on every transport and mode.

The 2026-07-28 protocol (``Client`` mode auto) builds a new server ``Connection`` per request: the server
keys the budget by what stays the same for one client (the in-process dispatcher pair, the stream's
channel). Stateless HTTP has no session: no per-call session is made up.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from opentelemetry.trace import SpanKind

from .conftest import Otel, free_port, named
from .test_v2_transports import SERVER_SCRIPT, serve

TOKENS = "mcp_token.session.tokens"


def echo_server() -> MCPServer:
    server = MCPServer("budget-test")

    @server.tool()
    def echo(text: str) -> str:
        return text

    return server


def session_tokens(otel: Otel, kind: SpanKind) -> list[int]:
    spans = [s for s in otel.spans() if s.kind is kind and named(s, "tools/call echo")]
    spans.sort(key=lambda s: s.start_time or 0)
    return [s.attributes[TOKENS] for s in spans if TOKENS in (s.attributes or {})]


def assert_grows(values: list[int]) -> None:
    assert len(values) == 3, values
    assert values[0] < values[1] < values[2], values


async def three_calls(call: Any) -> None:
    for i in range(3):
        await call("echo", {"text": f"call {i} " * 50})


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_in_process(otel: Otel, instrumented: Any, mode: str) -> None:
    async def main() -> None:
        with anyio.fail_after(30):
            async with Client(echo_server(), mode=mode) as client:
                await three_calls(client.call_tool)

    anyio.run(main)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


def test_in_process_auto_two_clients_are_two_sessions(otel: Otel, instrumented: Any) -> None:
    """Keyed per client, not per server: a second client starts from zero."""
    server = echo_server()

    async def main() -> None:
        with anyio.fail_after(30):
            async with Client(server) as first, Client(server) as second:
                await first.call_tool("echo", {"text": "a" * 400})
                await second.call_tool("echo", {"text": "a" * 400})
                await first.call_tool("echo", {"text": "a" * 400})

    anyio.run(main)
    first, second, again = session_tokens(otel, SpanKind.SERVER)
    assert first == second and again > first


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.slow
def test_stdio(otel: Otel, instrumented: Any, tmp_path: Path, mode: str) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {"MCP_TOKEN_TEST_INSTRUMENT": "1", "MCP_TOKEN_TEST_SPANS": str(spans_file)}
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER_SCRIPT)], env=env)

    async def main() -> None:
        with anyio.fail_after(30):
            async with Client(stdio_client(params), mode=mode) as client:
                for n in (100, 200, 300):
                    await client.call_tool("big", {"n": n})

    anyio.run(main)
    server_spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    values = [s["attributes"][TOKENS] for s in server_spans if s["name"] == "tools/call big"]
    assert_grows(values)


def run_served(app: Any, client: Callable[[int], Awaitable[None]]) -> None:
    """Serve ``app`` on a free loopback port, run ``client(port)`` against it, stop the server (bounded)."""
    port = free_port()

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                server = await serve(tg, app, port)
                try:
                    await client(port)
                finally:
                    server.should_exit = True

    anyio.run(main)


def test_sse(otel: Otel, instrumented: Any) -> None:
    async def client(port: int) -> None:
        async with sse_client(f"http://127.0.0.1:{port}/sse") as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await three_calls(session.call_tool)

    run_served(echo_server().sse_app(), client)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


def test_streamable_http_stateful(otel: Otel, instrumented: Any) -> None:
    async def client(port: int) -> None:
        async with (
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await three_calls(session.call_tool)

    run_served(echo_server().streamable_http_app(), client)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


@pytest.mark.parametrize("stateless", [True, False], ids=["stateless", "modern"])
def test_http_without_session_has_no_server_budget(otel: Otel, instrumented: Any, stateless: bool) -> None:
    """Stateless HTTP, or the 2026 protocol over HTTP: nothing ties two requests to one client, so the server
    keeps no budget (no made-up per-call session); the client still has its own."""
    server_app = echo_server()
    app = server_app.streamable_http_app(stateless_http=True) if stateless else server_app.streamable_http_app()

    async def client(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy" if stateless else "auto") as c:
            await three_calls(c.call_tool)

    run_served(app, client)
    assert session_tokens(otel, SpanKind.SERVER) == []
    assert_grows(session_tokens(otel, SpanKind.CLIENT))
    server_state = otel.metrics().get("mcp_token.sessions", [])
    assert all(p.value == 0 for p in server_state if p.attributes.get("mcp_token.side") == "server")

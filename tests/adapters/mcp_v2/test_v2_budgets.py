"""mcp 2.x: budgets where only mcp 2.x has the case (the scenarios both majors share, on every transport, are
tests/adapters/scenarios/test_budgets.py).

The 2026-07-28 protocol (``Client`` mode auto) builds a new server ``Connection`` per request: the server keys the
budget by what stays the same for one client (the in-process dispatcher pair); over HTTP nothing does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry.trace import SpanKind

from tests.adapters.scenarios.sdk import SDK
from tests.adapters.scenarios.test_budgets import assert_grows, session_tokens, three_calls
from tests.adapters.scenarios.test_budgets import echo_server as shared_echo_server

from .conftest import Otel, free_port
from .test_v2_transports import serve


def echo_server() -> MCPServer:
    server: MCPServer = shared_echo_server(SDK)
    return server


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


def test_http_2026_has_no_server_budget(otel: Otel, instrumented: Any) -> None:
    """The 2026 protocol over HTTP (stateful app, no session on the wire): nothing ties two requests to one client,
    so the server keeps no budget (no made-up per-call session); the client still has its own. Stateless HTTP, the
    same on both majors: tests/adapters/scenarios/test_budgets.py."""

    async def client(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="auto") as c:
            await three_calls(c)

    run_served(echo_server().streamable_http_app(), client)
    assert session_tokens(otel, SpanKind.SERVER) == []
    assert_grows(session_tokens(otel, SpanKind.CLIENT))
    server_state = otel.metrics().get("mcp_token.sessions", [])
    assert all(p.value == 0 for p in server_state if p.attributes.get("mcp_token.side") == "server")

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

from .conftest import Otel, free_port, named
from .test_v2_transports import serve

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
            await three_calls(c.call_tool)

    run_served(echo_server().streamable_http_app(), client)
    assert session_tokens(otel, SpanKind.SERVER) == []
    assert_grows(session_tokens(otel, SpanKind.CLIENT))
    server_state = otel.metrics().get("mcp_token.sessions", [])
    assert all(p.value == 0 for p in server_state if p.attributes.get("mcp_token.side") == "server")

"""The budget of one client session accumulates across its calls, on every transport and mode; stateless HTTP
keeps no server budget (no per-call session is made up). Under either SDK major.

The 2026-07-28 protocol (mcp 2.x ``Client`` mode auto) builds a new server ``Connection`` per request: the server
keys the budget by what stays the same for one client (the in-process dispatcher pair, the stream's channel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.trace import SpanKind

from tests.helpers.support import Otel, named

from .sdk import SDK, Driver

TOKENS = "mcp_token.session.tokens"


def echo_server(sdk: Driver) -> Any:
    server = sdk.server("budget-test")

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


async def three_calls(session: Any) -> None:
    for i in range(3):
        await session.call_tool("echo", {"text": f"call {i} " * 50})


@pytest.mark.parametrize("mode", SDK.in_memory_modes)
def test_in_memory(otel: Otel, instrumented: Any, sdk: Driver, mode: str) -> None:
    async def main() -> None:
        with anyio.fail_after(30):
            async with sdk.connect(echo_server(sdk), mode) as client:
                await three_calls(client)

    anyio.run(main)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


@pytest.mark.parametrize("mode", SDK.stdio_modes)
@pytest.mark.slow
def test_stdio(otel: Otel, instrumented: Any, sdk: Driver, tmp_path: Path, mode: str) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {"MCP_TOKEN_TEST_INSTRUMENT": "1", "MCP_TOKEN_TEST_SPANS": str(spans_file)}

    async def main() -> None:
        with anyio.fail_after(30):
            async with sdk.stdio(env, mode) as client:
                for n in (100, 200, 300):
                    await client.call_tool("big", {"n": n})

    anyio.run(main)
    server_spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    values = [s["attributes"][TOKENS] for s in server_spans if s["name"] == "tools/call big"]
    assert_grows(values)


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
def test_http_transports(otel: Otel, instrumented: Any, sdk: Driver, transport: str) -> None:
    async def main() -> None:
        with anyio.fail_after(30):
            async with sdk.http(echo_server(sdk), transport) as session:
                await three_calls(session)

    anyio.run(main)
    assert_grows(session_tokens(otel, SpanKind.SERVER))
    assert_grows(session_tokens(otel, SpanKind.CLIENT))


def test_stateless_http_keeps_no_server_budget(otel: Otel, instrumented: Any, sdk: Driver) -> None:
    """Nothing ties two requests to one client, so the server keeps no budget; the client still has its own."""

    async def main() -> None:
        with anyio.fail_after(30):
            async with sdk.http(echo_server(sdk), "streamable-http", stateless=True) as session:
                await three_calls(session)

    anyio.run(main)
    assert session_tokens(otel, SpanKind.SERVER) == []
    assert_grows(session_tokens(otel, SpanKind.CLIENT))
    server_state = otel.metrics().get("mcp_token.sessions", [])
    assert all(p.value == 0 for p in server_state if p.attributes.get("mcp_token.side") == "server")

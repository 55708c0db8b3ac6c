"""mcp 2.x: one owner of the instrumentation state. ``mcp_token_otel.instrument()`` / ``uninstrument()`` and
``McpTokenInstrumentor().instrument()`` / ``.uninstrument()`` drive the same instance, in any order: after every
step the SDK is either hooked (a real in-memory call is measured) or restored exactly (it is not)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import IS_MCP_V2, Otel, make_config

if not IS_MCP_V2:
    pytest.skip("mcp 2.x only", allow_module_level=True)

import anyio
import mcp.client.stdio as client_stdio
import mcp.server.mcpserver.server as mcpserver_module
import mcp.server.stdio as server_stdio
import mcp.shared.jsonrpc_dispatcher as jrd
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.session import ServerSession

import mcp_token_otel
from mcp_token_otel.config import ConfigError
from mcp_token_otel.instrumentation import McpTokenInstrumentor

# Every attribute the 2.x adapter hooks, as its owner holds it.
HOOKED: list[tuple[Any, str]] = [
    (Server, "__init__"),
    (ClientSession, "__init__"),
    (StreamableHTTPTransport, "__init__"),
    (jrd, "otel_span"),
    (ServerSession, "send_request"),
    (Connection, "send_raw_request"),
    (client_stdio, "_create_platform_compatible_process"),
    (server_stdio, "stdio_server"),
    (mcpserver_module, "stdio_server"),
]
ORIGINAL = [vars(owner)[name] for owner, name in HOOKED]


@pytest.fixture(autouse=True)
def _left_uninstrumented() -> Iterator[None]:
    yield
    mcp_token_otel.uninstrument()
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry


def on(entry: str, otel: Otel) -> Any:
    providers = {"tracer_provider": otel.tracer_provider, "meter_provider": otel.meter_provider}
    if entry == "function":
        return mcp_token_otel.instrument(make_config(), **providers)
    return McpTokenInstrumentor().instrument(config=make_config(), **providers)


def off(entry: str) -> None:
    if entry == "function":
        mcp_token_otel.uninstrument()
    else:
        McpTokenInstrumentor().uninstrument()


def measured(otel: Otel) -> bool:
    """One real in-memory client call (JSON-RPC): whether its client and server spans carry our estimate."""
    server = MCPServer("order")

    @server.tool()
    def echo(text: str) -> str:
        return text * 40

    async def main() -> None:
        async with Client(server, mode="legacy") as client:
            result = await client.call_tool("echo", {"text": "abc"})
            assert result.content[0].text == "abc" * 40

    before = len(otel.spans())
    anyio.run(main)
    new = otel.spans()[before:]
    (client,) = [s for s in new if s.name == "MCP send tools/call echo"]
    (srv,) = [s for s in new if s.name == "tools/call echo"]
    sides = {"mcp_token.output_tokens" in client.attributes, "mcp_token.output_tokens" in srv.attributes}
    assert len(sides) == 1, "client and server disagree"
    return sides.pop()


def assert_hooked(otel: Otel) -> None:
    assert McpTokenInstrumentor().is_instrumented_by_opentelemetry
    assert McpTokenInstrumentor().recorder is not None
    now = [vars(owner)[name] for owner, name in HOOKED]
    assert all(a is not b for a, b in zip(now, ORIGINAL, strict=True))
    assert measured(otel)


def assert_restored(otel: Otel) -> None:
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
    assert McpTokenInstrumentor().recorder is None
    now = [vars(owner)[name] for owner, name in HOOKED]
    assert all(a is b for a, b in zip(now, ORIGINAL, strict=True)), [
        f"{getattr(o, '__name__', o)}.{n}" for (o, n), a, b in zip(HOOKED, now, ORIGINAL, strict=True) if a is not b
    ]
    assert not measured(otel)


def test_one_instance() -> None:
    assert McpTokenInstrumentor() is McpTokenInstrumentor()


@pytest.mark.parametrize(
    ("first", "second"), [("function", "function"), ("class", "function"), ("function", "class"), ("class", "class")]
)
def test_any_order_of_entry_points_is_consistent(otel: Otel, first: str, second: str) -> None:
    assert_restored(otel)
    recorder = on(first, otel)
    assert_hooked(otel)
    assert recorder is McpTokenInstrumentor().recorder
    off(second)
    assert_restored(otel)
    on(first, otel)  # hooked again (the class entry point used to think it still was)
    assert_hooked(otel)
    active = McpTokenInstrumentor().recorder
    on(second, otel)  # a no-op: nothing hooked twice, the same recorder
    assert McpTokenInstrumentor().recorder is active
    if second == "function":
        assert on(second, otel) is active
    assert_hooked(otel)
    off(first)
    assert_restored(otel)
    mcp_token_otel.uninstrument()  # a no-op
    assert_restored(otel)


def test_instrument_twice_measures_each_call_once(otel: Otel) -> None:
    first = mcp_token_otel.instrument(make_config(), tracer_provider=otel.tracer_provider,
                                      meter_provider=otel.meter_provider)
    McpTokenInstrumentor().instrument()
    assert mcp_token_otel.instrument() is first
    assert measured(otel)
    points = [p for p in otel.metrics()["mcp_token.message.tokens"]
              if p.attributes.get("gen_ai.tool.name") == "echo" and p.attributes["mcp_token.side"] == "client"]
    assert [(p.attributes["mcp_token.direction"], p.count) for p in points] == [("output", 1)]


def test_a_bad_configuration_is_logged_by_the_class_and_raised_by_the_function(
    otel: Otel, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setenv("MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW", "lots")
    assert McpTokenInstrumentor().instrument() is None
    assert "not instrumenting, bad configuration: config key 'budget.context_window'" in caplog.text
    assert_restored(otel)
    with pytest.raises(ConfigError, match=r"'budget\.context_window'"):
        mcp_token_otel.instrument()
    assert_restored(otel)
    monkeypatch.delenv("MCP_TOKEN_OTEL_BUDGET_CONTEXT_WINDOW")
    on("class", otel)  # nothing was counted as instrumented: a later call hooks the SDK
    assert_hooked(otel)


def test_a_failed_hook_is_not_counted_as_instrumented(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        patched.delattr(jrd, "otel_span")  # as if a release renamed the private hook
        assert on("class", otel) is None
        assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
        assert [vars(owner).get(name) for owner, name in HOOKED[:3]] == ORIGINAL[:3]  # undone
    on("class", otel)
    assert_hooked(otel)


def _output_tokens(otel: Otel) -> float:
    points = otel.metrics().get("mcp_token.tokens", [])
    wanted = {"mcp_token.direction": "output", "mcp_token.side": "server"}
    return sum(p.value for p in points if wanted.items() <= dict(p.attributes).items())


def test_instrumenting_again_on_the_same_meter_provider_reports_the_new_recorder(otel: Otel) -> None:
    """The SDK hands back an existing instrument for a name it has seen (and drops the new callbacks): the
    observable counters of a second instrument() on the same MeterProvider must report its calls, not the
    first recorder's frozen totals."""
    on("function", otel)
    assert measured(otel)
    one_call = _output_tokens(otel)
    assert one_call > 0
    off("function")
    gc.collect()  # the recorder is gone: its totals must not be
    assert not measured(otel)
    assert _output_tokens(otel) == one_call  # an uninstrumented recorder's totals stay, frozen
    on("class", otel)
    assert measured(otel) and measured(otel)
    assert _output_tokens(otel) == 2 * one_call  # the second recorder's two calls, the first one's replaced
    off("class")
    assert not measured(otel)
    assert _output_tokens(otel) == 2 * one_call

"""mcp 1.x: one owner of the instrumentation state, and hooks that leave other libraries' wrappers alone.

``mcp_token_otel.instrument()`` / ``uninstrument()`` and ``McpTokenInstrumentor().instrument()`` /
``.uninstrument()`` drive the same instance in any order: after every step the SDK is either hooked (a real
in-memory call is measured) or restored exactly (it is not). Another library's wrapt wrapper on an SDK function we
hook, added after ours or before it, survives our ``uninstrument()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import mcp.client.stdio as client_stdio
import mcp.server.fastmcp.server as fastmcp_server
import mcp.server.stdio as server_stdio
import mcp.shared.memory as shared_memory
import pytest
import wrapt
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.shared.session import BaseSession, RequestResponder
from opentelemetry.trace import SpanKind

import mcp_token_otel
from mcp_token_otel.instrumentation import McpTokenInstrumentor

from .conftest import Otel, make_config

# Every attribute the 1.x adapter hooks, as its owner holds it.
HOOKED: list[tuple[Any, str]] = [
    (BaseSession, "__init__"),
    (BaseSession, "__aexit__"),
    (BaseSession, "send_request"),
    (BaseSession, "send_notification"),
    (ClientSession, "_received_notification"),
    (ServerSession, "_received_notification"),
    (RequestResponder, "__init__"),
    (RequestResponder, "__enter__"),
    (RequestResponder, "__exit__"),
    (RequestResponder, "respond"),
    (Server, "_handle_request"),
    (StreamableHTTPTransport, "__init__"),
    (client_stdio, "_create_platform_compatible_process"),
    (StreamableHTTPServerTransport, "connect"),
    (SseServerTransport, "connect_sse"),
    (server_stdio, "stdio_server"),
    (fastmcp_server, "stdio_server"),
    (shared_memory, "create_client_server_memory_streams"),
]
ORIGINAL = [vars(owner)[name] for owner, name in HOOKED]
ORDERS = [("function", "function"), ("class", "function"), ("function", "class"), ("class", "class")]
# A method, a module function the SDK looks up at call time, and an __init__: each runs on every call below.
TARGETS = [(BaseSession, "send_request"), (shared_memory, "create_client_server_memory_streams"),
           (RequestResponder, "__init__")]
IDS = ["BaseSession.send_request", "memory.create_client_server_memory_streams", "RequestResponder.__init__"]


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
    """One real in-memory call: whether it was measured (mcp 1.x has no spans of its own: ours or none)."""
    server = FastMCP("order")

    @server.tool()
    def echo(text: str) -> str:
        return text * 40

    async def main() -> None:
        async with create_connected_server_and_client_session(server) as client:
            result = await client.call_tool("echo", {"text": "abc"})
            assert not result.isError

    before = len(otel.spans())
    anyio.run(main)
    new = [s for s in otel.spans()[before:] if s.name == "tools/call echo"]
    if not new:
        return False
    assert {s.kind for s in new} == {SpanKind.CLIENT, SpanKind.SERVER} and len(new) == 2
    assert all(s.attributes["mcp_token.output_tokens"] > 0 for s in new)
    return True


def assert_hooked(otel: Otel) -> None:
    assert McpTokenInstrumentor().is_instrumented_by_opentelemetry
    now = [vars(owner)[name] for owner, name in HOOKED]
    assert all(a is not b for a, b in zip(now, ORIGINAL, strict=True))
    assert measured(otel)


def assert_restored(otel: Otel) -> None:
    assert not McpTokenInstrumentor().is_instrumented_by_opentelemetry
    now = [vars(owner)[name] for owner, name in HOOKED]
    assert all(a is b for a, b in zip(now, ORIGINAL, strict=True)), [
        f"{getattr(o, '__name__', o)}.{n}" for (o, n), a, b in zip(HOOKED, now, ORIGINAL, strict=True) if a is not b
    ]
    assert not measured(otel)


@pytest.mark.parametrize(("first", "second"), ORDERS)
def test_any_order_of_entry_points_is_consistent(otel: Otel, first: str, second: str) -> None:
    assert_restored(otel)
    on(first, otel)
    assert_hooked(otel)
    off(second)
    assert_restored(otel)
    on(first, otel)
    assert_hooked(otel)
    active = McpTokenInstrumentor().recorder
    on(second, otel)  # a no-op
    assert McpTokenInstrumentor().recorder is active
    assert_hooked(otel)
    off(first)
    assert_restored(otel)


class Counting:
    """Another library's wrapt wrapper: counts the calls it sees."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        return wrapped(*args, **kwargs)


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_after_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    on("function", otel)
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    assert measured(otel) and counting.calls >= 1
    mcp_token_otel.uninstrument()
    assert vars(owner)[name] is theirs and theirs.__wrapped__ is original
    seen = counting.calls
    assert not measured(otel)
    assert counting.calls > seen
    wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original


@pytest.mark.parametrize(("owner", "name"), TARGETS, ids=IDS)
def test_a_wrapper_added_before_ours_survives_our_uninstrument(otel: Otel, owner: Any, name: str) -> None:
    original = vars(owner)[name]
    counting = Counting()
    theirs = wrapt.wrap_function_wrapper(owner, name, counting)
    try:
        on("class", otel)
        assert vars(owner)[name] is not theirs
        assert measured(otel) and counting.calls >= 1
        McpTokenInstrumentor().uninstrument()
        assert vars(owner)[name] is theirs
        seen = counting.calls
        assert not measured(otel)
        assert counting.calls > seen
    finally:
        wrapt.unwrap_object(owner, name, theirs)
    assert vars(owner)[name] is original

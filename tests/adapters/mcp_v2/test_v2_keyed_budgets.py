"""Budgets keyed by the conversation on mcp 2.x: real SDK clients and servers, in process and over streamable HTTP
on 127.0.0.1, on the 2026-07-28 protocol (no sessions) and on 2025-11-25 (stateful HTTP).

A client application sets a ``gen_ai.conversation.id`` baggage entry around its calls; the server-side budget then
accumulates across 20 calls of about 4 KB (context window 15,000), its exhaustion is counted once and the session
hard limit refuses from then on. Without any key the tokens count as unbudgeted; no series has ``server=""``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.client._memory import InMemoryTransport
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import Context, MCPServer
from opentelemetry import baggage, context

from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import fresh_otel_globals, scrape

from .conftest import Otel, make_config
from .test_v2_budgets import run_served

CONVERSATION = "conversation-42"
PAYLOAD = " ".join(f"line {i} of the report" for i in range(200))[:4000]  # ~4 KB
CALLS = 20
#: auto: 2026-07-28 (server/discover, no Mcp-Session-Id); legacy: 2025-11-25 with a stateful HTTP session.
PROTOCOLS = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def make_server() -> MCPServer:
    server = MCPServer("keyed-test")

    @server.tool()
    def fetch() -> str:
        return PAYLOAD

    return server


def ends(recorder: TokenRecorder, side: str, server: str = "keyed-test") -> float:
    """Session ends the recorder reported so far: each observes its final utilization once."""
    return scrape(recorder).value("mcp_token_session_utilization_ratio_count", side=side, server=server)


@contextlib.contextmanager
def keyed(otel: Otel, **budget: Any) -> Iterator[TokenRecorder]:
    """instrument() with a 15,000-token window and the server-side hard limit."""
    config = make_config(budget={"context_window": 15_000, **budget},
                         guard={"mode": "enforce", "session_hard_limit": True, "sides": ["server"]})
    recorder = instrument(config, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        yield recorder
    finally:
        uninstrument()


@contextlib.contextmanager
def conversation(value: str | None) -> Iterator[None]:
    """What an agent framework does around a conversation's calls (nothing when ``value`` is None)."""
    if value is None:
        yield
        return
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", value))
    try:
        yield
    finally:
        context.detach(token)


async def twenty_calls(client: Client, value: str | None) -> list[types.CallToolResult]:
    with conversation(value):
        return [await client.call_tool("fetch", {}) for _ in range(CALLS)]


def total(recorder: TokenRecorder, name: str, **labels: str) -> float:
    return scrape(recorder).value(name, **labels)


def assert_no_empty_server(recorder: TokenRecorder) -> None:
    """No traffic is counted under server="" (process-wide series at 0 may carry it: nothing to attribute)."""
    empty = {name for name, rows in scrape(recorder).samples.items()
             for labels, value in rows if labels.get("server") == "" and value}
    assert not empty, f"series with server=\"\": {sorted(empty)}"


def over_http(mode: str, value: str | None) -> list[types.CallToolResult]:
    results: list[types.CallToolResult] = []

    async def client(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode) as c:
            assert c.protocol_version == PROTOCOLS[mode]
            results.extend(await twenty_calls(c, value))

    run_served(make_server().streamable_http_app(), client)
    return results


def assert_only_discovery_unbudgeted(recorder: TokenRecorder) -> None:
    """The conversation's calls are all budgeted: only server/discover, sent as the client connects (outside the
    conversation), has no key."""
    discover = total(recorder, "mcp_token_tokens_total", side="server", method="server/discover")
    assert total(recorder, "mcp_token_unbudgeted_tokens_total", side="server") == discover


def assert_exhausted_once_and_refused(recorder: TokenRecorder, results: list[types.CallToolResult]) -> None:
    assert total(recorder, "mcp_token_session_transitions_total", side="server", state="exhausted") == 1
    refused = [r for r in results if r.is_error]
    assert refused and results[-1].is_error  # refused from exhaustion on, never before
    assert not any(r.is_error for r in results[: len(results) - len(refused)])
    assert total(recorder, "mcp_token_guard_actions_total", side="server", policy="session_limit",
                 action="refused") == len(refused)


@pytest.mark.parametrize("mode", list(PROTOCOLS))
def test_http_budget_follows_the_conversation(otel: Otel, mode: str) -> None:
    """The SDK's recording tracer puts the context's baggage in _meta; the server keys its budget by it (2026)
    or by the Mcp-Session-Id (2025-11-25, session first)."""
    with keyed(otel) as recorder:
        results = over_http(mode, CONVERSATION)
        assert_exhausted_once_and_refused(recorder, results)
        assert_only_discovery_unbudgeted(recorder)
        assert_no_empty_server(recorder)
    for span in otel.spans():
        attributes = dict(span.attributes or {})
        if attributes.get("mcp.method.name") in ("tools/call", "server/discover", "initialize"):
            assert attributes.get("mcp.protocol.version") == PROTOCOLS[mode], span.name
            assert ("mcp.session.id" in attributes) is (mode == "legacy"), span.name


def test_http_2026_without_a_key_counts_unbudgeted(otel: Otel) -> None:
    with keyed(otel) as recorder:
        results = over_http("auto", None)
        assert not any(r.is_error for r in results)  # no budget, so no hard limit
        assert total(recorder, "mcp_token_session_transitions_total", side="server", state="exhausted") == 0
        unbudgeted = total(recorder, "mcp_token_unbudgeted_tokens_total", side="server", server="keyed-test")
        counted = total(recorder, "mcp_token_tokens_total", side="server", server="keyed-test")
        assert unbudgeted == counted > CALLS * 1000
        assert sum(recorder.states()["server"].values()) == 0
        assert_no_empty_server(recorder)


def test_http_2026_propagate_without_a_recording_tracer(otel: Otel) -> None:
    """No global tracer provider (the SDK's spans do not record): budget.propagate carries the conversation."""
    with fresh_otel_globals(), keyed(otel, propagate=True) as recorder:
        results = over_http("auto", CONVERSATION)
        assert_exhausted_once_and_refused(recorder, results)
        assert_only_discovery_unbudgeted(recorder)
        assert_no_empty_server(recorder)


@pytest.mark.parametrize("propagate", [False, True])
def test_in_process_propagate_is_what_carries_the_conversation(otel: Otel, propagate: bool) -> None:
    """In process (auto mode) the SDK sends no baggage at all: keyed by the conversation alone, the server sees it
    only with budget.propagate, and nothing changes without it."""
    seen: list[Any] = []

    async def main() -> list[types.CallToolResult]:
        server = make_server()

        @server.tool()
        def meta_of(ctx: Context) -> str:
            seen.append((ctx.request_context.params or {}).get("_meta", {}).get("baggage"))
            return "ok"

        async with Client(server, mode="auto") as client:
            with conversation(CONVERSATION):
                await client.call_tool("meta_of", {})
            return await twenty_calls(client, CONVERSATION)

    with keyed(otel, key=["baggage:gen_ai.conversation.id"], propagate=propagate) as recorder:
        results = anyio.run(main)
        if propagate:
            assert seen == ["gen_ai.conversation.id=conversation-42"]
            assert_exhausted_once_and_refused(recorder, results)
            assert_only_discovery_unbudgeted(recorder)
        else:
            assert seen == [None]
            assert not any(r.is_error for r in results)
            assert total(recorder, "mcp_token_unbudgeted_tokens_total", side="server") > CALLS * 1000
        assert_no_empty_server(recorder)


@pytest.mark.parametrize("streams", [False, True], ids=["direct", "streams"])
def test_in_process_2026_session_ends_when_the_client_closes(otel: Otel, streams: bool) -> None:
    """The in-process pair's budget (or, over memory streams as over stdio, the stream's) ends as the client
    closes (reported at once), not when collected."""
    async def main() -> None:
        server = make_server()
        async with Client(InMemoryTransport(server) if streams else server, mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            await client.call_tool("fetch", {})
            await client.call_tool("fetch", {})
            assert ends(recorder, "server") == 0

    with keyed(otel) as recorder:
        anyio.run(main)
        assert ends(recorder, "server") == 1
        assert ends(recorder, "client") == 1
        assert sum(recorder.states()["server"].values()) == 0
        assert_no_empty_server(recorder)


def test_mcp_param_schema_lookup_is_not_traffic(otel: Otel) -> None:
    """A low-level Server over 2026 HTTP lists its tools itself to validate each call's Mcp-Param-* headers: those
    listings are not measured (counted, they would be 4 on the server against the client's 1)."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="search", input_schema=schema)])

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=PAYLOAD)])

    async def client(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp") as c:
            for _ in range(3):
                assert not (await c.call_tool("search", {"q": "x"})).is_error

    with keyed(otel) as recorder:
        server = Server("lowlevel-test", on_list_tools=list_tools, on_call_tool=call_tool)
        run_served(server.streamable_http_app(), client)
        for side in ("client", "server"):  # the client lists once itself; the server's own listings are not counted
            assert total(recorder, "mcp_token_message_tokens_count", side=side, method="tools/list") == 1
            assert total(recorder, "mcp_token_message_tokens_count", side=side, method="tools/call") == 3
        assert_no_empty_server(recorder)


def test_a_budget_with_no_close_ends_when_idle() -> None:
    """A conversation's budget ends after budget.idle_timeout without traffic, its utilization observed once,
    even when nothing else happens on its side (found at a metrics collection, reported at the next message)."""
    recorder = TokenRecorder(make_config(budget={"idle_timeout": 0.01}))

    def exchange(side: Any, method: str, params: dict[str, Any], key: str | None, server: str | None) -> None:
        call = recorder.begin(side, method, params, key, server=server)
        call.open()
        call.result({"content": []} if method == "tools/call" else {})
        call.close()

    # A whole call: a request's tokens go to its budget with its answer's, when the call ends.
    exchange("server", "tools/call", {"name": "fetch"}, "baggage:gen_ai.conversation.id=c1", "keyed-test")
    assert recorder.session_states()[("server", "keyed-test")]["ok"] == 1
    anyio.run(anyio.sleep, 0.05)
    assert recorder.session_states()[("server", "keyed-test")]["ok"] == 0  # gone from the gauge at collection
    assert ends(recorder, "server") == 0  # reported at the next message, not by the collection
    exchange("client", "ping", {}, None, None)
    assert ends(recorder, "server") == 1
    recorder.close()

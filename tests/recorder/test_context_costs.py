"""Context costs beyond each message: the tools/list split and static maxima, prompt-cache churn and wasted tokens.

The end-to-end cases run a real MCPServer and Client (mcp 2.x, in memory, one session) under instrument(); the
bookkeeping cases drive the recorder directly with wire dicts, as the adapters do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.catalog import DEFINITION_PARTS
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.profiles import profile_tool_definition, tool_definition_tokens
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.store.memory import MAX_RECENT
from tests.helpers.calls import exchange
from tests.helpers.support import scrape

SEARCH = {
    "name": "search",
    "description": "Search the index and return matching documents.",
    "inputSchema": {"type": "object", "properties": {"limit": {"type": "integer", "maximum": 20}},
                    "required": ["limit"]},
    "outputSchema": {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "string"}, "title": {"type": "string"}}}}}},
}
READ = {"name": "read_file", "description": "Read a whole file.",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "outputSchema": {"type": "object", "properties": {"content": {"type": "string"}}}}


def samples(recorder: TokenRecorder, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A family's samples on /metrics: sorted label pairs -> value."""
    return {tuple(sorted(labels.items())): value for labels, value in scrape(recorder).pick(name)}


@pytest.fixture
def recorded(request: pytest.FixtureRequest) -> Iterator[TokenRecorder]:
    window = getattr(request, "param", 60)
    recorder = TokenRecorder(config_from_dict({"metrics": {"repeat_window": window}}), TracerProvider(),
                             MeterProvider(), server_name="srv")
    yield recorder
    recorder.close()


def listed(recorder: TokenRecorder, tools: list[dict[str, Any]], session: str | None = "s1", **extra: Any) -> None:
    exchange(recorder, "client", "tools/list", {}, session, result={"tools": tools, **extra})


def call(recorder: TokenRecorder, tool: str, arguments: dict[str, Any], result: dict[str, Any],
         session: str = "s1") -> int:
    """One tools/call; its result's tokens."""
    _, m = exchange(recorder, "client", "tools/call", {"name": tool, "arguments": arguments}, session, result=result)
    assert m is not None
    return m.total_tokens


def text(body: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": body}]}


# ---------------------------------------------------------------------------------------------------------
# tools/list: the split and the static maxima


def test_definition_parts_add_up_to_the_total_and_only_bounded_tools_get_a_static_maximum(recorded: Any) -> None:
    recorder = recorded
    listed(recorder, [SEARCH, READ])
    total = samples(recorder, "mcp_token_tool_definitions_tokens")[(("server", "srv"),)]
    assert total == tool_definition_tokens(SEARCH) + tool_definition_tokens(READ)
    parts = {dict(k)["part"]: v for k, v in samples(recorder, "mcp_token_tool_definitions_part_tokens").items()}
    assert set(parts) == set(DEFINITION_PARTS) and sum(parts.values()) == total
    assert parts["schema"] > parts["description"] > 0
    static = samples(recorder, "mcp_token_tool_static_max_tokens")
    search = profile_tool_definition(SEARCH)
    assert search.bounded and profile_tool_definition(READ).bounded is False
    assert static == {(("server", "srv"), ("tool", "search")): search.max_tokens}


# ---------------------------------------------------------------------------------------------------------
# Prompt-cache churn


def test_a_changed_or_reordered_tool_list_in_a_session_is_counted_with_the_new_lists_tokens(recorded: Any) -> None:
    recorder = recorded
    key = (("server", "srv"), ("side", "client"))
    listed(recorder, [SEARCH, READ])
    listed(recorder, [SEARCH, READ])  # the same list again: the cache holds
    assert samples(recorder, "mcp_token_prompt_cache_invalidations_total")[key] == 0
    listed(recorder, [READ, SEARCH])  # the same tools in another order: the prefix changed
    changed = {**READ, "description": "Read a whole file, at most 1 MB."}
    listed(recorder, [SEARCH, changed])
    listed(recorder, [SEARCH, changed], session="s2")  # another session's first list: nothing to compare
    assert samples(recorder, "mcp_token_prompt_cache_invalidations_total")[key] == 2
    resent = tool_definition_tokens(READ) + tool_definition_tokens(SEARCH)
    resent += tool_definition_tokens(SEARCH) + tool_definition_tokens(changed)
    assert samples(recorder, "mcp_token_prompt_cache_resent_tokens_total")[key] == resent


def test_later_pages_of_one_listing_are_not_a_change_and_the_state_ends_with_the_session(recorded: Any) -> None:
    recorder = recorded
    key = (("server", "srv"), ("side", "client"))
    listed(recorder, [SEARCH], nextCursor="2")
    listed(recorder, [READ])  # page 2 of the same listing
    listed(recorder, [SEARCH], nextCursor="2")  # listed again, the same first page
    listed(recorder, [READ])
    assert samples(recorder, "mcp_token_prompt_cache_invalidations_total")[key] == 0
    recorder.end_session("client", "s1")
    listed(recorder, [READ, SEARCH])  # the same key again is a new session: its first list
    assert samples(recorder, "mcp_token_prompt_cache_invalidations_total")[key] == 0


# ---------------------------------------------------------------------------------------------------------
# Wasted tokens


def wasted(recorder: TokenRecorder, tool: str, kind: str) -> float:
    key = (("kind", kind), ("server", "srv"), ("side", "client"), ("tool", tool))
    return samples(recorder, "mcp_token_wasted_tokens_total").get(key, 0.0)


def test_the_same_call_again_in_a_session_counts_its_output_as_repeated(recorded: Any) -> None:
    recorder = recorded
    call(recorder, "read_file", {"path": "a", "lines": [1, 2]}, text("x " * 400))
    call(recorder, "read_file", {"path": "b"}, text("y " * 400))
    call(recorder, "read_file", {"path": "a"}, text("z " * 400), session="s2")  # another session
    assert wasted(recorder, "read_file", "repeated") == 0
    # The same arguments, keys in another order: the same call.
    again = call(recorder, "read_file", {"lines": [1, 2], "path": "a"}, text("x " * 500))
    assert wasted(recorder, "read_file", "repeated") == again
    third = call(recorder, "read_file", {"path": "a", "lines": [1, 2]}, text("x " * 100))
    assert wasted(recorder, "read_file", "repeated") == again + third


@pytest.mark.parametrize("recorded", [0], indirect=True)
def test_a_zero_window_turns_repeats_off(recorded: Any) -> None:
    recorder = recorded
    for _ in range(3):
        call(recorder, "read_file", {"path": "a"}, text("x " * 100))
    assert wasted(recorder, "read_file", "repeated") == 0


def test_recent_calls_are_bounded_per_session_oldest_first(recorded: Any) -> None:
    recorder = recorded
    for i in range(MAX_RECENT + 1):  # the first digest is dropped to make room
        call(recorder, "read_file", {"path": str(i)}, text("x"))
    # The recent call digests are kept beside the budget, in the budget store (this process's memory here).
    digests = recorder._ledger.store._digests[("client", "s1")]
    assert len(digests.recent) == MAX_RECENT
    call(recorder, "read_file", {"path": "0"}, text("x"))
    assert wasted(recorder, "read_file", "repeated") == 0
    repeated = call(recorder, "read_file", {"path": str(MAX_RECENT)}, text("x"))
    assert wasted(recorder, "read_file", "repeated") == repeated


def test_structured_content_repeating_the_text_counts_as_duplicated(recorded: Any) -> None:
    recorder = recorded
    data = {"id": 7, "name": "Ada", "roles": ["reader", "writer"]}
    result = {"content": [{"type": "text", "text": json.dumps(data)}], "structuredContent": data}
    call(recorder, "lookup_user", {"id": 7}, result)
    _, m = exchange(recorder, "server", "tools/call", {"name": "x"}, None, result=result)  # the measurement's own
    assert m is not None
    duplicate = next(b.overhead_tokens for b in m.blocks if b.type == "structuredContent")
    assert duplicate > 0 and wasted(recorder, "lookup_user", "duplicated") == duplicate
    distinct = {"content": [{"type": "text", "text": "Ada, reader"}], "structuredContent": data}
    call(recorder, "lookup_user", {"id": 8}, distinct)
    assert wasted(recorder, "lookup_user", "duplicated") == duplicate


# ---------------------------------------------------------------------------------------------------------
# A real SDK session


def build_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("costs-demo", log_level="WARNING")

    @server.tool()
    def search_docs(query: str) -> str:
        """Search the docs (MCPServer repeats a str result as structuredContent)."""
        return json.dumps([{"title": f"{query} {i}", "url": f"https://docs.example/{i}"} for i in range(20)])

    return server


async def session(server: Any) -> None:
    from mcp import Client

    async with Client(server, mode="legacy") as client:
        await client.list_tools()
        await client.call_tool("search_docs", {"query": "budget"})
        await client.call_tool("search_docs", {"query": "budget"})
        await client.call_tool("search_docs", {"query": "window"})

        def archive(table: str) -> str:
            """Archive a table."""
            return table

        server.add_tool(archive)  # the server's tools change mid-session; the agent lists them again
        await client.list_tools()


def test_a_real_session_counts_repeats_duplicates_and_a_tool_list_change() -> None:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    recorder = instrument(config_from_dict({"prometheus": {"enabled": False}}), tracer_provider=TracerProvider(),
                          meter_provider=MeterProvider())
    assert recorder is not None
    try:
        anyio.run(session, build_server())
    finally:
        uninstrument()
    out = samples(recorder, "mcp_token_wasted_tokens_total")
    for side in ("client", "server"):
        by_kind = {dict(k)["kind"]: v for k, v in out.items() if dict(k)["side"] == side}
        assert by_kind["repeated"] > 0, out  # the second identical search_docs
        assert by_kind["duplicated"] > by_kind["repeated"], out  # every one of the three calls repeats its text
        invalidations = samples(recorder, "mcp_token_prompt_cache_invalidations_total")
        changes = {dict(k)["server"]: v for k, v in invalidations.items() if dict(k)["side"] == side and v}
        assert changes == {"costs-demo": 1}, changes

"""mcp 2.x with the spill on (guard.spill): a 150,000-token file read through a filesystem-shaped low-level Server
with a 5,000-token cap, with the SDK's own client, in process (2026-07-28 "auto" and 2025-11-25 "legacy"), over
streamable HTTP on 127.0.0.1 (a stateful session; the 2026 protocol keyed by the conversation's baggage) and over
stdio with a real server process.

The cut result carries the link after the notice; ``read_resource`` of every page in order gives back the file
byte for byte; another conversation is told not_found (-32602); past the TTL, expired; the server, which declares
no resources, is given the capability and empty listings; a client that ignores the link still has a valid cut
result and notice.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from opentelemetry import baggage, context

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.spill import META_SPILL_KEY, is_spill_uri
from mcp_token_otel.instrumentation import instrument, uninstrument
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.spill_support import source_file
from tests.helpers.support import ROOT, scrape

from .conftest import Otel
from .test_v2_budgets import run_served

CAP = 5000
GUARD = {"mode": "enforce", "max_response_tokens": CAP, "spill": True, "sides": ["server"]}
READ_FILE = types.Tool(
    name="read_file", description="Read the complete contents of a file as text.",
    input_schema={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    output_schema={"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]},
)
FS_SERVER = ROOT / "tests" / "fixtures" / "filesystem_server.py"


def the_file() -> str:
    return source_file(150_000)


def make_server() -> Server[Any]:
    """A low-level server shaped like the filesystem server (the file as JSON text and structuredContent), with
    no resources of its own."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[READ_FILE])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = {"content": the_file()}
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result))],
                                    structured_content=result)

    return Server("spill-fs", on_list_tools=list_tools, on_call_tool=call_tool)


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def spilling(otel: Otel, **guard: Any) -> Iterator[TokenRecorder]:
    recorder = instrument(config_from_dict({"guard": {**GUARD, **guard}}), tracer_provider=otel.tracer_provider,
                          meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        yield recorder
    finally:
        uninstrument()


@contextlib.contextmanager
def conversation(value: str | None) -> Iterator[None]:
    if value is None:
        yield
        return
    token = context.attach(baggage.set_baggage("gen_ai.conversation.id", value))
    try:
        yield
    finally:
        context.detach(token)


async def cut_and_link(client: Client) -> tuple[types.CallToolResult, types.ResourceLink]:
    await client.list_tools()
    result = await client.call_tool("read_file", {"path": "/big.py"})
    link = result.content[-1]
    assert isinstance(link, types.ResourceLink) and is_spill_uri(str(link.uri))
    notice = result.content[-2]
    # A client that ignores the link still has a valid cut result: the text shown and the notice.
    assert isinstance(notice, types.TextContent) and str(link.uri) in notice.text
    assert f"pages of up to {CAP:,} tokens" in notice.text and "response truncated" in notice.text
    assert link.size == len(the_file().encode()) and link.meta is not None
    assert link.meta[META_SPILL_KEY]["tokens"] >= 100_000
    return result, link


async def read_every_page(client: Client, uri: str) -> tuple[str, int]:
    """Each page in order from ``uri``, following ``_meta``'s next: the joined text and the page count."""
    texts: list[str] = []
    pages = 0
    next_uri: str | None = uri
    while next_uri is not None:
        page = await client.read_resource(next_uri)
        meta = (page.meta or {})[META_SPILL_KEY]
        pages += 1
        assert meta["page"] == pages and meta["tokens"] <= CAP
        for item in page.contents:
            assert isinstance(item, types.TextResourceContents)
            texts.append(item.text)
        next_uri = meta.get("next")
        assert pages <= meta["pages"]
    return "".join(texts), pages


async def not_found(client: Client, uri: str) -> dict[str, Any]:
    with pytest.raises(MCPError) as refused:
        await client.read_resource(uri)
    assert refused.value.code == -32602
    data = refused.value.data
    assert isinstance(data, dict)
    return data


def run(script: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        with anyio.fail_after(120):
            return await script()

    return anyio.run(main)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_in_process_the_file_reads_back_whole_and_stays_private(otel: Otel, mode: str) -> None:
    with spilling(otel, spill_ttl=120) as recorder:
        server = make_server()
        clock = Clock()
        recorder.guard.clock = clock

        async def script() -> None:
            async with Client(server, mode=mode) as client:
                caps = client.server_capabilities
                assert caps is not None and caps.resources is not None  # added: the server declared none
                assert (await client.list_resources()).resources == []
                assert (await client.list_resource_templates()).resource_templates == []
                _, link = await cut_and_link(client)
                text, pages = await read_every_page(client, str(link.uri))
                assert text.encode() == the_file().encode()
                assert pages == link.meta[META_SPILL_KEY]["pages"] >= 30  # type: ignore[index]
                async with Client(server, mode=mode) as other:  # another conversation
                    assert (await not_found(other, str(link.uri)))["reason"] == "not_found"
                assert (await not_found(client, str(link.uri) + "?page=999"))["reason"] == "page_out_of_range"
                clock.now += 121
                gone = await not_found(client, str(link.uri))
                assert gone["reason"] == "expired" and gone["cause"] == "ttl"

        run(script)
        m = scrape(recorder)
        base = {"side": "server", "server": "spill-fs", "tool": "read_file"}
        assert m.value("mcp_token_spill_reads_total", **base, outcome="served") >= 30
        assert m.value("mcp_token_spill_reads_total", **base, outcome="forbidden") == 1
        assert m.value("mcp_token_spill_reads_total", **base, outcome="expired") == 1
        assert m.value("mcp_token_spilled_tokens_total", **base) == m.value("mcp_token_spill_read_tokens_total",
                                                                             **base)


def test_both_sides_guarding_cut_once_and_read_back(otel: Otel) -> None:
    """The client side guards too (guard.sides: every side): it keeps nothing, does not cut the cut result again
    (the notice and the link are not the tool's data), and its reads go to the server, which answers them."""
    with spilling(otel, sides=["client", "server"]) as recorder:
        server = make_server()

        async def script() -> None:
            async with Client(server, mode="legacy") as client:
                result, link = await cut_and_link(client)
                assert sum(isinstance(b, types.ResourceLink) for b in result.content) == 1
                assert sum("response truncated" in getattr(b, "text", "") for b in result.content) == 1
                text, _ = await read_every_page(client, str(link.uri))
                assert text == the_file()

        run(script)
        m = scrape(recorder)
        assert m.value("mcp_token_guard_actions_total", side="client", policy="response_cap") == 0
        assert m.value("mcp_token_spill_reads_total", side="client") == 0
        assert m.value("mcp_token_spill_reads_total", side="server", outcome="served") >= 30


def test_streamable_http_session(otel: Otel) -> None:
    with spilling(otel):
        async def client(port: int) -> None:
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(url, mode="legacy") as c:
                _, link = await cut_and_link(c)
                text, _ = await read_every_page(c, str(link.uri))
                assert text == the_file()
                assert (await c.list_resources()).resources == []
                async with Client(url, mode="legacy") as other:  # another Mcp-Session-Id
                    assert (await not_found(other, str(link.uri)))["reason"] == "not_found"

        run_served(make_server().streamable_http_app(), client)


def test_streamable_http_2026_keyed_by_the_conversation(otel: Otel) -> None:
    """No sessions on 2026-07-28: the conversation's baggage (in _meta) owns the kept result."""
    with spilling(otel):
        async def client(port: int) -> None:
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(url, mode="auto") as c:
                assert c.protocol_version == "2026-07-28"
                with conversation("conversation-a"):
                    _, link = await cut_and_link(c)
                    text, _ = await read_every_page(c, str(link.uri))
                assert text == the_file()
                with conversation("conversation-b"):
                    assert (await not_found(c, str(link.uri)))["reason"] == "not_found"
                assert (await not_found(c, str(link.uri)))["reason"] == "not_found"  # no conversation at all

        run_served(make_server().streamable_http_app(), client)


@pytest.mark.slow
def test_stdio_server_process_and_its_ttl(tmp_path: Path) -> None:
    """The filesystem-shaped test server in its own process, instrumented by its configuration file: the file read
    back whole, and expired once its TTL (1 s) passed without a read."""
    big = tmp_path / "big.py"
    big.write_text(the_file(), encoding="utf-8", newline="")
    config = tmp_path / "mcp-token-otel.yaml"
    config.write_text(json.dumps({"guard": {**GUARD, "spill_ttl": 1}}))
    runner = ("import runpy, sys; from mcp_token_otel.instrumentation import instrument; instrument(); "
              f"sys.argv = [{str(FS_SERVER)!r}]; runpy.run_path({str(FS_SERVER)!r}, run_name='__main__')")
    env = {**os.environ, "MCP_TOKEN_OTEL_CONFIG": str(config),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    params = StdioServerParameters(command=sys.executable, args=["-c", runner], env=env)

    async def script() -> None:
        async with Client(params, mode="legacy") as client:
            caps = client.server_capabilities
            assert caps is not None and caps.resources is not None
            result = await client.call_tool("read_file", {"path": str(big)})
            link = result.content[-1]
            assert isinstance(link, types.ResourceLink)
            text, _ = await read_every_page(client, str(link.uri))
            # What the tool answered, byte for byte (it reads the file with universal newlines).
            assert text.encode() == big.read_text(encoding="utf-8").encode()
            await anyio.sleep(1.5)
            gone = await not_found(client, str(link.uri))
            assert gone["reason"] == "expired"

    run(script)

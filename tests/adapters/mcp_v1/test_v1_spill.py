"""mcp 1.x with the spill on (guard.spill): a 150,000-token file read through FastMCP with a 5,000-token cap and the
SDK's own ClientSession, in memory and over stateful streamable HTTP on 127.0.0.1.

Every page read in order gives back the file byte for byte; another session is told not_found (-32602); past the
TTL, expired; a low-level server that declares no resources is given the capability and empty listings, while
FastMCP (which declares them) answers its own listings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session

from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.spill import META_SPILL_KEY, is_spill_uri
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.spill_support import source_file
from tests.helpers.support import scrape

from .conftest import Otel, free_port, streamable_http_client

CAP = 5000
GUARD = {"mode": "enforce", "max_response_tokens": CAP, "spill": True, "sides": ["server"]}


def the_file() -> str:
    return source_file(150_000)


def fastmcp(port: int = 8000) -> FastMCP:
    server = FastMCP("spill-fs", port=port)

    @server.tool()
    def read_file(path: str) -> dict[str, str]:
        """Read the complete contents of a file as text."""
        return {"content": the_file()}

    return server


def lowlevel() -> Server[Any, Any]:
    """A server with tools and no resources: the capability is added for it."""
    server: Server[Any, Any] = Server("bare-fs")

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [types.Tool(name="read_file", inputSchema={"type": "object"})]

    @server.call_tool()
    async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
        return [types.TextContent(type="text", text=the_file())]

    return server


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@contextmanager
def spilling(otel: Otel) -> Iterator[TokenRecorder]:
    from mcp_token_otel.instrumentation import instrument, uninstrument

    recorder = instrument(config_from_dict({"guard": GUARD}), tracer_provider=otel.tracer_provider,
                          meter_provider=otel.meter_provider)
    assert recorder is not None
    try:
        yield recorder
    finally:
        uninstrument()


async def cut_link(session: ClientSession) -> str:
    await session.list_tools()
    result = await session.call_tool("read_file", {"path": "/big.py"})
    link, notice = result.content[-1], result.content[-2]
    assert isinstance(link, types.ResourceLink) and is_spill_uri(str(link.uri))
    assert isinstance(notice, types.TextContent) and str(link.uri) in notice.text
    assert f"pages of up to {CAP:,} tokens" in notice.text
    assert link.size == len(the_file().encode())
    return str(link.uri)


async def read_every_page(session: ClientSession, uri: str) -> str:
    texts: list[str] = []
    next_uri: str | None = uri
    pages = 0
    while next_uri is not None:
        page = await session.read_resource(next_uri)  # type: ignore[arg-type]
        meta = (page.meta or {})[META_SPILL_KEY]
        pages += 1
        assert meta["page"] == pages and meta["tokens"] <= CAP
        for item in page.contents:
            assert isinstance(item, types.TextResourceContents)
            texts.append(item.text)
        next_uri = meta.get("next")
        assert pages <= meta["pages"]
    assert pages >= 30
    return "".join(texts)


async def refused(session: ClientSession, uri: str) -> dict[str, Any]:
    with pytest.raises(McpError) as error:
        await session.read_resource(uri)  # type: ignore[arg-type]
    assert error.value.error.code == -32602
    data = error.value.error.data
    assert isinstance(data, dict)
    return data


def test_in_memory_with_fastmcp(otel: Otel) -> None:
    with spilling(otel) as recorder:
        clock = Clock()
        recorder.guard.clock = clock
        server = fastmcp()

        async def main() -> None:
            with anyio.fail_after(120):
                async with create_connected_server_and_client_session(server) as session:
                    uri = await cut_link(session)
                    assert (await read_every_page(session, uri)).encode() == the_file().encode()
                    async with create_connected_server_and_client_session(server) as other:
                        assert (await refused(other, uri))["reason"] == "not_found"
                    assert (await refused(session, uri + "?page=0"))["reason"] == "page_out_of_range"
                    assert (await refused(session, "mcp-token-otel://spill/nope"))["reason"] == "malformed"
                    # FastMCP declares resources itself: its own listing answers (empty: it has none).
                    assert (await session.list_resources()).resources == []
                    clock.now += 301
                    gone = await refused(session, uri)
                    assert gone["reason"] == "expired" and gone["cause"] == "ttl"

        anyio.run(main)
        m = scrape(recorder)
        base = {"side": "server", "server": "spill-fs", "tool": "read_file"}
        assert m.value("mcp_token_spill_reads_total", **base, outcome="served") >= 30
        assert m.value("mcp_token_spill_reads_total", **base, outcome="forbidden") == 1
        assert m.value("mcp_token_spill_reads_total", **base, outcome="expired") == 1


def test_the_capability_and_listings_for_a_server_without_resources(otel: Otel) -> None:
    with spilling(otel):
        server = lowlevel()

        async def main() -> None:
            with anyio.fail_after(60):
                async with create_connected_server_and_client_session(server) as session:
                    init = await session.initialize()
                    assert init.capabilities.resources is not None
                    assert (await session.list_resources()).resources == []
                    assert (await session.list_resource_templates()).resourceTemplates == []
                    result = await session.call_tool("read_file", {})
                    link = result.content[-1]
                    assert isinstance(link, types.ResourceLink)
                    assert await read_every_page(session, str(link.uri)) == the_file()

        anyio.run(main)


def test_streamable_http_sessions(otel: Otel) -> None:
    from .test_v1_transports import serve

    port = free_port()
    with spilling(otel):
        app = fastmcp(port).streamable_http_app()

        async def main() -> None:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    server = await serve(tg, app, port)
                    try:
                        url = f"http://127.0.0.1:{port}/mcp"
                        async with (streamable_http_client(url) as (read, write, _),
                                    ClientSession(read, write) as session):
                            await session.initialize()
                            uri = await cut_link(session)
                            assert await read_every_page(session, uri) == the_file()
                            async with (streamable_http_client(url) as (read2, write2, _),
                                        ClientSession(read2, write2) as other):
                                await other.initialize()
                                assert (await refused(other, uri))["reason"] == "not_found"
                    finally:
                        server.should_exit = True

        anyio.run(main)

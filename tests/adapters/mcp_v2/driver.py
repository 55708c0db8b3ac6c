"""The mcp 2.x driver of the shared scenarios (tests/adapters/scenarios/sdk.py says what a driver is)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import mcp.client.stdio as client_stdio
import mcp.server.mcpserver.server as mcpserver_module
import mcp.server.stdio as server_stdio
import mcp.shared.jsonrpc_dispatcher as jrd
from mcp import Client, types
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import StreamableHTTPTransport, streamable_http_client
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from tests.adapters.scenarios.sdk import serving

STDIO_SERVER = Path(__file__).parent / "servers" / "stdio_server.py"

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


class McpV2:
    major = 2
    in_memory_modes = ("auto", "legacy")
    jsonrpc_mode = "legacy"
    stdio_modes = ("legacy", "auto")
    error_type = MCPError
    hooked = HOOKED

    def server(self, name: str) -> MCPServer:
        return MCPServer(name)

    def connect(self, server: Any, mode: str) -> AbstractAsyncContextManager[Any]:
        return Client(server, mode=mode)

    @contextlib.asynccontextmanager
    async def stdio(self, env: dict[str, str], mode: str, script: Path | None = None) -> AsyncIterator[Any]:
        params = StdioServerParameters(command=sys.executable, args=[str(script or STDIO_SERVER)], env=env)
        async with Client(stdio_client(params), mode=mode) as client:
            yield client

    @contextlib.asynccontextmanager
    async def http(self, server: Any, transport: str, stateless: bool = False) -> AsyncIterator[Any]:
        if transport == "sse":
            app = server.sse_app()
        else:
            app = server.streamable_http_app(stateless_http=True) if stateless else server.streamable_http_app()
        async with serving(app) as port:
            if transport == "sse":
                async with sse_client(f"http://127.0.0.1:{port}/sse") as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
            elif stateless:
                async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                    yield client
            else:
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

    def rpc_error(self, code: int, message: str, data: Any = None) -> Exception:
        return MCPError(code=code, message=message, data=data)

    def own_spans(self, mode: str) -> bool:
        return mode == "auto"  # in process, direct: the SDK opens no client span

    async def unknown_request(self, session: Any, method: str) -> Any:
        target = session.session if isinstance(session, Client) else session  # a Client or a ClientSession
        return await target.send_request(types.Request(method=method, params=None), types.EmptyResult)

    def is_error(self, result: Any) -> bool:
        return bool(result.is_error)

    def text(self, result: Any) -> str:
        return str(result.content[0].text)

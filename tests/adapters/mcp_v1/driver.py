"""The mcp 1.x driver of the shared scenarios (tests/adapters/scenarios/sdk.py says what a driver is)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp.client.stdio as client_stdio
import mcp.server.fastmcp.server as fastmcp_server
import mcp.server.stdio as server_stdio
import mcp.shared.memory as shared_memory
from mcp import ClientSession, types
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.shared.session import BaseSession, RequestResponder
from mcp.types import ErrorData

from tests.adapters.scenarios.sdk import serving

# The streamable HTTP client was named streamablehttp_client before mcp 1.24 (kept as an alias since).
try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client  # type: ignore[no-redef]

STDIO_SERVER = Path(__file__).parent / "servers" / "stdio_server.py"

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


class McpV1:
    major = 1
    in_memory_modes = ("memory",)
    jsonrpc_mode = "memory"
    stdio_modes = ("stdio",)
    error_type = McpError
    hooked = HOOKED

    def server(self, name: str) -> FastMCP:
        return FastMCP(name)

    @contextlib.asynccontextmanager
    async def connect(self, server: Any, mode: str) -> AsyncIterator[ClientSession]:
        async with create_connected_server_and_client_session(server._mcp_server) as session:
            yield session

    @contextlib.asynccontextmanager
    async def stdio(
        self, env: dict[str, str], mode: str, script: Path | None = None
    ) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(command=sys.executable, args=[str(script or STDIO_SERVER)], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    @contextlib.asynccontextmanager
    async def http(self, server: Any, transport: str, stateless: bool = False) -> AsyncIterator[ClientSession]:
        server.settings.stateless_http = stateless  # FastMCP reads it when it builds the app
        app = server.sse_app() if transport == "sse" else server.streamable_http_app()
        async with serving(app) as port:
            if transport == "sse":
                async with sse_client(f"http://127.0.0.1:{port}/sse") as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
            else:
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

    def rpc_error(self, code: int, message: str, data: Any = None) -> Exception:
        return McpError(ErrorData(code=code, message=message, data=data))

    def own_spans(self, mode: str) -> bool:
        return True  # mcp 1.x opens no spans

    async def unknown_request(self, session: Any, method: str) -> Any:
        unknown = types.PingRequest.model_construct(method=method, params=None)  # skips the Literal check
        return await session.send_request(types.ClientRequest(unknown), types.EmptyResult)

    def is_error(self, result: Any) -> bool:
        return bool(result.isError)

    def text(self, result: Any) -> str:
        return str(result.content[0].text)

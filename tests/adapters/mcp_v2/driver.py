"""The mcp 2.x driver of the shared scenarios (tests/adapters/scenarios/sdk.py says what a driver is)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from tests.adapters.scenarios.sdk import serving

STDIO_SERVER = Path(__file__).parent / "servers" / "stdio_server.py"


class McpV2:
    major = 2
    in_memory_modes = ("auto", "legacy")
    jsonrpc_mode = "legacy"
    stdio_modes = ("legacy", "auto")

    def server(self, name: str) -> MCPServer:
        return MCPServer(name)

    def connect(self, server: Any, mode: str) -> AbstractAsyncContextManager[Any]:
        return Client(server, mode=mode)

    @contextlib.asynccontextmanager
    async def stdio(self, env: dict[str, str], mode: str) -> AsyncIterator[Any]:
        params = StdioServerParameters(command=sys.executable, args=[str(STDIO_SERVER)], env=env)
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

    def rpc_error(self, code: int, message: str) -> Exception:
        return MCPError(code=code, message=message)

    def is_error(self, result: Any) -> bool:
        return bool(result.is_error)

    def text(self, result: Any) -> str:
        return str(result.content[0].text)

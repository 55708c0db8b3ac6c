"""The installed SDK major's driver for the shared scenarios, and what every driver uses.

A scenario test asks the ``sdk`` fixture (tests/adapters/scenarios/conftest.py) for a server and a session and
never imports the SDK itself, so one module runs under mcp 2.x (``.venv``) and under mcp 1.x (``.venv-mcp1``).
Each major's driver is beside its own suite: tests/adapters/mcp_v2/driver.py, tests/adapters/mcp_v1/driver.py.
Parametrize over what the installed SDK offers with the module constant ``SDK`` (``SDK.in_memory_modes``).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import anyio
import uvicorn

from tests.helpers.support import free_port

#: Feature detection, as instrument() does it: the dispatcher package exists only in mcp 2.x.
IS_MCP_V2 = importlib.util.find_spec("mcp.shared.dispatcher") is not None


class Driver(Protocol):
    """What the shared scenarios need of an SDK. A session is the SDK's own client object (``call_tool``,
    ``list_tools``, ``read_resource``), opened and initialized."""

    #: The SDK major, 1 or 2.
    major: int
    #: The in-memory client modes: mcp 2.x ``Client(server)`` "auto" (direct) and "legacy" (JSON-RPC over memory
    #: streams); mcp 1.x its one in-memory session pair, "memory".
    in_memory_modes: tuple[str, ...]
    #: The in-memory mode that speaks JSON-RPC, as a real transport does.
    jsonrpc_mode: str
    #: The client modes over stdio (mcp 2.x: "legacy", "auto"; mcp 1.x: "stdio").
    stdio_modes: tuple[str, ...]
    #: The SDK's exception for a JSON-RPC error answer (mcp 2.x ``MCPError``, mcp 1.x ``McpError``); both hold the
    #: answer's ``ErrorData`` as ``.error``.
    error_type: type[Exception]
    #: Every SDK attribute the adapter hooks, as (owner, name): ``vars(owner)[name]`` is the hook while instrumented.
    hooked: list[tuple[Any, str]]

    def server(self, name: str) -> Any:
        """A high-level server (MCPServer, FastMCP) named ``name``: add tools with ``@server.tool()``."""

    def connect(self, server: Any, mode: str) -> AbstractAsyncContextManager[Any]:
        """A session with ``server`` in this process, in one of ``in_memory_modes``."""

    def stdio(self, env: dict[str, str], mode: str, script: Path | None = None) -> AbstractAsyncContextManager[Any]:
        """A session with the suite's stdio test server (servers/stdio_server.py: tools ``big`` and ``boom``), or the
        server ``script``, run as a subprocess with ``env`` added to its environment."""

    def http(self, server: Any, transport: str, stateless: bool = False) -> AbstractAsyncContextManager[Any]:
        """A session with ``server`` served on a free loopback port over ``transport`` ("sse" or
        "streamable-http"; ``stateless``: streamable HTTP without sessions)."""

    def rpc_error(self, code: int, message: str, data: Any = None) -> Exception:
        """The SDK's exception for a JSON-RPC error (what a handler raises to answer with one)."""

    def own_spans(self, mode: str) -> bool:
        """The shim opens the client spans itself in client ``mode`` (the SDK opens none: mcp 1.x always, mcp 2.x
        in process "auto"); otherwise it enriches the SDK's own, made by the global tracer provider."""

    async def unknown_request(self, session: Any, method: str) -> Any:
        """Send a request of ``method``, which the SDK's request types do not know, and return its result."""

    def is_error(self, result: Any) -> bool:
        """The tool result says isError."""

    def text(self, result: Any) -> str:
        """The text of the tool result's first content block."""


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[int]:
    """Serve the ASGI ``app`` on a free loopback port with uvicorn while the block runs; yields the port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.02)
        try:
            yield port
        finally:
            server.should_exit = True


def installed() -> Driver:
    """The driver of the installed SDK major."""
    if IS_MCP_V2:
        from tests.adapters.mcp_v2.driver import McpV2

        return McpV2()
    from tests.adapters.mcp_v1.driver import McpV1

    return McpV1()


SDK = installed()

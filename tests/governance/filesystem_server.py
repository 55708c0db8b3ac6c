"""A low-level mcp 2.x stdio server shaped like @modelcontextprotocol/server-filesystem, for the governance tests.

``read_file`` returns a file's text as one string field (``{"content": string}``) with optional ``head``/``tail``
line counts that have no default, as the npm server declares it; ``search`` takes a ``limit`` capped by
``maximum`` with a default; ``list_allowed_directories`` declares no outputSchema. With the argument ``next`` the
server is its next release: ``search``'s ``limit`` loses its ``maximum``.

Tool calls answer for real: ``read_file`` reads the file at ``path`` (``head``/``tail`` honoured).

``--http HOST:PORT`` serves streamable HTTP at /mcp instead of stdio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

NEXT = sys.argv[1:2] == ["next"]
LINES = {"type": "number", "description": "If provided, returns only the first N lines of the file"}

limit: dict[str, Any] = {"type": "integer", "minimum": 1, "default": 20, "description": "Matches to return"}
if not NEXT:
    limit["maximum"] = 50

TOOLS = [
    types.Tool(
        name="read_file",
        description="Read the complete contents of a file as text. Use head or tail for the first or last N lines.",
        input_schema={"type": "object", "properties": {
            "path": {"type": "string"},
            "head": LINES,
            "tail": {**LINES, "description": "If provided, returns only the last N lines of the file"},
        }, "required": ["path"]},
        output_schema={"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]},
    ),
    types.Tool(
        name="search",
        description="Search files under a directory for a pattern; returns matching paths and line numbers.",
        input_schema={"type": "object", "properties": {
            "path": {"type": "string"}, "pattern": {"type": "string"}, "limit": limit,
        }, "required": ["path", "pattern"]},
        output_schema={"type": "object", "properties": {
            "matches": {"type": "array", "items": {"type": "object", "properties": {
                "path": {"type": "string"}, "line": {"type": "integer"},
                "preview": {"type": "string", "maxLength": 120},
            }}},
            "total": {"type": "integer"},
        }, "required": ["matches"]},
    ),
    types.Tool(
        name="list_allowed_directories",
        description="Returns the list of directories that this server is allowed to access.",
        input_schema={"type": "object", "properties": {}},
    ),
]


def read_text(arguments: dict[str, Any]) -> str:
    lines = Path(str(arguments["path"])).read_text(encoding="utf-8").splitlines(keepends=True)
    if arguments.get("head") is not None:
        lines = lines[: int(arguments["head"])]
    if arguments.get("tail") is not None:
        lines = lines[-int(arguments["tail"]) :]
    return "".join(lines)


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = dict(params.arguments or {})
    if params.name == "read_file":
        result: dict[str, Any] = {"content": read_text(arguments)}
    elif params.name == "search":
        result = {"matches": [], "total": 0}
    else:
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(Path.cwd()))])
    text = json.dumps(result)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=result)


server = Server("filesystem-fixture", version="0.3.0" if NEXT else "0.2.0", on_list_tools=list_tools,
                on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(address: str) -> None:
    import uvicorn

    host, _, port = address.rpartition(":")
    uvicorn.run(server.streamable_http_app(), host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    if "--http" in sys.argv:
        serve_http(sys.argv[sys.argv.index("--http") + 1])
    else:
        anyio.run(main)

"""A low-level mcp 1.x server with the SDK's experimental tasks (protocol 2025-11-25), served over stdio; run
with the mcp 1.x interpreter (``.venv-mcp1``).

``report(n)``: n characters of text. Called as a task (the request carries ``task``), it returns a
``CreateTaskResult`` at once and completes in the background; the client polls ``tasks/get`` and fetches the
result with ``tasks/result``. Called plainly, it answers directly.
"""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

warnings.simplefilter("ignore")  # the experimental tasks API is deprecated in 1.x (removed in 2.0)

server = Server("tasks-v1")
server.experimental.enable_tasks()


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [types.Tool(name="report", description="n characters of text, as a task when asked",
                       inputSchema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
                       execution=types.ToolExecution(taskSupport="optional"))]


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
    text = [types.TextContent(type="text", text="z" * int(arguments.get("n", 10)))]
    ctx = server.request_context
    if ctx.experimental.task_metadata is None:
        return text

    async def work(task: Any) -> types.CallToolResult:
        await anyio.sleep(0.05)  # a poll or two sees it working
        return types.CallToolResult(content=text)

    return await ctx.experimental.run_task(work)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)

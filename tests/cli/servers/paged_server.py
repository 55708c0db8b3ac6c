"""A low-level mcp 2.x stdio server whose every list is paginated, for the discovery tests.

7 tools in pages of 3, 5 resources in pages of 2, 2 resource templates in pages of 1, 3 prompts in pages of
2. With the argument ``loop`` the tools cursor never ends (the client must stop); with ``tools-only`` the
server announces tools alone.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

MODE = sys.argv[1] if len(sys.argv) > 1 else ""


def page(items: list[Any], params: types.PaginatedRequestParams | None, size: int) -> tuple[list[Any], str | None]:
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + size
    if MODE == "loop":
        return items[:size], "0"
    return items[start:end], (str(end) if end < len(items) else None)


TOOLS = [
    types.Tool(
        name=f"tool_{i}",
        description=f"Tool number {i}.",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        output_schema={"type": "object", "properties": {
            "rows": {"type": "array", "maxItems": 10 * (i + 1), "items": {"type": "object", "properties": {
                "id": {"type": "integer"}, "label": {"type": "string"}}}}}},
    )
    for i in range(7)
]
RESOURCES = [types.Resource(uri=f"paged://resource/{i}", name=f"resource {i}") for i in range(5)]
TEMPLATES = [
    types.ResourceTemplate(uri_template=f"paged://template/{i}/{{id}}", name=f"template {i}") for i in range(2)
]
PROMPTS = [types.Prompt(name=f"prompt_{i}", description=f"Prompt {i}") for i in range(3)]


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    items, cursor = page(TOOLS, params, 3)
    return types.ListToolsResult(tools=items, next_cursor=cursor)


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    items, cursor = page(RESOURCES, params, 2)
    return types.ListResourcesResult(resources=items, next_cursor=cursor)


async def list_templates(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
    items, cursor = page(TEMPLATES, params, 1)
    return types.ListResourceTemplatesResult(resource_templates=items, next_cursor=cursor)


async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    items, cursor = page(PROMPTS, params, 2)
    return types.ListPromptsResult(prompts=items, next_cursor=cursor)


handlers: dict[str, Any] = {"on_list_tools": list_tools}
if MODE != "tools-only":
    handlers.update(on_list_resources=list_resources, on_list_resource_templates=list_templates,
                    on_list_prompts=list_prompts)
server = Server("paged", version="1.0.0", **handlers)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)

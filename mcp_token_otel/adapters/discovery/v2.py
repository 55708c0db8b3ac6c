"""Discovery on mcp 2.x: ``mcp.Client`` (initialize handshake, or the 2026 discovery where the server speaks
it), raw results."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any, TextIO

from .target import Fetch, Notes, Target, stdio_params


async def open_v2(
    stack: AsyncExitStack, target: Target, errlog: TextIO, notes: Notes
) -> tuple[dict[str, Any], dict[str, Any], Fetch]:
    from mcp import Client, types
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from pydantic import TypeAdapter

    if target.url is not None:
        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(target.headers)))
        http.event_hooks["response"].append(notes.on_response)
        transport: Any = streamable_http_client(target.url, http_client=http)
    else:
        transport = stdio_client(stdio_params(StdioServerParameters, target), errlog=errlog)
    # No response cache: every page comes from the server.
    client = await stack.enter_async_context(Client(transport, cache=None))
    # Every field the server sent, as a plain dict (the SDK's annotation asks for a model; any type validates).
    raw: TypeAdapter[Any] = TypeAdapter(dict[str, Any])
    requests = {
        "tools/list": types.ListToolsRequest,
        "resources/list": types.ListResourcesRequest,
        "resources/templates/list": types.ListResourceTemplatesRequest,
        "prompts/list": types.ListPromptsRequest,
    }

    async def fetch(method: str, cursor: str | None) -> dict[str, Any]:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        return await client.session.send_request(requests[method](params=params), raw)

    info = client.server_info
    server = info.model_dump(by_alias=True, exclude_none=True) if info is not None else {}
    server["protocolVersion"] = client.protocol_version
    caps = client.server_capabilities.model_dump(by_alias=True, exclude_none=True)
    return server, caps, fetch

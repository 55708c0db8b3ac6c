"""Discovery on mcp 1.x: ``ClientSession`` with an explicit initialize, raw results.

Type-checked against whichever SDK major is installed (see the mypy override in pyproject.toml).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any, TextIO

from .target import Fetch, Notes, Target, stdio_params


async def open_v1(
    stack: AsyncExitStack, target: Target, errlog: TextIO, notes: Notes
) -> tuple[dict[str, Any], dict[str, Any], Fetch]:
    from mcp import ClientSession, types
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamablehttp_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from pydantic import BaseModel, ConfigDict

    class RawResult(BaseModel):  # keeps every field the server sent
        model_config = ConfigDict(extra="allow")

    if target.url is not None:
        def client_factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
            client = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
            client.event_hooks["response"].append(notes.on_response)
            return client

        http = streamablehttp_client(target.url, headers=dict(target.headers), httpx_client_factory=client_factory)
        read, write, _ = await stack.enter_async_context(http)
    else:
        read, write = await stack.enter_async_context(
            stdio_client(stdio_params(StdioServerParameters, target), errlog=errlog)
        )
    session = await stack.enter_async_context(ClientSession(read, write))
    init = await session.initialize()
    requests = {
        "tools/list": types.ListToolsRequest,
        "resources/list": types.ListResourcesRequest,
        "resources/templates/list": types.ListResourceTemplatesRequest,
        "prompts/list": types.ListPromptsRequest,
    }

    async def fetch(method: str, cursor: str | None) -> dict[str, Any]:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        request = types.ClientRequest(requests[method](method=method, params=params))
        result = await session.send_request(request, RawResult)
        return result.model_dump(by_alias=True, exclude_none=True)

    server = init.serverInfo.model_dump(by_alias=True, exclude_none=True)
    server["protocolVersion"] = str(init.protocolVersion)
    caps = init.capabilities.model_dump(by_alias=True, exclude_none=True)
    return server, caps, fetch

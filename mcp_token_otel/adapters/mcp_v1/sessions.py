"""mcp 1.x sessions: what the shim keeps per session object, and the transports that tell a session what it
runs on (set around a transport's streams, read by the session built next in the task)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.client.session import ClientSession
from mcp.server.session import ServerSession

from ...recorder import Side
from ...semconv import http_attributes

_SESSION_HEADER = "mcp-session-id"
#: Client: the transport opened last in this task, ("tcp", StreamableHTTPTransport) or ("pipe", None).
CLIENT_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_v1_client_transport", default=None
)
#: Server: set around a transport's streams, which the ServerSession built next in this task reads.
SERVER_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_v1_server_transport", default=None
)
#: Inside ``create_client_server_memory_streams``: the sessions built there talk to a peer in this process.
IN_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_token_v1_in_process", default=False)
#: The chain depth of the inbound request whose handler runs in this context (guards on); None: not in a handler.
DEPTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("mcp_token_v1_chain_depth", default=None)


@dataclass
class SessionInfo:
    side: Side
    key: str | None  # budget key: the mcp-session-id when known, else a uuid4; None on stateless HTTP
    transport: str | None = None  # network.transport: "pipe" or "tcp"; None in memory
    http: Any = None  # the streamable HTTP transport (client or server), read lazily for the session id
    session_id: str | None = None  # the mcp-session-id seen in a request header (server)
    protocol_version: str | None = None
    ended: bool = False
    in_process: bool = False  # built on create_client_server_memory_streams: the peer is in this process

    def protocol_session_id(self) -> str | None:
        sid = getattr(self.http, "session_id" if self.side == "client" else "mcp_session_id", None)
        return sid if isinstance(sid, str) and sid else self.session_id


def side_of(session: Any) -> Side | None:
    if isinstance(session, ClientSession):
        return "client"
    if isinstance(session, ServerSession):
        return "server"
    return None  # some other BaseSession subclass: left alone


def server_name(session: Any) -> str | None:
    """A ServerSession's server name (its InitializationOptions.server_name)."""
    name = getattr(getattr(session, "_init_options", None), "server_name", None)
    return name if isinstance(name, str) and name else None


def server_protocol(session: Any, info: SessionInfo | None) -> str | None:
    if info is not None and info.protocol_version:
        return info.protocol_version
    client_params = getattr(session, "client_params", None)
    version = getattr(client_params, "protocolVersion", None)
    return str(version) if version is not None else None


def request_http_attributes(responder: Any) -> dict[str, Any] | None:
    """server.address/port and network.protocol.* of an HTTP request (a Starlette Request in the metadata)."""
    request = getattr(getattr(responder, "message_metadata", None), "request_context", None)
    url = getattr(request, "url", None)
    if url is None:
        return None
    scope = getattr(request, "scope", None)
    return http_attributes(url, scope.get("http_version") if isinstance(scope, Mapping) else None)


def header_session_id(responder: Any) -> str | None:
    """The request's ``mcp-session-id`` header (streamable HTTP: a Starlette Request in the metadata)."""
    request = getattr(getattr(responder, "message_metadata", None), "request_context", None)
    headers = getattr(request, "headers", None)
    value = headers.get(_SESSION_HEADER) if headers is not None else None
    return value if isinstance(value, str) and value else None


@contextlib.asynccontextmanager
async def with_transport(
    var: contextvars.ContextVar[tuple[str, Any] | None], value: tuple[str, Any], cm: Any
) -> AsyncIterator[Any]:
    # The body of an async context manager runs in the caller's context, so a session built inside
    # ``async with`` (in this task or a task started from it) sees ``value``.
    token = var.set(value)
    try:
        async with cm as streams:
            yield streams
    finally:
        with contextlib.suppress(ValueError):
            var.reset(token)


@contextlib.asynccontextmanager
async def in_process(cm: Any) -> AsyncIterator[Any]:
    token = IN_PROCESS.set(True)
    try:
        async with cm as streams:
            yield streams
    finally:
        with contextlib.suppress(ValueError):
            IN_PROCESS.reset(token)

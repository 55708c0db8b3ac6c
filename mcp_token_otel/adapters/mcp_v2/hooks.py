"""The patches the mcp 2.x shim installs into the SDK, and their removal.

Each hook is a wrapt wrapper, (wrapped, instance, args, kwargs); once uninstalled (``active`` false) a hook still
reachable through a wrapper another library put over ours passes the call straight through.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

import mcp.client.stdio as client_stdio
import mcp.server._streamable_http_modern as modern_http
import mcp.server.stdio as server_stdio
import mcp.shared._otel as sdk_otel
import mcp.shared.jsonrpc_dispatcher as jrd
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.shared.direct_dispatcher import DirectDispatcher
from opentelemetry.trace import SpanKind

from ...recorder import TokenRecorder
from .._common import Hooks
from . import context as cx
from .client import DispatcherProxy, handed_over
from .server import ServerSends, add_middleware, remove_middleware
from .sessions import ServerSessions


@contextlib.asynccontextmanager
async def _server_pipe(streams: Any) -> AsyncIterator[Any]:
    """``stdio_server()``'s streams, marked as a pipe for the middleware (memory and stdio streams look alike)."""
    token = cx.SERVER_TRANSPORT.set("pipe")
    try:
        async with streams as opened:
            yield opened
    finally:
        cx.reset(cx.SERVER_TRANSPORT, token)


class V2Shim:
    """The installed patches for one recorder; ``uninstall`` restores the SDK exactly."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self.active = False
        self._hooks = Hooks()
        self.servers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sessions: weakref.WeakSet[ClientSession] = weakref.WeakSet()
        #: The budget keys of the clients this process serves.
        self.sessions = ServerSessions(recorder)
        self._sends = ServerSends(self)
        sides = recorder.config.instrumentation.sides  # the sides this process instruments
        self.client, self.server = "client" in sides, "server" in sides

    def install(self) -> None:
        hooks = self._hooks
        stdio_server = server_stdio.stdio_server
        hooks.wrap(Server, "__init__", self._server_init)
        hooks.wrap(ClientSession, "__init__", self._session_init)
        hooks.wrap(StreamableHTTPTransport, "__init__", self._http_init)
        hooks.wrap(jrd, "otel_span", self._otel_span)
        hooks.wrap(ServerSession, "send_request", self._sends.session_request)
        hooks.wrap(Connection, "send_raw_request", self._sends.connection_request)
        hooks.wrap(client_stdio, "_create_platform_compatible_process", self._spawn)
        hooks.wrap(server_stdio, "stdio_server", self._stdio_server)
        hooks.wrap(modern_http, "_tool_input_schema", self._schema_lookup)
        # Where a dispatcher stops (sync hooks: a wrapper around the run coroutine would resume with every message).
        hooks.wrap(jrd.JSONRPCDispatcher, "_fan_out_closed", self._dispatcher_stopped)
        hooks.wrap(DirectDispatcher, "close", self._dispatcher_stopped)
        try:  # MCPServer.run("stdio") looks stdio_server up in its own module
            import mcp.server.mcpserver.server as mcpserver_module
        except ImportError:
            pass
        else:
            if getattr(mcpserver_module, "stdio_server", None) is stdio_server:
                hooks.wrap(mcpserver_module, "stdio_server", self._stdio_server)
        self.active = True

    def uninstall(self) -> None:
        self.active = False
        self._hooks.remove()
        for server in list(self.servers):
            remove_middleware(server)
        for session in list(self._sessions):
            proxy = session.__dict__.get("_dispatcher")
            if isinstance(proxy, DispatcherProxy) and proxy._shim is self:
                session._dispatcher = proxy._inner
        self._sessions = weakref.WeakSet()

    def instrument_server(self, server: Any) -> None:
        """A server built before ``install`` (a low-level Server or an MCPServer) gets our middleware too."""
        if self.server:
            add_middleware(self, server)

    def wrap_session(self, session: ClientSession) -> None:
        try:
            transport = cx.CLIENT_TRANSPORT.get()
            cx.CLIENT_TRANSPORT.set(None)  # consumed: a later in-memory session in this task is not "tcp"
            inner = session._dispatcher
            if not isinstance(inner, DispatcherProxy):
                session._dispatcher = DispatcherProxy(inner, self, session, transport)
                self._sessions.add(session)
        except Exception:
            self.recorder.fault("install")

    # -------------------------------------------------------------- hooks

    def _server_init(self, wrapped: Any, server: Server, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active and self.server:
            add_middleware(self, server)

    def _session_init(self, wrapped: Any, session: ClientSession, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active and self.client:
            self.wrap_session(session)

    def _http_init(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            # The transport's context-manager body runs in the caller's context, so the session built next in
            # this task sees it.
            cx.CLIENT_TRANSPORT.set(("tcp", transport))

    def _otel_span(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = cx.CAPTURE.get() if self.active and kwargs.get("kind") is SpanKind.CLIENT else None
        tracer = getattr(sdk_otel, "_tracer", None)
        if call is None or tracer is None:
            return wrapped(*args, **kwargs)
        cx.CAPTURE.set(None)  # single use: never leaks into a nested send or a handler
        return handed_over(call, tracer, *args, **kwargs)

    async def _spawn(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        process = await wrapped(*args, **kwargs)
        if self.active:
            cx.CLIENT_TRANSPORT.set(("pipe", None))
        return process

    def _stdio_server(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _server_pipe(streams) if self.active else streams

    async def _schema_lookup(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = cx.SCHEMA_LOOKUP.set(True)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            cx.reset(cx.SCHEMA_LOOKUP, token)

    def _dispatcher_stopped(self, wrapped: Any, dispatcher: Any, args: tuple[Any, ...],
                            kwargs: dict[str, Any]) -> Any:
        """A stream (its JSON-RPC dispatcher's run ending: EOF, cancellation) or an in-process pair (closed as the
        client leaves) serving the 2026-07-28 protocol is gone: the budget of the client it carried ends now, not
        when the anchor is collected."""
        try:
            return wrapped(*args, **kwargs)
        finally:
            if self.sessions.anchor_keys:
                try:
                    self.sessions.end_anchor(getattr(dispatcher, "_transport_ctx", dispatcher))
                except Exception:
                    self.recorder.fault("budget")

"""The patches the mcp 1.x shim installs into the SDK, its sessions, and their removal.

Each hook is a wrapt wrapper, (wrapped, instance, args, kwargs); once uninstalled (``active`` false) a hook still
reachable through a wrapper another library put over ours passes the call straight through.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

import mcp.client.stdio as client_stdio
import mcp.server.stdio as server_stdio
import mcp.shared.memory as shared_memory
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.session import BaseSession, RequestResponder

from ...recorder import Side, TokenRecorder
from .._common import Hooks
from .inbound import Inbound
from .outbound import Outbound
from .sessions import (
    CLIENT_TRANSPORT,
    IN_PROCESS,
    SERVER_TRANSPORT,
    SessionInfo,
    in_process,
    side_of,
    with_transport,
)


class V1Shim:
    """The installed patches for one recorder; ``uninstall`` restores the SDK exactly."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self.active = False
        self._hooks = Hooks()
        #: What the shim keeps per session object.
        self.sessions: weakref.WeakKeyDictionary[Any, SessionInfo] = weakref.WeakKeyDictionary()
        self._sides = frozenset(recorder.config.instrumentation.sides)  # the sides this process instruments
        self.outbound = Outbound(self)
        self.inbound = Inbound(self)

    def install(self) -> None:
        hooks = self._hooks
        hooks.wrap(BaseSession, "__init__", self._session_init)
        hooks.wrap(BaseSession, "__aexit__", self._session_aexit)
        hooks.wrap(BaseSession, "send_request", self.outbound.send_request)
        hooks.wrap(BaseSession, "send_notification", self.outbound.send_notification)
        for cls in (ClientSession, ServerSession):
            if "_received_notification" in vars(cls):  # the class's own (never turn an inherited one into one)
                hooks.wrap(cls, "_received_notification", self.inbound.received_notification)
        hooks.wrap(RequestResponder, "__init__", self.inbound.responder_init)
        hooks.wrap(RequestResponder, "__enter__", self.inbound.enter)
        hooks.wrap(RequestResponder, "__exit__", self.inbound.exit)
        hooks.wrap(RequestResponder, "respond", self.inbound.respond)
        hooks.wrap(LowLevelServer, "_handle_request", self.inbound.handle_request)
        self._install_transport_hooks()
        self.active = True

    def _install_transport_hooks(self) -> None:
        hooks = self._hooks
        stdio_server = server_stdio.stdio_server
        hooks.wrap(StreamableHTTPTransport, "__init__", self._http_init)
        hooks.wrap(client_stdio, "_create_platform_compatible_process", self._spawn)
        hooks.wrap(StreamableHTTPServerTransport, "connect", self._http_connect)
        hooks.wrap(SseServerTransport, "connect_sse", self._sse_connect)
        hooks.wrap(server_stdio, "stdio_server", self._stdio_server)
        hooks.wrap(shared_memory, "create_client_server_memory_streams", self._memory_streams)
        try:  # FastMCP.run_stdio_async looks stdio_server up in its own module
            import mcp.server.fastmcp.server as fastmcp_module
        except ImportError:
            pass
        else:
            if getattr(fastmcp_module, "stdio_server", None) is stdio_server:
                hooks.wrap(fastmcp_module, "stdio_server", self._stdio_server)

    def uninstall(self) -> None:
        self.active = False
        self._hooks.remove()

    def instrument_server(self, server: Any) -> None:
        """Nothing to do on mcp 1.x: the hooks are on the session classes, so every server is covered."""

    # -------------------------------------------------------------- transports

    def _memory_streams(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return in_process(streams) if self.active else streams

    def _http_init(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            CLIENT_TRANSPORT.set(("tcp", transport))

    async def _spawn(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        process = await wrapped(*args, **kwargs)
        if self.active:
            CLIENT_TRANSPORT.set(("pipe", None))
        return process

    def _http_connect(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return with_transport(SERVER_TRANSPORT, ("tcp", transport), streams) if self.active else streams

    def _sse_connect(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return with_transport(SERVER_TRANSPORT, ("tcp", None), streams) if self.active else streams

    def _stdio_server(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return with_transport(SERVER_TRANSPORT, ("pipe", None), streams) if self.active else streams

    # -------------------------------------------------------------- sessions

    def side(self, session: Any) -> Side | None:
        """The session's side when ``instrumentation.sides`` lists it, else None (the session is left alone)."""
        side = side_of(session)
        return side if side in self._sides else None

    def session_info(self, session: Any) -> SessionInfo | None:
        """The session's info; created on first sight for sessions built before install()."""
        info = self.sessions.get(session)
        if info is None:
            side = self.side(session)
            if side is None:
                return None
            info = SessionInfo(side=side, key=uuid.uuid4().hex)
            self.sessions[session] = info
            # `async with` bound the original __aexit__ when it entered, so ours will not run for this
            # session: the exit stack that __aexit__ closes ends the budget instead.
            stack = getattr(session, "_exit_stack", None)
            if stack is not None:
                try:
                    stack.callback(self._end_session, info)
                except Exception:
                    self.recorder.fault("install")
        return info

    def safe_info(self, session: Any) -> SessionInfo | None:
        try:
            return self.session_info(session)
        except Exception:
            self.recorder.fault("install")
            return None

    def _end_session(self, info: SessionInfo) -> None:
        if not info.ended:
            info.ended = True
            self.recorder.end_session(info.side, info.key)

    def _new_session(self, session: Any) -> None:
        side = self.side(session)
        if side is None:
            return
        if side == "client":
            transport = CLIENT_TRANSPORT.get()
            CLIENT_TRANSPORT.set(None)  # consumed: a later in-memory session in this task is not "tcp"
        else:
            transport = SERVER_TRANSPORT.get()  # not consumed: a stateless HTTP server builds one per request
        kind, http = transport if transport else (None, None)
        info = SessionInfo(side=side, key=uuid.uuid4().hex, transport=kind, http=http, in_process=IN_PROCESS.get())
        if side == "server":
            sid = info.protocol_session_id()
            if sid:
                info.key = sid  # stateful streamable HTTP: the id is known before initialize
            elif http is not None:
                info.key = None  # stateless streamable HTTP: a session per request is no session; no budget
        self.sessions[session] = info

    def _session_init(self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            try:
                self._new_session(session)
            except Exception:
                self.recorder.fault("install")

    async def _session_aexit(self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return await wrapped(*args, **kwargs)
        finally:
            # The receive loop has stopped: the session is over (closing it on GC would depend on reference
            # cycles; this does not).
            info = self.sessions.get(session)
            if info is not None:
                self._end_session(info)

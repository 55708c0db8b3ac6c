"""mcp 2.x hooks (verified against mcp 2.3; see docs/instrumentation.md).

Server: a middleware appended to every ``Server.middleware`` list (``Server.__init__`` is wrapped, and
``instrument_server`` covers servers built earlier). It runs inside the SDK's own SERVER span, which it
enriches; only when no MCP span is recording does it open its own SERVER span.

Client: ``ClientSession.__init__`` is wrapped to put the session's dispatcher behind a proxy. The proxy
opens one CLIENT span per request. On ``JSONRPCDispatcher`` the SDK would open a second CLIENT span,
so ``jsonrpc_dispatcher.otel_span`` is swapped for a version that *takes over* ours (one span, and the
trace context the SDK injects into ``_meta`` is ours, so the server span is its child). On
``DirectDispatcher`` (in-process) the server handler runs in our task, so ambient context parents it.

Session ids: the server uses ``Connection.session_id`` (stateful streamable HTTP), else a uuid4 per
Connection; the client uses a uuid4 per ClientSession as its budget key and reports the HTTP
transport's ``mcp-session-id`` as ``mcp.session.id`` once known.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import mcp.client.stdio as client_stdio
import mcp.server.stdio as server_stdio
import mcp.shared.jsonrpc_dispatcher as jrd
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanKind

from ..emitters.semconv import A_PROTOCOL, A_SESSION_ID, A_TRANSPORT, call_attributes, http_attributes, span_name
from ..recorder import TokenRecorder
from ._common import MARK as _MARK
from ._common import Patches, ShimSlot, called_tool, detach, is_mcp_span, wire_dict

logger = logging.getLogger(__name__)

#: The CLIENT span that the SDK's next ``otel_span(kind=CLIENT)`` must take over (single use).
_TAKEOVER: contextvars.ContextVar[Span | None] = contextvars.ContextVar("mcp_token_takeover", default=None)
#: Client: the transport opened last in this task, ("tcp", StreamableHTTPTransport) or ("pipe", None).
_CLIENT_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_client_transport", default=None
)
#: Server: "pipe" inside stdio_server() (memory and stdio streams look the same to a middleware).
_SERVER_TRANSPORT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcp_token_server_transport", default=None
)





def _error_data(exc: Exception) -> Any:
    """The JSON-RPC error the SDK answers a handler exception with (its own mapping; code 0 otherwise)."""
    try:
        error = jrd.handler_exception_to_error_data(exc)
    except Exception:
        error = None
    return error if error is not None else {"code": 0, "message": str(exc)}



def _transport_kind(ctx: Any) -> str | None:
    outbound = getattr(ctx.session, "_request_outbound", None)
    # The 2026 wrapper's own .transport builds a copy on every read (dataclasses.replace): read the inner one.
    transport = getattr(getattr(outbound, "_inner", outbound), "transport", None)
    return getattr(transport, "kind", None)


def _per_client_anchor(ctx: Any, connection: Any) -> Any:
    """What stays the same across the requests of one client when every request has its own Connection
    (2026-07-28 protocol), else None (a handshake-era Connection is itself the session)."""
    outbound = getattr(connection, "outbound", None)
    if type(outbound).__name__ == "NotifyOnlyOutbound":  # modern protocol over one stream (stdio, memory)
        return outbound
    request_outbound = getattr(ctx.session, "_request_outbound", None)
    inner = getattr(request_outbound, "_inner", None)
    if type(inner).__name__ == "_DirectDispatchContext":  # in-process auto mode: one transport per pair
        return getattr(inner, "transport", None)
    return None


class TokenMiddleware:
    """Server middleware: ``async (ctx, call_next) -> result``, measuring the wire params and result."""

    _mcp_token_otel = True

    def __init__(self, shim: V2Shim, server_name: str | None = None) -> None:
        self._shim = shim
        self._server = server_name if isinstance(server_name, str) and server_name else None

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        shim = self._shim
        if not shim.active:
            return await call_next(ctx)
        rec = shim.recorder
        method, params = ctx.method, ctx.params
        span, own, session_key = None, None, None
        extra: dict[str, Any] = {}
        try:
            session_id, session_key = shim.server_session(ctx)
            if ctx.request_id is None:
                session_key = None  # notifications never enter the model's context
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.SERVER, method):
                span = current
            else:
                # The SDK's OpenTelemetryMiddleware was removed (or is not recording): open our own.
                parent = extract(ctx.meta) if ctx.meta else None
                own = span = rec.start_span(
                    span_name(method, params),
                    SpanKind.SERVER,
                    call_attributes(method, params, request_id=ctx.request_id),
                    context=parent,
                )
            transport = "tcp" if ctx.request is not None else _SERVER_TRANSPORT.get()
            if session_id:
                extra[A_SESSION_ID] = session_id
            if transport:
                extra[A_TRANSPORT] = transport
            if ctx.protocol_version and own is not None:
                extra[A_PROTOCOL] = ctx.protocol_version
            if ctx.request is not None:  # HTTP: the address the client reached, the HTTP version
                scope = getattr(ctx.request, "scope", None)
                extra.update(http_attributes(getattr(ctx.request, "url", None),
                                             scope.get("http_version") if isinstance(scope, Mapping) else None))
        except Exception:
            rec._fault("span")
        # One set_attributes for the request side: the adapter's attributes ride with the estimate.
        server = self._server
        rec.record_input(span, "server", method, params, session_key, attributes=extra, server=server)
        tool = called_tool(method, params)
        token = trace.context_api.attach(trace.set_span_in_context(own)) if own is not None else None
        started = time.perf_counter()
        try:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                rec.record_output(span, "server", method, tool, error=exc.error, session_id=session_key,
                                  started=started, server=server)
                raise
            except Exception as exc:
                if own is not None:
                    rec.record_exception(own, exc)
                if ctx.request_id is not None:  # the SDK answers with a JSON-RPC error: it enters the context too
                    error = _error_data(exc)
                    rec.record_output(span, "server", method, tool, error=error, session_id=session_key,
                                      started=started, server=server)
                raise
            if ctx.request_id is not None:
                try:  # converting the result is part of measuring it: inside the never-break boundary
                    wire = wire_dict(result)
                except Exception:
                    rec._fault("estimate")
                else:
                    rec.record_output(span, "server", method, tool, result=wire, session_id=session_key,
                                      started=started, server=server)
            return result
        finally:
            detach(token)
            rec.end_span(own)


class DispatcherProxy:
    """Stands in for a ClientSession's dispatcher; everything not overridden is delegated."""

    def __init__(self, inner: Any, shim: V2Shim, session: ClientSession, transport: tuple[str, Any] | None):
        self._inner = inner
        self._shim = shim
        self._session = weakref.ref(session)
        self._direct = not isinstance(inner, jrd.JSONRPCDispatcher)
        self._transport = None if self._direct else transport
        self._key = uuid.uuid4().hex  # budget key: stable for this ClientSession
        # server.address/port and network.protocol.name of an HTTP transport (on the span with the estimate).
        self._http = http_attributes(getattr(self._transport[1], "url", None)) if self._transport else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _session_id(self) -> str | None:
        transport = self._transport[1] if self._transport else None
        return getattr(transport, "session_id", None)

    def _protocol_version(self) -> str | None:
        session = self._session()
        return getattr(session, "protocol_version", None) if session is not None else None

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> Any:
        shim = self._shim
        if not shim.active:
            return await self._inner.send_raw_request(method, params, opts)
        rec = shim.recorder
        span, own, token = None, None, None
        try:
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.CLIENT, method):
                span = current  # an outer MCP instrumentation already traces this call
            else:
                attrs = call_attributes(
                    method,
                    params,
                    protocol_version=self._protocol_version(),
                    transport=self._transport[0] if self._transport else None,
                )
                own = span = rec.start_span(span_name(method, params), SpanKind.CLIENT, attrs)
                if own is not None:
                    token = trace.context_api.attach(trace.set_span_in_context(own))
        except Exception:
            rec._fault("span")
        takeover = _TAKEOVER.set(span if span is not None and not self._direct else None)
        rec.record_input(span, "client", method, params, self._key, attributes=self._http)
        tool = called_tool(method, params)
        started = time.perf_counter()
        try:
            try:
                result = await self._inner.send_raw_request(method, params, opts)
            except MCPError as exc:
                rec.record_output(span, "client", method, tool, error=exc.error, session_id=self._key,
                                  started=started)
                raise
            except Exception as exc:
                if own is not None:
                    rec.record_exception(own, exc)
                raise
            rec.record_output(span, "client", method, tool, result=result, session_id=self._key, started=started)
            if method == "initialize" and isinstance(result, Mapping):
                rec.set_attributes(span, {"mcp.protocol.version": str(result.get("protocolVersion", ""))})
            return result
        finally:
            _TAKEOVER.reset(takeover)
            self._finish_client_span(span, own, token)

    def _finish_client_span(self, span: Span | None, own: Span | None, token: Any) -> None:
        rec = self._shim.recorder
        extra: dict[str, Any] = {}
        session_id = self._session_id()  # known after the initialize response
        if session_id:
            extra[A_SESSION_ID] = session_id
        version = self._protocol_version()
        if version:
            extra["mcp.protocol.version"] = version
        if extra:
            rec.set_attributes(span, extra)
        detach(token)
        rec.end_span(own)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> None:
        if self._shim.active:
            self._shim.recorder.record_input(None, "client", method, params)
        return await self._inner.notify(method, params, opts)

    async def run(
        self, on_request: Any, on_notify: Any, on_notify_intercept: Any = None, **kwargs: Any
    ) -> Any:
        shim = self._shim

        async def wrapped_on_request(dctx: Any, method: str, params: Any) -> Any:
            if not shim.active:
                return await on_request(dctx, method, params)
            return await self._inbound_request(on_request, dctx, method, params)

        async def wrapped_on_notify(dctx: Any, method: str, params: Any) -> Any:
            if shim.active:
                shim.recorder.record_input(None, "client", method, params)
            return await on_notify(dctx, method, params)

        try:
            return await self._inner.run(wrapped_on_request, wrapped_on_notify, on_notify_intercept, **kwargs)
        finally:
            shim.recorder.end_session("client", self._key)

    async def _inbound_request(self, on_request: Any, dctx: Any, method: str, params: Any) -> Any:
        """A server->client request (sampling, elicitation, roots): a SERVER span on the client side."""
        rec = self._shim.recorder
        span, token = None, None
        try:
            # Over memory streams the ambient context is the sender's: take the parent from _meta instead.
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            parent = extract(meta) if isinstance(meta, Mapping) else None
            attrs = call_attributes(method, params, request_id=getattr(dctx, "request_id", None))
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=parent)
            if span is not None:
                token = trace.context_api.attach(trace.set_span_in_context(span))
        except Exception:
            rec._fault("span")
        rec.record_input(span, "client", method, params, self._key)
        started = time.perf_counter()
        try:
            try:
                result = await on_request(dctx, method, params)
            except MCPError as exc:
                rec.record_output(span, "client", method, None, error=exc.error, session_id=self._key,
                                  started=started)
                raise
            except Exception as exc:
                rec.record_exception(span, exc)
                raise
            rec.record_output(span, "client", method, None, result=wire_dict(result), session_id=self._key,
                              started=started)
            return result
        finally:
            detach(token)
            rec.end_span(span)


class V2Shim:
    """The installed patches for one recorder; ``uninstall`` restores the SDK exactly."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self.active = False
        self._patches = Patches()
        self._servers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sessions: weakref.WeakSet[ClientSession] = weakref.WeakSet()
        self._connection_keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: id(anchor) -> (weak reference to it, budget key): the 2026 protocol's per-client anchors.
        self._anchor_keys: dict[int, tuple[weakref.ref[Any], str]] = {}

    # -------------------------------------------------------------- install / uninstall

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._patches.patch(owner, name, replacement)

    def install(self) -> None:
        shim = self
        server_init = Server.__init__
        session_init = ClientSession.__init__
        http_init = StreamableHTTPTransport.__init__
        sdk_otel_span = jrd.otel_span
        spawn = client_stdio._create_platform_compatible_process
        stdio_server = server_stdio.stdio_server

        @functools.wraps(server_init)
        def patched_server_init(self: Server, *args: Any, **kwargs: Any) -> None:
            server_init(self, *args, **kwargs)
            shim.add_middleware(self)

        @functools.wraps(session_init)
        def patched_session_init(self: ClientSession, *args: Any, **kwargs: Any) -> None:
            session_init(self, *args, **kwargs)
            shim.wrap_session(self)

        @functools.wraps(http_init)
        def patched_http_init(self: StreamableHTTPTransport, *args: Any, **kwargs: Any) -> None:
            http_init(self, *args, **kwargs)
            # The transport's context-manager body runs in the caller's context, so the session built next
            # in this task sees it.
            _CLIENT_TRANSPORT.set(("tcp", self))

        @contextlib.contextmanager
        def takeover_otel_span(
            name: str, *, kind: SpanKind, attributes: Any = None, **kwargs: Any
        ) -> Iterator[Any]:
            span = _TAKEOVER.get()
            if span is None or kind is not SpanKind.CLIENT:
                with sdk_otel_span(name, kind=kind, attributes=attributes, **kwargs) as sdk_span:
                    yield sdk_span
                return
            _TAKEOVER.set(None)  # single use: never leaks into a nested send or a handler
            if attributes:
                shim.recorder.set_attributes(span, attributes)  # the minted jsonrpc.request.id
            yield span  # current already: the SDK injects our span context into _meta

        @functools.wraps(spawn)
        async def patched_spawn(*args: Any, **kwargs: Any) -> Any:
            process = await spawn(*args, **kwargs)
            _CLIENT_TRANSPORT.set(("pipe", None))
            return process

        @contextlib.asynccontextmanager
        async def patched_stdio_server(*args: Any, **kwargs: Any) -> Any:
            token = _SERVER_TRANSPORT.set("pipe")
            try:
                async with stdio_server(*args, **kwargs) as streams:
                    yield streams
            finally:
                with contextlib.suppress(ValueError):
                    _SERVER_TRANSPORT.reset(token)

        functools.update_wrapper(patched_stdio_server, stdio_server)
        self._patch(Server, "__init__", patched_server_init)
        self._patch(ClientSession, "__init__", patched_session_init)
        self._patch(StreamableHTTPTransport, "__init__", patched_http_init)
        self._patch(jrd, "otel_span", takeover_otel_span)
        self._patch(client_stdio, "_create_platform_compatible_process", patched_spawn)
        self._patch(server_stdio, "stdio_server", patched_stdio_server)
        try:  # MCPServer.run("stdio") looks stdio_server up in its own module
            import mcp.server.mcpserver.server as mcpserver_module

            if getattr(mcpserver_module, "stdio_server", None) is stdio_server:
                self._patch(mcpserver_module, "stdio_server", patched_stdio_server)
        except ImportError:
            pass
        self.active = True

    def uninstall(self) -> None:
        self.active = False
        self._patches.restore()
        for server in list(self._servers):
            self.remove_middleware(server)
        for session in list(self._sessions):
            proxy = session.__dict__.get("_dispatcher")
            if isinstance(proxy, DispatcherProxy) and proxy._shim is self:
                session._dispatcher = proxy._inner
        self._sessions = weakref.WeakSet()

    # -------------------------------------------------------------- server side

    def add_middleware(self, server: Any) -> None:
        """Append our middleware (idempotent); accepts a low-level Server or an MCPServer."""
        try:
            low = getattr(server, "_lowlevel_server", server)
            chain = low.middleware
            if not any(getattr(m, _MARK, False) for m in chain):
                # After OpenTelemetryMiddleware (index 0): we run inside the SDK's SERVER span.
                chain.append(TokenMiddleware(self, getattr(low, "name", None)))
            self._servers.add(low)
        except Exception:
            self.recorder._fault("install")

    @staticmethod
    def remove_middleware(server: Any) -> None:
        low = getattr(server, "_lowlevel_server", server)
        with contextlib.suppress(Exception):
            low.middleware[:] = [m for m in low.middleware if not getattr(m, _MARK, False)]

    def server_session(self, ctx: Any) -> tuple[str | None, str | None]:
        """(the protocol's session id or None, the budget key or None when no client session is knowable).

        - stateful streamable HTTP: the ``mcp-session-id``;
        - a handshake-era connection (stdio, SSE, legacy in-memory): one key per ``Connection``, ended with it;
        - the 2026-07-28 protocol builds a new ``Connection`` per request, so the key follows what stays
          the same for one client: the in-process ``DirectDispatcher`` pair's transport context (auto mode),
          or the stream's shared outbound channel (stdio/memory streams serving the modern protocol);
        - stateless HTTP (a request with no session id): no session, so no budget (never one per call).
        """
        connection = getattr(ctx.session, "_connection", None)
        session_id = getattr(connection, "session_id", None)
        if session_id:
            key = self._connection_keys.get(connection) if connection is not None else None
            if connection is not None and key is None:
                self._connection_keys[connection] = session_id
                self._on_connection_end(connection, session_id)
            return session_id, session_id
        if connection is None or _transport_kind(ctx) == "streamable-http":
            return None, None  # stateless HTTP: nothing identifies the client across requests
        anchor = _per_client_anchor(ctx, connection)
        if anchor is not None:
            return None, self._anchor_key(anchor)
        key = self._connection_keys.get(connection)
        if key is None:
            key = self._connection_keys[connection] = uuid.uuid4().hex
            self._on_connection_end(connection, key)
        return None, key

    def _on_connection_end(self, connection: Any, key: str) -> None:
        # Every SDK driver unwinds the Connection's exit stack when the connection ends (its
        # per-connection cleanup hook); garbage collection is only the fallback.
        exit_stack = getattr(connection, "exit_stack", None)
        if exit_stack is not None:
            exit_stack.callback(self.recorder.end_session, "server", key)
        else:
            weakref.finalize(connection, self.recorder.end_session, "server", key)

    def _anchor_key(self, anchor: Any) -> str:
        """One budget key per client anchor; the session ends when the anchor is collected (the client
        closed: the dispatcher pair or the stream's channel is gone), or by the registry's idle timeout."""
        entry = self._anchor_keys.get(id(anchor))
        if entry is not None and entry[0]() is anchor:
            return entry[1]
        key = uuid.uuid4().hex
        try:
            ref = weakref.ref(anchor)
        except TypeError:
            return key  # not weak-referenceable: cannot follow it; the idle timeout still bounds the budget
        self._anchor_keys[id(anchor)] = (ref, key)
        weakref.finalize(anchor, self._anchor_gone, id(anchor), key)
        return key

    def _anchor_gone(self, anchor_id: int, key: str) -> None:
        entry = self._anchor_keys.get(anchor_id)
        if entry is not None and entry[1] == key:
            del self._anchor_keys[anchor_id]
        self.recorder.end_session("server", key)

    # -------------------------------------------------------------- client side

    def wrap_session(self, session: ClientSession) -> None:
        try:
            transport = _CLIENT_TRANSPORT.get()
            _CLIENT_TRANSPORT.set(None)  # consumed: a later in-memory session in this task is not "tcp"
            inner = session._dispatcher
            if not isinstance(inner, DispatcherProxy):
                session._dispatcher = DispatcherProxy(inner, self, session, transport)
                self._sessions.add(session)
        except Exception:
            self.recorder._fault("install")


_slot = ShimSlot(V2Shim)
#: Patch the SDK for a recorder (at most one shim is active) / restore it exactly.
install = _slot.install
uninstall = _slot.uninstall


def instrument_server(server: Any) -> None:
    """Instrument a server built before ``instrument()`` (a low-level Server or an MCPServer)."""
    if _slot.shim is None:
        logger.warning("mcp_token_otel: instrument_server() called before instrument(); ignored")
        return
    _slot.shim.add_middleware(server)

__all__ = ["DispatcherProxy", "TokenMiddleware", "V2Shim", "install", "instrument_server", "uninstall"]

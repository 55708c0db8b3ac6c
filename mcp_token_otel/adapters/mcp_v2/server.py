"""mcp 2.x server side: a middleware in every ``Server.middleware`` list, measuring each inbound request and
notification inside the SDK's own SERVER span (which it enriches; only when no MCP span is recording does it open
its own), and the requests a server sends (sampling, elicitation, roots, ping), measured with side ``server`` on
the budget of the client whose handler sends them."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import mcp.shared.jsonrpc_dispatcher as jrd
from mcp.server.connection import Connection
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from ...core.guard.limits import chain_depth
from ...core.protocol import wire_dict
from ...semconv import A_PROTOCOL, A_SESSION_ID, A_TRANSPORT, call_attributes, http_attributes, span_name
from .._common import MARK, is_mcp_span
from . import context as cx

if TYPE_CHECKING:
    from .hooks import V2Shim

#: The request's adapter attributes that the requests its handler sends carry too.
_SENDS_KEYS = (A_SESSION_ID, A_TRANSPORT)


def is_jsonrpc(channel: Any) -> bool:
    """Whether requests sent on this outbound channel go through ``JSONRPCDispatcher`` (the SDK spans them)."""
    return isinstance(channel, jrd.JSONRPCDispatcher) or isinstance(
        getattr(channel, "_dispatcher", None), jrd.JSONRPCDispatcher
    )


def _error_data(exc: Exception) -> Any:
    """The JSON-RPC error the SDK answers a handler exception with (its own mapping; code 0 otherwise)."""
    try:
        error = jrd.handler_exception_to_error_data(exc)
    except Exception:
        error = None
    return error if error is not None else {"code": 0, "message": str(exc)}


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
        method, params = ctx.method, ctx.params
        if method == "tools/list" and cx.SCHEMA_LOOKUP.get():
            return await call_next(ctx)  # the SDK's own listing, validating a call's headers: not traffic
        rec = shim.recorder
        request = ctx.request_id is not None  # notifications never enter the model's context
        span, own, key, extra = self._span_and_key(ctx, request)
        call = rec.begin("server", method, params, key, server=self._server, budgeted=request,
                         version=ctx.protocol_version)
        call.span = span
        call.transport = extra.get(A_TRANSPORT)
        depth: contextvars.Token[int | None] | None = None
        if request and rec.guard_active:  # the guards off: this one check
            if rec.guards("server"):
                call.guard()  # on the session's budget before this request counts
            try:  # whichever sides guard, the handler's own requests (nested calls, sampling) carry one more
                depth = cx.DEPTH.set(chain_depth(params))
            except Exception:
                rec.fault("guard")
        call.open(span, extra)
        tokens = cx.activate(own)
        # What the requests this handler sends (sampling, elicitation) are measured with (see server_send).
        server_call = cx.SERVER_CALL.set((key, extra, ctx.protocol_version))
        try:
            if call.refusal is not None:  # answered by the guard: the handler is not called
                return call.refused()
            if call.refusal_error is not None:  # a read of a kept result that cannot be served: its error
                error = call.refused()
                raise MCPError(error["code"], error["message"], error.get("data"))
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                if request:  # a notification has no response
                    call.error(exc.error)
                raise
            except Exception as exc:
                # The SDK answers with a JSON-RPC error: it enters the context too.
                call.failed(exc, _error_data(exc) if request else None, on_span=own is not None)
                raise
            except BaseException:
                if method == cx.LISTEN:  # the client ended the stream: the call's duration and end still count
                    call.cancelled()
                raise
            return call.result(result) if request else result
        finally:
            if depth is not None:
                cx.reset(cx.DEPTH, depth)
            cx.reset(cx.SERVER_CALL, server_call)
            call.close()
            if tokens[0] is not None or tokens[1] is not None:
                cx.deactivate(tokens)
            if own is not None:
                rec.end_span(own)

    def _span_and_key(self, ctx: Any, request: bool) -> tuple[Span | None, Span | None, str | None, dict[str, Any]]:
        """(the span to measure on, the shim's own span if it opened one, the budget key, the adapter's
        attributes: session id, transport, protocol version of its own span, the HTTP peer)."""
        shim = self._shim
        rec = shim.recorder
        span = own = key = None
        extra: dict[str, Any] = {}
        try:
            session_id, key = shim.sessions.session(ctx)
            if not request:
                key = None
            elif key is None or not rec.session_first:  # the session key unless budget.key says more
                key = shim.sessions.key(ctx, key)
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.SERVER, ctx.method):
                span = current
            else:
                # The SDK's OpenTelemetryMiddleware was removed (or is not recording): open our own.
                own = span = rec.start_span(
                    span_name(ctx.method, ctx.params), SpanKind.SERVER,
                    call_attributes(ctx.method, ctx.params, request_id=ctx.request_id),
                    context=cx.parent_context(ctx.meta),
                )
            transport = "tcp" if ctx.request is not None else cx.SERVER_TRANSPORT.get()
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
            rec.fault("span")
        return span, own, key, extra


class ServerSends:
    """The requests a server sends (sampling, elicitation, roots, ping): ``ServerSession.send_request`` and
    ``Connection.send_raw_request``."""

    def __init__(self, shim: V2Shim) -> None:
        self._shim = shim

    async def session_request(self, wrapped: Any, session: ServerSession, args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> Any:
        if not (self._shim.active and self._shim.server):
            return await wrapped(*args, **kwargs)
        return await self._session_request(wrapped, session, *args, **kwargs)

    async def _session_request(self, send: Any, session: ServerSession, request: Any, result_type: Any,
                               *args: Any, **kw: Any) -> Any:
        rec = self._shim.recorder
        method, params, jsonrpc = "unknown", None, True
        data: Any = None
        try:
            data = wire_dict(request)
            method, params = str(data.get("method", "unknown")), data.get("params")
            metadata = kw.get("metadata", args[1] if len(args) > 1 else None)
            # The channel the SDK picks: the request's own when related to it, else the connection's.
            related = getattr(metadata, "related_request_id", None)
            channel = session._request_outbound if related is not None else session._connection.outbound
            jsonrpc = is_jsonrpc(channel)
        except Exception:
            rec.fault("span")
        if rec.guard_active and cx.DEPTH.get() is not None and data is not None:
            try:  # the handler's request (sampling, elicitation) carries the next chain depth
                chained = cx.deeper(method, params)
                request = type(request).model_validate({**data, "params": chained}, by_name=False)
                params = chained
            except Exception:
                rec.fault("guard")
        return await self.send(lambda: send(request, result_type, *args, **kw), method, params, jsonrpc)

    async def connection_request(self, wrapped: Any, connection: Connection, args: tuple[Any, ...],
                                 kwargs: dict[str, Any]) -> Any:
        if not (self._shim.active and self._shim.server):
            return await wrapped(*args, **kwargs)
        return await self._connection_request(wrapped, connection, *args, **kwargs)

    async def _connection_request(self, send: Any, connection: Connection, method: str, params: Any,
                                  *args: Any, **kw: Any) -> Any:
        rec = self._shim.recorder
        jsonrpc = is_jsonrpc(getattr(connection, "outbound", None))
        if rec.guard_active:
            try:
                params = cx.deeper(method, params)
            except Exception:
                rec.fault("guard")
        return await self.send(lambda: send(method, params, *args, **kw), method, params, jsonrpc)

    async def send(self, send: Callable[[], Awaitable[Any]], method: str, params: Any, jsonrpc: bool) -> Any:
        """Measured with side ``server``, on the budget of the client session whose handler sends it."""
        from .client import OutboundCall

        attrs: dict[str, Any] = {}
        key: str | None = None
        version = None
        try:
            server_call = cx.SERVER_CALL.get()
            attrs = call_attributes(method, params)
            if server_call is not None:
                key, extra, version = server_call
                attrs.update((k, v) for k, v in extra.items() if k in _SENDS_KEYS)
                if version:
                    attrs[A_PROTOCOL] = version
        except Exception:
            self._shim.recorder.fault("span")
        call = OutboundCall(self._shim, "server", method, params, key, attrs, version=version,
                            transport=attrs.get(A_TRANSPORT))
        try:
            return await call.send(send, jsonrpc)
        finally:
            call.end()


def add_middleware(shim: V2Shim, server: Any) -> None:
    """Append our middleware (idempotent); accepts a low-level Server or an MCPServer."""
    try:
        low = getattr(server, "_lowlevel_server", server)
        chain = low.middleware
        if not any(getattr(m, MARK, False) for m in chain):
            # Right after the SDK's OpenTelemetryMiddleware, whatever was added since: inside the SDK's SERVER
            # span, and before any middleware that rewrites the wire (the sealing of a multi round-trip
            # request's state), so what is measured is what the client sends and receives.
            at = next((i + 1 for i, m in enumerate(chain) if type(m).__name__ == "OpenTelemetryMiddleware"), 0)
            chain.insert(at, TokenMiddleware(shim, getattr(low, "name", None)))
        shim.servers.add(low)
    except Exception:
        shim.recorder.fault("install")


def remove_middleware(server: Any) -> None:
    low = getattr(server, "_lowlevel_server", server)
    with contextlib.suppress(Exception):
        low.middleware[:] = [m for m in low.middleware if not getattr(m, MARK, False)]

"""mcp 2.x hooks (verified against mcp 2.3; see docs/instrumentation.md).

Server: a middleware appended to every ``Server.middleware`` list (``Server.__init__`` is wrapped, and
``instrument_server`` covers servers built earlier). It runs inside the SDK's own SERVER span, which it
enriches; only when no MCP span is recording does it open its own SERVER span. Requests the server sends
(sampling, elicitation, roots, ping: ``ServerSession.send_request`` and ``Connection.send_raw_request``) are
measured with side ``server``.

Client: ``ClientSession.__init__`` is wrapped to put the session's dispatcher behind a proxy. On
``JSONRPCDispatcher`` the SDK opens its own CLIENT span (``MCP send ...``, scope ``mcp-python-sdk``):
``jsonrpc_dispatcher.otel_span`` is swapped for a version that opens that same span with the SDK's own
tracer and hands it to the request being measured, which enriches it and ends it once the response is
measured. Only where the SDK makes no span (``DirectDispatcher``, in process) or its span does not record
(a no-op tracer, or a sampler that drops it) does the shim open its own CLIENT span.

Transparency: the shim never adds trace context to a request. Its own spans are made current only while the
SDK's own tracer makes spans (then the SDK already puts a ``traceparent`` of its own span on every JSON-RPC
request, so only the parent changes); otherwise, a global tracer provider set or not, they parent one another
through a private context variable.

Session ids: the server uses ``Connection.session_id`` (stateful streamable HTTP), else a uuid4 per
Connection; the client uses a uuid4 per ClientSession as its budget key and reports the HTTP
transport's ``mcp-session-id`` as ``mcp.session.id`` once known.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

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
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from ..core.guard.limits import chain_depth, with_depth
from ..core.measure import called_tool
from ..recorder import Side, TokenRecorder
from ..semconv import A_PROTOCOL, A_SESSION_ID, A_TRANSPORT, call_attributes, http_attributes, span_name
from ._common import MARK as _MARK
from ._common import (
    Hooks,
    PendingEvents,
    deliver,
    detach,
    extract_parent,
    installed,
    is_mcp_span,
    makes_spans,
    wire_dict,
)
from .budget_keys import ClientFacts, ServerFacts, with_conversation_baggage

try:
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError:  # pragma: no cover - an SDK before the 2026 protocol
    MODERN_PROTOCOL_VERSIONS = ()  # type: ignore[misc]  # the SDK's Final, stood in for when it is missing
_MODERN_VERSIONS: tuple[str, ...] = tuple(MODERN_PROTOCOL_VERSIONS)
#: Where a 2026-07-28 request carries its protocol version.
_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
#: A long-lived request whose end is the client going away (a cancellation): its duration is recorded then.
_LISTEN = "subscriptions/listen"

logger = logging.getLogger(__name__)

#: The request whose SDK CLIENT span the next ``otel_span(kind=CLIENT)`` hands over (single use).
_CAPTURE: contextvars.ContextVar[OutboundCall | None] = contextvars.ContextVar("mcp_token_capture", default=None)
#: The shim's own span that is the parent of the next shim span in this task, when it is not made current.
_SHIM_PARENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar("mcp_token_shim_parent", default=None)
#: Server: inside a request handler, (the budget key, the request's adapter attributes, its protocol version)
#: for the requests the handler sends (their attributes are picked from these only when one is sent).
_SERVER_CALL: contextvars.ContextVar[tuple[str | None, dict[str, Any], Any] | None] = contextvars.ContextVar(
    "mcp_token_server_call", default=None
)
#: The request's adapter attributes that the requests its handler sends carry too.
_SENDS_KEYS = (A_SESSION_ID, A_TRANSPORT)
#: Client: the transport opened last in this task, ("tcp", StreamableHTTPTransport) or ("pipe", None).
_CLIENT_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_client_transport", default=None
)
#: Server, guards on: the chain depth of the request whose handler runs (docs/guardrails.md "Chain depth");
#: requests the handler sends carry one more.
_DEPTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("mcp_token_depth", default=None)
#: Server: inside the SDK's own tools/list that validates a tools/call's Mcp-Param-* headers (not traffic).
_SCHEMA_LOOKUP: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_token_schema_lookup", default=False)
#: Server: "pipe" inside stdio_server() (memory and stdio streams look the same to a middleware).
_SERVER_TRANSPORT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcp_token_server_transport", default=None
)


def _envelope(refusal: dict[str, Any], version: Any) -> dict[str, Any]:
    """A guard's refusal shaped as the negotiated protocol shapes a result: a 2026-era result carries its
    ``resultType`` (the SDK adds it to handler results; a short-circuiting middleware owns its envelope)."""
    if version in _MODERN_VERSIONS and "resultType" not in refusal:
        return {**refusal, "resultType": "complete"}
    return refusal


def _deeper(params: Any) -> Any:
    """``params`` with the next chain depth when sent from inside a served request (guards on), else as is."""
    depth = _DEPTH.get()
    if depth is None or (params is not None and not isinstance(params, Mapping)):
        return params
    return with_depth(params, depth + 1)


def _parent_context(meta: Any = None) -> Any:
    """Where a shim span hangs: the trace context in ``_meta``, else the ambient one, else (no valid ambient
    span: the shim's spans are not current while the SDK's tracer is a no-op) the shim's own enclosing span."""
    parent = extract_parent(meta)
    if parent is not None:
        return parent
    if trace.get_current_span().get_span_context().is_valid:
        return None
    shim_parent = _SHIM_PARENT.get()
    return trace.set_span_in_context(shim_parent) if shim_parent is not None else None


def _activate(span: Span | None) -> tuple[Any, Any]:
    """Make a shim span the parent of what follows in this task. Current (the OTel context) only while the SDK's
    own tracer makes spans: then the SDK already puts a ``traceparent`` of its own span on every JSON-RPC request,
    and only the parent changes. Else privately: the SDK injects whatever context is current, so a current shim
    span would add to ``_meta`` what the application never sees without the shim."""
    if span is None:
        return None, None
    if makes_spans(getattr(sdk_otel, "_tracer", None)):
        return trace.context_api.attach(trace.set_span_in_context(span)), None
    return None, _SHIM_PARENT.set(span)


def _deactivate(tokens: tuple[Any, Any]) -> None:
    detach(tokens[0])
    if tokens[1] is not None:
        with contextlib.suppress(ValueError):
            _SHIM_PARENT.reset(tokens[1])


def _is_jsonrpc(channel: Any) -> bool:
    """Whether requests sent on this outbound channel go through ``JSONRPCDispatcher`` (the SDK spans them)."""
    return isinstance(channel, jrd.JSONRPCDispatcher) or isinstance(
        getattr(channel, "_dispatcher", None), jrd.JSONRPCDispatcher
    )


@contextlib.contextmanager
def _handed_over(call: OutboundCall, tracer: Any, name: str, *, kind: SpanKind, attributes: Any = None,
                 **kwargs: Any) -> Iterator[Any]:
    """The SDK's own CLIENT span (its tracer, name and attributes), handed to ``call`` and left open until the
    response is measured."""
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes, end_on_exit=False, **kwargs) as span:
        call.start(span)
        yield span


@contextlib.asynccontextmanager
async def _server_pipe(streams: Any) -> AsyncIterator[Any]:
    """``stdio_server()``'s streams, marked as a pipe for the middleware (memory and stdio streams look alike)."""
    token = _SERVER_TRANSPORT.set("pipe")
    try:
        async with streams as opened:
            yield opened
    finally:
        with contextlib.suppress(ValueError):
            _SERVER_TRANSPORT.reset(token)


class OutboundCall:
    """One request this process sends (a client call, or a server->client request) and the span it is
    measured on: the SDK's own CLIENT span when it records (JSON-RPC), else an outer instrumentation's MCP
    CLIENT span, else the shim's own. ``start`` runs once: inside the SDK's span (handed over by the
    ``otel_span`` patch) or, where the SDK opens none, before the call."""

    def __init__(
        self,
        shim: V2Shim,
        side: Side,
        method: str,
        params: Any,
        key: str | None,
        attrs: dict[str, Any],
        input_attrs: Mapping[str, Any] | None = None,
        server: str | None = None,
    ):
        self.shim, self.side, self.method, self.params, self.key = shim, side, method, params, key
        #: The server's name where the sender knows it (a client session's, once negotiated): a budget keyed by
        #: the conversation gets it with its first message.
        self.server = server
        self.attrs = attrs
        self.input_attrs = input_attrs  # e.g. server.address/port of an HTTP transport, set with the estimate
        self.tool = called_tool(method, params)
        self.span: Span | None = None
        self.own: Span | None = None
        self.sdk: Span | None = None  # the SDK's span, whose end waits for the response's measurement
        self.started = False
        #: Guard events decided before the span exists (replayed onto it in start()).
        self.pending: PendingEvents | None = None
        #: The protocol version the session negotiated (shapes a refusal), where the caller knows it.
        self.version: str | None = None
        self._tokens: tuple[Any, Any] = (None, None)
        self._outer: Span | None = None
        try:
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.CLIENT, method):
                self._outer = current  # an outer MCP instrumentation already traces this call
        except Exception:
            shim.recorder.fault("span")

    def start(self, sdk_span: Span | None = None, *, activate: bool = False) -> None:
        if self.started:
            return
        self.started = True
        rec = self.shim.recorder
        try:
            self.sdk = sdk_span
            if sdk_span is not None and sdk_span.is_recording():
                self.span = sdk_span
                rec.set_attributes(sdk_span, self.attrs)  # name, scope and provider stay the SDK's
            elif self._outer is not None:
                self.span = self._outer
            else:
                # No SDK span, or one that does not record (a no-op or dropping tracer): ours, never injected.
                name = span_name(self.method, self.params)
                self.own = self.span = rec.start_span(name, SpanKind.CLIENT, self.attrs, context=_parent_context())
                if activate:
                    self._tokens = _activate(self.own)
            if self.pending is not None:
                self.pending.replay(self.span)
        except Exception:
            rec.fault("span")
        rec.record_input(self.span, self.side, self.method, self.params, self.key, attributes=self.input_attrs,
                         server=self.server)

    def end(self, extra: Mapping[str, Any] | None = None) -> None:
        rec = self.shim.recorder
        if extra:
            rec.set_attributes(self.span, extra)
        _deactivate(self._tokens)
        rec.end_span(self.own)
        rec.end_span(self.sdk)

    async def send(self, send: Callable[[], Awaitable[Any]], jsonrpc: bool) -> Any:
        """Run ``send`` measured: the input once the span is known, the result or the error after it.

        Guards on: the request is guarded before it is sent (a refusal answers at once; the request is never
        sent) and the result before it is handed back."""
        rec = self.shim.recorder
        guarded = rec.guard_active and rec.guards(self.side)
        if guarded:
            self.pending = PendingEvents()
            # PendingEvents stands in for the span that is not open yet (the guard adds events to it, nothing else).
            refusal = rec.guard_request(cast(Span, self.pending), self.side, self.method, self.params, self.key)
            if refusal is not None:
                self.start()
                refusal = _envelope(refusal, self.version)
                rec.record_output(self.span, self.side, self.method, self.tool, result=refusal, session_id=self.key)
                return refusal
        if not jsonrpc:
            self.start(activate=True)
        # Over JSON-RPC the SDK's otel_span hands its span over; a direct send must not pass the slot on
        # to a JSON-RPC request made while it runs (an in-process handler's own outbound calls).
        capture = _CAPTURE.set(self if jsonrpc else None)
        t0 = time.perf_counter()
        try:
            try:
                result = await send()
            except MCPError as exc:
                self.start()  # the SDK failed before opening its span (e.g. connection closed)
                rec.record_output(self.span, self.side, self.method, self.tool, error=exc.error, session_id=self.key,
                                  started=t0)
                raise
            except Exception as exc:
                self.start()
                if self.own is not None:
                    rec.record_exception(self.own, exc)  # the SDK's span records its own exception
                raise
            except BaseException:
                if self.method == _LISTEN:  # the client ended the stream: the call's duration and end still count
                    self.start()
                    rec.record_output(self.span, self.side, self.method, None, result={}, session_id=self.key,
                                      started=t0)
                raise
            self.start()
            try:  # converting the result is part of measuring it: inside the never-break boundary
                wire = wire_dict(result)
            except Exception:
                rec.fault("estimate")
                return result
            if not guarded:
                rec.record_output(self.span, self.side, self.method, self.tool, result=wire, session_id=self.key,
                                  started=t0)
                return result
            _, out = rec.record_guarded_output(
                self.span, self.side, self.method, self.tool, wire, self.key, started=t0,
                arguments=self.params.get("arguments") if self.tool is not None else None,
            )
            try:
                return deliver(result, wire, out)
            except Exception:
                rec.fault("guard")
                return result
        finally:
            with contextlib.suppress(ValueError):
                _CAPTURE.reset(capture)


def _envelope_version(params: Any) -> str | None:
    """The protocol version a 2026-07-28 request carries in its ``_meta`` (server/discover's before it is
    negotiated)."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    version = meta.get(_VERSION_META_KEY) if isinstance(meta, Mapping) else None
    return version if isinstance(version, str) else None


def _error_data(exc: Exception) -> Any:
    """The JSON-RPC error the SDK answers a handler exception with (its own mapping; code 0 otherwise)."""
    try:
        error = jrd.handler_exception_to_error_data(exc)
    except Exception:
        error = None
    return error if error is not None else {"code": 0, "message": str(exc)}



def _request_inner(ctx: Any) -> tuple[Any, Any]:
    """(the session's request outbound, the 2026 wrapper's inner context or None); read once per request."""
    outbound = getattr(ctx.session, "_request_outbound", None)
    return outbound, getattr(outbound, "_inner", None)


def _transport_kind(outbound: Any, inner: Any) -> str | None:
    # The 2026 wrapper's own .transport builds a copy on every read (dataclasses.replace): read the inner one.
    transport = getattr(inner if inner is not None else outbound, "transport", None)
    return getattr(transport, "kind", None)


def _per_client_anchor(connection: Any, inner: Any) -> Any:
    """What stays the same across the requests of one client when every request has its own Connection
    (2026-07-28 protocol), else None (a handshake-era Connection is itself the session)."""
    outbound = getattr(connection, "outbound", None)
    if type(outbound).__name__ == "NotifyOnlyOutbound":  # modern protocol over one stream (stdio, memory)
        return getattr(outbound, "_outbound", outbound)  # the stream's dispatcher: its run ends with the stream
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
        if method == "tools/list" and _SCHEMA_LOOKUP.get():
            return await call_next(ctx)  # the SDK's own listing, validating a call's headers: not traffic
        span, own, session_key = None, None, None
        request = ctx.request_id is not None  # notifications never enter the model's context
        extra: dict[str, Any] = {}
        try:
            session_id, session_key = shim.server_session(ctx)
            if not request:
                session_key = None
            elif session_key is None or not rec.session_first:  # the session key unless budget.key says more
                session_key = shim.server_key(ctx, session_key)
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.SERVER, method):
                span = current
            else:
                # The SDK's OpenTelemetryMiddleware was removed (or is not recording): open our own.
                own = span = rec.start_span(
                    span_name(method, params),
                    SpanKind.SERVER,
                    call_attributes(method, params, request_id=ctx.request_id),
                    context=_parent_context(ctx.meta),
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
            rec.fault("span")
        # One set_attributes for the request side: the adapter's attributes ride with the estimate.
        server = self._server
        guarded = False
        refusal: dict[str, Any] | None = None
        depth_token: contextvars.Token[int | None] | None = None
        if rec.guard_active and request:  # the guards off: this one check
            guarded = rec.guards("server")
            if guarded:  # on the session's budget before this request is added to it
                refusal = rec.guard_request(span, "server", method, params, session_key, server=server)
            try:  # whichever sides guard, the handler's own requests (nested calls, sampling) carry one more
                depth_token = _DEPTH.set(chain_depth(params))
            except Exception:
                rec.fault("guard")
        # The request's span attributes are held and set with the response's: one set_attributes per call.
        held: dict[str, Any] = {}
        rec.record_input(span, "server", method, params, session_key, attributes=extra, server=server, hold=held,
                         budgeted=request)
        tool = called_tool(method, params)
        tokens = _activate(own)
        # What the requests this handler sends (sampling, elicitation) are measured with (see server_send).
        server_call = _SERVER_CALL.set((session_key, extra, ctx.protocol_version))
        started = time.perf_counter()
        try:
            if refusal is not None:  # answered by the guard: the handler is not called
                refusal = _envelope(refusal, ctx.protocol_version)
                rec.record_output(span, "server", method, tool, result=refusal, session_id=session_key,
                                  started=started, server=server, held=held)
                return refusal
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                if request:  # a notification has no response
                    rec.record_output(span, "server", method, tool, error=exc.error, session_id=session_key,
                                      started=started, server=server, held=held)
                raise
            except Exception as exc:
                if own is not None:
                    rec.record_exception(own, exc)
                if request:  # the SDK answers with a JSON-RPC error: it enters the context too
                    error = _error_data(exc)
                    rec.record_output(span, "server", method, tool, error=error, session_id=session_key,
                                      started=started, server=server, held=held)
                raise
            except BaseException:
                if method == _LISTEN:  # the client ended the stream: the call's duration and end still count
                    rec.record_output(span, "server", method, None, result={}, session_id=session_key,
                                      started=started, server=server, held=held)
                raise
            if request:
                try:  # converting the result is part of measuring it: inside the never-break boundary
                    wire = wire_dict(result)
                except Exception:
                    rec.fault("estimate")
                    return result
                if not guarded:
                    rec.record_output(span, "server", method, tool, result=wire, session_id=session_key,
                                      started=started, server=server, held=held)
                    return result
                _, out = rec.record_guarded_output(
                    span, "server", method, tool, wire, session_key, started=started, server=server,
                    arguments=params.get("arguments") if tool is not None else None, held=held,
                )
                try:
                    return deliver(result, wire, out)
                except Exception:
                    rec.fault("guard")
            return result
        finally:
            if depth_token is not None:
                with contextlib.suppress(ValueError):
                    _DEPTH.reset(depth_token)
            try:  # noqa: SIM105 - contextlib.suppress builds an object and makes two calls on every request
                _SERVER_CALL.reset(server_call)
            except ValueError:
                pass
            if held:  # no response recorded (a notification, a cancelled call, a fault): the request's own
                rec.set_attributes(span, held)
            if tokens[0] is not None or tokens[1] is not None:
                _deactivate(tokens)
            if own is not None:
                rec.end_span(own)


class DispatcherProxy:
    """Stands in for a ClientSession's dispatcher; everything not overridden is delegated."""

    def __init__(self, inner: Any, shim: V2Shim, session: ClientSession, transport: tuple[str, Any] | None):
        self._inner = inner
        self._shim = shim
        self._session = weakref.ref(session)
        self._direct = not isinstance(inner, jrd.JSONRPCDispatcher)
        self._transport = None if self._direct else transport
        self._key = uuid.uuid4().hex  # the session budget key: stable for this ClientSession
        self._propagate = shim.recorder.config.budget.propagate
        self._server: str | None = None
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

    def _budget_key(self, params: Any) -> str:
        """The session's key, unless ``budget.key`` puts another source first (read from this request and the
        current context's baggage, as the server reads it); the session's when no source is present (a client
        always knows its session)."""
        rec = self._shim.recorder
        if rec.session_first:
            return self._key
        return rec.budget_key(ClientFacts(session=self._key, params=params)) or self._key

    def _server_name(self) -> str | None:
        """The server's name once the session negotiated (initialize's serverInfo, the 2026 discover stamp)."""
        if self._server is None:
            session = self._session()
            name = getattr(getattr(session, "server_info", None), "name", None)
            self._server = name if isinstance(name, str) and name else None
        return self._server

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> Any:
        shim = self._shim
        if not shim.active:
            return await self._inner.send_raw_request(method, params, opts)
        rec = shim.recorder
        if rec.guard_active:
            try:  # a call a served request's handler makes: one deeper in the chain
                params = _deeper(params)
            except Exception:
                rec.fault("guard")
        if self._propagate:
            try:  # budget.propagate: the conversation reaches the server where nothing else carries it
                params = with_conversation_baggage(params)
            except Exception:
                rec.fault("budget")
        attrs: dict[str, Any] = {}
        try:
            attrs = call_attributes(
                method,
                params,
                protocol_version=self._protocol_version() or _envelope_version(params),
                transport=self._transport[0] if self._transport else None,
            )
        except Exception:
            rec.fault("span")
        call = OutboundCall(shim, "client", method, params, self._budget_key(params), attrs, self._http,
                            self._server_name())
        call.version = self._protocol_version()
        try:
            result = await call.send(lambda: self._inner.send_raw_request(method, params, opts), not self._direct)
            if method == "initialize" and isinstance(result, Mapping):
                shim.recorder.set_attributes(call.span, {A_PROTOCOL: str(result.get("protocolVersion", ""))})
            return result
        finally:
            call.end(self._span_extra())

    def _span_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        version = self._protocol_version()
        session_id = self._session_id()  # known after the initialize response; none on 2026-07-28
        if session_id and version not in _MODERN_VERSIONS:
            extra[A_SESSION_ID] = session_id
        if version:
            extra[A_PROTOCOL] = version
        return extra

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> None:
        if self._shim.active:  # off the budget; the session names its server
            self._shim.recorder.record_input(None, "client", method, params, self._key, budgeted=False)
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
                shim.recorder.record_input(None, "client", method, params, self._key, budgeted=False)
            return await on_notify(dctx, method, params)

        try:
            return await self._inner.run(wrapped_on_request, wrapped_on_notify, on_notify_intercept, **kwargs)
        finally:
            shim.recorder.end_session("client", self._key)

    async def _inbound_request(self, on_request: Any, dctx: Any, method: str, params: Any) -> Any:
        """A server->client request (sampling, elicitation, roots): a SERVER span on the client side."""
        rec = self._shim.recorder
        span: Span | None = None
        tokens: tuple[Any, Any] = (None, None)
        try:
            # Over memory streams the ambient context is the sender's: take the parent from _meta instead.
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            attrs = call_attributes(method, params, request_id=getattr(dctx, "request_id", None))
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=_parent_context(meta))
            tokens = _activate(span)
        except Exception:
            rec.fault("span")
        key = self._budget_key(params)
        rec.record_input(span, "client", method, params, key)
        started = time.perf_counter()
        try:
            try:
                result = await on_request(dctx, method, params)
            except MCPError as exc:
                rec.record_output(span, "client", method, None, error=exc.error, session_id=key, started=started)
                raise
            except Exception as exc:
                rec.record_exception(span, exc)
                raise
            if not (rec.guard_active and rec.guards("client")):
                rec.record_output(span, "client", method, None, result=wire_dict(result), session_id=key,
                                  started=started)
                return result
            try:
                wire = wire_dict(result)
            except Exception:
                rec.fault("estimate")
                return result
            _, out = rec.record_guarded_output(span, "client", method, None, wire, key, started=started)
            try:  # the answer the client sends back (sampling, elicitation), as the guards left it
                return deliver(result, wire, out)
            except Exception:
                rec.fault("guard")
                return result
        finally:
            _deactivate(tokens)
            rec.end_span(span)


class V2Shim:
    """The installed patches for one recorder; ``uninstall`` restores the SDK exactly."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self.active = False
        self._hooks = Hooks()
        self._servers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sessions: weakref.WeakSet[ClientSession] = weakref.WeakSet()
        self._connection_keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: id(anchor) -> (weak reference to it, budget key, its finalizer): the 2026 protocol's per-client anchors.
        self._anchor_keys: dict[int, tuple[weakref.ref[Any], str, weakref.finalize[Any, Any]]] = {}
        self._anchor_sweep_at = 256
        sides = recorder.config.instrumentation.sides  # the sides this process instruments
        self._client, self._server = "client" in sides, "server" in sides

    # -------------------------------------------------------------- install / uninstall

    def install(self) -> None:
        hooks = self._hooks
        stdio_server = server_stdio.stdio_server
        hooks.wrap(Server, "__init__", self._server_init)
        hooks.wrap(ClientSession, "__init__", self._session_init)
        hooks.wrap(StreamableHTTPTransport, "__init__", self._http_init)
        hooks.wrap(jrd, "otel_span", self._otel_span)
        hooks.wrap(ServerSession, "send_request", self._server_send_request)
        hooks.wrap(Connection, "send_raw_request", self._connection_send)
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

    # Each hook is a wrapt wrapper, (wrapped, instance, args, kwargs); once uninstalled (``active`` false) a hook
    # still reachable through a wrapper another library put over ours passes the call straight through.

    def _server_init(self, wrapped: Any, server: Server, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active and self._server:
            self.add_middleware(server)

    def _session_init(
        self, wrapped: Any, session: ClientSession, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        wrapped(*args, **kwargs)
        if self.active and self._client:
            self.wrap_session(session)

    def _http_init(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            # The transport's context-manager body runs in the caller's context, so the session built next
            # in this task sees it.
            _CLIENT_TRANSPORT.set(("tcp", transport))

    def _otel_span(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = _CAPTURE.get() if self.active and kwargs.get("kind") is SpanKind.CLIENT else None
        tracer = getattr(sdk_otel, "_tracer", None)
        if call is None or tracer is None:
            return wrapped(*args, **kwargs)
        _CAPTURE.set(None)  # single use: never leaks into a nested send or a handler
        return _handed_over(call, tracer, *args, **kwargs)

    async def _spawn(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        process = await wrapped(*args, **kwargs)
        if self.active:
            _CLIENT_TRANSPORT.set(("pipe", None))
        return process

    def _stdio_server(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _server_pipe(streams) if self.active else streams

    async def _schema_lookup(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _SCHEMA_LOOKUP.set(True)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            with contextlib.suppress(ValueError):
                _SCHEMA_LOOKUP.reset(token)

    def _dispatcher_stopped(self, wrapped: Any, dispatcher: Any, args: tuple[Any, ...],
                            kwargs: dict[str, Any]) -> Any:
        """A stream (its JSON-RPC dispatcher's run ending: EOF, cancellation) or an in-process pair (closed as the
        client leaves) serving the 2026-07-28 protocol is gone: the budget of the client it carried ends now, not
        when the anchor is collected."""
        try:
            return wrapped(*args, **kwargs)
        finally:
            if self._anchor_keys:
                try:
                    self._end_anchor(getattr(dispatcher, "_transport_ctx", dispatcher))
                except Exception:
                    self.recorder.fault("budget")

    async def _server_send_request(
        self, wrapped: Any, session: ServerSession, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not (self.active and self._server):
            return await wrapped(*args, **kwargs)
        return await self._server_request(wrapped, session, *args, **kwargs)

    async def _server_request(self, send: Any, session: ServerSession, request: Any, result_type: Any,
                              *args: Any, **kw: Any) -> Any:
        method, params, jsonrpc = "unknown", None, True
        try:
            data = wire_dict(request)
            method, params = str(data.get("method", "unknown")), data.get("params")
            metadata = kw.get("metadata", args[1] if len(args) > 1 else None)
            # The channel the SDK picks: the request's own when related to it, else the connection's.
            related = getattr(metadata, "related_request_id", None)
            channel = session._request_outbound if related is not None else session._connection.outbound
            jsonrpc = _is_jsonrpc(channel)
        except Exception:
            self.recorder.fault("span")
        if self.recorder.guard_active and _DEPTH.get() is not None:
            try:  # the handler's request (sampling, elicitation) carries the next chain depth
                deeper = _deeper(params)
                request = type(request).model_validate({**data, "params": deeper}, by_name=False)
                params = deeper
            except Exception:
                self.recorder.fault("guard")
        return await self.server_send(lambda: send(request, result_type, *args, **kw), method, params, jsonrpc)

    async def _connection_send(
        self, wrapped: Any, connection: Connection, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not (self.active and self._server):
            return await wrapped(*args, **kwargs)
        return await self._connection_request(wrapped, connection, *args, **kwargs)

    async def _connection_request(self, send: Any, connection: Connection, method: str, params: Any,
                                  *args: Any, **kw: Any) -> Any:
        jsonrpc = _is_jsonrpc(getattr(connection, "outbound", None))
        if self.recorder.guard_active:
            try:
                params = _deeper(params)
            except Exception:
                self.recorder.fault("guard")
        return await self.server_send(lambda: send(method, params, *args, **kw), method, params, jsonrpc)

    async def server_send(self, send: Callable[[], Awaitable[Any]], method: str, params: Any, jsonrpc: bool) -> Any:
        """A request the server sends (sampling, elicitation, roots, ping): side ``server``, on the budget of
        the client session whose handler sends it."""
        attrs: dict[str, Any] = {}
        key: str | None = None
        try:
            server_call = _SERVER_CALL.get()
            attrs = call_attributes(method, params)
            if server_call is not None:
                key, extra, version = server_call
                attrs.update((k, v) for k, v in extra.items() if k in _SENDS_KEYS)
                if version:
                    attrs[A_PROTOCOL] = version
        except Exception:
            self.recorder.fault("span")
        call = OutboundCall(self, "server", method, params, key, attrs)
        try:
            return await call.send(send, jsonrpc)
        finally:
            call.end()

    def uninstall(self) -> None:
        self.active = False
        self._hooks.remove()
        for server in list(self._servers):
            self.remove_middleware(server)
        for session in list(self._sessions):
            proxy = session.__dict__.get("_dispatcher")
            if isinstance(proxy, DispatcherProxy) and proxy._shim is self:
                session._dispatcher = proxy._inner
        self._sessions = weakref.WeakSet()

    # -------------------------------------------------------------- server side

    def instrument_server(self, server: Any) -> None:
        """A server built before ``install`` (a low-level Server or an MCPServer) gets our middleware too."""
        if self._server:
            self.add_middleware(server)

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
            self.recorder.fault("install")

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
        if connection is None:
            return None, None
        outbound, inner = _request_inner(ctx)
        if _transport_kind(outbound, inner) == "streamable-http":
            return None, None  # stateless HTTP: nothing identifies the client across requests
        anchor = _per_client_anchor(connection, inner)
        if anchor is not None:
            return None, self._anchor_key(anchor)
        key = self._connection_keys.get(connection)
        if key is None:
            key = self._connection_keys[connection] = uuid.uuid4().hex
            self._on_connection_end(connection, key)
        return None, key

    def server_key(self, ctx: Any, session: str | None) -> str | None:
        """A served request's budget key from ``budget.key``: ``session`` (see :meth:`server_session`), the
        request's ``_meta`` and HTTP headers, the SDK's authenticated principal, the client's identity."""
        connection = getattr(ctx.session, "_connection", None)

        def client_info() -> Any:
            return getattr(getattr(connection, "client_params", None), "client_info", None)

        return self.recorder.budget_key(ServerFacts(session, ctx.params, ctx.request, client_info))

    def _on_connection_end(self, connection: Any, key: str) -> None:
        # Every SDK driver unwinds the Connection's exit stack when the connection ends (its
        # per-connection cleanup hook); garbage collection is only the fallback.
        exit_stack = getattr(connection, "exit_stack", None)
        if exit_stack is not None:
            exit_stack.callback(self.recorder.end_session, "server", key)
        else:
            weakref.finalize(connection, self.recorder.end_session_soon, "server", key)

    def _anchor_key(self, anchor: Any) -> str:
        """One budget key per client anchor; the session ends when the anchor's dispatcher stops running (the
        stream closed, the in-process pair closed), else when the anchor is collected or by idle expiry."""
        entry = self._anchor_keys.get(id(anchor))
        if entry is not None and entry[0]() is anchor:
            return entry[1]
        key = uuid.uuid4().hex
        try:
            ref = weakref.ref(anchor)
        except TypeError:
            return key  # not weak-referenceable: cannot follow it; the idle timeout still bounds the budget
        if len(self._anchor_keys) >= self._anchor_sweep_at:  # forget anchors gone since (ids are reused)
            self._anchor_keys = {i: e for i, e in self._anchor_keys.items() if e[0]() is not None}
            self._anchor_sweep_at = max(256, 2 * len(self._anchor_keys))
        # The fallback: runs when the anchor is collected, inside whatever code allocated then: it only queues.
        finalizer = weakref.finalize(anchor, self.recorder.end_session_soon, "server", key)
        self._anchor_keys[id(anchor)] = (ref, key, finalizer)
        return key

    def _end_anchor(self, anchor: Any) -> None:
        entry = self._anchor_keys.get(id(anchor))
        if entry is None or entry[0]() is not anchor:
            return
        self._anchor_keys.pop(id(anchor), None)
        entry[2].detach()
        self.recorder.end_session("server", entry[1])

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
            self.recorder.fault("install")


def install(recorder: TokenRecorder) -> V2Shim:
    """Hook mcp 2.x for ``recorder``; all or nothing. The caller owns the shim: its ``uninstall()`` restores the
    SDK, its ``instrument_server(server)`` adds a server built earlier."""
    return installed(V2Shim(recorder))


__all__ = ["DispatcherProxy", "TokenMiddleware", "V2Shim", "install"]

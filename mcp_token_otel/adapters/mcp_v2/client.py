"""mcp 2.x client side: each ``ClientSession``'s dispatcher behind a proxy that measures every request it sends
(``server/discover`` and ``subscriptions/listen`` included), every request the server sends it (sampling,
elicitation, roots) and every notification.

On ``JSONRPCDispatcher`` the SDK opens its own CLIENT span (``MCP send ...``): ``jsonrpc_dispatcher.otel_span`` is
swapped for a version that opens that same span with the SDK's own tracer and hands it to the request being
measured, which enriches it and ends it once the response is measured. Only where the SDK makes no span
(``DirectDispatcher``, in process) or its span does not record (a no-op tracer, or a sampler that drops it) does
the shim open its own CLIENT span. The client keys its budget by a uuid4 per ClientSession and reports the HTTP
transport's ``mcp-session-id`` as ``mcp.session.id`` once known.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import mcp.shared.jsonrpc_dispatcher as jrd
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from ...core.protocol import is_modern, request_version
from ...recorder import Side
from ...semconv import A_PROTOCOL, A_SESSION_ID, call_attributes, http_attributes, span_name
from .._common import is_mcp_span
from ..key_facts import ClientFacts, with_conversation_baggage
from . import context as cx

if TYPE_CHECKING:
    from .hooks import V2Shim


class OutboundCall:
    """One request this process sends (a client call, or a server->client request) and the span it is measured on:
    the SDK's own CLIENT span when it records (JSON-RPC), else an outer instrumentation's MCP CLIENT span, else
    the shim's own. ``start`` runs once: inside the SDK's span (handed over by the ``otel_span`` patch) or, where
    the SDK opens none, before the call."""

    def __init__(self, shim: V2Shim, side: Side, method: str, params: Any, key: str | None,
                 attrs: dict[str, Any], input_attrs: Mapping[str, Any] | None = None, server: str | None = None,
                 version: str | None = None, transport: str | None = None) -> None:
        self.shim = shim
        self.method = method
        self.params = params
        self.attrs = attrs
        self.input_attrs = input_attrs  # e.g. server.address/port of an HTTP transport, set with the estimate
        #: The server's name where the sender knows it (a client session's, once negotiated).
        self.call = shim.recorder.begin(side, method, params, key, server=server, version=version)
        self.call.transport = transport
        self.own: Span | None = None
        self.sdk: Span | None = None  # the SDK's span, whose end waits for the response's measurement
        self.started = False
        self._tokens: tuple[Any, Any] = (None, None)
        self._outer: Span | None = None
        try:
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.CLIENT, method):
                self._outer = current  # an outer MCP instrumentation already traces this call
        except Exception:
            shim.recorder.fault("span")

    @property
    def span(self) -> Span | None:
        return self.call.span

    def start(self, sdk_span: Span | None = None, *, activate: bool = False) -> None:
        if self.started:
            return
        self.started = True
        rec = self.shim.recorder
        span: Span | None = None
        try:
            self.sdk = sdk_span
            if sdk_span is not None and sdk_span.is_recording():
                span = sdk_span
                rec.set_attributes(sdk_span, self.attrs)  # name, scope and provider stay the SDK's
            elif self._outer is not None:
                span = self._outer
            else:
                # No SDK span, or one that does not record (a no-op or dropping tracer): ours, never injected.
                name = span_name(self.method, self.params)
                self.own = span = rec.start_span(name, SpanKind.CLIENT, self.attrs, context=cx.parent_context())
                if activate:
                    self._tokens = cx.activate(self.own)
        except Exception:
            rec.fault("span")
        self.call.open(span, self.input_attrs)

    def end(self, extra: Mapping[str, Any] | None = None) -> None:
        rec = self.shim.recorder
        if extra:
            self.call.held.update(extra)
        self.call.close()
        cx.deactivate(self._tokens)
        rec.end_span(self.own)
        rec.end_span(self.sdk)

    async def send(self, send: Callable[[], Awaitable[Any]], jsonrpc: bool) -> Any:
        """Run ``send`` measured. Guards on: the request is guarded before it is sent (a refusal answers at once;
        the request is never sent) and the result before it is handed back."""
        call = self.call
        rec = self.shim.recorder
        if rec.guard_active and rec.guards(call.side) and call.guard() is not None:
            self.start()
            return call.refused()
        if not jsonrpc:
            self.start(activate=True)
        # Over JSON-RPC the SDK's otel_span hands its span over; a direct send must not pass the slot on to a
        # JSON-RPC request made while it runs (an in-process handler's own outbound calls).
        capture = cx.CAPTURE.set(self if jsonrpc else None)
        try:
            try:
                result = await send()
            except MCPError as exc:
                self.start()  # the SDK failed before opening its span (e.g. connection closed)
                call.error(exc.error)
                raise
            except Exception as exc:
                self.start()
                call.failed(exc, on_span=self.own is not None)  # the SDK's span records its own exception
                raise
            except BaseException:
                if self.method == cx.LISTEN:  # the client ended the stream: the call's duration and end still count
                    self.start()
                    call.cancelled()
                raise
            self.start()
            return call.result(result)
        finally:
            cx.reset(cx.CAPTURE, capture)


@contextlib.contextmanager
def handed_over(call: OutboundCall, tracer: Any, name: str, *, kind: SpanKind, attributes: Any = None,
                **kwargs: Any) -> Iterator[Any]:
    """The SDK's own CLIENT span (its tracer, name and attributes), handed to ``call`` and left open until the
    response is measured."""
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes, end_on_exit=False, **kwargs) as span:
        call.start(span)
        yield span


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
                params = cx.deeper(method, params)
            except Exception:
                rec.fault("guard")
        if self._propagate:
            try:  # budget.propagate: the conversation reaches the server where nothing else carries it
                params = with_conversation_baggage(params)
            except Exception:
                rec.fault("budget")
        version = self._protocol_version()
        attrs: dict[str, Any] = {}
        try:
            attrs = call_attributes(method, params, protocol_version=version or request_version(params),
                                    transport=self._transport[0] if self._transport else None)
        except Exception:
            rec.fault("span")
        call = OutboundCall(shim, "client", method, params, self._budget_key(params), attrs, self._http,
                            self._server_name(), version, self._transport[0] if self._transport else None)
        try:
            return await call.send(lambda: self._inner.send_raw_request(method, params, opts), not self._direct)
        finally:
            call.end(self._span_extra())

    def _span_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        version = self._protocol_version()
        session_id = self._session_id()  # known after the initialize response; none on 2026-07-28
        if session_id and not is_modern(version):
            extra[A_SESSION_ID] = session_id
        if version:
            extra[A_PROTOCOL] = version
        return extra

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> None:
        if self._shim.active:  # off the budget; the session names its server
            self._shim.recorder.notify("client", method, params, self._key)
        return await self._inner.notify(method, params, opts)

    async def run(self, on_request: Any, on_notify: Any, on_notify_intercept: Any = None, **kwargs: Any) -> Any:
        shim = self._shim

        async def wrapped_on_request(dctx: Any, method: str, params: Any) -> Any:
            if not shim.active:
                return await on_request(dctx, method, params)
            return await self._inbound_request(on_request, dctx, method, params)

        async def wrapped_on_notify(dctx: Any, method: str, params: Any) -> Any:
            if shim.active:
                shim.recorder.notify("client", method, params, self._key)
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
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=cx.parent_context(meta))
            tokens = cx.activate(span)
        except Exception:
            rec.fault("span")
        call = rec.begin("client", method, params, self._budget_key(params))
        call.open(span)
        try:
            try:
                result = await on_request(dctx, method, params)
            except MCPError as exc:
                call.error(exc.error)
                raise
            except Exception as exc:
                call.failed(exc)
                raise
            return call.result(result)  # the answer the client sends back, as the guards left it
        finally:
            call.close()
            cx.deactivate(tokens)
            rec.end_span(span)

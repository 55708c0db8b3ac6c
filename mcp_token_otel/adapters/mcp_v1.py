"""mcp 1.x hooks (verified against mcp 1.30; see docs/instrumentation-mcp1.md).

mcp 1.x emits no spans of its own, so the shim opens both sides, with the same names, attributes and
events as the 2.x adapter:

- Outbound requests (``BaseSession.send_request``, client calls and server->client sampling alike): a
  CLIENT span, current for the call, whose W3C context is injected into ``params._meta``.
- Inbound requests (``RequestResponder.__enter__`` / ``respond`` / ``__exit__``): a SERVER span whose parent
  is extracted from the request's ``_meta``, attached so that handler code sees it.
- Notifications: outbound ones (``send_notification``) and client-side inbound ones are measured without a
  span; server-side inbound ones get a SERVER span, as in 2.x. None of them count toward a budget.

Guards (docs/guardrails.md; only when ``recorder.guard_active``): the request-side decision is taken where the
request is sent (``send_request``) or entered (``RequestResponder.__enter__``, before it is recorded); a refused
``tools/call`` is answered with the refusal instead of being sent, or (server side) instead of running the
handler (``Server._handle_request``). Results go through ``record_guarded_output`` where they are measured and
are validated back into their model type only when the guard changed them. The server side keeps an incoming
request's chain depth in a context variable while its handler runs; the ``tools/call`` and
``sampling/createMessage`` requests sent meanwhile carry depth + 1.

Sessions: a ``_SessionInfo`` per session object (``BaseSession.__init__`` is wrapped), holding the budget
key, the transport and the negotiated protocol version. The budget ends when the session's
``async with`` exits (``BaseSession.__aexit__``), never on garbage collection.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.client.stdio as client_stdio
import mcp.server.stdio as server_stdio
import mcp.shared.memory as shared_memory
from mcp.client.session import ClientSession
from mcp.client.streamable_http import StreamableHTTPTransport
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.exceptions import McpError
from mcp.shared.session import BaseSession, RequestResponder
from mcp.types import CallToolResult, ErrorData, ServerResult
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind
from pydantic import BaseModel, RootModel

from ..core.guard import chain_depth, with_depth
from ..core.measure import called_tool
from ..recorder import Side, TokenRecorder
from ..semconv import A_PROTOCOL, A_SESSION_ID, call_attributes, http_attributes, span_name
from ._common import MARK as _MARK
from ._common import Hooks, argument, detach, extract_parent, installed, is_mcp_span, wire_dict
from .budget_keys import ClientFacts, ServerFacts, with_conversation_baggage

logger = logging.getLogger(__name__)

_SESSION_HEADER = "mcp-session-id"
#: Attribute on a RequestResponder: the parent context taken from trace context this shim injected.
_PARENT = "_mcp_token_otel_parent"
#: Client: the transport opened last in this task, ("tcp", StreamableHTTPTransport) or ("pipe", None).
_CLIENT_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_v1_client_transport", default=None
)
#: Server: set around a transport's streams, which the ServerSession built next in this task reads.
_SERVER_TRANSPORT: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "mcp_token_v1_server_transport", default=None
)
#: Inside ``create_client_server_memory_streams``: the sessions built there talk to a peer in this process.
_IN_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_token_v1_in_process", default=False)
#: The chain depth of the inbound request whose handler runs in this context (guards on); None: not in a handler.
_DEPTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("mcp_token_v1_chain_depth", default=None)
#: Requests a handler sends that continue its chain: they carry the handler's depth + 1.
_CHAINED = frozenset({"tools/call", "sampling/createMessage"})
#: Trace-context keys the shim writes into ``_meta``.
_TRACE_KEYS = ("traceparent", "tracestate", "baggage")


class _Injected:
    """What the shim wrote into requests, by ``traceparent`` (its span id makes it unique), so that a
    receiving session in this process takes its parent from it and removes it before any handler sees it.
    Bounded: entries for peers in other processes (``propagate_context: always``) are dropped oldest first."""

    def __init__(self, limit: int = 4096) -> None:
        self._entries: OrderedDict[str, tuple[dict[str, str], bool]] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, carrier: dict[str, str], meta_was_absent: bool) -> None:
        with self._lock:
            self._entries[carrier["traceparent"]] = (carrier, meta_was_absent)
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)

    def take(self, meta: Any) -> tuple[dict[str, str], bool] | None:
        """The entry whose keys ``meta`` carries unchanged, removed from the record; else None."""
        extra = getattr(meta, "__pydantic_extra__", None)
        if not isinstance(extra, dict):
            return None
        value = extra.get("traceparent")
        if not isinstance(value, str):
            return None
        with self._lock:
            entry = self._entries.get(value)
            if entry is None or any(extra.get(k) != v for k, v in entry[0].items()):
                return None
            del self._entries[value]
        return entry


@dataclass
class _SessionInfo:
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


@dataclass
class _InboundState:
    """What ``__enter__`` leaves on a RequestResponder for ``respond`` and ``__exit__``."""

    span: Span | None
    token: Any
    side: Side
    method: str
    tool: str | None
    key: str | None
    info: _SessionInfo | None
    responded: bool = False
    started: float | None = None  # time.perf_counter() when the request came in (operation duration)
    server: str | None = None  # the server's own name (server side)
    arguments: Any = None  # a tools/call's arguments (the cap's pagination hint reads them); guards on only
    refusal: Any = None  # the ServerResult a guard answers with instead of running the handler
    refused: bool = False  # the response is the guard's own refusal: recorded as it is, not guarded
    depth_token: Any = None  # resets _DEPTH when the handler is done


def _request_http_attributes(responder: Any) -> dict[str, Any] | None:
    """server.address/port and network.protocol.* of an HTTP request (a Starlette Request in the metadata)."""
    request = getattr(getattr(responder, "message_metadata", None), "request_context", None)
    url = getattr(request, "url", None)
    if url is None:
        return None
    scope = getattr(request, "scope", None)
    return http_attributes(url, scope.get("http_version") if isinstance(scope, Mapping) else None)


def _server_name(session: Any) -> str | None:
    """A ServerSession's server name (its InitializationOptions.server_name)."""
    name = getattr(getattr(session, "_init_options", None), "server_name", None)
    return name if isinstance(name, str) and name else None


def _side_of(session: Any) -> Side | None:
    if isinstance(session, ClientSession):
        return "client"
    if isinstance(session, ServerSession):
        return "server"
    return None  # some other BaseSession subclass: left alone


def _header_session_id(responder: Any) -> str | None:
    """The request's ``mcp-session-id`` header (streamable HTTP: a Starlette Request in the metadata)."""
    request = getattr(getattr(responder, "message_metadata", None), "request_context", None)
    headers = getattr(request, "headers", None)
    value = headers.get(_SESSION_HEADER) if headers is not None else None
    return value if isinstance(value, str) and value else None


@contextlib.asynccontextmanager
async def _with_transport(
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
async def _in_process(cm: Any) -> AsyncIterator[Any]:
    token = _IN_PROCESS.set(True)
    try:
        async with cm as streams:
            yield streams
    finally:
        with contextlib.suppress(ValueError):
            _IN_PROCESS.reset(token)


class V1Shim:
    """The installed patches for one recorder; ``uninstall`` restores the SDK exactly."""

    def __init__(self, recorder: TokenRecorder) -> None:
        self.recorder = recorder
        self.active = False
        self._hooks = Hooks()
        self._sessions: weakref.WeakKeyDictionary[Any, _SessionInfo] = weakref.WeakKeyDictionary()
        self._propagate = recorder.config.spans.propagate_context
        self._conversation = recorder.config.budget.propagate  # budget.propagate: the conversation's baggage
        self._injected = _Injected()
        self._sides = frozenset(recorder.config.instrumentation.sides)  # the sides this process instruments

    # -------------------------------------------------------------- install / uninstall

    def install(self) -> None:
        hooks = self._hooks
        hooks.wrap(BaseSession, "__init__", self._session_init)
        hooks.wrap(BaseSession, "__aexit__", self._session_aexit)
        hooks.wrap(BaseSession, "send_request", self._send_request)
        hooks.wrap(BaseSession, "send_notification", self._send_notification)
        for cls in (ClientSession, ServerSession):
            if "_received_notification" in vars(cls):  # the class's own (never turn an inherited one into one)
                hooks.wrap(cls, "_received_notification", self._received_notification)
        hooks.wrap(RequestResponder, "__init__", self._responder_init)
        hooks.wrap(RequestResponder, "__enter__", self._enter)
        hooks.wrap(RequestResponder, "__exit__", self._exit)
        hooks.wrap(RequestResponder, "respond", self._respond)
        hooks.wrap(LowLevelServer, "_handle_request", self._handle_request)
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
    # Each hook is a wrapt wrapper, (wrapped, instance, args, kwargs); once uninstalled (``active`` false) a hook
    # still reachable through a wrapper another library put over ours passes the call straight through.

    def _memory_streams(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _in_process(streams) if self.active else streams

    def _http_init(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            _CLIENT_TRANSPORT.set(("tcp", transport))

    async def _spawn(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        process = await wrapped(*args, **kwargs)
        if self.active:
            _CLIENT_TRANSPORT.set(("pipe", None))
        return process

    def _http_connect(self, wrapped: Any, transport: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _with_transport(_SERVER_TRANSPORT, ("tcp", transport), streams) if self.active else streams

    def _sse_connect(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _with_transport(_SERVER_TRANSPORT, ("tcp", None), streams) if self.active else streams

    def _stdio_server(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        streams = wrapped(*args, **kwargs)
        return _with_transport(_SERVER_TRANSPORT, ("pipe", None), streams) if self.active else streams

    # -------------------------------------------------------------- sessions

    def _side(self, session: Any) -> Side | None:
        """The session's side when ``instrumentation.sides`` lists it, else None (the session is left alone)."""
        side = _side_of(session)
        return side if side in self._sides else None

    def session_info(self, session: Any) -> _SessionInfo | None:
        """The session's info; created on first sight for sessions built before install()."""
        info = self._sessions.get(session)
        if info is None:
            side = self._side(session)
            if side is None:
                return None
            info = _SessionInfo(side=side, key=uuid.uuid4().hex)
            self._sessions[session] = info
            # `async with` bound the original __aexit__ when it entered, so ours will not run for this
            # session: the exit stack that __aexit__ closes ends the budget instead.
            stack = getattr(session, "_exit_stack", None)
            if stack is not None:
                try:
                    stack.callback(self._end_session, info)
                except Exception:
                    self.recorder.fault("install")
        return info

    def _safe_info(self, session: Any) -> _SessionInfo | None:
        try:
            return self.session_info(session)
        except Exception:
            self.recorder.fault("install")
            return None

    def _end_session(self, info: _SessionInfo) -> None:
        if not info.ended:
            info.ended = True
            self.recorder.end_session(info.side, info.key)

    def _new_session(self, session: Any) -> None:
        side = self._side(session)
        if side is None:
            return
        if side == "client":
            transport = _CLIENT_TRANSPORT.get()
            _CLIENT_TRANSPORT.set(None)  # consumed: a later in-memory session in this task is not "tcp"
        else:
            transport = _SERVER_TRANSPORT.get()  # not consumed: a stateless HTTP server builds one per request
        kind, http = transport if transport else (None, None)
        info = _SessionInfo(side=side, key=uuid.uuid4().hex, transport=kind, http=http, in_process=_IN_PROCESS.get())
        if side == "server":
            sid = info.protocol_session_id()
            if sid:
                info.key = sid  # stateful streamable HTTP: the id is known before initialize
            elif http is not None:
                info.key = None  # stateless streamable HTTP: a session per request is no session; no budget
        self._sessions[session] = info

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
            # The receive loop has stopped: the session is over (closing it on GC would depend on
            # reference cycles; this does not).
            info = self._sessions.get(session)
            if info is not None:
                self._end_session(info)

    # -------------------------------------------------------------- outbound

    async def _send_request(self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        info = self._safe_info(session) if self.active else None
        if info is None:
            return await wrapped(*args, **kwargs)
        return await self._outbound_request(wrapped, session, info, *args, **kwargs)

    async def _outbound_request(
        self, send: Callable[..., Any], session: Any, info: _SessionInfo, request: Any, result_type: Any,
        *args: Any, **kwargs: Any,
    ) -> Any:
        rec = self.recorder
        side, key = info.side, info.key
        method, params = "unknown", None
        data: dict[str, Any] | None = None
        if key is not None and side == "client" and not rec.session_first:
            key = rec.budget_key(ClientFacts(session=key, params=self._params_of(request))) or key
        span, own, token = None, None, None
        try:
            data = wire_dict(request)
            method = str(data.get("method", "unknown"))
            params = data.get("params")
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.CLIENT, method):
                span = current  # an outer MCP instrumentation already traces this call
            else:
                attrs = call_attributes(
                    method,
                    params,
                    # The id the SDK assigns next; nothing awaits between this read and its assignment.
                    request_id=getattr(session, "_request_id", None),
                    protocol_version=info.protocol_version,
                    transport=info.transport,
                )
                own = span = rec.start_span(span_name(method, params), SpanKind.CLIENT, attrs)
                if own is not None:
                    token = otel_context.attach(trace.set_span_in_context(own))
        except Exception:
            rec.fault("span")
        guarded = rec.guard_active
        answer, refusal = None, None
        if guarded:
            if data is not None:
                request, data, params = self._chain(request, data, method, params)
            # The budget as it stands: before this request is recorded.
            refusal = rec.guard_request(span, side, method, params, key)
            if refusal is not None:
                answer = self._refusal(result_type, refusal)
        if data is not None and answer is None:
            try:
                request = self._inject(request, data, info)
                if self._conversation and side == "client":
                    request = self._with_conversation(request)
            except Exception:
                rec.fault("span")
        # HTTP: server.address/port and network.protocol.name from the transport's URL (with the estimate).
        http = http_attributes(getattr(info.http, "url", None)) if info.http is not None else None
        rec.record_input(span, side, method, params, key, attributes=http)
        tool = called_tool(method, params)
        started = time.perf_counter()
        try:
            if answer is not None:  # refused by a guard: the request is not sent, the refusal is its result
                rec.record_output(span, side, method, tool, result=refusal, session_id=key, started=started)
                return answer
            try:
                result = await send(request, result_type, *args, **kwargs)
            except McpError as exc:
                rec.record_output(span, side, method, tool, error=exc.error, session_id=key, started=started)
                raise
            except Exception as exc:
                if own is not None:
                    rec.record_exception(own, exc)
                raise
            wire = self._result_dict(result)
            if guarded and isinstance(wire, Mapping):
                arguments = params.get("arguments") if tool is not None and isinstance(params, Mapping) else None
                _, delivered = rec.record_guarded_output(span, side, method, tool, wire, key, arguments=arguments,
                                                         started=started)
                if delivered is not wire:
                    result = self._revalidate(result, delivered)
            else:
                rec.record_output(span, side, method, tool, result=wire, session_id=key, started=started)
            if method == "initialize" and isinstance(wire, Mapping):
                version = wire.get("protocolVersion")
                if isinstance(version, str):
                    info.protocol_version = version
            return result
        finally:
            self._finish_client_span(info, span, token, own)

    def _chain(self, request: Any, data: dict[str, Any], method: str, params: Any) -> tuple[Any, dict[str, Any], Any]:
        """Sent from a handler (guards on): a tools/call or sampling request carries the handler's depth + 1."""
        depth = _DEPTH.get()
        if depth is None or method not in _CHAINED:
            return request, data, params
        try:
            chained = with_depth(params if isinstance(params, Mapping) else None, depth + 1)
            out = {**data, "params": chained}
            return type(request).model_validate(out), out, chained
        except Exception:
            self.recorder.fault("guard")
            return request, data, params

    def _refusal(self, result_type: Any, refusal: dict[str, Any]) -> Any:
        """The guard's refusal as the result type the caller awaits; None (the call goes on) when that fails."""
        try:
            return result_type.model_validate(refusal)
        except Exception:
            self.recorder.fault("guard")
            return None

    def _result_dict(self, result: Any) -> Any:
        try:
            return wire_dict(result)  # the validated result model: re-dumped in its wire form
        except Exception:
            self.recorder.fault("estimate")
            return None

    @staticmethod
    def _params_of(request: Any) -> Any:
        try:
            return wire_dict(request).get("params")
        except Exception:
            return None

    @staticmethod
    def _with_conversation(request: Any) -> Any:
        """budget.propagate: the request with the context's conversation baggage entry in ``_meta`` where it
        carries no baggage yet (never into a request without params)."""
        data = wire_dict(request)
        params = data.get("params")
        if not isinstance(params, Mapping):
            return request
        carried = with_conversation_baggage(params)
        return request if carried is params else type(request).model_validate({**data, "params": carried})

    def _inject(self, request: Any, data: dict[str, Any], info: _SessionInfo) -> Any:
        """The request with our W3C context in ``params._meta`` (a new, re-validated model), where
        ``spans.propagate_context`` allows it; never into a request without params (it would gain some)."""
        params = data.get("params")
        if not isinstance(params, Mapping) or self._propagate == "never":
            return request
        if self._propagate == "in_process" and not info.in_process:
            return request  # a peer in another process would show the keys to its handlers
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        meta = params.get("_meta")
        if not carrier.get("traceparent") or (isinstance(meta, Mapping) and any(k in meta for k in carrier)):
            return request  # nothing to propagate, or the application's own context: keep the request as it is
        self._injected.add(carrier, meta_was_absent=not isinstance(meta, Mapping))
        out = dict(params)
        out["_meta"] = {**meta, **carrier} if isinstance(meta, Mapping) else carrier
        # RequestParams.Meta allows extra keys, so traceparent survives validation and serialization.
        return type(request).model_validate({**data, "params": out})

    def _finish_client_span(self, info: _SessionInfo, span: Span | None, token: Any, own: Span | None) -> None:
        extra: dict[str, Any] = {}
        session_id = info.protocol_session_id()  # known after the initialize response
        if session_id:
            extra[A_SESSION_ID] = session_id
        if info.protocol_version:
            extra[A_PROTOCOL] = info.protocol_version
        if extra:
            self.recorder.set_attributes(span, extra)
        detach(token)
        self.recorder.end_span(own)

    async def _send_notification(
        self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.active:
            self._measure_notification(session, argument(args, kwargs, 0, "notification"))
        return await wrapped(*args, **kwargs)

    def _measure_notification(self, session: Any, notification: Any) -> None:
        """A notification's params, on the metrics only (no span, never on a budget; its session names the
        server)."""
        try:
            side = self._side(session)
            if side is None:
                return
            data = wire_dict(notification)
            method, params = str(data.get("method", "unknown")), data.get("params")
            info = self._sessions.get(session)
        except Exception:
            self.recorder.fault("estimate")
            return
        server = _server_name(session) if side == "server" else None
        self.recorder.record_input(None, side, method, params, info.key if info is not None else None,
                                   server=server, budgeted=False)

    async def _received_notification(
        self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not self.active or self._side(session) is None:
            return await wrapped(*args, **kwargs)
        notification = argument(args, kwargs, 0, "notification")
        if isinstance(session, ClientSession):
            self._measure_notification(session, notification)
            return await wrapped(*args, **kwargs)
        span = self._notification_span(session, notification)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            self.recorder.end_span(span)

    def _notification_span(self, session: Any, notification: Any) -> Span | None:
        """Server side: a SERVER span for an inbound notification, as the 2.x SDK opens one."""
        rec = self.recorder
        span = None
        method, params = "unknown", None
        try:
            info = self._safe_info(session)
            data = wire_dict(notification)
            method, params = str(data.get("method", "unknown")), data.get("params")
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            attrs = call_attributes(
                method,
                params,
                session_id=info.protocol_session_id() if info else None,
                protocol_version=self._server_protocol(session, info),
                transport=info.transport if info else None,
            )
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=extract_parent(meta))
        except Exception:
            rec.fault("span")
        # Notifications stay off budgets.
        rec.record_input(span, "server", method, params, server=_server_name(session), budgeted=False)
        return span

    # -------------------------------------------------------------- inbound requests

    @staticmethod
    def _server_protocol(session: Any, info: _SessionInfo | None) -> str | None:
        if info is not None and info.protocol_version:
            return info.protocol_version
        client_params = getattr(session, "client_params", None)
        version = getattr(client_params, "protocolVersion", None)
        return str(version) if version is not None else None

    def _responder_init(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self.active:
            try:
                self._take_injected(responder)
            except Exception:
                self.recorder.fault("span")

    def _take_injected(self, responder: Any) -> None:
        """Before the session hands the request to anyone: the trace context this shim injected becomes the
        SERVER span's parent and leaves ``_meta`` (left as the sender's application built it)."""
        params = getattr(getattr(responder, "request", None), "root", None)
        params = getattr(params, "params", None)
        meta = getattr(params, "meta", None)
        if params is None or meta is None:
            return
        entry = self._injected.take(meta)
        if entry is None:
            return
        carrier, meta_was_absent = entry
        setattr(responder, _PARENT, propagate.extract(carrier))
        if meta_was_absent:
            params.meta = None
            params.__pydantic_fields_set__.discard("meta")
            responder.request_meta = None
        else:
            for key in carrier:
                meta.__pydantic_extra__.pop(key, None)

    def _enter(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entered = wrapped(*args, **kwargs)
        if self.active and getattr(responder, _MARK, None) is None:
            try:
                self._open_inbound(responder)
            except Exception:
                self.recorder.fault("span")
        return entered

    def _open_inbound(self, responder: Any) -> None:
        """Runs in the handler's task (``with responder:``), so attaching here is what the handler sees."""
        rec = self.recorder
        session = getattr(responder, "_session", None)
        info = self._safe_info(session)
        if info is None:
            return
        side = info.side
        key: str | None = info.key
        span, token = None, None
        method, params = "unknown", None
        try:
            data = wire_dict(responder.request)
            method, params = str(data.get("method", "unknown")), data.get("params")
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            request_id = getattr(responder, "request_id", None)
            if side == "server":
                header_id = _header_session_id(responder)
                if header_id and not info.session_id:
                    info.session_id = header_id
                attrs = call_attributes(
                    method,
                    params,
                    session_id=info.protocol_session_id(),
                    request_id=request_id,
                    protocol_version=self._server_protocol(session, info),
                    transport=info.transport,
                )
            else:
                # A server->client request (sampling, elicitation, roots): the same attributes as in 2.x.
                attrs = call_attributes(method, params, request_id=request_id)
            parent = getattr(responder, _PARENT, None) or extract_parent(meta)
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=parent)
            if span is not None:
                token = otel_context.attach(trace.set_span_in_context(span))
        except Exception:
            rec.fault("span")
        server = _server_name(session) if side == "server" else None
        if side == "server" and (key is None or not rec.session_first):
            key = self._server_key(responder, session, params, key)
        state = _InboundState(
            span, token, side, method, called_tool(method, params), key, info, started=time.perf_counter(),
            server=server,
        )
        try:
            setattr(responder, _MARK, state)
        except Exception:
            rec.fault("span")
            detach(token)
            rec.end_span(span)
            return
        if rec.guard_active:
            self._guard_inbound(state, params)  # the budget as it stands: before the request is recorded
        http = _request_http_attributes(responder) if side == "server" else None
        rec.record_input(span, side, method, params, key, attributes=http, server=server)

    def _server_key(self, responder: Any, session: Any, params: Any, session_key: str | None) -> str | None:
        """A served request's budget key from ``budget.key``: the session (none on stateless HTTP), the
        request's ``_meta`` (and the baggage this shim carried in it), HTTP headers, the SDK's authenticated
        principal, the client's identity."""
        request = getattr(getattr(responder, "message_metadata", None), "request_context", None)

        def client_info() -> Any:
            return getattr(getattr(session, "client_params", None), "clientInfo", None)

        facts = ServerFacts(session_key, params, request, client_info, getattr(responder, _PARENT, None))
        return self.recorder.budget_key(facts)

    def _guard_inbound(self, state: _InboundState, params: Any) -> None:
        """Keep the request's chain depth for the requests its handler sends, and take the guard's decision:
        a refusal is kept for ``Server._handle_request`` to answer with (the handler does not run)."""
        rec = self.recorder
        try:
            state.depth_token = _DEPTH.set(chain_depth(params))
            if state.tool is not None and isinstance(params, Mapping):
                state.arguments = params.get("arguments")
        except Exception:
            rec.fault("guard")
        refusal = rec.guard_request(state.span, state.side, state.method, params, state.key, server=state.server)
        if refusal is not None and state.side == "server":
            try:
                state.refusal = ServerResult(CallToolResult.model_validate(refusal))
            except Exception:
                rec.fault("guard")  # the call goes on as if allowed

    async def _handle_request(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        message = argument(args, kwargs, 0, "message")
        state = getattr(message, _MARK, None)
        if not self.active or not isinstance(state, _InboundState) or state.refusal is None:
            return await wrapped(*args, **kwargs)
        refusal = state.refusal
        # A guard refused this tools/call: answer with its tool error result; the handler never runs.
        state.refusal = None
        state.refused = True
        try:
            await message.respond(refusal)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("mcp_token_otel: refusal for %s dropped - transport closed", message.request_id)
        return None

    async def _respond(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        state = getattr(responder, _MARK, None)
        if self.active and isinstance(state, _InboundState) and not state.responded:
            state.responded = True
            response = self._measure_response(state, argument(args, kwargs, 0, "response"))
            return await wrapped(response)
        return await wrapped(*args, **kwargs)

    def _measure_response(self, state: _InboundState, response: Any) -> Any:
        """Record the response; returns what to send (the guard's result, re-validated, when it changed)."""
        rec = self.recorder
        if state.refusal is not None:  # never reached Server._handle_request: the handler ran after all
            state.refusal = None
            rec.fault("guard")
        if isinstance(response, ErrorData):
            # ErrorData: a handler's McpError, an unknown method, an uncaught exception (code 0).
            rec.record_output(state.span, state.side, state.method, state.tool, error=response, session_id=state.key,
                              started=state.started, server=state.server)
            return response
        result = self._result_dict(response)
        if state.refused or not rec.guard_active:
            rec.record_output(state.span, state.side, state.method, state.tool, result=result, session_id=state.key,
                              started=state.started, server=state.server)
        else:
            _, delivered = rec.record_guarded_output(
                state.span, state.side, state.method, state.tool, result, state.key, arguments=state.arguments,
                started=state.started, server=state.server,
            )
            if delivered is not result:
                response = self._revalidate(response, delivered)
        if state.method == "initialize" and state.side == "server" and isinstance(result, Mapping):
            version = result.get("protocolVersion")
            if isinstance(version, str) and state.info is not None:
                state.info.protocol_version = version  # negotiated: may differ from the client's request
                rec.set_attributes(state.span, {A_PROTOCOL: version})
        return response

    def _revalidate(self, original: Any, delivered: Any) -> Any:
        """``delivered`` (the guard's changed wire dict) as the model type of ``original``; ``original`` itself
        when that fails (counted: the call goes on with what the server or the peer sent)."""
        try:
            root = getattr(original, "root", None)
            if isinstance(original, RootModel) and isinstance(root, BaseModel):
                # ServerResult/ClientResult are unions: validate into the member the result already is.
                return type(original)(type(root).model_validate(delivered))
            return type(original).model_validate(delivered)
        except Exception:
            self.recorder.fault("guard")
            return original

    def _exit(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            state = getattr(responder, _MARK, None)
            if isinstance(state, _InboundState):
                self._close_inbound(responder, state, args[1] if len(args) > 1 else None)

    def _close_inbound(self, responder: Any, state: _InboundState, exc: BaseException | None) -> None:
        rec = self.recorder
        if state.depth_token is not None:
            with contextlib.suppress(Exception):
                _DEPTH.reset(state.depth_token)
            state.depth_token = None
        if isinstance(exc, Exception) and not state.responded:
            rec.record_exception(state.span, exc)
        detach(state.token)
        state.token = None
        rec.end_span(state.span)
        state.span = None


def install(recorder: TokenRecorder) -> V1Shim:
    """Hook mcp 1.x for ``recorder``; all or nothing. The caller owns the shim: its ``uninstall()`` restores the
    SDK."""
    return installed(V1Shim(recorder))


__all__ = ["V1Shim", "install"]

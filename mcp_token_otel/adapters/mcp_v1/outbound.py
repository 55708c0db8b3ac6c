"""mcp 1.x outbound requests (``BaseSession.send_request``: client calls and server->client requests alike) and
notifications: a CLIENT span, current for the call, whose W3C context is injected into ``params._meta`` where
``spans.propagate_context`` allows it, and the call measured through the recorder's Call."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcp.shared.exceptions import McpError
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from ...core.guard import CHAINED_METHODS, with_depth
from ...core.protocol import wire_dict
from ...semconv import A_PROTOCOL, A_SESSION_ID, call_attributes, http_attributes, span_name
from .._common import argument, detach, is_mcp_span
from ..key_facts import ClientFacts, with_conversation_baggage
from .sessions import DEPTH, SessionInfo, server_name

if TYPE_CHECKING:
    from .hooks import V1Shim



class Injected:
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


class Outbound:
    """The requests and notifications a session sends."""

    def __init__(self, shim: V1Shim) -> None:
        self._shim = shim
        self._propagate = shim.recorder.config.spans.propagate_context
        self._conversation = shim.recorder.config.budget.propagate  # budget.propagate: the conversation's baggage
        self.injected = Injected()

    async def send_request(self, wrapped: Any, session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        shim = self._shim
        info = shim.safe_info(session) if shim.active else None
        if info is None:
            return await wrapped(*args, **kwargs)
        return await self._request(wrapped, session, info, *args, **kwargs)

    async def _request(self, send: Callable[..., Any], session: Any, info: SessionInfo, request: Any,
                       result_type: Any, *args: Any, **kwargs: Any) -> Any:
        rec = self._shim.recorder
        side, key = info.side, info.key
        method, params = "unknown", None
        data: dict[str, Any] | None = None
        span, own, token = None, None, None
        try:
            data = wire_dict(request)
            method = str(data.get("method", "unknown"))
            params = data.get("params")
            if key is not None and side == "client" and not rec.session_first:
                key = rec.budget_key(ClientFacts(session=key, params=params)) or key
            current = trace.get_current_span()
            if is_mcp_span(current, SpanKind.CLIENT, method):
                span = current  # an outer MCP instrumentation already traces this call
            else:
                attrs = call_attributes(
                    method, params,
                    # The id the SDK assigns next; nothing awaits between this read and its assignment.
                    request_id=getattr(session, "_request_id", None),
                    protocol_version=info.protocol_version, transport=info.transport,
                )
                own = span = rec.start_span(span_name(method, params), SpanKind.CLIENT, attrs)
                if own is not None:
                    token = otel_context.attach(trace.set_span_in_context(own))
        except Exception:
            rec.fault("span")
        if rec.guard_active and data is not None:
            request, data, params = self._chain(request, data, method, params)
        call = rec.begin(side, method, params, key, version=info.protocol_version)
        call.span = span
        call.transport = info.transport
        answer = None
        if rec.guard_active and call.guard() is not None:  # the budget as it stands: before this request counts
            answer = self._refusal(result_type, call.refusal)
        if data is not None and answer is None:
            try:
                request = self._inject(request, data, info)
                if self._conversation and side == "client":
                    request = self._with_conversation(request)
            except Exception:
                rec.fault("span")
        # HTTP: server.address/port and network.protocol.name from the transport's URL (with the estimate).
        call.open(span, http_attributes(getattr(info.http, "url", None)) if info.http is not None else None)
        try:
            if answer is not None:  # refused by a guard: the request is not sent, the refusal is its result
                call.refused()
                return answer
            try:
                result = await send(request, result_type, *args, **kwargs)
            except McpError as exc:
                call.error(exc.error)
                raise
            except Exception as exc:
                call.failed(exc, on_span=own is not None)
                raise
            result = call.result(result)
            if method == "initialize" and call.version is not None:
                info.protocol_version = call.version
            return result
        finally:
            self._finish(info, call, token, own)

    def _chain(self, request: Any, data: dict[str, Any], method: str, params: Any) -> tuple[Any, dict[str, Any], Any]:
        """Sent from a handler (guards on): a request that continues the chain carries the handler's depth + 1."""
        depth = DEPTH.get()
        if depth is None or method not in CHAINED_METHODS:
            return request, data, params
        try:
            chained = with_depth(params if isinstance(params, Mapping) else None, depth + 1)
            out = {**data, "params": chained}
            return type(request).model_validate(out), out, chained
        except Exception:
            self._shim.recorder.fault("guard")
            return request, data, params

    def _refusal(self, result_type: Any, refusal: Any) -> Any:
        """The guard's refusal as the result type the caller awaits; None (the call goes on) when that fails."""
        try:
            return result_type.model_validate(refusal)
        except Exception:
            self._shim.recorder.fault("guard")
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

    def _inject(self, request: Any, data: dict[str, Any], info: SessionInfo) -> Any:
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
        self.injected.add(carrier, meta_was_absent=not isinstance(meta, Mapping))
        out = dict(params)
        out["_meta"] = {**meta, **carrier} if isinstance(meta, Mapping) else carrier
        # RequestParams.Meta allows extra keys, so traceparent survives validation and serialization.
        return type(request).model_validate({**data, "params": out})

    def _finish(self, info: SessionInfo, call: Any, token: Any, own: Span | None) -> None:
        session_id = info.protocol_session_id()  # known after the initialize response
        if session_id:
            call.held[A_SESSION_ID] = session_id
        if info.protocol_version:
            call.held[A_PROTOCOL] = info.protocol_version
        call.close()
        if token is not None:
            detach(token)
        self._shim.recorder.end_span(own)

    # -------------------------------------------------------------- notifications

    async def send_notification(self, wrapped: Any, session: Any, args: tuple[Any, ...],
                                kwargs: dict[str, Any]) -> Any:
        if self._shim.active:
            self.notification(session, argument(args, kwargs, 0, "notification"))
        return await wrapped(*args, **kwargs)

    def notification(self, session: Any, notification: Any) -> None:
        """A notification's params, on the metrics only (no span, never on a budget; its session names the
        server)."""
        shim = self._shim
        try:
            side = shim.side(session)
            if side is None:
                return
            data = wire_dict(notification)
            method, params = str(data.get("method", "unknown")), data.get("params")
            info = shim.sessions.get(session)
        except Exception:
            shim.recorder.fault("estimate")
            return
        shim.recorder.notify(side, method, params, info.key if info is not None else None,
                             server=server_name(session) if side == "server" else None)

"""mcp 1.x inbound requests (``RequestResponder.__enter__`` / ``respond`` / ``__exit__``): a SERVER span whose
parent is extracted from the request's ``_meta``, attached so that handler code sees it, and the call measured
through the recorder's Call. A refused ``tools/call``, a read of a kept result (a page or its error) and a listing
the guards answer are answered in the server's place instead of running the handler (``Server._handle_request``).
Server-side inbound notifications get a SERVER span too, as in 2.x."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from mcp.client.session import ClientSession
from mcp.types import (
    CallToolResult,
    ErrorData,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ReadResourceResult,
    ServerResult,
)
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from ...core.guard import chain_depth
from ...core.protocol import wire_dict
from ...recorder import Call
from ...semconv import call_attributes, span_name
from .._common import MARK, argument, detach, extract_parent
from ..key_facts import ServerFacts
from .sessions import (
    DEPTH,
    SessionInfo,
    header_session_id,
    request_http_attributes,
    server_name,
    server_protocol,
)

if TYPE_CHECKING:
    from .hooks import V1Shim

logger = logging.getLogger(__name__)

#: Attribute on a RequestResponder: the parent context taken from trace context this shim injected.
_PARENT = "_mcp_token_otel_parent"
#: The result type of each request a guard answers in the server's place.
_ANSWERS: dict[str, Any] = {"tools/call": CallToolResult, "resources/read": ReadResourceResult,
                            "resources/list": ListResourcesResult,
                            "resources/templates/list": ListResourceTemplatesResult}


class InboundState:
    """What ``__enter__`` leaves on a RequestResponder for ``respond`` and ``__exit__``."""

    __slots__ = ("call", "depth_token", "info", "refusal", "refused", "responded", "token")

    def __init__(self, call: Call, token: Any, info: SessionInfo) -> None:
        self.call = call
        self.token = token
        self.info = info
        self.responded = False
        #: The ServerResult (or ErrorData) a guard answers with instead of running the handler.
        self.refusal: Any = None
        #: The response is the guard's own refusal: recorded as it is, not guarded.
        self.refused = False
        self.depth_token: Any = None  # resets DEPTH when the handler is done


class Inbound:
    """The requests and notifications a session receives."""

    def __init__(self, shim: V1Shim) -> None:
        self._shim = shim

    def responder_init(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if self._shim.active:
            try:
                self._take_injected(responder)
            except Exception:
                self._shim.recorder.fault("span")

    def _take_injected(self, responder: Any) -> None:
        """Before the session hands the request to anyone: the trace context this shim injected becomes the
        SERVER span's parent and leaves ``_meta`` (left as the sender's application built it)."""
        params = getattr(getattr(responder, "request", None), "root", None)
        params = getattr(params, "params", None)
        meta = getattr(params, "meta", None)
        if params is None or meta is None:
            return
        entry = self._shim.outbound.injected.take(meta)
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

    def enter(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entered = wrapped(*args, **kwargs)
        if self._shim.active and getattr(responder, MARK, None) is None:
            try:
                self._open(responder)
            except Exception:
                self._shim.recorder.fault("span")
        return entered

    def _open(self, responder: Any) -> None:
        """Runs in the handler's task (``with responder:``), so attaching here is what the handler sees."""
        shim = self._shim
        rec = shim.recorder
        session = getattr(responder, "_session", None)
        info = shim.safe_info(session)
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
                header_id = header_session_id(responder)
                if header_id and not info.session_id:
                    info.session_id = header_id
                attrs = call_attributes(
                    method, params, session_id=info.protocol_session_id(), request_id=request_id,
                    protocol_version=server_protocol(session, info), transport=info.transport,
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
        server = server_name(session) if side == "server" else None
        if side == "server" and (key is None or not rec.session_first):
            key = self._server_key(responder, session, params, key)
        call = rec.begin(side, method, params, key, server=server,
                         version=server_protocol(session, info) if side == "server" else info.protocol_version)
        call.span = span
        call.transport = info.transport
        state = InboundState(call, token, info)
        try:
            setattr(responder, MARK, state)
        except Exception:
            rec.fault("span")
            detach(token)
            rec.end_span(span)
            return
        if rec.guard_active:
            self._guard(state, params)  # the budget as it stands: before the request counts
        call.open(span, request_http_attributes(responder) if side == "server" else None)

    def _server_key(self, responder: Any, session: Any, params: Any, session_key: str | None) -> str | None:
        """A served request's budget key from ``budget.key``: the session (none on stateless HTTP), the
        request's ``_meta`` (and the baggage this shim carried in it), HTTP headers, the SDK's authenticated
        principal, the client's identity."""
        request = getattr(getattr(responder, "message_metadata", None), "request_context", None)

        def client_info() -> Any:
            return getattr(getattr(session, "client_params", None), "clientInfo", None)

        facts = ServerFacts(session_key, params, request, client_info, getattr(responder, _PARENT, None))
        return self._shim.recorder.budget_key(facts)

    def _guard(self, state: InboundState, params: Any) -> None:
        """Keep the request's chain depth for the requests its handler sends, and take the guard's decision:
        a refusal is kept for ``Server._handle_request`` to answer with (the handler does not run)."""
        rec = self._shim.recorder
        try:
            state.depth_token = DEPTH.set(chain_depth(params))
        except Exception:
            rec.fault("guard")
        call = state.call
        if call.side != "server":  # a client's inbound requests (sampling, elicitation, roots) are never guarded
            return
        refusal = call.guard()
        try:
            if refusal is not None:
                state.refusal = ServerResult(_ANSWERS[call.method].model_validate(refusal))
            elif call.refusal_error is not None:
                state.refusal = ErrorData.model_validate(call.refusal_error)
        except Exception:
            rec.fault("guard")  # the call goes on as if allowed

    async def handle_request(self, wrapped: Any, _: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        message = argument(args, kwargs, 0, "message")
        state = getattr(message, MARK, None)
        if not self._shim.active or not isinstance(state, InboundState) or state.refusal is None:
            return await wrapped(*args, **kwargs)
        refusal = state.refusal
        # A guard answers in the server's place (a refused tools/call, a read of a kept result): the handler never
        # runs.
        state.refusal = None
        state.refused = True
        try:
            await message.respond(refusal)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("mcp_token_otel: refusal for %s dropped - transport closed", message.request_id)
        return None

    async def respond(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        state = getattr(responder, MARK, None)
        if self._shim.active and isinstance(state, InboundState) and not state.responded:
            state.responded = True
            response = self._measure_response(state, argument(args, kwargs, 0, "response"))
            return await wrapped(response)
        return await wrapped(*args, **kwargs)

    def _measure_response(self, state: InboundState, response: Any) -> Any:
        """Record the response; returns what to send (the guard's result, re-validated, when it changed)."""
        call = state.call
        if state.refusal is not None:  # never reached Server._handle_request: the handler ran after all
            state.refusal = None
            self._shim.recorder.fault("guard")
        if state.refused:
            call.refused()
            return response
        if isinstance(response, ErrorData):
            # ErrorData: a handler's McpError, an unknown method, an uncaught exception (code 0).
            call.error(response)
            return response
        response = call.result(response)
        if call.method == "initialize" and call.side == "server" and call.version is not None:
            state.info.protocol_version = call.version  # negotiated: may differ from the client's request
        return response

    def exit(self, wrapped: Any, responder: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            state = getattr(responder, MARK, None)
            if isinstance(state, InboundState):
                self._close(state, args[1] if len(args) > 1 else None)

    def _close(self, state: InboundState, exc: BaseException | None) -> None:
        rec = self._shim.recorder
        if state.depth_token is not None:
            with contextlib.suppress(Exception):
                DEPTH.reset(state.depth_token)
            state.depth_token = None
        call = state.call
        if isinstance(exc, Exception) and not state.responded:
            call.failed(exc)
        call.close()
        detach(state.token)
        state.token = None
        rec.end_span(call.span)
        call.span = None

    # -------------------------------------------------------------- notifications

    async def received_notification(self, wrapped: Any, session: Any, args: tuple[Any, ...],
                                    kwargs: dict[str, Any]) -> Any:
        shim = self._shim
        if not shim.active or shim.side(session) is None:
            return await wrapped(*args, **kwargs)
        notification = argument(args, kwargs, 0, "notification")
        if isinstance(session, ClientSession):
            shim.outbound.notification(session, notification)
            return await wrapped(*args, **kwargs)
        span = self._notification_span(session, notification)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            shim.recorder.end_span(span)

    def _notification_span(self, session: Any, notification: Any) -> Span | None:
        """Server side: a SERVER span for an inbound notification, as the 2.x SDK opens one."""
        rec = self._shim.recorder
        span = None
        method, params = "unknown", None
        try:
            info = self._shim.safe_info(session)
            data = wire_dict(notification)
            method, params = str(data.get("method", "unknown")), data.get("params")
            meta = params.get("_meta") if isinstance(params, Mapping) else None
            attrs = call_attributes(
                method, params, session_id=info.protocol_session_id() if info else None,
                protocol_version=server_protocol(session, info), transport=info.transport if info else None,
            )
            span = rec.start_span(span_name(method, params), SpanKind.SERVER, attrs, context=extract_parent(meta))
        except Exception:
            rec.fault("span")
        rec.notify("server", method, params, None, server=server_name(session), span=span)  # off budgets
        return span

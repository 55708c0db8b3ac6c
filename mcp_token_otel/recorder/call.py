"""One message exchange, measured: the life of a call, written once for every adapter path and the proxy.

``call = recorder.begin(side, method, params, key)``, then :meth:`Call.guard` (the request-side guards: an answer
in the server's place is ``call.refusal``, a result, or ``call.refusal_error``, a JSON-RPC error) where the
adapter can answer in the server's place, :meth:`Call.open` when the request goes through (measured onto its
span), and one answer: :meth:`Call.result` (what to hand on: the result itself, or what a guard made of it),
:meth:`Call.error` (a JSON-RPC error), :meth:`Call.refused` (the guard's answer, sent in the server's place: a
refused tool call, a page of a kept result, or the error a read of one gets) or :meth:`Call.cancelled` (a stream
the client ended); :meth:`Call.close` ends it in every case.

The call owns the timing, the budget (the request's and the answer's tokens count together, once, when it ends),
the never-break boundary (the conversion of an SDK model included), the span attributes (set once, with the
answer) and the metric points. Nothing here raises into the MCP call: a fault is counted and the call goes on
with what it was handed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span

from ..core.guard import GuardAction
from ..core.measure import Measurement, called_tool, measure_error, measure_request, measure_result
from ..core.protocol import revalidated, shaped_result, wire_dict
from ..core.risk import BREACH_TIERS
from ..emitters.otel_metrics import NO_SPAN
from ..semconv import A_PROTOCOL, MCP_CLIENT_OPERATION_DURATION, MCP_SERVER_OPERATION_DURATION
from .guarding import is_refusal
from .legs import (
    LEG_METHODS,
    MRTR_METHODS,
    TASK,
    TASK_CREATED,
    TASK_RESULT,
    answer_direction,
    asks_more,
    is_retry,
    leg_attributes,
    link,
    request_part,
)

if TYPE_CHECKING:
    from ..core.logical_calls import Leg, Outcome
    from .ledger import SessionMeta, Side
    from .token_recorder import TokenRecorder

#: The JSON-RPC code an older server answers an unknown method (server/discover) with.
METHOD_NOT_FOUND = -32601
#: Requests whose result names the server (client side): their own metrics wait for it.
_NAMING = frozenset({"initialize", "server/discover"})
_CONVENTION_SIDES = frozenset({"client", "server"})


def _exemplar() -> dict[str, str] | None:
    """The current span's ids: a breach's bucket on /metrics links to the trace that caused it."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


class _Events:
    """Stands in for a span that is not open yet (a request is guarded before its span exists): keeps the
    events added to it, replayed onto the span once there is one."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def is_recording(self) -> bool:
        return True

    def add_event(self, name: str, attributes: Any = None) -> None:
        self.events.append((name, attributes))


class Call:
    """One request and its answer (or a notification), measured once. Made by :meth:`TokenRecorder.begin`."""

    __slots__ = ("_events", "_first_leg", "_input", "_meta", "_naming", "_opened", "_rec", "actions", "answered",
                 "budgeted", "counts_as", "held", "key", "leg", "method", "params", "refusal", "refusal_error",
                 "server", "side", "span", "started", "tool", "transport", "version")

    def __init__(self, rec: TokenRecorder, side: Side, method: str, params: Any, key: str | None,
                 server: str | None = None, budgeted: bool = True, version: str | None = None) -> None:
        self._rec = rec
        self.side = side
        self.method = method
        self.params = params
        #: The budget this exchange counts toward (``budget.key``); None: unbudgeted.
        self.key = key
        #: The server's own name where the adapter knows it.
        self.server = server
        #: False for a notification: it never enters the model's context (no budget, not unbudgeted either).
        self.budgeted = budgeted
        #: The negotiated protocol version, where known (shapes the guard's own answers); an initialize result
        #: sets it.
        self.version = version
        #: The conventions' ``network.transport`` ("pipe", "tcp"), where the adapter knows it.
        self.transport: str | None = None
        self.tool = called_tool(method, params)
        self.span: Span | None = None
        #: The request's span attributes, set together with the answer's (one call into the span).
        self.held: dict[str, Any] = {}
        self.started = 0.0
        #: The guard's answer in the server's place (a CallToolResult refusing a tool call, a page of a kept result,
        #: an empty resource listing: a result wire dict), or None: the call goes on.
        self.refusal: dict[str, Any] | None = None
        #: The guard's JSON-RPC error in the server's place (``code``, ``message``, ``data``: a read of a kept result
        #: that cannot be served), or None.
        self.refusal_error: dict[str, Any] | None = None
        #: What the guards did on this call, request and result side.
        self.actions: tuple[GuardAction, ...] = ()
        #: Whether the answer was recorded (a result, an error, a refusal or a cancellation).
        self.answered = False
        #: What this exchange is in its logical call (a first leg, a retry, a task message), or None.
        self.leg: Leg | None = None
        #: The direction the request counts as when the caller knows better (a task notification's is ``task``).
        self.counts_as: str | None = None
        #: A call's first request: a leg of a logical call only if its answer asks for more (made then).
        self._first_leg = False
        self._input: Measurement | None = None
        self._meta: SessionMeta | None = None
        #: A naming request with no session to hold it (a proxy's 2026 server/discover): recorded with its answer.
        self._naming: Measurement | None = None
        self._opened = False
        self._events: _Events | None = None

    @property
    def pending_tokens(self) -> int:
        """The request's tokens, not in its budget yet (they are added with the answer)."""
        return self._input.total_tokens if self._input is not None and self.budgeted else 0

    @property
    def arguments(self) -> Any:
        """A tools/call's arguments (the guards' chain, padding and pagination policies read them)."""
        return self.params.get("arguments") if self.tool is not None else None

    # ------------------------------------------------------------------ the request

    def guard(self) -> dict[str, Any] | None:
        """The request-side guards, on the budget as it stands (before this request counts). Returns the
        refusal (also in :attr:`refusal`), shaped for the negotiated protocol, or None: go on (unless
        :attr:`refusal_error` is set: answer with that JSON-RPC error)."""
        rec = self._rec
        span: Any = self.span
        if span is None:
            span = self._events = self._events or _Events()
        try:
            refusal = rec._guards.request(span, self.side, self.method, self.params, self.key, self.server,
                                          self.held)
            if refusal is None and self.method[:10] == "resources/":  # a read of a kept result, a listing
                refusal = rec._guards.answer(self)
            if refusal is not None:
                self.refusal = shaped_result(refusal, self.version)
        except Exception:  # the guards catch their own faults; this is the boundary around the rest
            rec.fault("guard")
        return self.refusal

    def open(self, span: Span | None = None, attributes: Mapping[str, Any] | None = None,
             started: float | None = None) -> None:
        """The request goes through: measured onto ``span`` (the first call only). ``attributes``: the adapter's
        own (transport, session id, HTTP peer), set with the estimates. ``started``: when, on the clock the answer's
        ``at`` uses (default: ``time.perf_counter()`` now)."""
        if self._opened:
            return
        self._opened = True
        if span is not None:
            self.span = span
        try:  # the never-break boundary: a fault is counted, the call goes on
            self._request(attributes, started)
        except Exception:
            self._rec.fault("metrics")
        if not self.started:
            self.started = time.perf_counter() if started is None else started

    def _request(self, attributes: Mapping[str, Any] | None, started: float | None) -> None:
        rec = self._rec
        events = self._events
        if events is not None:
            self._events = None
            try:
                if self.span is not None and self.span.is_recording():
                    for name, event in events.events:
                        self.span.add_event(name, event)
            except Exception:
                rec.fault("span")
        ledger = rec._ledger
        if ledger.ending:
            rec._end_queued()
        counted, direction = self.params, self.counts_as or "input"
        if self.method in LEG_METHODS and self.counts_as is None:
            if self.method in MRTR_METHODS and not is_retry(self.params):
                self._first_leg = True  # most calls are answered at once: joined only if the answer asks
            else:
                try:
                    leg = self.leg = rec.logical[self.side].request(self.method, self.params, self.key, started)
                    counted, direction = request_part(leg, self.params)
                    if leg.role == TASK:
                        self.budgeted = False  # task bookkeeping never enters the model's context
                    link(self.span, leg)
                except Exception:
                    rec.fault("metrics")
        try:
            m = measure_request(self.method if direction == "input" else "", counted, rec.policy)
        except Exception:
            rec.fault("estimate")
            if attributes:
                self.held.update(attributes)
            self.started = time.perf_counter() if started is None else started
            return
        self._input = m
        side, key = self.side, self.key
        meta = ledger.meta(side, key, self.server, attributes) if self.budgeted else ledger.find_meta(side, key)
        self._meta = meta
        if self.span is not None:
            rec._spans.request(self.span, self.method, self.params, m, attributes, self.held,
                               meta.server if meta is not None else self.server)
        label = rec._label(meta, self.server)
        if key is None and self.budgeted:
            rec.aggregate.add("mcp_token_unbudgeted_tokens", (side, label), m.total_tokens)
        if self.method in _NAMING and side != "server" and rec._labels.awaits_name(meta, self.server):
            if meta is not None:
                meta.pending = (side, self.method, self.tool, m)  # recorded once the answer names the server
            else:
                self._naming = m
        else:
            message_metrics(rec, side, self.method, self.tool, direction, m, label)
        self.started = time.perf_counter() if started is None else started

    # ------------------------------------------------------------------ the answer

    def result(self, result: Any, at: float | None = None) -> Any:
        """The result came: what to hand on (``result`` itself unless a guard changed it, then the changed
        result in ``result``'s own type). ``at``: when, on ``open``'s clock (default: now)."""
        if self.answered:
            return result
        self.answered = True
        try:  # converting the result is part of measuring it: inside the never-break boundary
            wire = wire_dict(result)
        except Exception:
            self._rec.fault("estimate")
            self._unanswered()
            return result
        deliver = self._answer(wire, None, at, guard=True)
        if deliver is wire:
            return result
        try:
            return revalidated(result, deliver)
        except Exception:
            self._rec.fault("guard")
            return result

    def error(self, error: Any, at: float | None = None) -> None:
        """A JSON-RPC error answered the call (an SDK error object, its ``ErrorData`` or the wire dict)."""
        if not self.answered:
            self.answered = True
            self._answer(None, error, at, guard=False)

    def refused(self, at: float | None = None) -> dict[str, Any]:
        """The guard's answer answers the call (the server is not asked): recorded and returned, the result
        (:attr:`refusal`) or else the JSON-RPC error (:attr:`refusal_error`)."""
        if self.refusal is None and self.refusal_error is not None:
            if not self.answered:
                self.answered = True
                self._answer(None, self.refusal_error, at, guard=False)
            return self.refusal_error
        refusal = self.refusal or {}
        if not self.answered:
            self.answered = True
            self._answer(refusal, None, at, guard=False)
        return refusal

    def cancelled(self, at: float | None = None) -> None:
        """A long-lived request the client ended (``subscriptions/listen``): its duration and end still count."""
        if not self.answered:
            self.answered = True
            self._answer({}, None, at, guard=False)

    def failed(self, exc: BaseException, error: Any = None, *, on_span: bool = True) -> None:
        """A failure that is not a JSON-RPC answer (a transport error, a handler's exception): its class is the
        span's ``error.type`` (``on_span``: a span the SDK does not mark itself); ``error``, where the SDK turns the
        exception into one, is the JSON-RPC error the peer receives."""
        if on_span:
            self._rec._spans.exception(self.span, exc)
        if error is not None:
            self.error(error)

    def close(self) -> None:
        """The exchange is over: a request that got no answer still counts toward its budget, and attributes
        still held go onto the span."""
        try:
            if not self.answered:
                if self._input is not None:
                    self._unanswered()
                if self._naming is not None:
                    self._record_naming(self._rec._label(self._meta, self.server))
                if self.leg is not None:  # never answered: its logical call ends unfinished
                    self._rec.logical[self.side].abandon(self.leg)
        except Exception:
            self._rec.fault("metrics")
        if self.held:
            self._rec._spans.set_attributes(self.span, self.held)
            self.held = {}

    # ------------------------------------------------------------------ recording

    def _record_naming(self, label: str) -> None:
        naming, self._naming = self._naming, None
        if naming is not None:
            message_metrics(self._rec, self.side, self.method, self.tool, "input", naming, label)

    def _unanswered(self) -> None:
        """No answer will be measured: the request's tokens still count toward the budget."""
        if self.budgeted and self._input is not None:
            inputs, self._input = self._input.total_tokens, None
            update = self._rec._ledger.record(self.side, self.key, inputs)
            if update is not None and update.transitions:
                label = self._rec._label(self._meta, self.server)
                for state in update.transitions:
                    self._rec.aggregate.add("mcp_token_session_transitions", (self.side, label, state))

    def delivered(self, outcome: Outcome) -> None:
        """This notification delivered a task's result (``notifications/tasks``): counted as the result of the
        call that created the task."""
        if not self.answered:
            self.answered = True
            self._answer(outcome.result, outcome.error, None, guard=False, outcome=outcome)

    def _answer(self, result: Any, error: Any, at: float | None, *, guard: bool, outcome: Outcome | None = None
                ) -> Any:
        """Measure the answer; with ``guard``, a call's final result goes through the result-side guards. Returns
        what to deliver (``result`` itself when no guard changed it, and on any fault). ``outcome``: what the
        answer is in its logical call, when already known (a task notification)."""
        try:  # the never-break boundary: a fault is counted, the call goes on with what it was handed
            return self._record_answer(result, error, at, guard, outcome)
        except Exception:
            self._rec.fault("metrics")
            return result

    def _record_answer(self, result: Any, error: Any, at: float | None, guard: bool, outcome: Outcome | None) -> Any:
        rec = self._rec
        if not self._opened:
            self.open()
        ledger = rec._ledger
        if ledger.ending:
            rec._end_queued()
        side = self.side
        duration = max(0.0, (time.perf_counter() if at is None else at) - self.started)
        leg = self.leg
        if leg is None and self._first_leg and error is None and asks_more(result):
            try:  # the first leg of a call that goes on (input_required, a task): joined from here
                leg = self.leg = rec.logical[side].request(self.method, self.params, self.key, self.started)
                link(self.span, leg)
            except Exception:
                rec.fault("metrics")
        if leg is not None and outcome is None:
            try:
                logical = rec.logical[side]
                outcome = logical.error(leg, error, at) if error is not None else logical.result(leg, result, at)
            except Exception:
                rec.fault("metrics")
        direction = answer_direction(leg, outcome)
        # What is counted: the answer, or for a task's result, its call's result (method, tool and budget too).
        method, tool, key, counted, failure = self.method, self.tool, self.key, result, error
        budgeted = self.budgeted
        task_call = outcome.call if outcome is not None and outcome.kind == TASK_RESULT else None
        delivered_by_task = task_call is not None
        if task_call is not None and outcome is not None:
            method, key, counted, failure = task_call.method, task_call.key, outcome.result, outcome.error
            tool, budgeted = task_call.target if task_call.method == "tools/call" else None, True
        try:
            if failure is not None:
                m = measure_error(method, failure, tool_name=tool, policy=rec.policy)
            else:
                m = measure_result(method, counted, tool_name=tool, policy=rec.policy)
        except Exception:
            rec.fault("estimate")
            self._unanswered()
            return result
        if failure is not None and method == "server/discover" and m.error_type == str(METHOD_NOT_FOUND):
            # An older server answers the 2026 client's probe "method not found": version negotiation, no error.
            m = dataclasses.replace(m, error_type=None)
        final = direction == "output"
        deliver, tokens, cost = result, m.total_tokens, None
        guards = rec._guards
        if final and failure is None:
            # A task's result cannot be rewritten inside its task message: observed only.
            if guard and not delivered_by_task and guards.active and side in guards.sides and not is_refusal(result):
                deliver, actions, tokens, cost = guards.result(self, result, m)
                self.actions += actions
            elif guards.cost_on:
                cost = guards.cost(tokens)
        meta = self._meta if key == self.key else None
        if meta is None and budgeted:
            meta = ledger.meta(side, key, self.server, None)
            if key == self.key:
                self._meta = meta
        definitions = rec._tool_definitions(counted) if failure is None and method == "tools/list" else None
        inputs = self._input.total_tokens if self._input is not None and self.budgeted else 0
        self._input = None
        update = None
        if budgeted and key is not None:
            costs = rec._costs
            # A retry is never a repeated call: a call's digest is asked at its final result, unless its first
            # leg was not seen.
            joined = outcome.call if outcome is not None else None
            if task_call is not None:  # the digest its first leg kept when the task was created
                digest = task_call.data if failure is None else None
            elif final and tool is not None and failure is None and not (joined is not None and joined.partial):
                digest = costs.call_digest(tool, self.arguments)
            else:
                digest = None
            if joined is not None and outcome is not None and outcome.kind == TASK_CREATED and tool is not None:
                joined.data = costs.call_digest(tool, self.arguments)  # asked when its result arrives
            update = ledger.record(
                side, key, inputs + (0 if direction == "task" else tokens), digest,
                costs.tools_digest(meta, definitions) if definitions is not None else None,
            )
        elif ledger.ended_waiting:
            ledger.report_ended()  # budgets let go of at a collection: reported at this safe point
        if failure is None and counted is result:
            if (meta is None or meta.server is None) and side != "server":
                rec._learn_server(result, meta)  # (a request with no session still names a proxy's server)
            if method == "initialize" and isinstance(result, dict):
                version = result.get("protocolVersion")
                if isinstance(version, str):
                    self.version = version
                    self.held[A_PROTOCOL] = version
        label = rec._label(meta, self.server)
        if key is None and budgeted and direction != "task":
            rec.aggregate.add("mcp_token_unbudgeted_tokens", (side, label), tokens)
        if meta is not None and meta.pending is not None:  # the naming request, now with its server
            pending, meta.pending = meta.pending, None
            message_metrics(rec, pending[0], pending[1], pending[2], "input", pending[3], label)
        if self._naming is not None:
            self._record_naming(label)
        transport, protocol = self._convention_attributes(meta)
        if leg is not None:
            self.held.update(leg_attributes(leg, outcome, result))
        if self.span is not None:
            rec._spans.response(self.span, method, m, update, definitions, cost, counted, failure, self.held)
            self.held = {}
        if delivered_by_task:  # the call's output under its own labels; this task message's duration under its own
            message_metrics(rec, side, method, tool, "output", m, label)
            if leg is not None:  # a request's (a notification has no duration; its envelope counted as it came)
                leg_duration(rec, side, label, self.method, self.tool, duration, transport, protocol)
                if outcome is not None and outcome.envelope:  # the task state around the result: bookkeeping
                    envelope = measure_result(self.method, outcome.envelope, policy=rec.policy)
                    message_metrics(rec, side, self.method, self.tool, "task", envelope, label)
        else:
            message_metrics(rec, side, method, tool, direction, m, label, duration, transport, protocol)
        joined = outcome.call if outcome is not None else None
        if final and joined is not None and outcome is not None and outcome.duration is not None and (
                joined.legs > 1 or joined.task):  # a call answered at once: its operation duration is the call's
            logical_duration(rec, side, label, method, tool, outcome.duration)
        if update is not None:
            for state in update.transitions:
                rec.aggregate.add("mcp_token_session_transitions", (side, label, state))
        if definitions is not None:
            rec._tools_listed(side, label, definitions, update is not None and update.tools_changed)
        elif final and tool is not None and failure is None:
            rec._costs.output(side, label, m, tokens, update is not None and update.repeat)
        if self.actions or cost is not None:
            guards.signals(self.span, side, self.actions, (tool, cost) if cost is not None else None, label)
        if final:
            for listener in rec.listeners:
                try:
                    listener(self, m)
                except Exception:
                    rec.fault("metrics")
        return deliver

    def _convention_attributes(self, meta: SessionMeta | None) -> tuple[Any, Any]:
        """The conventions' transport and protocol of this call: what the adapter said, else what its session
        learnt; the session keeps what it learns for its later calls and its end."""
        transport, protocol = self.transport, self.version
        if meta is not None:
            if transport is None:
                transport = meta.transport
            elif meta.transport is None:
                meta.transport = transport
            if protocol is None:
                protocol = meta.protocol
            elif meta.protocol is None:
                meta.protocol = protocol
        return transport, protocol


class OffCall(Call):
    """A call inside an OpenTelemetry suppression context: nothing is measured, everything passes through."""

    def guard(self) -> dict[str, Any] | None:
        return None

    def open(self, span: Span | None = None, attributes: Mapping[str, Any] | None = None,
             started: float | None = None) -> None:
        if span is not None:
            self.span = span

    def result(self, result: Any, at: float | None = None) -> Any:
        return result

    def error(self, error: Any, at: float | None = None) -> None:
        return None

    def refused(self, at: float | None = None) -> dict[str, Any]:
        return self.refusal or {}

    def cancelled(self, at: float | None = None) -> None:
        return None

    def delivered(self, outcome: Outcome) -> None:
        return None

    def failed(self, exc: BaseException, error: Any = None, *, on_span: bool = True) -> None:
        return None

    def close(self) -> None:
        return None


def message_metrics(rec: TokenRecorder, side: str, method: str, tool: str | None, direction: str,
                    m: Measurement, label: str, duration: float | None = None, transport: Any = None,
                    protocol: Any = None) -> None:
    """One message's points: its series (bounded labels, found once) and, for an answer, its error and the
    operation duration (the Prometheus family and the MCP conventions' instrument)."""
    output = direction == "output"
    ms = rec._series(side, label, method, tool, direction, output and m.error_type is None)
    agg = rec.aggregate
    tier = m.risk_tier if output else None
    if tier in BREACH_TIERS:  # the breach's exemplar: its bucket links to the trace that caused it
        agg.add_message(ms, m.total_tokens, m.bytes, m.overhead_tokens, tier, _exemplar(), None)
    else:
        agg.add_message(ms, m.total_tokens, m.bytes, m.overhead_tokens, tier, None, NO_SPAN)
    error_type = m.error_type if output else None
    if error_type is not None:
        agg.add("mcp_token_call_errors", (*ms.out, error_type))
    if duration is not None:
        operation_duration(rec, ms, side, duration, error_type, transport, protocol)


def operation_duration(rec: TokenRecorder, ms: Any, side: str, duration: float, error_type: str | None,
                       transport: Any, protocol: Any) -> None:
    """One request's duration: the Prometheus family and the MCP conventions' instrument."""
    agg = rec.aggregate
    if ms.duration is not None:
        agg.add_duration(ms, duration)
    else:  # a leg that is not a call's final answer
        agg.observe("mcp_token_operation_duration_seconds", ms.out, duration)
    if agg.points is not None:
        name = MCP_SERVER_OPERATION_DURATION if side == "server" else MCP_CLIENT_OPERATION_DURATION
        _, server, method_label, tool_label = ms.out
        agg.observe(name, (None if side in _CONVENTION_SIDES else side, server, method_label, tool_label,
                           error_type, transport, protocol), duration, NO_SPAN)


def leg_duration(rec: TokenRecorder, side: str, label: str, method: str, tool: str | None, duration: float,
                 transport: Any, protocol: Any) -> None:
    """A task message's own operation duration (its answer counted as its call's output)."""
    operation_duration(rec, rec._series(side, label, method, tool, "task", False), side, duration, None, transport,
                       protocol)


def logical_duration(rec: TokenRecorder, side: str, label: str, method: str, tool: str | None,
                     seconds: float) -> None:
    """A logical call's whole duration, from its first request to its final answer."""
    ms = rec._series(side, label, method, tool, "output", False)
    rec.aggregate.observe("mcp_token_logical_call_duration_seconds", ms.out, seconds, NO_SPAN)

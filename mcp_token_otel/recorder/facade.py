"""The recorder's facade: measurements -> span attributes, span events, session budgets, guard actions, metrics.

Every adapter (mcp 2.x, mcp 1.x, the proxy) finds or opens the span for a message and hands the raw wire dicts
to a :class:`TokenRecorder`. It asks the pure core for the measurement, then hands the results to its parts:
the session ledger (budgets), the guards, the span annotator and the sink fan-out. The recorder never raises:
a fault in the estimator, the span API, the budget registry or a metrics sink is counted
(``mcp_token.instrumentation.errors`` with ``mcp_token.stage``), logged at debug level, and the MCP call
carries on untouched.

Metric attributes are bounded: tool names past ``metrics.max_tool_names`` (and method names past
``MAX_METHODS``, beyond the spec's own) share an overflow value, and no metric ever carries a session or
request id.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Tracer

from ..config import Config, build_policy
from ..core.budget_key import KeyFacts, KeySource, choose_budget_key, parse_key_sources
from ..core.guard import GuardAction, GuardEngine
from ..core.labels import UNKNOWN_SERVER, NameLimiter
from ..core.measure import Measurement, Policy, measure_error, measure_request, measure_result
from ..emitters.deferred import DeferredSink
from ..emitters.otel_metrics import OtelMetricsSink
from ..emitters.sink import CallInfo, MetricsSink
from ..semconv import SCHEMA_URL, SCOPE_NAME
from .context_costs import ContextCosts, ToolList, tool_list
from .fanout import SinkFanout
from .guarding import GuardOrchestrator, is_refusal
from .labels import LabelBounds, server_info_name
from .ledger import SessionLedger, SessionMeta, Side
from .response import Response
from .spans import SpanAnnotator, capture_from_env, enabled

#: Requests whose result names the server (client side): their own metrics wait for it (see record_input).
_NAMING = ("initialize", "server/discover")


def _waiting(provider: metrics.MeterProvider) -> bool:
    """Whether ``provider`` is the API's proxy, no global MeterProvider set yet (its class is private: known by
    name, with the attribute it fills in when one is set, read on every message while it waits)."""
    return type(provider).__name__ == "_ProxyMeterProvider" and hasattr(provider, "_real_meter_provider") and (
        provider._real_meter_provider is None)


class TokenRecorder:
    """Turns MCP messages into token estimates on spans and metrics; shared by every adapter."""

    def __init__(
        self,
        config: Config | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        policy: Policy | None = None,
        server_name: str | None = None,
    ) -> None:
        from .. import __version__

        self.config = config or Config()
        self.policy = policy or build_policy(self.config)
        self.tracer: Tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            SCOPE_NAME, __version__, schema_url=SCHEMA_URL
        )
        self._labels = LabelBounds(self.config.metrics, server_name or "", self.fault)
        self._fanout = SinkFanout(self._labels)
        self._spans = SpanAnnotator(
            self.tracer,
            self.policy,
            self.config.spans.capture_content or capture_from_env(),
            self.config.spans.max_content_chars,
            self._fanout.fault,
        )
        budget = self.config.budget
        #: The parsed ``budget.key``: what adapters key a message's budget by (see :meth:`budget_key`).
        self.key_sources: tuple[KeySource, ...] = parse_key_sources(budget.key)
        #: Whether ``session`` is the first key source: an adapter that knows the session uses it as the key
        #: without reading anything else of the message.
        self.session_first = bool(self.key_sources) and self.key_sources[0].kind == "session"
        self._ledger = SessionLedger(budget, self._fanout.fault, self._session_ended, self._meta_evicted)
        self._costs = ContextCosts(self.config.metrics.repeat_window, self._fanout, self.fault)
        self._guards = GuardOrchestrator(
            self.config.guard, self.policy, budget.max_sessions, (self._ledger, self._labels, self._fanout)
        )
        #: The guard policies (docs/guardrails.md); one engine per recorder, shared by every side.
        self.guard: GuardEngine = self._guards.engine
        #: Budgets of the live sessions, per side.
        self.sessions = self._ledger.sessions
        #: Bounded tool-name labels.
        self.tool_names: NameLimiter = self._labels.tool_names
        #: The API's proxy MeterProvider while no global one is set (the OpenTelemetry sink waits); None: made.
        self._otel_waiting: Any = None
        self._otel_lock = threading.Lock()
        proxy = metrics.get_meter_provider() if meter_provider is None else None
        if proxy is not None and _waiting(proxy):
            # Until an application sets one, the API's proxy records nothing: neither does the sink's work.
            self._otel_waiting = proxy
        else:
            self._add_otel_sink(meter_provider, __version__)

    def _add_otel_sink(self, meter_provider: metrics.MeterProvider | None, version: str) -> None:
        try:
            prom = self.config.prometheus
            otel_sink: Any = OtelMetricsSink(
                meter_provider,
                version,
                states=self.session_states,
                rate_budgets={"tool": prom.tool_output_rate_budget, "service": prom.service_output_rate_budget},
                server=self.server_label(),
                input_histograms=self.config.metrics.input_histograms,
            )
            if self.config.metrics.defer_otel:  # the OTel SDK's per-point cost stays off the call path
                otel_sink = DeferredSink(otel_sink, on_error=self.fault)
            self.add_sink(otel_sink, inline=True)
        except Exception:
            self.fault("metrics")

    def _otel_when_set(self) -> None:
        """The OpenTelemetry sink, made at the first message after a global MeterProvider was set."""
        from .. import __version__

        with self._otel_lock:
            waiting, self._otel_waiting = self._otel_waiting, None
        if waiting is not None:
            self._add_otel_sink(None, __version__)

    # ------------------------------------------------------------------ sinks and faults

    @property
    def sinks(self) -> list[MetricsSink]:
        """Every metrics sink, in the order added."""
        return self._fanout.sinks

    @sinks.setter
    def sinks(self, sinks: list[MetricsSink]) -> None:
        self._fanout.sinks = sinks

    @property
    def error_counts(self) -> Counter[str]:
        """In-process fault counts per stage; the one place a fault is visible when the meter itself fails."""
        return self._fanout.error_counts

    @property
    def capture_content(self) -> bool:
        """Whether tool arguments and results go on spans (spans.capture_content or the GenAI switch)."""
        return self._spans.capture

    def add_sink(self, sink: MetricsSink, *, inline: bool = False) -> None:
        """Send metrics to another sink too.

        A sink runs off the MCP call path, replayed by a :class:`DeferredSink`'s background thread, so a sink
        that blocks or is slow never holds up a call (``flush()`` replays now). ``inline=True`` runs it on the
        call path: for sinks whose every call is cheap (the built-in pre-aggregating ones: a dict increment).
        """
        self._fanout.add(sink, inline=inline)

    def fault(self, stage: str) -> None:
        """Count and log an instrumentation fault; never raises. A fault has no session to name its server: the
        sinks get the server_label()."""
        self._fanout.fault(stage)

    def flush(self) -> None:
        """Hand every deferred metric point to its sink now (tests, shutdown)."""
        self._fanout.flush()

    def close(self) -> None:
        """Flush and stop background work (uninstrument calls this)."""
        self._end_queued()
        self._ledger.report_ended()
        self._fanout.close()

    # ------------------------------------------------------------------ spans

    def start_span(
        self, name: str, kind: SpanKind, attributes: dict[str, Any] | None = None, context: Any = None
    ) -> Span | None:
        """Open one of our spans; None when the tracing pipeline fails (the call goes on without it) or when
        instrumentation is suppressed in this context."""
        return self._spans.start(name, kind, attributes, context)

    def end_span(self, span: Span | None) -> None:
        self._spans.end(span)

    def set_attributes(self, span: Span | None, attributes: Mapping[str, Any]) -> None:
        self._spans.set_attributes(span, attributes)

    def record_exception(self, span: Span | None, exc: BaseException) -> None:
        """A non-JSON-RPC failure of the call (transport error...): error.type is the exception class."""
        self._spans.exception(span, exc)

    # ------------------------------------------------------------------ messages

    def budget_key(self, facts: KeyFacts) -> str | None:
        """The budget a message counts toward: the first ``budget.key`` source ``facts`` can answer (a session
        key is the session id itself; any other is ``"<source>=<value>"``), or None (its tokens then count as
        unbudgeted when recorded). Pass the result as ``session_id``. Never raises (a fault gives None)."""
        try:
            return choose_budget_key(self.key_sources, facts)
        except Exception:
            self.fault("budget")
            return None

    def record_input(
        self,
        span: Span | None,
        side: Side,
        method: str,
        params: Any,
        session_id: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
        hold: dict[str, Any] | None = None,
        budgeted: bool = True,
    ) -> Measurement | None:
        """Measure a request's (or notification's) params toward the budget ``session_id`` (see
        :meth:`budget_key`); with ``session_id`` None its tokens count as unbudgeted.

        ``attributes`` (the adapter's own, e.g. transport and session id) go onto the span in the same
        ``set_attributes`` call. The session's running totals go on with the response (set once per span).
        ``server``: the server's own name, where the adapter knows it (the server side).
        ``hold``: a dict that receives the request's span attributes instead of the span, for an adapter that
        passes it to :meth:`record_output` as ``held`` (one ``set_attributes`` per call, not two) and sets
        what is still held on the span itself if no output is recorded. Events are added at once either way.
        ``budgeted=False``: a message that never enters the model's context (a notification): no budget, not
        unbudgeted either; ``session_id`` then only names the session's server.
        Nothing is recorded inside an OpenTelemetry suppression context.
        """
        if not enabled():
            return None
        waiting = self._otel_waiting
        if waiting is not None and waiting._real_meter_provider is not None:  # one was set: from now on
            self._otel_when_set()
        ledger = self._ledger
        if ledger.ending:
            self._end_queued()
        try:
            measurement = measure_request(method, params, self.policy)
        except Exception:
            self.fault("estimate")
            if attributes:
                self.set_attributes(span, attributes)
            return None
        if budgeted:
            update = ledger.record(side, session_id, measurement.total_tokens)
            meta = ledger.meta(side, session_id, server, attributes)
        else:
            update, meta = None, ledger.find_meta(side, session_id)
        if span is not None:
            self._spans.request(span, method, params, measurement, update, attributes, hold)
        label = self._labels.server(meta, server)
        if session_id is None and budgeted:
            self._fanout.unbudgeted(side, label, measurement.total_tokens)
        if method == "tools/call" and meta is not None and self._costs.window:
            self._costs.call(meta, measurement.tool_name, params)
        if label == UNKNOWN_SERVER and method in _NAMING and side != "server" and meta is not None:
            # The server's name arrives with this request's result: its metrics are recorded then, with it.
            meta.pending = (side, method, measurement.tool_name, "input", measurement, update)
        else:
            self._fanout.message(side, method, measurement.tool_name, "input", measurement, update, label)
        return measurement

    def record_output(
        self,
        span: Span | None,
        side: Side,
        method: str,
        tool_name: str | None,
        result: Any = None,
        error: Any = None,
        session_id: str | None = None,
        *,
        started: float | None = None,
        duration_s: float | None = None,
        server: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        held: dict[str, Any] | None = None,
    ) -> Measurement | None:
        """Measure a response: ``result`` (wire dict or model) or ``error`` (MCPError/ErrorData/dict).

        ``started`` (a ``time.perf_counter()`` value taken when the request went out or came in) or
        ``duration_s`` times the call for the conventions' operation duration; ``server`` is the server's
        own name where the adapter knows it. Nothing is recorded inside a suppression context.
        With the guards on, a successful result also goes through them (counted, budgeted as delivered):
        adapters that deliver the guarded result call :meth:`record_guarded_output` instead.
        ``held``: the request's attributes held by :meth:`record_input`; set with the response's, then cleared.
        """
        return self._output(Response(span, side, method, tool_name, result, error, session_id, server, arguments,
                                     held, started, duration_s))[0]

    def record_guarded_output(
        self,
        span: Span | None,
        side: Side,
        method: str,
        tool_name: str | None,
        result: Any,
        session_id: str | None = None,
        *,
        arguments: Mapping[str, Any] | None = None,
        started: float | None = None,
        duration_s: float | None = None,
        server: str | None = None,
        held: dict[str, Any] | None = None,
    ) -> tuple[Measurement | None, Any]:
        """:meth:`record_output` for a successful result (a wire dict) that returns (measurement, the result to
        deliver). The result to deliver ``is result`` when no guard changed it, and on any fault.

        Order: measure the server's result, run the result-side guards on it (the session budget as it
        stands), add what enters the context (the guarded result's tokens) to the budget, then spans and
        metrics (cost on the span and the cost counter)."""
        return self._output(Response(span, side, method, tool_name, result, None, session_id, server, arguments,
                                     held, started, duration_s))

    def _output(self, r: Response) -> tuple[Measurement | None, Any]:
        if not enabled():
            return None, r.result
        waiting = self._otel_waiting
        if waiting is not None and waiting._real_meter_provider is not None:  # one was set: from now on
            self._otel_when_set()
        ledger = self._ledger
        if ledger.ending:
            self._end_queued()
        if r.duration is None and r.started is not None:
            r.duration = max(0.0, time.perf_counter() - r.started)
        try:
            if r.error is not None:
                m = measure_error(r.method, r.error, tool_name=r.tool_name, policy=self.policy)
            else:
                m = measure_result(r.method, r.result, tool_name=r.tool_name, policy=self.policy)
        except Exception:
            self.fault("estimate")
            return None, r.result
        deliver, tokens, cost = r.result, m.total_tokens, None
        actions: tuple[GuardAction, ...] = ()
        if r.error is None:
            guards = self._guards
            if guards.active and r.side in guards.sides and not is_refusal(r.result):
                deliver, actions, tokens, cost = guards.result(r, m)
            elif guards.cost_on:
                cost = guards.cost(tokens)
        update = ledger.record(r.side, r.session_id, tokens)
        meta = ledger.meta(r.side, r.session_id, r.server, None)
        # What a result teaches: the server's name (a peer's side), the declared tools (tools/list).
        if r.error is None and meta is not None and meta.server is None and r.side != "server":
            self._learn_server(r.result, meta)
        definitions = self._tool_definitions(r.result) if r.error is None and r.method == "tools/list" else None
        server = self._labels.server(meta, r.server)
        if r.session_id is None:
            self._fanout.unbudgeted(r.side, server, tokens)
        if meta is not None and meta.pending is not None:  # the initialize request, now with its server
            pending, meta.pending = meta.pending, None
            self._fanout.message(*pending, server)
        call = CallInfo(m.error_type, r.duration)
        if r.span is not None:
            self._spans.response(r, m, update, definitions, cost, call)
        if meta is not None:  # a session's transport and protocol, for its calls and its end
            meta.transport = meta.transport or call.transport
            meta.protocol = meta.protocol or call.protocol
            if call.transport is None:
                call.transport, call.protocol = meta.transport, meta.protocol
        self._fanout.message(r.side, r.method, r.tool_name, "output", m, update, server, call)
        if definitions is not None:
            self._fanout.tool_definitions(server, definitions.total, definitions.per_tool)
            self._fanout.tool_profiles(server, definitions.parts, definitions.static_max)
            self._costs.tool_list(meta, r.side, server, definitions)
        elif r.method == "tools/call" and r.error is None:
            self._costs.output(meta, r.side, server, m, tokens)
        if actions or cost is not None:
            self._guards.signals(r.span, r.side, actions, (r.tool_name, cost) if cost is not None else None, server)
        return m, deliver

    def _learn_server(self, result: Any, meta: SessionMeta) -> None:
        """The server's name from a result: initialize's ``serverInfo``, or the serverInfo stamp of a
        2026-07-28 result (server/discover's, and any later one's)."""
        try:
            meta.server = server_info_name(result)
        except Exception:
            self.fault("metrics")

    def _tool_definitions(self, result: Any) -> ToolList | None:
        """The tools a tools/list result declares and what their definitions cost in context."""
        try:
            return tool_list(result, self.policy.estimator, self._labels.tool_names)
        except Exception:
            self.fault("metrics")
            return None

    # ------------------------------------------------------------------ guards

    @property
    def guard_active(self) -> bool:
        """False when no guard mode is on anywhere: adapters skip every guard step (one bool check)."""
        return self._guards.active

    def guards(self, side: Side) -> bool:
        """Whether ``side`` runs the guards: a mode is on and ``guard.sides`` lists the side."""
        return self._guards.active and side in self._guards.sides

    def guard_request(
        self,
        span: Span | None,
        side: Side,
        method: str,
        params: Any,
        session_id: str | None = None,
        *,
        server: str | None = None,
    ) -> dict[str, Any] | None:
        """Run the request-side guards before a request is sent on or served.

        None: go on. A dict: the CallToolResult wire dict to answer with instead (the tool is not called);
        record it as the call's output. The actions are counted and put on ``span``. Never raises: a fault
        is counted (stage ``guard``) and the request goes on."""
        return self._guards.request(span, side, method, params, session_id, server)

    # ------------------------------------------------------------------ sessions

    def server_label(self, server: str | None = None) -> str:
        """The bounded ``server`` label of series with no session to tell more: the override, else ``server``
        (a name the caller knows), else the proxy's name."""
        return self._labels.server(None, server)

    def end_session(self, side: Side, session_id: str | None) -> None:
        """The connection is gone: close its budget (observes ``mcp_token.session.utilization``)."""
        if session_id is None:
            return
        self._ledger.end(side, session_id)
        self._guards.end_session(side, session_id)

    def end_session_soon(self, side: Side, session_id: str) -> None:
        """:meth:`end_session` for a garbage-collection callback. Such a callback runs inside whatever code
        allocated, holding whatever lock it held (an aggregate's, the budget registry's: not reentrant), so
        this only queues; the session ends at the next safe point (the next message recorded, a read of the
        session states, close)."""
        self._ledger.end_soon(side, session_id)

    def _end_queued(self) -> None:
        ending = self._ledger.ending
        while ending:
            try:
                side, session_id = ending.popleft()
            except IndexError:  # another thread took the last one
                return
            self.end_session(side, session_id)

    def states(self) -> dict[str, dict[str, int]]:
        """Live sessions per budget state, per side (budgets idle past ``budget.idle_timeout`` ended first)."""
        if self._ledger.ending:
            self._end_queued()
        self._ledger.expire()
        self._ledger.report_ended()
        return self._ledger.states()

    def session_states(self) -> dict[tuple[str, str], dict[str, int]]:
        """Live sessions per (side, server label) and budget state, every state present: what the sessions
        gauges show. Read at collection (one pass over the live sessions); a (side, server) seen once keeps
        its series at 0 when its sessions end. Sessions whose server is not known yet count under
        server_label()."""
        if self._ledger.ending:
            self._end_queued()
        return self._ledger.session_states(self._labels.server)

    def _session_ended(self, side: Side, utilization: float, meta: SessionMeta | None, why: str) -> None:
        """A session the ledger let go of: its final utilization and lifetime; an eviction is counted too."""
        call = CallInfo()
        server = self._labels.server(meta)
        if meta is not None:
            call = CallInfo(None, max(0.0, time.monotonic() - meta.started), meta.transport, meta.protocol)
            if meta.pending is not None:  # an initialize that never got its result
                self._fanout.message(*meta.pending, server)
        self._fanout.session_end(side, utilization, server, call)
        if why == "evicted":
            self._fanout.session_evicted(side, server)

    def _meta_evicted(self, side: Side, meta: SessionMeta) -> None:
        """A session's metadata evicted at the bound: its held initialize is recorded, the eviction counted."""
        server = self._labels.server(meta)
        if meta.pending is not None:
            self._fanout.message(*meta.pending, server)
        self._fanout.session_evicted(side, server)

"""The orchestrator: measurements -> span attributes, span events, session budgets, metrics.

Every adapter (mcp 2.x, mcp 1.x, the proxy) finds or opens the span for a message and hands the raw wire
dicts to a :class:`TokenRecorder`. It asks the pure core for the measurement and the budget, then hands
the results to the emitters (span attributes here, metric sinks in ``emitters``). The recorder never
raises: a fault in the estimator, the span API, the budget registry or a metrics sink is counted
(``mcp_token.instrumentation.errors`` with ``mcp_token.stage``), logged at debug level, and the MCP call
carries on untouched.

Metric attributes are bounded: tool names past ``metrics.max_tool_names`` (and method names past
``MAX_METHODS``, beyond the spec's own) share an overflow value, and no metric ever carries a session or
request id.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from ..config import Config, build_policy
from ..core.budget import BUDGET_STATES, BudgetUpdate, SessionBudget, SessionRegistry
from ..core.guard import META_GUARD_KEY, GuardAction, GuardEngine
from ..core.labels import MAX_METHODS, SPEC_METHODS, NameLimiter
from ..core.measure import Measurement, Policy, measure_error, measure_request, measure_result
from ..core.risk import BREACH_TIERS
from ..emitters.deferred import DeferredSink
from ..emitters.otel_metrics import CallInfo, MetricsSink, OtelMetricsSink
from ..semconv import (
    A_ADVISORY,
    A_ARGUMENTS,
    A_COST_USD,
    A_ERROR_TYPE,
    A_ESTIMATOR,
    A_INPUT_TOKENS,
    A_OUTPUT_TOKENS,
    A_OVERHEAD_RATIO,
    A_OVERHEAD_TOKENS,
    A_PROTOCOL,
    A_RESOURCE_URI,
    A_RESULT,
    A_RISK_TIER,
    A_SESSION_STATE,
    A_SESSION_TOKENS,
    A_SESSION_UTILIZATION,
    A_STATUS_CODE,
    A_TOOL_DEFINITION_TOKENS,
    A_TRANSPORT,
    EVENT_BUDGET,
    EVENT_GUARD,
    EVENT_RISK,
    SCHEMA_URL,
    SCOPE_NAME,
)

logger = logging.getLogger(__name__)

Side = Literal["client", "server", "proxy"]
SIDES: tuple[Side, ...] = ("client", "server", "proxy")
#: The GenAI conventions' content-capture switch, honoured beside ``spans.capture_content``.
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})
_MAX_SESSION_META = 100_000


try:  # the keys is_instrumentation_enabled() reads, read from one context lookup instead of two
    from opentelemetry.instrumentation.utils import (  # type: ignore[attr-defined]
        _SUPPRESS_INSTRUMENTATION_KEY as _SUPPRESS,
    )
    from opentelemetry.instrumentation.utils import (  # type: ignore[attr-defined]
        _SUPPRESS_INSTRUMENTATION_KEY_PLAIN as _SUPPRESS_PLAIN,
    )

    def _enabled() -> bool:
        """is_instrumentation_enabled(), with one context lookup (it is asked twice per message)."""
        ctx = otel_context.get_current()
        return not (ctx.get(_SUPPRESS) or ctx.get(_SUPPRESS_PLAIN))
except ImportError:  # an instrumentation package that moved its keys: its own function
    _enabled = is_instrumentation_enabled


def capture_from_env() -> bool:
    """True when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT asks for content on spans."""
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in _CAPTURE_VALUES


def _server_info_name(result: Any) -> str | None:
    """``serverInfo.name`` of an initialize result (wire dict or model)."""
    info = result.get("serverInfo") if isinstance(result, Mapping) else getattr(result, "server_info", None)
    name = info.get("name") if isinstance(info, Mapping) else getattr(info, "name", None)
    return name if isinstance(name, str) and name else None


class _SessionMeta:
    """What the recorder keeps per live session for its metrics: when it began and which server it is."""

    __slots__ = ("pending", "protocol", "server", "started", "transport")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.server: str | None = None
        self.transport: str | None = None
        self.protocol: str | None = None
        #: A client's initialize request, recorded once its result names the server (see record_input).
        self.pending: tuple[Any, ...] | None = None


def _status_unset(span: Span) -> bool:
    # Keep a status (and its description) that the SDK's own instrumentation already set.
    status = getattr(span, "status", None)
    return status is None or status.status_code is StatusCode.UNSET


def _truncate(value: Any, limit: int) -> str:
    """The first ``limit`` characters of ``value``'s JSON, written only that far (a 50 MB result costs what
    the 2 KB kept costs): strings are cut before they are encoded, containers stop once the limit is met."""
    if isinstance(value, str):
        return value[:limit]
    out: list[str] = []
    _write_bounded(value, out, limit, 0)
    return "".join(out)[:limit]


def _write_bounded(value: Any, out: list[str], limit: int, depth: int) -> int:
    """Append JSON for ``value`` to ``out`` until ``limit`` characters are written; returns what is left."""
    if limit <= 0:
        return 0
    if isinstance(value, str):
        piece = json.dumps(value[:limit], ensure_ascii=False)
    elif value is None or isinstance(value, (bool, int, float)):
        piece = json.dumps(value)
    elif depth >= 64:
        piece = '"…"'
    elif isinstance(value, Mapping):
        out.append("{")
        limit -= 1
        for index, (key, item) in enumerate(value.items()):
            if limit <= 0:
                return 0
            key_text = json.dumps(str(key)[:limit], ensure_ascii=False) + ": "  # json.dumps' own separators
            out.append(key_text if index == 0 else ", " + key_text)
            limit = _write_bounded(item, out, limit - len(key_text) - 2 * (index > 0), depth + 1)
        piece = "}"
    elif isinstance(value, (list, tuple)):
        out.append("[")
        limit -= 1
        for index, item in enumerate(value):
            if limit <= 0:
                return 0
            if index:
                out.append(", ")
                limit -= 2
            limit = _write_bounded(item, out, limit, depth + 1)
        piece = "]"
    else:
        piece = json.dumps(str(value)[:limit], ensure_ascii=False)
    out.append(piece)
    return limit - len(piece)


def _status_description(m: Measurement, result: Any, error: Any) -> str:
    """A short status description: the JSON-RPC error's code and message, or the tool error's first text."""
    if m.error_type == "tool_error":
        content = result.get("content") if isinstance(result, Mapping) else None
        first = content[0] if isinstance(content, list) and content else None
        text = first.get("text") if isinstance(first, Mapping) else None
        return f"tool_error: {text[:200]}" if isinstance(text, str) and text else "tool_error"
    message = error.get("message") if isinstance(error, Mapping) else getattr(error, "message", None)
    return f"{m.error_type}: {message[:200]}" if isinstance(message, str) and message else str(m.error_type)


def _is_refusal(result: Any) -> bool:
    """A guard's own refusal (its _meta carries the guard key): recorded as the output, never guarded again."""
    meta = result.get("_meta") if isinstance(result, Mapping) else None
    return isinstance(meta, Mapping) and META_GUARD_KEY in meta


def _rate_key(side: str, session_id: str | None) -> str | None:
    """The rate limiter's key: per side, so an in-process client and server never count one call twice."""
    return None if session_id is None else f"{side}:{session_id}"


def _budget_attributes(update: BudgetUpdate) -> dict[str, Any]:
    return {
        A_SESSION_TOKENS: update.tokens,
        A_SESSION_UTILIZATION: update.utilization,
        A_SESSION_STATE: update.state,
    }


def _budget_events(span: Span, update: BudgetUpdate) -> None:
    for state in update.transitions:
        span.add_event(
            EVENT_BUDGET,
            {A_SESSION_STATE: state, A_SESSION_TOKENS: update.tokens, A_SESSION_UTILIZATION: update.utilization},
        )


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
        self._capture = self.config.spans.capture_content or capture_from_env()
        self._max_chars = self.config.spans.max_content_chars
        self.tool_names = NameLimiter(
            self.config.metrics.max_tool_names, self.config.metrics.overflow_tool_name
        )
        self.server_names = NameLimiter(
            self.config.metrics.max_server_names, self.config.metrics.overflow_tool_name
        )
        #: metrics.server_name: one name for every series, whatever the sessions say.
        self._server_override = self.config.metrics.server_name or None
        #: The name when nothing more specific is known (the proxy's --name).
        self.default_server: str = server_name or ""
        self._session_meta: dict[tuple[str, str], _SessionMeta] = {}
        self._session_servers: set[tuple[str, str]] = set()  # (side, server) pairs the sessions gauge shows
        self.method_names = NameLimiter(MAX_METHODS + len(SPEC_METHODS), self.config.metrics.overflow_tool_name)
        for spec_method in SPEC_METHODS:
            self.method_names(spec_method)
        budget = self.config.budget
        self._budget_lock = threading.Lock()
        # Sessions ended under the lock, to report after it.
        self._ended: deque[tuple[str, float, _SessionMeta | None]] = deque()
        # Sessions to end at the next safe point (end_session_soon: garbage-collection callbacks).
        self._ending: deque[tuple[Side, str]] = deque()
        self.sessions: dict[str, SessionRegistry] = {
            side: SessionRegistry(
                budget.context_window,
                budget.warning_ratio,
                budget.exhaustion_ratio,
                max_sessions=budget.max_sessions,
                idle_timeout=budget.idle_timeout_seconds,
                on_end=self._session_ended_callback(side),
            )
            for side in SIDES
        }
        guard = self.config.guard
        #: The guard policies (docs/guardrails.md); one engine per recorder, shared by every side.
        self.guard = GuardEngine(guard, self.policy, max_sessions=budget.max_sessions)
        self._guard_on = self.guard.active
        self._guard_sides = frozenset(guard.sides)
        #: The refusal and padding policies switched on: their series start at 0 per (side, server, tool).
        self._guard_zero: tuple[str, ...] = tuple(
            policy for policy, on in (("chain_depth", guard.max_chain_depth > 0), ("session_limit",
                                      guard.session_hard_limit), ("rate_limit", guard.rate_limit),
                                      ("padding", guard.padding.enabled)) if on
        )
        self._guard_touched: set[tuple[str, str, str | None]] = set()
        #: Cost is observability: computed whenever guard.model is set, guard on or off.
        self._cost_on = bool(guard.model)
        #: In-process fault counts per stage; the one place a fault is visible when the meter itself fails.
        self.error_counts: Counter[str] = Counter()
        self.sinks: list[MetricsSink] = []
        try:
            prom = self.config.prometheus
            otel_sink: Any = OtelMetricsSink(
                meter_provider,
                __version__,
                states=self.session_states,
                rate_budgets={"tool": prom.tool_output_rate_budget, "service": prom.service_output_rate_budget},
                server=self.server_label(),
                input_histograms=self.config.metrics.input_histograms,
            )
            if self.config.metrics.defer_otel:  # the OTel SDK's per-point cost stays off the call path
                otel_sink = DeferredSink(otel_sink, on_error=self.fault)
            self.add_sink(otel_sink)
        except Exception:
            self.fault("metrics")

    # ------------------------------------------------------------------ sinks and faults

    def flush(self) -> None:
        """Hand every deferred metric point to its sink now (tests, shutdown)."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if callable(flush):
                flush()

    def close(self) -> None:
        """Flush and stop background work (uninstrument calls this)."""
        self._end_queued()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    self.fault("metrics")

    def add_sink(self, sink: MetricsSink) -> None:
        """Send metrics to another sink too.

        The built-in pre-aggregating sinks (``server_aware``) run inline: a message costs them a dict
        increment. Any other sink runs off the MCP call path, replayed by a :class:`DeferredSink`'s background
        thread, so a sink that blocks or is slow never holds up a call (``flush()`` replays now).
        """
        if getattr(sink, "server_aware", False) is not True and not isinstance(sink, DeferredSink):
            sink = DeferredSink(sink, on_error=self.fault)
        self.sinks.append(sink)

    def fault(self, stage: str) -> None:
        """Count and log an instrumentation fault; never raises. A fault has no session to name its server:
        the built-in sinks get the server_label() (without calling it: its own faults come here)."""
        self.error_counts[stage] += 1
        logger.debug("mcp_token_otel: fault in stage %s", stage, exc_info=True)
        try:
            name = self._server_override or self.default_server
            server = (self.server_names(name) or "") if name else ""
        except Exception:
            server = ""
        for sink in self.sinks:
            try:
                if getattr(sink, "server_aware", False) is True:
                    sink.record_error(stage, server)
                else:
                    sink.record_error(stage)
            except Exception:
                self.error_counts["metrics"] += 1

    def _emit(self, name: str, *args: Any, server: tuple[Any, ...] | None = None) -> None:
        """Call ``name`` on every sink; a failing sink does not stop the others. ``server``: the arguments the
        built-in (server-aware) sinks take after ``args``; user sinks get ``args`` alone."""
        for sink in self.sinks:
            try:
                if server is not None and getattr(sink, "server_aware", False) is True:
                    getattr(sink, name)(*args, *server)
                else:
                    getattr(sink, name)(*args)
            except Exception:
                self.fault("metrics")

    def _emit_rich(self, name: str, *args: Any) -> None:
        """A call only the built-in sinks know (calls, tool definitions)."""
        for sink in self.sinks:
            if getattr(sink, "server_aware", False) is True:
                try:
                    getattr(sink, name)(*args)
                except Exception:
                    self.fault("metrics")

    # ------------------------------------------------------------------ spans

    def start_span(
        self, name: str, kind: SpanKind, attributes: dict[str, Any] | None = None, context: Any = None
    ) -> Span | None:
        """Open one of our spans; None when the tracing pipeline fails (the call goes on without it) or when
        instrumentation is suppressed in this context."""
        if not is_instrumentation_enabled():
            return None
        try:
            return self.tracer.start_span(
                name,
                context=context,
                kind=kind,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            )
        except Exception:
            self.fault("span")
            return None

    def end_span(self, span: Span | None) -> None:
        if span is None:
            return
        try:
            span.end()
        except Exception:
            self.fault("span")

    def set_attributes(self, span: Span | None, attributes: Mapping[str, Any]) -> None:
        try:
            if span is not None and span.is_recording():
                span.set_attributes(attributes)
        except Exception:
            self.fault("span")

    def record_exception(self, span: Span | None, exc: BaseException) -> None:
        """A non-JSON-RPC failure of the call (transport error...): error.type is the exception class."""
        try:
            if span is not None and span.is_recording():
                span.set_attribute(A_ERROR_TYPE, type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, f"{type(exc).__qualname__}: {str(exc)[:200]}")
        except Exception:
            self.fault("span")

    # ------------------------------------------------------------------ messages

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
    ) -> Measurement | None:
        """Measure a request's (or notification's) params; ``session_id`` None keeps it off the budget.

        ``attributes`` (the adapter's own, e.g. transport and session id) go onto the span in the same
        ``set_attributes`` call. The session's running totals go on with the response (set once per span).
        ``server``: the server's own name, where the adapter knows it (the server side).
        ``hold``: a dict that receives the request's span attributes instead of the span, for an adapter that
        passes it to :meth:`record_output` as ``held`` (one ``set_attributes`` per call, not two) and sets
        what is still held on the span itself if no output is recorded. Events are added at once either way.
        Nothing is recorded inside an OpenTelemetry suppression context.
        """
        if not _enabled():
            return None
        if self._ending:
            self._end_queued()
        try:
            measurement = measure_request(method, params, self.policy)
        except Exception:
            self.fault("estimate")
            if attributes:
                self.set_attributes(span, attributes)
            return None
        update = self._budget(side, session_id, measurement.total_tokens)
        meta = self._meta(side, session_id, server, attributes)
        try:
            if span is not None and span.is_recording():
                attrs: dict[str, Any] = dict(attributes) if attributes else {}
                attrs[A_INPUT_TOKENS] = measurement.total_tokens
                attrs[A_ESTIMATOR] = self.policy.estimator_name
                if self._capture and method == "tools/call" and isinstance(params, Mapping):
                    attrs[A_ARGUMENTS] = _truncate(params.get("arguments"), self._max_chars)
                elif method.startswith("resources/") and isinstance(params, Mapping):
                    uri = params.get("uri")  # conditionally required; also on spans the SDK opened itself
                    if isinstance(uri, str):
                        attrs[A_RESOURCE_URI] = uri
                if update is not None and update.transitions:  # the state entered is news: say it now
                    attrs.update(_budget_attributes(update))
                    _budget_events(span, update)
                if hold is not None:
                    hold.update(attrs)
                else:
                    span.set_attributes(attrs)
        except Exception:
            self.fault("span")
        label = self._server(meta, server)
        if not label and method == "initialize" and side != "server" and meta is not None:
            # The server's name arrives with this request's result: its metrics are recorded then, with it.
            meta.pending = (side, method, measurement.tool_name, "input", measurement, update)
        else:
            self._metrics(side, method, measurement.tool_name, "input", measurement, update, label)
        return measurement

    # ------------------------------------------------------------------ guards

    @property
    def guard_active(self) -> bool:
        """False when no guard mode is on anywhere: adapters skip every guard step (one bool check)."""
        return self._guard_on

    def guards(self, side: Side) -> bool:
        """Whether ``side`` runs the guards: a mode is on and ``guard.sides`` lists the side."""
        return self._guard_on and side in self._guard_sides

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
        if not self._guard_on or side not in self._guard_sides or not is_instrumentation_enabled():
            return None
        try:
            budget = self.sessions[side].get(session_id) if session_id is not None else None
            decision = self.guard.on_request(
                method, params, session_id=_rate_key(side, session_id), budget=budget
            )
        except Exception:
            self.fault("guard")
            return None
        if decision.actions or method == "tools/call":
            server_label = self._server(self._meta(side, session_id, server, None), server)
            if method == "tools/call":
                self._guard_series(side, server_label, params)
            if decision.actions:
                self._guard_signals(span, side, decision.actions, None, server_label)
        return None if decision.allow else decision.result

    def _guard_series(self, side: Side, server: str, params: Any) -> None:
        """A tool's first guarded call (per side and server): its refusal and padding series start at 0, so that
        alert rules taking increase() see the first refusal (a series born with it has no earlier sample)."""
        try:
            name = params.get("name") if isinstance(params, Mapping) else None
            if not isinstance(name, str) or not self._guard_zero:
                return
            tool = self.tool_names(name, False)
            key = (side, server, tool)
            if key in self._guard_touched:
                return
            if len(self._guard_touched) >= 10_000:
                self._guard_touched.clear()
            self._guard_touched.add(key)
            tp = self.guard.tool_policy(name)
            if not tp.active:
                return
            series = [(p, "found" if p == "padding" else "refused", tp.enforce) for p in self._guard_zero
                      if p != "padding" or tp.padding]
        except Exception:
            self.fault("metrics")
            return
        for sink in self.sinks:
            touch = getattr(sink, "touch_guard", None)  # the Prometheus sink; OTel counters need no zero
            if touch is not None:
                try:
                    touch(side, server, tool, series)
                except Exception:
                    self.fault("metrics")

    def _guard_result(
        self,
        side: Side,
        method: str,
        tool_name: str | None,
        result: Any,
        session_id: str | None,
        arguments: Mapping[str, Any] | None,
        m: Measurement,
    ) -> tuple[Any, tuple[GuardAction, ...], int, float | None]:
        """engine.on_result on a measured result: (result to deliver, actions, tokens entering the context,
        cost). A fault delivers the result unchanged."""
        try:
            budget = self.sessions[side].get(session_id) if session_id is not None else None
            outcome = self.guard.on_result(
                method, result, tool=tool_name, arguments=arguments, budget=budget, measurement=m
            )
        except Exception:
            self.fault("guard")
            return result, (), m.total_tokens, self._cost(m.total_tokens)
        tokens = outcome.context_tokens if outcome.context_tokens is not None else m.total_tokens
        return outcome.result, outcome.actions, tokens, outcome.cost_usd

    def _cost(self, tokens: int) -> float | None:
        if not self._cost_on:
            return None
        try:
            return self.guard.cost_usd(tokens)
        except Exception:
            self.fault("guard")
            return None

    def _guard_signals(
        self,
        span: Span | None,
        side: Side,
        actions: tuple[GuardAction, ...],
        cost: tuple[str | None, float] | None,
        server: str,
    ) -> None:
        """Span events (one ``mcp_token.guard`` per action) and the guard counters; ``cost``: (tool, USD)."""
        try:
            if span is not None and actions and span.is_recording():
                for action in actions:
                    span.add_event(EVENT_GUARD, action.attributes())
        except Exception:
            self.fault("span")
        for action in actions:
            try:
                tool = self.tool_names(action.tool, False)
            except Exception:
                self.fault("metrics")
                continue
            self._emit_rich("record_guard_action", side, server, action.policy, action.action, action.enforced, tool)
        if cost is not None:
            try:
                tool = self.tool_names(cost[0], False)
            except Exception:
                self.fault("metrics")
                return
            self._emit_rich("record_cost", side, server, tool, cost[1])

    # ------------------------------------------------------------------ responses

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
        return self._output(span, side, method, tool_name, result, error, session_id, started, duration_s, server,
                            arguments, held)[0]

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
        return self._output(span, side, method, tool_name, result, None, session_id, started, duration_s, server,
                            arguments, held)

    def _output(
        self,
        span: Span | None,
        side: Side,
        method: str,
        tool_name: str | None,
        result: Any,
        error: Any,
        session_id: str | None,
        started: float | None,
        duration_s: float | None,
        server: str | None,
        arguments: Mapping[str, Any] | None,
        held: dict[str, Any] | None = None,
    ) -> tuple[Measurement | None, Any]:
        if not _enabled():
            return None, result
        if self._ending:
            self._end_queued()
        if duration_s is None and started is not None:
            duration_s = max(0.0, time.perf_counter() - started)
        try:
            if error is not None:
                measurement = measure_error(method, error, tool_name=tool_name, policy=self.policy)
            else:
                measurement = measure_result(method, result, tool_name=tool_name, policy=self.policy)
        except Exception:
            self.fault("estimate")
            return None, result
        deliver = result
        tokens = measurement.total_tokens
        actions: tuple[GuardAction, ...] = ()
        cost: float | None = None
        if error is None:
            if self._guard_on and side in self._guard_sides and not _is_refusal(result):
                deliver, actions, tokens, cost = self._guard_result(
                    side, method, tool_name, result, session_id, arguments, measurement
                )
            elif self._cost_on:
                cost = self._cost(tokens)
        update = self._budget(side, session_id, tokens)
        meta = self._meta(side, session_id, server, None)
        definitions: tuple[int, dict[str, int]] | None = None
        if error is None and method in ("initialize", "tools/list"):
            definitions = self._from_result(side, method, result, meta)
        server_label = self._server(meta, server)
        if meta is not None and meta.pending is not None:  # the initialize request, now with its server
            pending, meta.pending = meta.pending, None
            self._metrics(*pending, server_label)
        call = CallInfo(measurement.error_type, duration_s)
        try:
            if span is not None and span.is_recording():
                self._output_on_span(span, measurement, result, update, definitions, error, cost, held)
                if duration_s is not None:  # the conventions' metric attributes the span already carries
                    span_attrs = getattr(span, "attributes", None)
                    if isinstance(span_attrs, Mapping):
                        call.transport = span_attrs.get(A_TRANSPORT)
                        call.protocol = span_attrs.get(A_PROTOCOL)
                        if meta is not None:
                            meta.transport = meta.transport or call.transport
                            meta.protocol = meta.protocol or call.protocol
        except Exception:
            self.fault("span")
        if call.transport is None and meta is not None:
            call.transport, call.protocol = meta.transport, meta.protocol
        self._metrics(side, method, tool_name, "output", measurement, update, server_label, call)
        if definitions is not None:
            self._emit_rich("record_tool_definitions", server_label, *definitions)
        if actions or cost is not None:
            self._guard_signals(span, side, actions, (tool_name, cost) if cost is not None else None, server_label)
        return measurement, deliver

    def _from_result(
        self, side: Side, method: str, result: Any, meta: _SessionMeta | None
    ) -> tuple[int, dict[str, int]] | None:
        """What an initialize or tools/list result tells: the server's name; the tools it declares (their
        names become labels before their first call) and what their definitions cost in context."""
        try:
            if method == "initialize":
                name = _server_info_name(result) if side != "server" else None
                if name is not None and meta is not None:
                    meta.server = name
                return None
            tools = result.get("tools") if isinstance(result, Mapping) else None
            if not isinstance(tools, list):
                return None
            from ..core.profiles import tool_definition_tokens

            total = 0
            per_tool: dict[str, int] = {}
            overflow = self.tool_names.overflow
            estimator = self.policy.estimator
            for tool in tools:
                if not isinstance(tool, Mapping):
                    continue
                tokens = tool_definition_tokens(tool, estimator)
                total += tokens
                name = tool.get("name")
                if isinstance(name, str):
                    label = self.tool_names(name)
                    if label is not None and label != overflow:  # per-tool figures only within the bound
                        per_tool[label] = tokens
            return total, per_tool
        except Exception:
            self.fault("metrics")
            return None

    def _meta(
        self, side: Side, session_id: str | None, server: str | None, attributes: Mapping[str, Any] | None
    ) -> _SessionMeta | None:
        """The session's metric context, created at its first message (the session's start)."""
        if session_id is None:
            return None
        try:
            key = (side, session_id)
            meta = self._session_meta.get(key)
            if meta is None:
                if len(self._session_meta) >= _MAX_SESSION_META:  # only if sessions end unseen
                    self._session_meta.clear()
                meta = self._session_meta[key] = _SessionMeta()
            if server and meta.server is None:
                meta.server = server
            if attributes and meta.transport is None:
                meta.transport = attributes.get(A_TRANSPORT)
            return meta
        except Exception:
            self.fault("metrics")
            return None

    def server_label(self) -> str:
        """The ``server`` label of series with no session to tell more (the override, or the proxy's name)."""
        return self._server(None)

    def _server(self, meta: _SessionMeta | None, server: str | None = None) -> str:
        """The bounded ``server`` label: config override, then the adapter's, the proxy's --name, the session's."""
        name = self._server_override or server or self.default_server or (meta.server if meta is not None else None)
        if not name:
            return ""
        try:
            return self.server_names(name) or ""
        except Exception:
            self.fault("metrics")
            return ""

    def end_session(self, side: Side, session_id: str | None) -> None:
        """The connection is gone: close its budget (observes ``mcp_token.session.utilization``)."""
        if session_id is None:
            return
        try:
            with self._budget_lock:
                self.sessions[side].end(session_id)
        except Exception:
            self.fault("budget")
        if self._guard_on:
            try:
                self.guard.end_session(_rate_key(side, session_id))
            except Exception:
                self.fault("guard")
        self._emit_ended()

    def end_session_soon(self, side: Side, session_id: str) -> None:
        """:meth:`end_session` for a garbage-collection callback. Such a callback runs inside whatever code
        allocated, holding whatever lock it held (an aggregate's, the budget registry's: not reentrant), so
        this only queues; the session ends at the next safe point (the next message recorded, a read of the
        session states, close)."""
        self._ending.append((side, session_id))

    def _end_queued(self) -> None:
        while self._ending:
            try:
                side, session_id = self._ending.popleft()
            except IndexError:  # another thread took the last one
                return
            self.end_session(side, session_id)

    def states(self) -> dict[str, dict[str, int]]:
        """Live sessions per budget state, per side."""
        if self._ending:
            self._end_queued()
        with self._budget_lock:
            return {side: dict(reg.states()) for side, reg in self.sessions.items()}

    def session_states(self) -> dict[tuple[str, str], dict[str, int]]:
        """Live sessions per (side, server label) and budget state, every state present: what the sessions
        gauges show. Read at collection (one pass over the live sessions); a (side, server) seen once keeps
        its series at 0 when its sessions end. Sessions whose server is not known yet count under
        server_label()."""
        if self._ending:
            self._end_queued()
        with self._budget_lock:
            live = {side: reg.sessions() for side, reg in self.sessions.items()}
        default = self.server_label()
        out = {key: dict.fromkeys(BUDGET_STATES, 0) for key in self._session_servers}
        labels: dict[str | None, str] = {None: default}  # a session's label depends only on its meta.server
        for side, sessions in live.items():
            out.setdefault((side, default), dict.fromkeys(BUDGET_STATES, 0))
            for session_id, state in sessions:
                meta = self._session_meta.get((side, session_id))
                name = meta.server if meta is not None else None
                server = labels.get(name)
                if server is None:
                    server = labels[name] = self._server(meta)
                counts = out.get((side, server))
                if counts is None:
                    counts = out[side, server] = dict.fromkeys(BUDGET_STATES, 0)
                counts[state] += 1
        if len(out) <= 1_000:  # labels are bounded; this bounds the set whatever happens
            self._session_servers = set(out)
        return out

    # ------------------------------------------------------------------ internals

    def _session_ended_callback(self, side: Side) -> Callable[[str, SessionBudget, str], None]:
        # Called by the registry under _budget_lock: only note it; _emit_ended() reports it after the lock,
        # so no sink ever runs while the lock is held (a sink may read states()).
        def ended(session_id: str, budget: SessionBudget, _why: str) -> None:
            self._ended.append((side, budget.utilization, self._session_meta.pop((side, session_id), None)))

        return ended

    def _emit_ended(self) -> None:
        while self._ended:
            side, utilization, meta = self._ended.popleft()
            call = CallInfo()
            if meta is not None:
                call = CallInfo(None, max(0.0, time.monotonic() - meta.started), meta.transport, meta.protocol)
                if meta.pending is not None:  # an initialize that never got its result
                    self._metrics(*meta.pending, self._server(meta))
            self._emit("record_session_end", side, utilization, server=(self._server(meta), call))

    def _budget(self, side: Side, session_id: str | None, tokens: int) -> BudgetUpdate | None:
        if session_id is None:
            return None
        try:
            with self._budget_lock:
                update = self.sessions[side].record(session_id, tokens)
        except Exception:
            self.fault("budget")
            return None
        if self._ended:  # idle or evicted sessions the registry let go of while recording
            self._emit_ended()
        return update

    def _output_on_span(
        self,
        span: Span,
        m: Measurement,
        result: Any,
        update: BudgetUpdate | None,
        definitions: tuple[int, dict[str, int]] | None = None,
        error: Any = None,
        cost: float | None = None,
        held: dict[str, Any] | None = None,
    ) -> None:
        # The request's held attributes first: the response's (session totals included) are newer.
        attrs: dict[str, Any] = held if held is not None else {}
        attrs[A_OUTPUT_TOKENS] = m.total_tokens
        attrs[A_OVERHEAD_TOKENS] = m.overhead_tokens
        attrs[A_OVERHEAD_RATIO] = m.overhead_ratio
        attrs[A_RISK_TIER] = m.risk_tier
        attrs[A_ESTIMATOR] = self.policy.estimator_name
        if update is not None:  # _budget_attributes, inlined: one dict per response, not two
            attrs[A_SESSION_TOKENS] = update.tokens
            attrs[A_SESSION_UTILIZATION] = update.utilization
            attrs[A_SESSION_STATE] = update.state
        if m.error_type is not None:
            attrs[A_ERROR_TYPE] = m.error_type
            if m.error_type != "tool_error":
                attrs[A_STATUS_CODE] = m.error_type
        if definitions is not None:
            attrs[A_TOOL_DEFINITION_TOKENS] = definitions[0]
        if cost is not None:
            attrs[A_COST_USD] = cost
        if self._capture and m.method == "tools/call" and result is not None:
            content = result.get("content", result) if isinstance(result, Mapping) else result
            attrs[A_RESULT] = _truncate(content, self._max_chars)
        span.set_attributes(attrs)
        if held:
            held.clear()  # on the span now: the adapter has nothing left to set
        if m.error_type is not None and _status_unset(span):
            span.set_status(StatusCode.ERROR, _status_description(m, result, error))
        if m.risk_tier in BREACH_TIERS:
            event: dict[str, Any] = {A_RISK_TIER: m.risk_tier, A_OUTPUT_TOKENS: m.total_tokens}
            advisories = m.advisories
            if advisories:
                event[A_ADVISORY] = advisories[0]
            span.add_event(EVENT_RISK, event)
        if update is not None:
            _budget_events(span, update)

    def _metrics(
        self,
        side: Side,
        method: str,
        tool_name: str | None,
        direction: str,
        m: Measurement,
        update: BudgetUpdate | None,
        server: str = "",
        call: CallInfo | None = None,
    ) -> None:
        try:
            admit = direction == "output" and m.error_type is None
            method_label = self.method_names(method, admit) or method
            tool_label = self.tool_names(tool_name, admit)
        except Exception:
            self.fault("metrics")
            return
        # One pass over the sinks per message (a response's message, breach, call and transition points);
        # each sink still gets its calls in the order it always did.
        output = direction == "output"
        breach = output and m.risk_tier in BREACH_TIERS
        timed = output and call is not None and (call.error_type is not None or call.duration is not None)
        transitions = update.transitions if update is not None else ()
        for sink in self.sinks:
            aware = getattr(sink, "server_aware", False) is True
            try:
                if aware:
                    sink.record_message(side, method_label, tool_label, direction, m, server)
                else:
                    sink.record_message(side, method_label, tool_label, direction, m)
            except Exception:
                self.fault("metrics")
            if breach:
                try:
                    if aware:
                        sink.record_breach(side, method_label, tool_label, m.risk_tier, server)
                    else:
                        sink.record_breach(side, method_label, tool_label, m.risk_tier)
                except Exception:
                    self.fault("metrics")
            if timed and aware:
                try:
                    sink.record_call(side, method_label, tool_label, server, call)
                except Exception:
                    self.fault("metrics")
            for state in transitions:
                try:
                    if aware:
                        sink.record_transition(side, state, server)
                    else:
                        sink.record_transition(side, state)
                except Exception:
                    self.fault("metrics")

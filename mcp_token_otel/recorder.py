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
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from .config import Config, build_policy
from .core.budget import BudgetUpdate, SessionBudget, SessionRegistry
from .core.labels import MAX_METHODS, SPEC_METHODS, NameLimiter
from .core.measure import Measurement, Policy, measure_error, measure_request, measure_result
from .core.risk import BREACH_TIERS
from .emitters.deferred import DeferredSink
from .emitters.otel_metrics import MetricsSink, OtelMetricsSink
from .emitters.semconv import (
    A_ADVISORY,
    A_ARGUMENTS,
    A_ERROR_TYPE,
    A_ESTIMATOR,
    A_INPUT_TOKENS,
    A_OUTPUT_TOKENS,
    A_OVERHEAD_RATIO,
    A_OVERHEAD_TOKENS,
    A_RESULT,
    A_RISK_TIER,
    A_SESSION_STATE,
    A_SESSION_TOKENS,
    A_SESSION_UTILIZATION,
    A_STATUS_CODE,
    EVENT_BUDGET,
    EVENT_RISK,
    SCOPE_NAME,
)

logger = logging.getLogger(__name__)

Side = Literal["client", "server", "proxy"]
SIDES: tuple[Side, ...] = ("client", "server", "proxy")


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
    ) -> None:
        from . import __version__

        self.config = config or Config()
        self.policy = policy or build_policy(self.config)
        self.tracer: Tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            SCOPE_NAME, __version__
        )
        self._capture = self.config.spans.capture_content
        self._max_chars = self.config.spans.max_content_chars
        self.tool_names = NameLimiter(
            self.config.metrics.max_tool_names, self.config.metrics.overflow_tool_name
        )
        self.method_names = NameLimiter(MAX_METHODS + len(SPEC_METHODS), self.config.metrics.overflow_tool_name)
        for spec_method in SPEC_METHODS:
            self.method_names(spec_method)
        budget = self.config.budget
        self._budget_lock = threading.Lock()
        self._ended: deque[tuple[str, float]] = deque()  # sessions ended under the lock, to report after it
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
        #: In-process fault counts per stage; the one place a fault is visible when the meter itself fails.
        self.error_counts: Counter[str] = Counter()
        self.sinks: list[MetricsSink] = []
        try:
            prom = self.config.prometheus
            otel_sink: MetricsSink = OtelMetricsSink(
                meter_provider,
                __version__,
                states=self.states,
                rate_budgets={"tool": prom.tool_output_rate_budget, "service": prom.service_output_rate_budget},
            )
            if self.config.metrics.defer_otel:  # the OTel SDK's per-point cost stays off the call path
                otel_sink = DeferredSink(otel_sink, on_error=self._fault)
            self.add_sink(otel_sink)
        except Exception:
            self._fault("metrics")

    # ------------------------------------------------------------------ sinks and faults

    def flush(self) -> None:
        """Hand every deferred metric point to its sink now (tests, shutdown)."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if callable(flush):
                flush()

    def close(self) -> None:
        """Flush and stop background work (uninstrument calls this)."""
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    self._fault("metrics")

    def add_sink(self, sink: MetricsSink) -> None:
        """Send metrics to another sink too (e.g. a Prometheus client registry)."""
        self.sinks.append(sink)

    def _fault(self, stage: str) -> None:
        """Count and log an instrumentation fault; never raises."""
        self.error_counts[stage] += 1
        logger.debug("mcp_token_otel: fault in stage %s", stage, exc_info=True)
        for sink in self.sinks:
            try:
                sink.record_error(stage)
            except Exception:
                self.error_counts["metrics"] += 1

    def _emit(self, name: str, *args: Any) -> None:
        """Call ``name`` on every sink; a failing sink does not stop the others."""
        for sink in self.sinks:
            try:
                getattr(sink, name)(*args)
            except Exception:
                self._fault("metrics")

    # ------------------------------------------------------------------ spans

    def start_span(
        self, name: str, kind: SpanKind, attributes: dict[str, Any] | None = None, context: Any = None
    ) -> Span | None:
        """Open one of our spans; None when the tracing pipeline fails (the call goes on without it)."""
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
            self._fault("span")
            return None

    def end_span(self, span: Span | None) -> None:
        if span is None:
            return
        try:
            span.end()
        except Exception:
            self._fault("span")

    def set_attributes(self, span: Span | None, attributes: Mapping[str, Any]) -> None:
        try:
            if span is not None and span.is_recording():
                span.set_attributes(attributes)
        except Exception:
            self._fault("span")

    def record_exception(self, span: Span | None, exc: BaseException) -> None:
        """A non-JSON-RPC failure of the call (transport error...): error.type is the exception class."""
        try:
            if span is not None and span.is_recording():
                span.set_attribute(A_ERROR_TYPE, type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, str(exc)[:200])
        except Exception:
            self._fault("span")

    # ------------------------------------------------------------------ messages

    def record_input(
        self,
        span: Span | None,
        side: Side,
        method: str,
        params: Any,
        session_id: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> Measurement | None:
        """Measure a request's (or notification's) params; ``session_id`` None keeps it off the budget.

        ``attributes`` (the adapter's own, e.g. transport and session id) go onto the span in the same
        ``set_attributes`` call. The session's running totals go on with the response (set once per span).
        """
        try:
            measurement = measure_request(method, params, self.policy)
        except Exception:
            self._fault("estimate")
            if attributes:
                self.set_attributes(span, attributes)
            return None
        update = self._budget(side, session_id, measurement.total_tokens)
        try:
            if span is not None and span.is_recording():
                attrs: dict[str, Any] = dict(attributes) if attributes else {}
                attrs[A_INPUT_TOKENS] = measurement.total_tokens
                attrs[A_ESTIMATOR] = self.policy.estimator_name
                if self._capture and method == "tools/call" and isinstance(params, Mapping):
                    attrs[A_ARGUMENTS] = _truncate(params.get("arguments"), self._max_chars)
                if update is not None and update.transitions:  # the state entered is news: say it now
                    attrs.update(_budget_attributes(update))
                    _budget_events(span, update)
                span.set_attributes(attrs)
        except Exception:
            self._fault("span")
        self._metrics(side, method, measurement.tool_name, "input", measurement, update)
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
    ) -> Measurement | None:
        """Measure a response: ``result`` (wire dict or model) or ``error`` (MCPError/ErrorData/dict)."""
        try:
            if error is not None:
                measurement = measure_error(method, error, tool_name=tool_name, policy=self.policy)
            else:
                measurement = measure_result(method, result, tool_name=tool_name, policy=self.policy)
        except Exception:
            self._fault("estimate")
            return None
        if method == "tools/list" and error is None:
            self._admit_declared_tools(result)
        update = self._budget(side, session_id, measurement.total_tokens)
        try:
            if span is not None and span.is_recording():
                self._output_on_span(span, measurement, result, update)
        except Exception:
            self._fault("span")
        self._metrics(side, method, tool_name, "output", measurement, update)
        return measurement

    def _admit_declared_tools(self, result: Any) -> None:
        """Tools a server declares are real: their names become labels before their first call."""
        try:
            tools = result.get("tools") if isinstance(result, Mapping) else None
            for tool in tools if isinstance(tools, list) else ():
                name = tool.get("name") if isinstance(tool, Mapping) else None
                if isinstance(name, str):
                    self.tool_names(name)
        except Exception:
            self._fault("metrics")

    def end_session(self, side: Side, session_id: str | None) -> None:
        """The connection is gone: close its budget (observes ``mcp_token.session.utilization``)."""
        if session_id is None:
            return
        try:
            with self._budget_lock:
                self.sessions[side].end(session_id)
        except Exception:
            self._fault("budget")
        self._emit_ended()

    def states(self) -> dict[str, dict[str, int]]:
        """Live sessions per budget state, per side."""
        with self._budget_lock:
            return {side: dict(reg.states()) for side, reg in self.sessions.items()}

    # ------------------------------------------------------------------ internals

    def _session_ended_callback(self, side: Side) -> Callable[[str, SessionBudget, str], None]:
        # Called by the registry under _budget_lock: only note it; _emit_ended() reports it after the lock,
        # so no sink ever runs while the lock is held (a sink may read states()).
        def ended(_session_id: str, budget: SessionBudget, _why: str) -> None:
            self._ended.append((side, budget.utilization))

        return ended

    def _emit_ended(self) -> None:
        while self._ended:
            side, utilization = self._ended.popleft()
            self._emit("record_session_end", side, utilization)

    def _budget(self, side: Side, session_id: str | None, tokens: int) -> BudgetUpdate | None:
        if session_id is None:
            return None
        try:
            with self._budget_lock:
                update = self.sessions[side].record(session_id, tokens)
        except Exception:
            self._fault("budget")
            return None
        if self._ended:  # idle or evicted sessions the registry let go of while recording
            self._emit_ended()
        return update

    def _output_on_span(self, span: Span, m: Measurement, result: Any, update: BudgetUpdate | None) -> None:
        attrs: dict[str, Any] = {
            A_OUTPUT_TOKENS: m.total_tokens,
            A_OVERHEAD_TOKENS: m.overhead_tokens,
            A_OVERHEAD_RATIO: m.overhead_ratio,
            A_RISK_TIER: m.risk_tier,
            A_ESTIMATOR: self.policy.estimator_name,
        }
        if update is not None:
            attrs.update(_budget_attributes(update))
        if m.error_type is not None:
            attrs[A_ERROR_TYPE] = m.error_type
            if m.error_type != "tool_error":
                attrs[A_STATUS_CODE] = m.error_type
        if self._capture and m.method == "tools/call" and result is not None:
            content = result.get("content", result) if isinstance(result, Mapping) else result
            attrs[A_RESULT] = _truncate(content, self._max_chars)
        span.set_attributes(attrs)
        if m.error_type is not None and _status_unset(span):
            span.set_status(StatusCode.ERROR)
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
    ) -> None:
        try:
            admit = direction == "output" and m.error_type is None
            method_label = self.method_names(method, admit) or method
            tool_label = self.tool_names(tool_name, admit)
        except Exception:
            self._fault("metrics")
            return
        self._emit("record_message", side, method_label, tool_label, direction, m)
        if direction == "output" and m.risk_tier in BREACH_TIERS:
            self._emit("record_breach", side, method_label, tool_label, m.risk_tier)
        if update is not None:
            for state in update.transitions:
                self._emit("record_transition", side, state)

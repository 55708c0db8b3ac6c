"""The SDK-independent emitter: measurements -> span attributes, span events, session budgets, metrics.

Every adapter (mcp 2.x and 1.x) finds or opens the span for a message and hands the raw wire
dicts to a :class:`TokenRecorder`. The recorder never raises: a fault in the estimator, the span API,
the budget registry or a metrics sink is counted (``mcp_token.instrumentation.errors`` with
``mcp_token.stage``), logged at debug level, and the MCP call carries on untouched.

Metric attributes are bounded: tool names past ``metrics.max_tool_names`` (and method names past
``MAX_METHODS``, beyond the spec's own) share an overflow value, and no metric ever carries a session or
request id.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Protocol

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from .budget import BudgetUpdate, SessionBudget, SessionRegistry
from .config import Config, build_policy
from .deferred import DeferredSink
from .measure import Measurement, Policy, measure_error, measure_request, measure_result
from .risk import BREACH_TIERS

logger = logging.getLogger(__name__)

Side = Literal["client", "server"]
SIDES: tuple[Side, ...] = ("client", "server")
SCOPE_NAME = "mcp_token_otel"
#: Distinct method names kept as a metric label; a peer can send arbitrary methods.
MAX_METHODS = 64
#: Methods of the MCP specification: always metric labels (other methods need a successful response first).
SPEC_METHODS = (
    "initialize", "ping", "server/discover", "tools/list", "tools/call", "resources/list", "resources/read",
    "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel", "sampling/createMessage", "elicitation/create", "roots/list",
    "subscriptions/listen", "notifications/initialized", "notifications/cancelled", "notifications/progress",
    "notifications/message", "notifications/resources/updated", "notifications/resources/list_changed",
    "notifications/tools/list_changed", "notifications/prompts/list_changed", "notifications/roots/list_changed",
)

# Span attributes (OTel MCP semantic conventions, then this project's estimates).
A_METHOD = "mcp.method.name"
A_SESSION_ID = "mcp.session.id"
A_PROTOCOL = "mcp.protocol.version"
A_REQUEST_ID = "jsonrpc.request.id"
A_TOOL = "gen_ai.tool.name"
A_PROMPT = "gen_ai.prompt.name"
A_OPERATION = "gen_ai.operation.name"
A_TRANSPORT = "network.transport"
A_ERROR_TYPE = "error.type"
A_STATUS_CODE = "rpc.response.status_code"
A_ARGUMENTS = "gen_ai.tool.call.arguments"
A_RESULT = "gen_ai.tool.call.result"
A_INPUT_TOKENS = "mcp_token.input_tokens"
A_OUTPUT_TOKENS = "mcp_token.output_tokens"
A_OVERHEAD_TOKENS = "mcp_token.overhead_tokens"
A_OVERHEAD_RATIO = "mcp_token.overhead_ratio"
A_RISK_TIER = "mcp_token.risk_tier"
A_ESTIMATOR = "mcp_token.estimator"
A_SESSION_TOKENS = "mcp_token.session.tokens"
A_SESSION_UTILIZATION = "mcp_token.session.utilization"
A_SESSION_STATE = "mcp_token.session.state"
A_ADVISORY = "mcp_token.advisory"
# Metric attributes.
M_SIDE = "mcp_token.side"
M_DIRECTION = "mcp_token.direction"
M_STAGE = "mcp_token.stage"
M_SCOPE = "mcp_token.scope"
EVENT_RISK = "mcp_token.risk"
EVENT_BUDGET = "mcp_token.budget"

#: Powers of 4 from 1 to 64 Mi tokens, as in the GenAI token usage convention.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(14))
RATIO_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
UTILIZATION_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0)


def span_name(method: str, params: Any) -> str:
    """``{mcp.method.name} {target}``: the tool or prompt name is the target (semconv)."""
    if method in ("tools/call", "prompts/get") and isinstance(params, Mapping):
        target = params.get("name")
        if isinstance(target, str):
            return f"{method} {target}"
    return method


def call_attributes(
    method: str,
    params: Any,
    *,
    session_id: str | None = None,
    request_id: Any = None,
    protocol_version: str | None = None,
    transport: str | None = None,
) -> dict[str, Any]:
    """The semantic-convention attributes of one MCP message (no estimates)."""
    attrs: dict[str, Any] = {A_METHOD: method}
    name = params.get("name") if isinstance(params, Mapping) else None
    if method == "tools/call":
        attrs[A_OPERATION] = "execute_tool"
        if isinstance(name, str):
            attrs[A_TOOL] = name
    elif method == "prompts/get" and isinstance(name, str):
        attrs[A_PROMPT] = name
    if session_id:
        attrs[A_SESSION_ID] = session_id
    if request_id is not None:
        attrs[A_REQUEST_ID] = str(request_id)
    if protocol_version:
        attrs[A_PROTOCOL] = protocol_version
    if transport:
        attrs[A_TRANSPORT] = transport
    return attrs


class MetricsSink(Protocol):
    """Where measurements go as metrics. Attribute values are already bounded; never a session id."""

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement
    ) -> None: ...
    def record_breach(self, side: str, method: str, tool: str | None, tier: str) -> None: ...
    def record_transition(self, side: str, state: str) -> None: ...
    def record_session_end(self, side: str, utilization: float) -> None: ...
    def record_error(self, stage: str) -> None: ...


class OtelMetricsSink:
    """A :class:`MetricsSink` on an OpenTelemetry Meter."""

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        version: str = "",
        *,
        states: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
        rate_budgets: Mapping[str, float] | None = None,
    ) -> None:
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(SCOPE_NAME, version)
        self._states = states
        self._rate_budgets = dict(rate_budgets or {})
        self._tokens = meter.create_histogram(
            "mcp_token.message.tokens",
            unit="{token}",
            description="Estimated tokens of one MCP message (input: request params; output: response).",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._overhead = meter.create_histogram(
            "mcp_token.overhead.ratio",
            unit="1",
            description="Share of a response's tokens that is framing, _meta or duplicated content.",
            explicit_bucket_boundaries_advisory=RATIO_BUCKETS,
        )
        self._utilization = meter.create_histogram(
            "mcp_token.session.utilization",
            unit="1",
            description="Share of the context window a session had used when it ended.",
            explicit_bucket_boundaries_advisory=UTILIZATION_BUCKETS,
        )
        # The same families as the Prometheus endpoint, so dashboards and alerts work through a Collector.
        self._token_total = meter.create_counter(
            "mcp_token.tokens", unit="{token}", description="Estimated tokens of MCP messages."
        )
        meter.create_observable_gauge(
            "mcp_token.sessions",
            callbacks=[self._observe_sessions],
            unit="{session}",
            description="Live MCP sessions per context-window budget state.",
        )
        meter.create_observable_gauge(
            "mcp_token.output_rate_budget",
            callbacks=[self._observe_budgets],
            unit="{token}/s",
            description="Configured sustained output-token budget (for alerting).",
        )
        self._breaches = meter.create_counter(
            "mcp_token.risk.breaches", unit="{message}", description="Responses in the high or critical tier."
        )
        self._transitions = meter.create_counter(
            "mcp_token.session.transitions",
            unit="{transition}",
            description="Sessions entering the warning or exhausted budget state.",
        )
        self._errors = meter.create_counter(
            "mcp_token.instrumentation.errors",
            unit="{error}",
            description="Faults inside the instrumentation (the MCP call itself went on).",
        )
        self._attrs: dict[tuple[Any, ...], dict[str, str]] = {}
        self._deferred: Any = None
        # Collection runs observable callbacks before it reads the synchronous instruments, so this one
        # drains a DeferredSink's queue first: every export (and the final one at shutdown) is complete.
        meter.create_observable_counter(
            "mcp_token.instrumentation.dropped",
            callbacks=[self._drain_and_observe],
            unit="{point}",
            description="Metric points dropped because the background recorder's queue was full.",
        )

    def _observe_sessions(self, _options: Any) -> Iterator[metrics.Observation]:
        if self._states is None:
            return
        for side, counts in self._states().items():
            for state, count in counts.items():
                yield metrics.Observation(count, {M_SIDE: side, A_SESSION_STATE: state})

    def _observe_budgets(self, _options: Any) -> Iterator[metrics.Observation]:
        for scope, budget in self._rate_budgets.items():
            yield metrics.Observation(budget, {M_SCOPE: scope})

    def set_deferred(self, deferred: Any) -> None:
        """Called by the DeferredSink that wraps this sink."""
        self._deferred = deferred

    def _drain_and_observe(self, _options: Any) -> Iterator[metrics.Observation]:
        deferred = self._deferred
        if deferred is not None:
            deferred.flush()
        yield metrics.Observation(deferred.dropped if deferred is not None else 0)

    def _cached(self, key: tuple[Any, ...], build: Callable[[], dict[str, str]]) -> dict[str, str]:
        # Attribute dicts are reused: building them per call shows up in the per-call overhead.
        attrs = self._attrs.get(key)
        if attrs is None:
            if len(self._attrs) > 4096:
                self._attrs.clear()
            attrs = self._attrs[key] = build()
        return attrs

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement
    ) -> None:
        tier = measurement.risk_tier

        def build() -> dict[str, str]:
            attrs = {M_SIDE: side, A_METHOD: method, M_DIRECTION: direction, A_RISK_TIER: tier}
            if tool is not None:
                attrs[A_TOOL] = tool
            return attrs

        attrs = self._cached(("m", side, method, tool, direction, tier), build)
        self._tokens.record(measurement.total_tokens, attrs)

        def build_total() -> dict[str, str]:
            return {k: v for k, v in attrs.items() if k != A_RISK_TIER}

        self._token_total.add(measurement.total_tokens, self._cached(("t", side, method, tool, direction), build_total))
        if direction == "output":
            self._overhead.record(measurement.overhead_ratio, attrs)

    def record_breach(self, side: str, method: str, tool: str | None, tier: str) -> None:
        def build() -> dict[str, str]:
            attrs = {M_SIDE: side, A_METHOD: method, A_RISK_TIER: tier}
            if tool is not None:
                attrs[A_TOOL] = tool
            return attrs

        self._breaches.add(1, self._cached(("b", side, method, tool, tier), build))

    def record_transition(self, side: str, state: str) -> None:
        self._transitions.add(1, {M_SIDE: side, A_SESSION_STATE: state})

    def record_session_end(self, side: str, utilization: float) -> None:
        self._utilization.record(utilization, {M_SIDE: side})

    def record_error(self, stage: str) -> None:
        self._errors.add(1, {M_STAGE: stage})


class NameLimiter:
    """Keeps the first ``limit`` distinct names admitted; other names map to ``overflow`` (bounded cardinality).

    Any name takes a free place while fewer than half are used. Past that, only ``admit=True`` lookups do:
    the recorder admits a name when a response to it succeeds or a server declares it, so a client calling
    tools that do not exist (agents invent tool names) can use up at most half of the places.
    """

    def __init__(self, limit: int, overflow: str) -> None:
        self.limit = limit
        self.overflow = overflow
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str | None, admit: bool = True) -> str | None:
        if name is None or name in self._kept:
            return name
        with self._lock:
            if len(self._kept) < (self.limit if admit else self.limit // 2):
                self._kept.add(name)
                return name
        return self.overflow


def _status_unset(span: Span) -> bool:
    # Keep a status (and its description) that the SDK's own instrumentation already set.
    status = getattr(span, "status", None)
    return status is None or status.status_code is StatusCode.UNSET


def _truncate(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit]


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
    ) -> Measurement | None:
        """Measure a request's (or notification's) params; ``session_id`` None keeps it off the budget."""
        try:
            measurement = measure_request(method, params, self.policy)
        except Exception:
            self._fault("estimate")
            return None
        update = self._budget(side, session_id, measurement.total_tokens)
        try:
            if span is not None and span.is_recording():
                attrs: dict[str, Any] = {
                    A_INPUT_TOKENS: measurement.total_tokens,
                    A_ESTIMATOR: self.policy.estimator_name,
                }
                if self._capture and method == "tools/call" and isinstance(params, Mapping):
                    attrs[A_ARGUMENTS] = _truncate(params.get("arguments"), self._max_chars)
                span.set_attributes(attrs)
                self._budget_on_span(span, update)
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

    def _budget_on_span(self, span: Span, update: BudgetUpdate | None) -> None:
        if update is None:
            return
        span.set_attributes(
            {
                A_SESSION_TOKENS: update.tokens,
                A_SESSION_UTILIZATION: update.utilization,
                A_SESSION_STATE: update.state,
            }
        )
        for state in update.transitions:
            span.add_event(
                EVENT_BUDGET,
                {
                    A_SESSION_STATE: state,
                    A_SESSION_TOKENS: update.tokens,
                    A_SESSION_UTILIZATION: update.utilization,
                },
            )

    def _output_on_span(self, span: Span, m: Measurement, result: Any, update: BudgetUpdate | None) -> None:
        attrs: dict[str, Any] = {
            A_OUTPUT_TOKENS: m.total_tokens,
            A_OVERHEAD_TOKENS: m.overhead_tokens,
            A_OVERHEAD_RATIO: m.overhead_ratio,
            A_RISK_TIER: m.risk_tier,
            A_ESTIMATOR: self.policy.estimator_name,
        }
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
            if m.advisories:
                event[A_ADVISORY] = m.advisories[0]
            span.add_event(EVENT_RISK, event)
        self._budget_on_span(span, update)

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

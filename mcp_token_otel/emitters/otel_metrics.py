"""The OpenTelemetry metrics emitter: every Prometheus family mirrored as an OTel instrument, so dashboards
and alerts work through a Collector too, plus the MCP conventions' own duration histograms
(``mcp.{client,server}.operation.duration``, ``mcp.{client,server}.session.duration``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS
from ..semconv import (
    A_ERROR_TYPE,
    A_METHOD,
    A_PROTOCOL,
    A_RISK_TIER,
    A_SERVER_NAME,
    A_SESSION_STATE,
    A_TOOL,
    A_TRANSPORT,
    DURATION_BUCKETS,
    M_DIRECTION,
    M_GUARD_ACTION,
    M_GUARD_ENFORCED,
    M_GUARD_POLICY,
    M_SCOPE,
    M_SIDE,
    M_STAGE,
    MCP_CLIENT_OPERATION_DURATION,
    MCP_CLIENT_SESSION_DURATION,
    MCP_SERVER_OPERATION_DURATION,
    MCP_SERVER_SESSION_DURATION,
    RATIO_BUCKETS,
    SCHEMA_URL,
    SCOPE_NAME,
    TOKEN_BUCKETS,
    UTILIZATION_BUCKETS,
)
from .aggregate import CountFamily
from .sink import CallInfo, MetricsSink  # noqa: F401  MetricsSink: imported from here until the recorder moves

#: Recorded with no span in its context, a point is offered to no exemplar reservoir (the SDK's default
#: trace-based filter samples points recorded inside a sampled span): exemplars only where they help, on the
#: breaches, whose bucket then links to the trace that caused it. An offer costs about 2.5 µs a point.
#: Not empty: the SDK reads an empty context as "none given" and takes the current one.
_NO_SPAN = trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())


class OtelMetricsSink:
    """A :class:`~.sink.MetricsSink` on an OpenTelemetry Meter.

    The SDK costs ~20 µs per synchronous point (attribute cleaning, hashing, exemplar offers), so only the
    histograms are synchronous, one point per message (plus the overhead ratio of a response and the
    conventions' operation duration of a timed call). Counters (tokens, bytes, responses, errors) are
    pre-aggregated here (a dict increment) and reported through observable instruments at collection.
    """

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        version: str = "",
        *,
        states: Callable[[], Mapping[Any, Mapping[str, int]]] | None = None,
        rate_budgets: Mapping[str, float] | None = None,
        server: str = "",
        input_histograms: bool = False,
    ) -> None:
        """``states``: live sessions per (side, server) and state (TokenRecorder.session_states; keyed by side
        alone they count under ``server``). ``server``: the recorder's server_label(), for what belongs to no
        session (the configured budgets, dropped points). ``input_histograms``: also record the token
        histogram of requests (off: their tokens go to the counter alone, one SDK point less per call)."""
        self._input_histograms = input_histograms
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(SCOPE_NAME, version, schema_url=SCHEMA_URL)
        self._states = states
        self._server = server
        self._rate_budgets = dict(rate_budgets or {})
        lock = threading.Lock()
        self._token_sums = CountFamily(lock, _no_labels)
        self._breach_counts = CountFamily(lock, _no_labels)
        self._response_counts = CountFamily(lock, _no_labels)
        self._transition_counts = CountFamily(lock, _no_labels)
        self._error_counts = CountFamily(lock, _no_labels)
        self._byte_sums = CountFamily(lock, _no_labels)
        self._call_errors = CountFamily(lock, _no_labels)
        self._guard_counts = CountFamily(lock, _no_labels)
        self._cost_sums = CountFamily(lock, _no_labels)
        self._evicted_counts = CountFamily(lock, _no_labels)
        self._definitions: dict[str, int] = {}
        self._tool_definitions: dict[tuple[str, str], int] = {}
        self._call_attrs: dict[tuple[Any, ...], dict[str, str]] = {}
        self._attrs: dict[tuple[Any, ...], dict[str, str]] = {}
        self._deferred: Any = None
        # Collection runs observable callbacks (in creation order) before it reads the synchronous
        # instruments, so this one, created first, drains a DeferredSink's queue before anything is read:
        # every export (and the final one at shutdown) is complete.
        meter.create_observable_counter(
            "mcp_token.instrumentation.dropped",
            callbacks=[self._drain_and_observe],
            unit="{point}",
            description="Metric points dropped because the background recorder's queue was full.",
        )
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
        # The conventions' durations (their names, unit and boundaries); one point per timed call.
        duration = {"unit": "s", "explicit_bucket_boundaries_advisory": DURATION_BUCKETS}
        self._operation = {
            "client": meter.create_histogram(
                MCP_CLIENT_OPERATION_DURATION, description="Duration of an MCP request as the client saw it.",
                **duration,
            ),
            "server": meter.create_histogram(
                MCP_SERVER_OPERATION_DURATION, description="Duration of an MCP request as the server saw it.",
                **duration,
            ),
        }
        self._session = {
            "client": meter.create_histogram(
                MCP_CLIENT_SESSION_DURATION, description="Duration of an MCP session as the client saw it.",
                **duration,
            ),
            "server": meter.create_histogram(
                MCP_SERVER_SESSION_DURATION, description="Duration of an MCP session as the server saw it.",
                **duration,
            ),
        }
        # The same families as the Prometheus endpoint, so dashboards and alerts work through a Collector.
        meter.create_observable_counter(
            "mcp_token.bytes",
            callbacks=[self._observer(self._byte_sums)],
            unit="By",
            description="UTF-8 bytes of MCP messages (the sum of the Prometheus message-size histogram).",
        )
        meter.create_observable_counter(
            "mcp_token.call.errors",
            callbacks=[self._observer(self._call_errors)],
            unit="{call}",
            description="Calls that ended in a JSON-RPC error or an isError result, per error.type.",
        )
        meter.create_observable_gauge(
            "mcp_token.tool_definitions.tokens",
            callbacks=[self._observe_definitions],
            unit="{token}",
            description="Estimated tokens of all a server's tool definitions (its last tools/list result).",
        )
        meter.create_observable_gauge(
            "mcp_token.tool_definition.tokens",
            callbacks=[self._observe_tool_definitions],
            unit="{token}",
            description="Estimated tokens of one tool's definition (tools within the tool-name bound).",
        )
        meter.create_observable_counter(
            "mcp_token.tokens",
            callbacks=[self._observer(self._token_sums)],
            unit="{token}",
            description="Estimated tokens of MCP messages.",
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
        meter.create_observable_counter(
            "mcp_token.responses",
            callbacks=[self._observer(self._response_counts)],
            unit="{message}",
            description="Responses per risk tier.",
        )
        meter.create_observable_counter(
            "mcp_token.risk.breaches",
            callbacks=[self._observer(self._breach_counts)],
            unit="{message}",
            description="Responses in the high or critical tier.",
        )
        meter.create_observable_counter(
            "mcp_token.session.transitions",
            callbacks=[self._observer(self._transition_counts)],
            unit="{transition}",
            description="Sessions entering the warning or exhausted budget state.",
        )
        meter.create_observable_counter(
            "mcp_token.guard.actions",
            callbacks=[self._observer(self._guard_counts)],
            unit="{action}",
            description="Guard actions per policy (enforced false: observe mode, what enforce would have done).",
        )
        meter.create_observable_counter(
            "mcp_token.cost",
            callbacks=[self._observer(self._cost_sums)],
            unit="USD",
            description="Estimated USD of the results that entered the context (guard.model's input price).",
        )
        meter.create_observable_counter(
            "mcp_token.sessions.evicted",
            callbacks=[self._observer(self._evicted_counts)],
            unit="{session}",
            description="Live sessions whose bookkeeping was dropped (least recently used) to stay within the bound.",
        )
        meter.create_observable_counter(
            "mcp_token.instrumentation.errors",
            callbacks=[self._observer(self._error_counts)],
            unit="{error}",
            description="Faults inside the instrumentation (the MCP call itself went on).",
        )

    @staticmethod
    def _observer(family: CountFamily) -> Callable[[Any], Iterator[metrics.Observation]]:
        def observe(_options: Any) -> Iterator[metrics.Observation]:
            for attrs, value in family.values():
                yield metrics.Observation(value, dict(attrs))

        return observe

    def _observe_sessions(self, _options: Any) -> Iterator[metrics.Observation]:
        if self._states is None:
            return
        for key, counts in self._states().items():
            side, server = key if isinstance(key, tuple) else (key, self._server)
            for state, count in counts.items():
                yield metrics.Observation(count, {M_SIDE: side, A_SESSION_STATE: state, **dict(_server(server))})

    def _observe_budgets(self, _options: Any) -> Iterator[metrics.Observation]:
        for scope, budget in self._rate_budgets.items():
            yield metrics.Observation(budget, {M_SCOPE: scope, **dict(_server(self._server))})

    def set_deferred(self, deferred: Any) -> None:
        """Called by the DeferredSink that wraps this sink."""
        self._deferred = deferred

    def _drain_and_observe(self, _options: Any) -> Iterator[metrics.Observation]:
        deferred = self._deferred
        if deferred is not None:
            deferred.flush()
        yield metrics.Observation(deferred.dropped if deferred is not None else 0, dict(_server(self._server)))

    def _observe_definitions(self, _options: Any) -> Iterator[metrics.Observation]:
        for server, value in list(self._definitions.items()):
            yield metrics.Observation(value, {A_SERVER_NAME: server})

    def _observe_tool_definitions(self, _options: Any) -> Iterator[metrics.Observation]:
        for (server, tool), value in list(self._tool_definitions.items()):
            yield metrics.Observation(value, {A_SERVER_NAME: server, A_TOOL: tool})

    def _message_attrs(
        self, side: str, method: str, tool: str | None, direction: str, server: str
    ) -> dict[str, str]:
        # Attribute dicts are reused: building them per call shows up in the per-call overhead.
        key = (side, method, tool, direction, server)
        attrs = self._attrs.get(key)
        if attrs is None:
            if len(self._attrs) > 4096:
                self._attrs.clear()
            attrs = {M_SIDE: side, A_METHOD: method, M_DIRECTION: direction}
            if server:
                attrs[A_SERVER_NAME] = server
            if tool is not None:
                attrs[A_TOOL] = tool
            self._attrs[key] = attrs
        return attrs

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        attrs = self._message_attrs(side, method, tool, direction, server)
        context = None if measurement.risk_tier in BREACH_TIERS else _NO_SPAN  # None: the caller's, its span
        if direction == "output" or self._input_histograms:
            self._tokens.record(measurement.total_tokens, attrs, context)
        key = tuple(attrs.items())
        self._token_sums.add(key, measurement.total_tokens)
        self._byte_sums.add(key, measurement.bytes)
        if direction == "output":
            self._overhead.record(measurement.overhead_ratio, attrs, context)
            tier = ((M_SIDE, side), (A_METHOD, method), (A_RISK_TIER, measurement.risk_tier), *_server(server))
            self._response_counts.add(tier + (((A_TOOL, tool),) if tool is not None else ()))

    def record_breach(self, side: str, method: str, tool: str | None, tier: str, server: str) -> None:
        attrs = ((M_SIDE, side), (A_METHOD, method), (A_RISK_TIER, tier), *_server(server))
        self._breach_counts.add(attrs + (((A_TOOL, tool),) if tool is not None else ()))

    def record_transition(self, side: str, state: str, server: str) -> None:
        self._transition_counts.add(((M_SIDE, side), (A_SESSION_STATE, state), *_server(server)))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        self._utilization.record(utilization, {M_SIDE: side, **dict(_server(server))}, _NO_SPAN)
        if call.duration is not None:
            attrs = dict(_server(server))
            if call.transport:
                attrs[A_TRANSPORT] = call.transport
            if call.protocol:
                attrs[A_PROTOCOL] = call.protocol
            self._session["server" if side == "server" else "client"].record(call.duration, attrs, _NO_SPAN)

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        """One response: its error (pre-aggregated) and, when the call was timed, the conventions' duration."""
        if call.error_type is not None:
            errors = ((M_SIDE, side), (A_METHOD, method), (A_ERROR_TYPE, call.error_type), *_server(server))
            self._call_errors.add(errors + (((A_TOOL, tool),) if tool is not None else ()))
        if call.duration is None:
            return
        key = (side, method, tool, server, call.error_type, call.transport, call.protocol)
        attrs = self._call_attrs.get(key)
        if attrs is None:
            if len(self._call_attrs) > 4096:
                self._call_attrs.clear()
            # The conventions' attributes (never a session or request id) and the server name.
            attrs = {A_METHOD: method, **dict(_server(server))}
            if tool is not None:
                attrs[A_TOOL] = tool
            if call.error_type is not None:
                attrs[A_ERROR_TYPE] = call.error_type
            if call.transport:
                attrs[A_TRANSPORT] = call.transport
            if call.protocol:
                attrs[A_PROTOCOL] = call.protocol
            self._call_attrs[key] = attrs
        self._operation["server" if side == "server" else "client"].record(call.duration, attrs, _NO_SPAN)

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        self._definitions[server] = total
        tools = {k: v for k, v in self._tool_definitions.items() if k[0] != server}
        tools.update(((server, tool), tokens) for tool, tokens in per_tool.items())
        self._tool_definitions = tools  # swapped whole: a collection reads one consistent set

    def record_error(self, stage: str, server: str) -> None:
        self._error_counts.add(((M_STAGE, stage), *_server(server)))

    def record_session_evicted(self, side: str, server: str) -> None:
        self._evicted_counts.add(((M_SIDE, side), *_server(server)))

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        attrs = ((M_SIDE, side), (M_GUARD_POLICY, policy), (M_GUARD_ACTION, action), (M_GUARD_ENFORCED, enforced),
                 *_server(server))
        self._guard_counts.add(attrs + (((A_TOOL, tool),) if tool else ()))

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        attrs = ((M_SIDE, side), *_server(server))
        self._cost_sums.add(attrs + (((A_TOOL, tool),) if tool else ()), usd)


def _server(server: str) -> tuple[tuple[str, str], ...]:
    """The server attribute, absent when no name is known (as an empty Prometheus label is)."""
    return ((A_SERVER_NAME, server),) if server else ()


def _no_labels(key: Any) -> tuple[str, ...]:
    return ()

"""The OpenTelemetry metrics emitter: every Prometheus family mirrored as an OTel instrument, so dashboards
and alerts work through a Collector too."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from opentelemetry import metrics

from ..core.measure import Measurement
from .semconv import (
    A_METHOD,
    A_RISK_TIER,
    A_SESSION_STATE,
    A_TOOL,
    M_DIRECTION,
    M_SCOPE,
    M_SIDE,
    M_STAGE,
    RATIO_BUCKETS,
    SCOPE_NAME,
    TOKEN_BUCKETS,
    UTILIZATION_BUCKETS,
)


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

"""The OpenTelemetry metrics emitter: every Prometheus family mirrored as an OTel instrument, so dashboards
and alerts work through a Collector too."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from opentelemetry import metrics

from ..core.measure import Measurement
from .aggregate import CountFamily
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
    """A :class:`MetricsSink` on an OpenTelemetry Meter.

    The SDK costs ~20 µs per synchronous point (attribute cleaning, hashing, exemplar offers), so only the
    histograms are synchronous, one point per message (plus the overhead ratio of a response). Counters
    are pre-aggregated here (a dict increment) and reported through observable instruments at collection.
    """

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
        lock = threading.Lock()
        self._token_sums = CountFamily(lock, _no_labels)
        self._breach_counts = CountFamily(lock, _no_labels)
        self._response_counts = CountFamily(lock, _no_labels)
        self._transition_counts = CountFamily(lock, _no_labels)
        self._error_counts = CountFamily(lock, _no_labels)
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
        # The same families as the Prometheus endpoint, so dashboards and alerts work through a Collector.
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

    def _message_attrs(self, side: str, method: str, tool: str | None, direction: str) -> dict[str, str]:
        # Attribute dicts are reused: building them per call shows up in the per-call overhead.
        key = (side, method, tool, direction)
        attrs = self._attrs.get(key)
        if attrs is None:
            if len(self._attrs) > 4096:
                self._attrs.clear()
            attrs = {M_SIDE: side, A_METHOD: method, M_DIRECTION: direction}
            if tool is not None:
                attrs[A_TOOL] = tool
            self._attrs[key] = attrs
        return attrs

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement
    ) -> None:
        attrs = self._message_attrs(side, method, tool, direction)
        self._tokens.record(measurement.total_tokens, attrs)
        self._token_sums.add(tuple(attrs.items()), measurement.total_tokens)
        if direction == "output":
            self._overhead.record(measurement.overhead_ratio, attrs)
            tier = ((M_SIDE, side), (A_METHOD, method), (A_RISK_TIER, measurement.risk_tier))
            self._response_counts.add(tier + (((A_TOOL, tool),) if tool is not None else ()))

    def record_breach(self, side: str, method: str, tool: str | None, tier: str) -> None:
        attrs = ((M_SIDE, side), (A_METHOD, method), (A_RISK_TIER, tier))
        self._breach_counts.add(attrs + (((A_TOOL, tool),) if tool is not None else ()))

    def record_transition(self, side: str, state: str) -> None:
        self._transition_counts.add(((M_SIDE, side), (A_SESSION_STATE, state)))

    def record_session_end(self, side: str, utilization: float) -> None:
        self._utilization.record(utilization, {M_SIDE: side})

    def record_error(self, stage: str) -> None:
        self._error_counts.add(((M_STAGE, stage),))


def _no_labels(key: Any) -> tuple[str, ...]:
    return ()

"""Prometheus metric families (prometheus-client) fed by the recorder, as a metrics sink.

Families (prefix ``mcp_token_``; documented in README):
    message_tokens                   histogram  side, method, tool, direction, risk_tier
    tokens_total                     counter    side, method, tool, direction
    risk_breaches_total              counter    side, method, tool, risk_tier (high, critical)
    overhead_ratio                   histogram  side, method, tool           (output messages)
    session_utilization_ratio        histogram  side                          (observed at session end)
    sessions                         gauge      side, state                   (live sessions per state)
    session_transitions_total        counter    side, state                   (warning, exhausted)
    instrumentation_errors_total     counter    stage
    output_rate_budget_per_second    gauge      scope (tool, service)         (configured, for alerting)

Cardinality: no session id ever; tool and method values arrive bounded by the recorder's limiters and are
sanitised here (length, control characters, invalid UTF-8). Histograms carry a ``trace_id`` exemplar
when a span is recording (rendered when the scraper negotiates OpenMetrics). With
``PROMETHEUS_MULTIPROC_DIR`` set (multi-worker servers) the values live in prometheus-client's shared
files, serve with :func:`multiprocess_registry`, and exemplars are off (the client does not support them
there).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.budget import BUDGET_STATES
from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS
from .semconv import RATIO_BUCKETS, TOKEN_BUCKETS, UTILIZATION_BUCKETS  # one set of buckets for both paths

PREFIX = "mcp_token"
MAX_LABEL_CHARS = 128
_BREACH_TIERS = tuple(sorted(BREACH_TIERS))
_MAX_CACHED_SERIES = 10_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: Live sessions per side and state, as the recorder reports them.
StatesFn = Callable[[], Mapping[str, Mapping[str, int]]]


def label_value(value: str | None) -> str:
    """A safe label value: "" for none, valid UTF-8, no control characters, at most 128 characters."""
    if not value:
        return ""
    text = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("_", text)[:MAX_LABEL_CHARS]


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def multiprocess_registry() -> CollectorRegistry:
    """A registry that serves the merged values of every worker (multiprocess mode)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


class _SessionsCollector(Collector):
    """``mcp_token_sessions``, read from the recorder at scrape time (O(1): the registry keeps counts)."""

    def __init__(self, states: StatesFn) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_sessions", "Live MCP sessions per context-window budget state.", labels=["side", "state"]
        )
        for side, counts in sorted(self._states().items()):
            for state in BUDGET_STATES:
                family.add_metric([side, state], counts.get(state, 0))
        yield family


def _exemplar() -> dict[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


class PrometheusMetrics:
    """A recorder metrics sink writing prometheus-client families into ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        states: StatesFn | None = None,
        tool_output_rate_budget: float = 100.0,
        service_output_rate_budget: float = 500.0,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._multiprocess = multiprocess_mode()
        self._states = states
        r = self.registry
        self.message_tokens = Histogram(
            f"{PREFIX}_message_tokens",
            "Estimated tokens of one MCP message (input: request params; output: the response).",
            ["side", "method", "tool", "direction", "risk_tier"], buckets=TOKEN_BUCKETS, registry=r,
        )
        self.tokens = Counter(
            f"{PREFIX}_tokens", "Estimated tokens of MCP messages.",
            ["side", "method", "tool", "direction"], registry=r,
        )
        self.breaches = Counter(
            f"{PREFIX}_risk_breaches", "Output messages in the high or critical risk tier.",
            ["side", "method", "tool", "risk_tier"], registry=r,
        )
        self.overhead = Histogram(
            f"{PREFIX}_overhead_ratio",
            "Share of an output message's tokens that is overhead (framing, _meta, duplicated content).",
            ["side", "method", "tool"], buckets=RATIO_BUCKETS, registry=r,
        )
        self.utilization = Histogram(
            f"{PREFIX}_session_utilization_ratio",
            "Share of the context window a session had used when it ended.",
            ["side"], buckets=UTILIZATION_BUCKETS, registry=r,
        )
        self.transitions = Counter(
            f"{PREFIX}_session_transitions", "Sessions entering a context-window budget state.",
            ["side", "state"], registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_instrumentation_errors",
            "Faults caught inside the instrumentation; the MCP call itself went on.", ["stage"], registry=r,
        )
        budget = Gauge(
            f"{PREFIX}_output_rate_budget_per_second",
            "Configured sustained output-token budget, in tokens per second (for alerting).",
            ["scope"], registry=r, multiprocess_mode="max",
        )
        budget.labels("tool").set(tool_output_rate_budget)
        budget.labels("service").set(service_output_rate_budget)
        self._series: dict[tuple[str, str, str | None, str, str], tuple[Any, ...]] = {}
        self._live_sessions: Gauge | None = None
        if states is not None:
            if self._multiprocess:
                # Shared files cannot call back into each worker: each sets its own counts, summed.
                self._live_sessions = Gauge(
                    f"{PREFIX}_sessions", "Live MCP sessions per context-window budget state.",
                    ["side", "state"], registry=r, multiprocess_mode="livesum",
                )
            else:
                r.register(_SessionsCollector(states))
        # Pre-create series that alerts take increase() of: a series born at its first event would hide
        # that event from increase() (it has no earlier sample), and a healthy process should export 0.
        self.errors.labels("estimate")
        for side in ("client", "server"):
            for state in ("warning", "exhausted"):
                self.transitions.labels(side, state)

    def _children(self, side: str, method: str, tool: str | None, direction: str, tier: str) -> tuple[Any, ...]:
        """The labelled series one message touches, cached: labels() takes a lock and validates each time."""
        key = (side, method, tool, direction, tier)
        children = self._series.get(key)
        if children is None:
            method_label, tool_label = label_value(method), label_value(tool)
            children = (
                self.message_tokens.labels(side, method_label, tool_label, direction, tier),
                self.tokens.labels(side, method_label, tool_label, direction),
                self.overhead.labels(side, method_label, tool_label) if direction == "output" else None,
            )
            if direction == "output":
                for breach_tier in _BREACH_TIERS:  # exist at 0 before a first breach, for increase()
                    self.breaches.labels(side, method_label, tool_label, breach_tier)
            if len(self._series) >= _MAX_CACHED_SERIES:  # labels are bounded upstream; this bounds the cache too
                self._series.clear()
            self._series[key] = children
        return children

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement
    ) -> None:
        tokens_hist, tokens_total, overhead = self._children(side, method, tool, direction, measurement.risk_tier)
        exemplar = None if self._multiprocess else _exemplar()
        tokens_hist.observe(measurement.total_tokens, exemplar)
        tokens_total.inc(measurement.total_tokens)
        if overhead is not None:
            overhead.observe(measurement.overhead_ratio, exemplar)
        if self._live_sessions is not None and self._states is not None:
            for session_side, counts in self._states().items():
                for state in BUDGET_STATES:
                    self._live_sessions.labels(session_side, state).set(counts.get(state, 0))

    def record_breach(self, side: str, method: str, tool: str | None, tier: str) -> None:
        self.breaches.labels(side, label_value(method), label_value(tool), tier).inc()

    def record_transition(self, side: str, state: str) -> None:
        self.transitions.labels(side, state).inc()

    def record_session_end(self, side: str, utilization: float) -> None:
        self.utilization.labels(side).observe(utilization)

    def record_error(self, stage: str) -> None:
        self.errors.labels(label_value(stage)).inc()

"""Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set): the catalog's families as prometheus-client objects,
whose values live in the client's shared files and are merged by its multiprocess collector.

The same families and labels as the single-process sink, except the series-overflow counts (series are not
capped here: label values arrive bounded, and the files hold what the workers wrote). Exemplars are off (the
client does not support them in this mode).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

from ..catalog import prometheus_families
from ..core.budget import BUDGET_STATES
from ..core.measure import Measurement
from ..core.risk import RISK_TIERS
from .prometheus_text import label_value, label_values
from .sink import CallInfo

_MAX_CACHED_SERIES = 10_000
#: Seconds between a worker's refreshes of its live-sessions gauge (done on a message).
_STATES_INTERVAL = 1.0

#: Live sessions per (side, server) and state, as the recorder reports them (TokenRecorder.session_states);
#: a mapping keyed by side alone (TokenRecorder.states) is shown under the sink's own ``server``.
StatesFn = Callable[[], Mapping[Any, Mapping[str, int]]]


def by_server(states: Mapping[Any, Mapping[str, int]], server: str) -> list[tuple[str, str, Mapping[str, int]]]:
    """(side, server, counts) rows from either shape of a StatesFn's answer, sorted."""
    rows = [(*(key if isinstance(key, tuple) else (key, server)), counts) for key, counts in states.items()]
    return sorted(rows, key=lambda row: (row[0], row[1]))


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def multiprocess_registry() -> CollectorRegistry:
    """A registry that serves the merged values of every worker (multiprocess mode)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def _metric(family: Any, registry: CollectorRegistry) -> Any:
    labels = list(family.labels)
    if family.kind == "histogram":
        return Histogram(family.name, family.help, labels, buckets=family.buckets, registry=registry)
    if family.kind == "counter":
        return Counter(family.name, family.help, labels, registry=registry)
    return Gauge(family.name, family.help, labels, registry=registry, multiprocess_mode=family.multiprocess_mode)


class SharedFileFamilies:
    """A :class:`~.sink.MetricsSink` on prometheus-client objects (one per catalog family)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        states: StatesFn | None,
        rate_budgets: Mapping[str, float],
        server: str,
        input_histograms: bool = False,
    ) -> None:
        self._states = states
        self._input_histograms = input_histograms
        self._states_read = float("-inf")
        self._server = server
        self.m = {f.name: _metric(f, registry) for f in prometheus_families("recorder") if not f.capped_only}
        for scope, value in rate_budgets.items():
            self.m["mcp_token_output_rate_budget_tokens_per_second"].labels(scope, server).set(value)
        self._series: dict[tuple[str, str, str, str | None, str], tuple[Any, ...]] = {}
        # Series that alerts take increase() of exist at 0 from the start.
        self.m["mcp_token_instrumentation_errors"].labels("estimate", server)
        for side in ("client", "server", "proxy") if server else ():  # an unknown name gets its real one later
            self._touch_server(side, server)

    def _touch_server(self, side: str, server: str) -> None:
        """A side's transition, unbudgeted and prompt-cache series at 0 from its first message (alerts and
        dashboards take increase() and rate() of them)."""
        for state in ("warning", "exhausted"):
            self.m["mcp_token_session_transitions"].labels(side, server, state)
        for name in ("mcp_token_unbudgeted_tokens", "mcp_token_prompt_cache_invalidations",
                     "mcp_token_prompt_cache_resent_tokens"):
            self.m[name].labels(side, server)

    def _children(self, side: str, server: str, method: str, tool: str | None, direction: str) -> tuple[Any, ...]:
        """The labelled series one message touches, cached: labels() takes a lock and validates each time."""
        key = (side, server, method, tool, direction)
        children = self._series.get(key)
        if children is None:
            m = self.m
            labels = (side, label_value(server), label_value(method), label_value(tool))
            output = direction == "output"
            children = (
                m["mcp_token_message_tokens"].labels(*labels, direction) if output or self._input_histograms else None,
                m["mcp_token_tokens"].labels(*labels, direction),
                m["mcp_token_bytes"].labels(*labels, direction),
                m["mcp_token_overhead_tokens"].labels(*labels) if output else None,
                {t: m["mcp_token_responses"].labels(*labels, t) for t in RISK_TIERS} if output else None,
            )
            if output:
                self._touch_server(side, label_value(server))
            if len(self._series) >= _MAX_CACHED_SERIES:  # a cache of children: clearing it loses no value
                self._series.clear()
            self._series[key] = children
        return children

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        tokens_hist, tokens_total, bytes_total, overhead, responses = self._children(
            side, server, method, tool, direction
        )
        if tokens_hist is not None:
            tokens_hist.observe(measurement.total_tokens)
        tokens_total.inc(measurement.total_tokens)
        bytes_total.inc(measurement.bytes)
        if overhead is not None:
            overhead.inc(measurement.overhead_tokens)
            responses[measurement.risk_tier].inc()
        now = time.monotonic()
        if self._states is not None and now - self._states_read >= _STATES_INTERVAL:
            # Reading the states is a pass over the live sessions: once a second at most, not per message.
            # Shared files cannot call back into each worker: each sets its own counts, summed (livesum).
            self._states_read = now
            live = self.m["mcp_token_sessions"]
            for session_side, server_label, counts in by_server(self._states(), self._server):
                for state in BUDGET_STATES:
                    live.labels(session_side, label_value(server_label), state).set(counts.get(state, 0))

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        labels = label_values((side, server, method, tool))
        if call.error_type is not None:
            self.m["mcp_token_call_errors"].labels(*labels, label_value(call.error_type)).inc()
        if call.duration is not None:
            self.m["mcp_token_operation_duration_seconds"].labels(*labels).observe(call.duration)

    def record_transition(self, side: str, state: str, server: str) -> None:
        self.m["mcp_token_session_transitions"].labels(side, label_value(server), state).inc()

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        self.m["mcp_token_session_utilization_ratio"].labels(side, label_value(server)).observe(utilization)
        if call.duration is not None:
            self.m["mcp_token_session_duration_seconds"].labels(side, label_value(server)).observe(call.duration)

    def record_session_evicted(self, side: str, server: str) -> None:
        self.m["mcp_token_sessions_evicted"].labels(side, label_value(server)).inc()

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        self.m["mcp_token_unbudgeted_tokens"].labels(side, label_value(server)).inc(tokens)

    def record_error(self, stage: str, server: str) -> None:
        self.m["mcp_token_instrumentation_errors"].labels(label_value(stage), label_value(server)).inc()

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        self.m["mcp_token_tool_definitions_tokens"].labels(label_value(server)).set(total)
        for tool, tokens in per_tool.items():
            self.m["mcp_token_tool_definition_tokens"].labels(label_value(server), label_value(tool)).set(tokens)

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        for part, tokens in parts.items():
            self.m["mcp_token_tool_definitions_part_tokens"].labels(label_value(server), part).set(tokens)
        for tool, tokens in static_max.items():
            self.m["mcp_token_tool_static_max_tokens"].labels(label_value(server), label_value(tool)).set(tokens)

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        self.m["mcp_token_prompt_cache_invalidations"].labels(side, label_value(server)).inc()
        self.m["mcp_token_prompt_cache_resent_tokens"].labels(side, label_value(server)).inc(resent_tokens)

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        self.m["mcp_token_wasted_tokens"].labels(*label_values((side, server, tool, kind))).inc(tokens)

    def guard_series(self, key: tuple[str, ...]) -> Any:
        """The guard-action series of (side, server, policy, action, enforced, tool)."""
        return self.m["mcp_token_guard_actions"].labels(*label_values(key))

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        self.guard_series((side, server, policy, action, "true" if enforced else "false", tool or "")).inc()

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        self.m["mcp_token_cost_usd"].labels(*label_values((side, server, tool))).inc(usd)

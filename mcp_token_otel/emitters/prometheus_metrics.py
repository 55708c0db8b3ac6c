"""Prometheus metric families (prometheus-client) fed by the recorder, as a metrics sink.

The families, their labels, help and buckets are the recorder's Prometheus families of
:mod:`mcp_token_otel.catalog` (the docs' metrics table lists them); nothing here declares one.

Cardinality: no session id ever; tool and method values arrive bounded by the recorder's limiters and are
sanitised here (length, control characters, invalid UTF-8). A family holds at most 20,000 series: past that,
new label sets fold into one overflow series (every label ``_other``) and ``mcp_token_series_overflow_total``
counts the folded records, while existing series keep counting.

Cost: a message is a few dict increments in :mod:`.aggregate`; a scrape renders the series from there (no
``_created`` series unless ``created_series``). The registry's collector yields prometheus-client Metric
objects (for ``generate_latest`` and the OpenMetrics encoder, which carries a breach's ``trace_id`` exemplar);
:meth:`PrometheusMetrics.exposition` serves the same bytes from :mod:`.prometheus_text`, which writes them
straight from copies of the aggregate rows. With ``PROMETHEUS_MULTIPROC_DIR`` set (multi-worker servers) the
values live in prometheus-client's shared files instead (:mod:`.prometheus_multiprocess`).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from ..catalog import BY_NAME, OVERFLOW_VALUE, Family, prometheus_families
from ..core.budget import BUDGET_STATES
from ..core.labels import UNKNOWN_SERVER
from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS
from . import prometheus_text as text
from .aggregate import CountFamily, Hist, HistFamily, MessageSlots
from .prometheus_multiprocess import (
    SharedFileFamilies,
    StatesFn,
    by_server,
    multiprocess_mode,
    multiprocess_registry,
)
from .prometheus_text import PlainRows, label_value, label_values
from .sink import CallInfo

__all__ = ["PrometheusMetrics", "label_value", "multiprocess_mode", "multiprocess_registry"]

_BREACH_TIERS = tuple(sorted(BREACH_TIERS))
_KNOWN_BOUND = 10_000
_TOKENS = "mcp_token_message_tokens"

#: Set in the thread of an exposition() while it collects: the collector then yields its families already
#: rendered as text instead of Sample objects (other encoders, other threads, get Samples as before).
_TEXT = threading.local()


def _exemplar() -> dict[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


class _One:
    """One family as a collector, for generate_latest (families from other collectors in the registry)."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


class _AggregateCollector(Collector):
    """The catalog's recorder families, in catalog order, from the sink's aggregate families and readers.

    For generate_latest and the OpenMetrics encoder it yields prometheus-client Metric/Sample objects; for
    exposition() (``_TEXT.on`` in its thread) each family's text, from rows copied under the aggregate lock (one
    short hold per family) and formatted after it is released.
    """

    def __init__(self, sink: PrometheusMetrics, created: bool) -> None:
        self._sink = sink
        self._created = created

    def collect(self) -> Iterator[Metric]:
        as_text = getattr(_TEXT, "on", False)
        copies: dict[str, Any] = {}  # a histogram's rows, shared with the counter of its sums: they agree
        for family in prometheus_families("recorder"):
            yield self._text(family, copies) if as_text else self._metric(family)

    def _hides_input(self, family: Family) -> bool:
        """The token histogram leaves out the requests' series unless metrics.input_histograms."""
        return family.name == _TOKENS and not self._sink.input_histograms

    def _text(self, family: Family, copies: dict[str, Any]) -> Metric:
        sink = self._sink
        if family.kind == "histogram":
            rows = copies[family.name] = sink.hists[family.name].copy()
            if self._hides_input(family):
                rows = [row for row in rows if row[0].labels[-1] != "input"]
            body = text.histogram_text(family, rows)
        elif family.sum_of:
            of = BY_NAME[family.sum_of]
            les = text.bucket_les(of)

            def cache(series: Hist) -> tuple[Any, ...]:  # the histogram's, also for series it leaves out
                return text.series_cache(series, of, les)

            body = text.sum_counter_text(family, copies[of.name], cache)
        elif family.name in sink.readers:
            body = text.plain_text(family, sink.readers[family.name]())
        else:
            body = text.counter_text(family, sink.counts[family.name].copy())
        return text.Rendered(family.name, family.kind, body)

    def _metric(self, family: Family) -> Metric:
        sink = self._sink
        metric = Metric(family.name, family.help, family.kind)
        if family.kind == "histogram":
            self._histogram_samples(family, metric.samples)
        elif family.sum_of:
            of = sink.hists[family.sum_of]
            for labels, _b, value_sum, _c, created, _e in of.snapshot():
                self._counter_sample(family, metric.samples, labels, value_sum, created)
        elif family.name in sink.readers:
            for values, value in sink.readers[family.name]():
                metric.samples.append(Sample(family.sample_name, dict(zip(family.labels, values, strict=True)), value))
        else:
            for labels, value, created in sink.counts[family.name].snapshot():
                self._counter_sample(family, metric.samples, labels, value, created)
        return metric

    def _counter_sample(
        self, family: Family, samples: list[Sample], labels: tuple[str, ...], value: float, created: float
    ) -> None:
        base = dict(zip(family.labels, labels, strict=True))
        samples.append(Sample(family.sample_name, base, value))
        if self._created:
            samples.append(Sample(f"{family.name}_created", base, created))

    def _histogram_samples(self, family: Family, samples: list[Sample]) -> None:
        name = family.name
        les = text.bucket_les(family)
        bucket, total, count, created = f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"
        hides_input = self._hides_input(family)
        for labels, buckets, value_sum, value_count, created_at, exemplars in self._sink.hists[name].snapshot():
            if hides_input and labels[-1] == "input":
                continue
            base = dict(zip(family.labels, labels, strict=True))
            running = 0
            for index, le in enumerate(les):
                running += buckets[index]
                exemplar = None
                if exemplars is not None and index in exemplars:
                    ex_labels, ex_value, ex_time = exemplars[index]
                    exemplar = Exemplar(ex_labels, ex_value, ex_time)
                samples.append(Sample(bucket, {**base, "le": le}, running, None, exemplar))
            samples.append(Sample(count, base, value_count))
            samples.append(Sample(total, base, value_sum))
            if self._created:
                samples.append(Sample(created, base, created_at))


class PrometheusMetrics:
    """A :class:`~.sink.MetricsSink` whose families are scraped from ``registry``.

    ``created_series`` (config ``prometheus.created_series``) adds the ``_created`` series of every counter
    and histogram (off by default: one more line per series that no dashboard or rule reads).
    ``server`` is the server name known at start (the recorder's ``server_label()``: the configured override
    or the proxy's ``--name``): its series exist from the start, and the series that belong to no session
    (instrumentation errors, the configured budgets) carry it. ``input_histograms`` (config
    ``metrics.input_histograms``) also exposes the token histogram of requests; off, their tokens are in
    ``tokens_total`` only.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        states: StatesFn | None = None,
        tool_output_rate_budget: float = 100.0,
        service_output_rate_budget: float = 500.0,
        created_series: bool = False,
        server: str = "",
        input_histograms: bool = False,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self.input_histograms = input_histograms
        self._states = states
        self.rate_budgets = {"tool": tool_output_rate_budget, "service": service_output_rate_budget}
        self.server = label_value(server)
        self._created = created_series
        self._files: SharedFileFamilies | None = None
        if multiprocess_mode():
            self._files = SharedFileFamilies(self.registry, states, self.rate_budgets, self.server, input_histograms)
            return
        #: The families read at scrape time; every other catalog family is stored below.
        self.readers: dict[str, Callable[[], PlainRows]] = {
            "mcp_token_tool_definitions_tokens": self._definition_rows,
            "mcp_token_tool_definition_tokens": self._tool_definition_rows,
            "mcp_token_tool_definitions_part_tokens": self._part_rows,
            "mcp_token_tool_static_max_tokens": self._static_max_rows,
            "mcp_token_series_overflow": self._overflow_rows,
            "mcp_token_output_rate_budget_tokens_per_second": self._budget_rows,
            "mcp_token_sessions": self._session_rows,
        }
        lock = threading.Lock()
        #: Every other catalog family, stored: histograms and counters by name.
        self.hists: dict[str, HistFamily] = {}
        self.counts: dict[str, CountFamily] = {}
        for family in prometheus_families("recorder"):
            if family.name in self.readers or family.sum_of:
                continue
            overflow = (OVERFLOW_VALUE,) * len(family.labels)
            if family.kind == "histogram":
                self.hists[family.name] = HistFamily(family.buckets, lock, label_values, overflow)
            elif family.kind == "counter":
                self.counts[family.name] = CountFamily(lock, label_values, overflow)
            else:
                raise ValueError(f"{family.name}: a gauge the Prometheus sink has no reader for")
        # The hot paths' families, named once.
        self._tokens = self.hists[_TOKENS]
        self._overhead, self._byte_sums = self.counts["mcp_token_overhead_tokens"], self.counts["mcp_token_bytes"]
        self._responses = self.counts["mcp_token_responses"]
        self._transitions = self.counts["mcp_token_session_transitions"]
        self._unbudgeted = self.counts["mcp_token_unbudgeted_tokens"]
        self._invalidations = self.counts["mcp_token_prompt_cache_invalidations"]
        self._resent = self.counts["mcp_token_prompt_cache_resent_tokens"]
        #: server -> (total tokens, {tool: tokens}) of its last tools/list result.
        self._definitions: dict[str, tuple[int, dict[str, int]]] = {}
        #: server -> ({part: tokens}, {tool: static maximum}) of the same result.
        self._profiles: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self._slots: dict[tuple[str, str, str, str | None, str], MessageSlots] = {}
        self._lock = lock
        self._token_bounds = self._tokens.bounds
        self.registry.register(_AggregateCollector(self, created_series))
        # Pre-create series that alerts take increase() of: a series born at its first event would hide
        # that event from increase() (it has no earlier sample), and a healthy process should export 0.
        self.counts["mcp_token_instrumentation_errors"].touch(("estimate", server))
        named = server and server != UNKNOWN_SERVER  # an unknown name gets its real one later
        for side in ("client", "server", "proxy") if named else ():
            self._touch_server(side, server)

    def _touch_server(self, side: str, server: str) -> None:
        """A side's first message for a server: its transition, unbudgeted and prompt-cache series start at 0
        (alerts and dashboards take increase() and rate() of them)."""
        for state in ("warning", "exhausted"):
            self._transitions.touch((side, server, state))
        self._unbudgeted.touch((side, server))
        self._invalidations.touch((side, server))
        self._resent.touch((side, server))

    # ------------------------------------------------------------------ families read at scrape time

    def _definition_rows(self) -> PlainRows:
        return [((label_value(server),), total) for server, (total, _) in sorted(self._definitions.items())]

    def _tool_definition_rows(self) -> PlainRows:
        return [((label_value(server), label_value(tool)), tokens)
                for server, (_, tools) in sorted(self._definitions.items()) for tool, tokens in sorted(tools.items())]

    def _part_rows(self) -> PlainRows:
        return [((label_value(server), part), tokens)
                for server, (parts, _) in sorted(self._profiles.items()) for part, tokens in parts.items()]

    def _static_max_rows(self) -> PlainRows:
        return [((label_value(server), label_value(tool)), tokens)
                for server, (_, tools) in sorted(self._profiles.items()) for tool, tokens in sorted(tools.items())]

    def _overflow_rows(self) -> PlainRows:
        capped = {**self.hists, **self.counts}
        return [((f.name,), float(capped[f.name].folded)) for f in prometheus_families("recorder") if f.name in capped]

    def _budget_rows(self) -> PlainRows:
        return [((scope, self.server), value) for scope, value in self.rate_budgets.items()]

    def _session_rows(self) -> PlainRows:
        if self._states is None:
            return []
        return [((side, label_value(server), state), counts.get(state, 0))
                for side, server, counts in by_server(self._states(), self.server) for state in BUDGET_STATES]

    def exposition(self) -> bytes:
        """The registry's Prometheus text exposition (format 0.0.4): the same bytes as ``generate_latest``
        (a test compares them), several times faster (see :mod:`.prometheus_text`). Families of any other
        collector in the registry go through ``generate_latest``. Exemplars need OpenMetrics: serve the
        OpenMetrics encoder when the scraper asks for it."""
        if self._files is not None or self._created:  # the client's own layout for these (_created families)
            return generate_latest(self.registry)
        out: list[str] = []
        _TEXT.on = True
        try:
            for metric in self.registry.collect():
                if isinstance(metric, text.Rendered):
                    out.append(metric.text)
                else:
                    out.append(generate_latest(_One(metric)).decode("utf-8"))
        finally:
            _TEXT.on = False
        return "".join(out).encode("utf-8")

    # ------------------------------------------------------------------ the sink

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        if self._files is not None:
            self._files.record_message(side, method, tool, direction, measurement, server)
            return
        # One message's series are found once and updated under one hold of the lock.
        slots = self._slots.get((side, server, method, tool, direction))
        if slots is None:
            slots = self._new_slots((side, server, method, tool, direction))
        tier, tokens = measurement.risk_tier, measurement.total_tokens
        response = None
        if slots.tiers is not None:
            response = slots.tiers.get(tier)
            if response is None:
                response = slots.tiers[tier] = self._responses.slot((*slots.values, tier))
        # Exemplars where they help: a breach links its bucket to the trace that caused it.
        exemplar = _exemplar() if tier in BREACH_TIERS else None
        index = bisect_left(self._token_bounds, tokens)
        hist, folded = slots.attrs
        with self._lock:
            hist.add(index, tokens, exemplar)
            if folded:
                self._tokens.folded += 1
            slots.add(measurement, response, self._responses)

    def _new_slots(self, key: tuple[str, str, str, str | None, str]) -> MessageSlots:
        """A message key's series; its server's series and a response's breach tiers start at 0 (alerts and
        dashboards take increase() of them: a series born at its first event would hide that event)."""
        side, server, method, tool, direction = key
        self._touch_server(side, server)
        out = (side, server, method, tool)
        hist = self._tokens.slot(key)
        slots = MessageSlots(out, hist, None, (self._byte_sums, key),
                             (self._overhead, out) if direction == "output" else None)
        if direction == "output":
            for breach_tier in _BREACH_TIERS:
                self._responses.touch((*out, breach_tier))
        if len(self._slots) >= _KNOWN_BOUND:  # a cache: the series stay in their families
            self._slots.clear()
        self._slots[key] = slots
        return slots

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        if self._files is not None:
            self._files.record_call(side, method, tool, server, call)
            return
        key = (side, server, method, tool)
        if call.error_type is not None:
            self.counts["mcp_token_call_errors"].add((*key, call.error_type))
        if call.duration is not None:
            self.hists["mcp_token_operation_duration_seconds"].observe(key, call.duration)

    def record_transition(self, side: str, state: str, server: str) -> None:
        if self._files is not None:
            self._files.record_transition(side, state, server)
        else:
            self._transitions.add((side, server, state))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        if self._files is not None:
            self._files.record_session_end(side, utilization, server, call)
            return
        self.hists["mcp_token_session_utilization_ratio"].observe((side, server), utilization)
        if call.duration is not None:
            self.hists["mcp_token_session_duration_seconds"].observe((side, server), call.duration)

    def record_session_evicted(self, side: str, server: str) -> None:
        if self._files is not None:
            self._files.record_session_evicted(side, server)
        else:
            self.counts["mcp_token_sessions_evicted"].add((side, server))

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        if self._files is not None:
            self._files.record_unbudgeted(side, server, tokens)
        else:
            self._unbudgeted.add((side, server), tokens)

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        if self._files is not None:
            self._files.record_tool_definitions(server, total, per_tool)
        else:
            self._definitions[server] = (total, dict(per_tool))

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        if self._files is not None:
            self._files.record_tool_profiles(server, parts, static_max)
        else:
            self._profiles[server] = (dict(parts), dict(static_max))

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        if self._files is not None:
            self._files.record_prompt_cache_invalidation(side, server, resent_tokens)
        else:
            self._invalidations.add((side, server))
            self._resent.add((side, server), resent_tokens)

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        if self._files is not None:
            self._files.record_wasted(side, server, tool, kind, tokens)
        else:
            self.counts["mcp_token_wasted_tokens"].add((side, server, tool or "", kind), tokens)

    def record_error(self, stage: str, server: str) -> None:
        if self._files is not None:
            self._files.record_error(stage, server)
        else:
            self.counts["mcp_token_instrumentation_errors"].add((stage, server))

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        """One guard action; ``tool`` arrives bounded by the recorder's tool-name limiter."""
        if self._files is not None:
            self._files.record_guard_action(side, server, policy, action, enforced, tool)
        else:
            key = (side, server, policy, action, "true" if enforced else "false", tool or "")
            self.counts["mcp_token_guard_actions"].add(key)

    def touch_guard(
        self, side: str, server: str, tool: str | None, series: list[tuple[str, str, bool]]
    ) -> None:
        """Guard-action series (policy, action, enforced) of a tool at 0 before its first action (alerts take
        increase() of the refusals and padding findings)."""
        for policy, action, enforced in series:
            key = (side, server, policy, action, "true" if enforced else "false", tool or "")
            if self._files is not None:
                self._files.guard_series(key)
            else:
                self.counts["mcp_token_guard_actions"].touch(key)

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        """Estimated USD of one result entering the context."""
        if self._files is not None:
            self._files.record_cost(side, server, tool, usd)
        else:
            self.counts["mcp_token_cost_usd"].add((side, server, tool or ""), usd)

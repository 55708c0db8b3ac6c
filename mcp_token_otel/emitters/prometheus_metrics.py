"""Prometheus metric families (prometheus-client) fed by the recorder, as a metrics sink.

Families (prefix ``mcp_token_``; documented in README):
    message_tokens                   histogram  side, server, method, tool, direction
    tokens_total                     counter    side, server, method, tool, direction   (the histogram's sum)
    message_bytes                    histogram  side, server, method, tool, direction   (UTF-8 bytes, output only)
    bytes_total                      counter    side, server, method, tool, direction   (input and output)
    responses_total                  counter    side, server, method, tool, risk_tier   (output messages per tier)
    risk_breaches_total              counter    side, server, method, tool, risk_tier (high, critical)
    call_errors_total                counter    side, server, method, tool, error_type  (JSON-RPC error, isError)
    operation_duration_seconds       histogram  side, server, method, tool, error_type  (timed calls)
    overhead_ratio                   histogram  side, server, method, tool           (output messages)
    session_utilization_ratio        histogram  side, server                          (observed at session end)
    session_duration_seconds         histogram  side, server                          (observed at session end)
    sessions                         gauge      side, server, state           (live sessions per state)
    session_transitions_total        counter    side, server, state           (warning, exhausted)
    tool_definitions_tokens          gauge      server                        (last tools/list, all tools)
    tool_definition_tokens           gauge      server, tool                  (per tool, within the tool bound)
    instrumentation_errors_total     counter    stage, server                 (server: server_label() at start)
    guard_actions_total              counter    side, server, policy, action, enforced, tool  (guardrails)
    cost_usd_total                   counter    side, server, tool            (USD of results entering the context)
    output_rate_budget_tokens_per_second  gauge      scope (tool, service), server (configured, for alerting)

Cardinality: no session id ever; tool and method values arrive bounded by the recorder's limiters and are
sanitised here (length, control characters, invalid UTF-8). A risk tier is derivable from the token value,
so the token histogram carries none: ``responses_total`` counts responses per tier with one line per series.

Cost: a message is a few dict increments in :mod:`.aggregate`; a scrape renders the series from there (no
``_created`` series unless ``created_series``): :meth:`PrometheusMetrics.exposition` writes the text straight
from copies of the aggregate rows (each series caches its escaped label text and bucket line prefixes; the
aggregate lock is held only while a family's rows are copied), the same bytes as ``generate_latest``.
A breach (high or critical response) leaves a ``trace_id`` exemplar on its bucket, rendered when the scraper
negotiates OpenMetrics. With ``PROMETHEUS_MULTIPROC_DIR`` set (multi-worker servers) the values live in
prometheus-client's shared files instead (same families and labels), serve with :func:`multiprocess_registry`;
exemplars are off there (the client does not support them).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from itertools import accumulate
from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

from ..core.budget import BUDGET_STATES
from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS, RISK_TIERS
from ..semconv import (  # one set of buckets for both paths
    BYTE_BUCKETS,
    DURATION_BUCKETS,
    RATIO_BUCKETS,
    TOKEN_BUCKETS,
    UTILIZATION_BUCKETS,
)
from .aggregate import Count, CountFamily, Hist, HistFamily
from .sink import CallInfo

PREFIX = "mcp_token"
MAX_LABEL_CHARS = 128
_BREACH_TIERS = tuple(sorted(BREACH_TIERS))
_MAX_CACHED_SERIES = 10_000
#: Multiprocess mode: seconds between a worker's refreshes of its live-sessions gauge (done on a message).
_STATES_INTERVAL = 1.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MINUS_INF = float("-inf")

#: Live sessions per (side, server) and state, as the recorder reports them (TokenRecorder.session_states);
#: a mapping keyed by side alone (TokenRecorder.states) is shown under the sink's own ``server``.
StatesFn = Callable[[], Mapping[Any, Mapping[str, int]]]


def _by_server(states: Mapping[Any, Mapping[str, int]], server: str) -> list[tuple[str, str, Mapping[str, int]]]:
    """(side, server, counts) rows from either shape of a StatesFn's answer, sorted."""
    rows = [(*(key if isinstance(key, tuple) else (key, server)), counts) for key, counts in states.items()]
    return sorted(rows, key=lambda row: (row[0], row[1]))


def label_value(value: str | None) -> str:
    """A safe label value: "" for none, valid UTF-8, no control characters, at most 128 characters."""
    if not value:
        return ""
    text = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("_", text)[:MAX_LABEL_CHARS]


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def multiprocess_registry() -> CollectorRegistry:
    """A registry that serves the merged values of every worker (multiprocess mode)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


class _SessionsCollector(Collector):
    """``mcp_token_sessions``, read from the recorder at scrape time (TokenRecorder.session_states: one pass
    over the live sessions, at most ``budget.max_sessions`` per side)."""

    def __init__(self, states: StatesFn, server: str) -> None:
        self._states = states
        self._server = server

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_sessions", "Live MCP sessions per context-window budget state.",
            labels=["side", "server", "state"],
        )
        for side, server, counts in _by_server(self._states(), self._server):
            for state in BUDGET_STATES:
                family.add_metric([side, label_value(server), state], counts.get(state, 0))
        yield family


def _exemplar() -> dict[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


_MESSAGE_LABELS = ("side", "server", "method", "tool", "direction")
_TOOL_LABELS = ("side", "server", "method", "tool")
_TIER_LABELS = ("side", "server", "method", "tool", "risk_tier")
_CALL_LABELS = ("side", "server", "method", "tool", "error_type")
_SESSION_LABELS = ("side", "server")
_TRANSITION_LABELS = ("side", "server", "state")
_GUARD_LABELS = ("side", "server", "policy", "action", "enforced", "tool")
_COST_LABELS = ("side", "server", "tool")
_ERROR_LABELS = ("stage", "server")
_HELP = {
    "message_tokens": "Estimated tokens of one MCP message (input: request params; output: the response).",
    "tokens": "Estimated tokens of MCP messages.",
    "message_bytes": "UTF-8 bytes of one MCP response as measured (output messages only).",
    "bytes": "UTF-8 bytes of MCP messages.",
    "responses": "Output messages per risk tier.",
    "breaches": "Output messages in the high or critical risk tier.",
    "call_errors": "Calls that ended in a JSON-RPC error (error_type: its code) or an isError result (tool_error).",
    "operation": "Duration of an MCP request, from the request to its response (the MCP conventions' buckets).",
    "overhead": "Share of an output message's tokens that is overhead (framing, _meta, duplicated content).",
    "utilization": "Share of the context window a session had used when it ended.",
    "session_duration": "Duration of an MCP session, observed when it ended.",
    "transitions": "Sessions entering a context-window budget state.",
    "errors": "Faults caught inside the instrumentation; the MCP call itself went on.",
    "budget": "Configured sustained output-token budget, in tokens per second (for alerting).",
    "sessions": "Live MCP sessions per context-window budget state.",
    "definitions": "Estimated tokens of a server's tool definitions (its last tools/list result): what every "
    "conversation pays before the first call.",
    "definition": "Estimated tokens of one tool's definition (tools within the tool-name bound).",
    "guard": "Guard actions (truncated, refused, warned, found, stripped, annotated) per policy; enforced=false: "
    "observe mode, what enforce mode would have done.",
    "evicted": "Live sessions whose bookkeeping was dropped (least recently used) to stay within the bound.",
    "cost": "Estimated USD of the results that entered the context (guard.model's input price).",
}


def _named_labels(key: tuple[Any, ...]) -> tuple[str, ...]:
    """side, server, method, tool[, last]: the free-form values sanitised."""
    side, server, method, tool, *rest = key
    return (side, label_value(server), label_value(method), label_value(tool), *(label_value(v) for v in rest))


def _plain_labels(key: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(label_value(v) for v in key)


#: Set in the thread of an exposition() while it collects: the aggregate collector then yields its families
#: already rendered as text instead of Sample objects (other encoders, other threads, get Samples as before).
_TEXT = threading.local()
#: A histogram family's rows as HistFamily.copy() returns them: (series, buckets, sum, count).
_HistRows = list[tuple[Hist, list[int], float, int]]


class _Rendered(Metric):
    """A family already rendered in the text format (only exposition() ever receives one)."""

    def __init__(self, name: str, typ: str, text: str) -> None:
        super().__init__(name, "", typ)
        self.text = text


class _One:
    """One family as a collector, for generate_latest (families from other collectors in the registry)."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


def _label_text(pairs: list[tuple[str, str]]) -> str:
    """Label pairs as generate_latest writes them: sorted by name, values escaped."""
    return ",".join(f'{name}="{_escape_value(value)}"' for name, value in sorted(pairs))


def _go_float(value: float) -> str:
    """floatToGoString(value) for the usual values at about half its cost: below 1e6 (where Go switches to
    exponents) a finite float's repr is its answer; the rest (1e6 and up, infinities, NaN) go to it."""
    if _MINUS_INF < value < 1e6:
        return repr(float(value))
    return floatToGoString(value)


def _header(family: str, doc: str, kind: str) -> str:
    return f"# HELP {family} {_escape_help(doc)}\n# TYPE {family} {kind}\n"


def _hist_cache(name: str, names: tuple[str, ...], labels: tuple[str, ...], les: list[str]) -> tuple[Any, ...]:
    """A histogram series' line prefixes: (name, label text, bucket prefixes, count prefix, sum prefix).
    ``le`` takes its sorted place among the label names, as generate_latest sorts them."""
    pairs = sorted(zip(names, labels, strict=True))
    parts = [f'{label}="{_escape_value(value)}"' for label, value in pairs]
    text = ",".join(parts)
    at = sum(1 for label, _ in pairs if label < "le")
    before, after = "".join(f"{p}," for p in parts[:at]), "".join(f",{p}" for p in parts[at:])
    buckets = tuple(f'{name}_bucket{{{before}le="{le}"{after}}} ' for le in les)
    return name, text, buckets, f"{name}_count{{{text}}} ", f"{name}_sum{{{text}}} "


def _series_cache(series: Hist, name: str, names: tuple[str, ...], les: list[str]) -> tuple[Any, ...]:
    """``series``' line prefixes (see _hist_cache), built on its first rendering and kept on it."""
    cache = series.text
    if cache is None or cache[0] != name:
        cache = series.text = _hist_cache(name, names, series.labels, les)
    return cache


def _hist_text(name: str, doc: str, names: tuple[str, ...], bounds: tuple[float, ...], rows: _HistRows) -> str:
    """A histogram family, byte for byte as generate_latest writes it, from copied aggregate rows."""
    les = [floatToGoString(b) for b in bounds] + ["+Inf"]
    out = [_header(name, doc, "histogram")]
    for series, buckets, value_sum, count in rows:
        cache = _series_cache(series, name, names, les)
        prefixes = cache[2]
        if count < 1_000_000:  # every cumulative count is <= count: floatToGoString's "n.0" for all of them
            out += [f"{prefix}{running}.0\n" for prefix, running in zip(prefixes, accumulate(buckets), strict=True)]
            out.append(f"{cache[3]}{count}.0\n")
        else:  # Go's exponent form from 1e6 on
            out += [f"{prefix}{floatToGoString(running)}\n"
                    for prefix, running in zip(prefixes, accumulate(buckets), strict=True)]
            out.append(f"{cache[3]}{floatToGoString(count)}\n")
        out.append(f"{cache[4]}{_go_float(value_sum)}\n")
    return "".join(out)


def _counter_text(name: str, doc: str, names: tuple[str, ...], rows: list[tuple[Count, float]]) -> str:
    """A counter family (``name``_total) from copied aggregate rows; the label text is cached on the series."""
    total = f"{name}_total"
    out = [_header(total, doc, "counter")]
    for series, value in rows:
        text = series.text
        if text is None:
            text = series.text = _label_text(list(zip(names, series.labels, strict=True)))
        out.append(f"{total}{{{text}}} {_go_float(value)}\n")
    return "".join(out)


def _sum_counter_text(name: str, doc: str, rows: _HistRows, cache: Callable[[Hist], tuple[Any, ...]]) -> str:
    """A counter equal to a histogram's sums, from its rows; ``cache`` gives a series' cached label text
    (the histogram's, also for the series the histogram leaves out)."""
    total = f"{name}_total"
    out = [_header(total, doc, "counter")]
    out += [f"{total}{{{cache(series)[1]}}} {_go_float(value_sum)}\n" for series, _b, value_sum, _c in rows]
    return "".join(out)


def _gauge_text(name: str, doc: str, rows: list[tuple[list[tuple[str, str]], float]]) -> str:
    out = [_header(name, doc, "gauge")]
    out += [f"{name}{{{_label_text(pairs)}}} {_go_float(value)}\n" for pairs, value in rows]
    return "".join(out)


class _AggregateCollector(Collector):
    """Renders the pre-aggregated families on scrape (cumulative buckets computed here, not per message).

    For generate_latest and the OpenMetrics encoder it yields prometheus-client Metric/Sample objects; for
    exposition() (``_TEXT.on`` in its thread) the families' text straight from copies of the aggregate rows.
    """

    def __init__(self, sink: PrometheusMetrics, created: bool) -> None:
        self._sink = sink
        self._created = created

    def _histogram(
        self, name: str, doc: str, names: tuple[str, ...], family: HistFamily, shown: bool = True
    ) -> Metric:
        """``shown``: False leaves out the requests' series (direction "input"; metrics.input_histograms)."""
        metric = Metric(name, doc, "histogram")
        samples = metric.samples
        les = [floatToGoString(b) for b in family.bounds] + ["+Inf"]
        bucket, total, count, created = f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"
        for labels, buckets, value_sum, value_count, created_at, exemplars in family.snapshot():
            if not shown and labels[-1] == "input":
                continue
            base = dict(zip(names, labels, strict=True))
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
        return metric

    def _counter(self, name: str, doc: str, rows: list[tuple[dict[str, str], float, float]]) -> Metric:
        metric = Metric(name, doc, "counter")
        for labels, value, created_at in rows:
            metric.samples.append(Sample(f"{name}_total", labels, value))
            if self._created:
                metric.samples.append(Sample(f"{name}_created", labels, created_at))
        return metric

    @staticmethod
    def _sums(family: HistFamily) -> list[tuple[dict[str, str], float, float]]:
        return [
            (dict(zip(_MESSAGE_LABELS, labels, strict=True)), value_sum, created)
            for labels, _b, value_sum, _c, created, _e in family.snapshot()
        ]

    @staticmethod
    def _rows(names: tuple[str, ...], family: CountFamily) -> list[tuple[dict[str, str], float, float]]:
        return [(dict(zip(names, labels, strict=True)), value, created) for labels, value, created in family.snapshot()]

    def _gauges(self) -> tuple[list[Any], list[Any], list[Any]]:
        """(definitions, per-tool definitions, rate budgets) as (label pairs, value) rows."""
        sink = self._sink
        definitions, per_tool = [], []
        for server, (total, tools) in sorted(sink._definitions.items()):
            definitions.append(([("server", label_value(server))], total))
            for tool, tokens in sorted(tools.items()):
                per_tool.append(([("server", label_value(server)), ("tool", label_value(tool))], tokens))
        budgets = [([("scope", scope), ("server", sink.server)], value) for scope, value in sink.rate_budgets.items()]
        return definitions, per_tool, budgets

    def collect(self) -> Iterator[Metric]:
        if getattr(_TEXT, "on", False):
            yield from self._collect_text()
            return
        sink = self._sink
        yield self._histogram(
            f"{PREFIX}_message_tokens", _HELP["message_tokens"], _MESSAGE_LABELS, sink._tokens, sink.input_histograms
        )
        # tokens_total (bytes_total) is the histogram's sum, kept as a counter for the queries and rules that
        # use it (and that join with the OpenTelemetry path's counter of the same name).
        yield self._counter(f"{PREFIX}_tokens", _HELP["tokens"], self._sums(sink._tokens))
        yield self._histogram(f"{PREFIX}_message_bytes", _HELP["message_bytes"], _MESSAGE_LABELS, sink._bytes)
        yield self._counter(f"{PREFIX}_bytes", _HELP["bytes"], self._rows(_MESSAGE_LABELS, sink._byte_sums))
        responses = self._rows(_TIER_LABELS, sink._responses)
        yield self._counter(f"{PREFIX}_responses", _HELP["responses"], responses)
        yield self._counter(
            f"{PREFIX}_risk_breaches",
            _HELP["breaches"],
            [row for row in responses if row[0]["risk_tier"] in BREACH_TIERS],
        )
        yield self._counter(f"{PREFIX}_call_errors", _HELP["call_errors"], self._rows(_CALL_LABELS, sink._call_errors))
        yield self._histogram(
            f"{PREFIX}_operation_duration_seconds", _HELP["operation"], _CALL_LABELS, sink._operation
        )
        yield self._histogram(f"{PREFIX}_overhead_ratio", _HELP["overhead"], _TOOL_LABELS, sink._overhead)
        yield self._histogram(
            f"{PREFIX}_session_utilization_ratio", _HELP["utilization"], _SESSION_LABELS, sink._utilization
        )
        yield self._histogram(
            f"{PREFIX}_session_duration_seconds", _HELP["session_duration"], _SESSION_LABELS, sink._session_duration
        )
        yield self._counter(
            f"{PREFIX}_session_transitions", _HELP["transitions"], self._rows(_TRANSITION_LABELS, sink._transitions)
        )
        definitions, per_tool, budgets = self._gauges()
        for name, doc, labels, rows in (
            (f"{PREFIX}_tool_definitions_tokens", _HELP["definitions"], ["server"], definitions),
            (f"{PREFIX}_tool_definition_tokens", _HELP["definition"], ["server", "tool"], per_tool),
        ):
            family = GaugeMetricFamily(name, doc, labels=labels)
            for pairs, value in rows:
                family.add_metric([v for _, v in pairs], value)
            yield family
        yield self._counter(
            f"{PREFIX}_instrumentation_errors", _HELP["errors"], self._rows(_ERROR_LABELS, sink._errors)
        )
        yield self._counter(f"{PREFIX}_guard_actions", _HELP["guard"], self._rows(_GUARD_LABELS, sink._guard))
        yield self._counter(f"{PREFIX}_cost_usd", _HELP["cost"], self._rows(_COST_LABELS, sink._cost))
        yield self._counter(f"{PREFIX}_sessions_evicted", _HELP["evicted"], self._rows(_SESSION_LABELS, sink._evicted))
        budget = GaugeMetricFamily(
            f"{PREFIX}_output_rate_budget_tokens_per_second", _HELP["budget"], labels=["scope", "server"]
        )
        for pairs, value in budgets:
            budget.add_metric([v for _, v in pairs], value)
        yield budget

    def _collect_text(self) -> Iterator[Metric]:
        """The same families in the same order as collect(), as text. Each family's rows are copied under the
        aggregate lock (one short hold per family) and formatted after it is released."""
        sink = self._sink

        def histogram(
            name: str, doc: str, names: tuple[str, ...], family: HistFamily, rows: _HistRows | None = None
        ) -> Metric:
            text = _hist_text(name, doc, names, family.bounds, family.copy() if rows is None else rows)
            return _Rendered(name, "histogram", text)

        def counter(name: str, doc: str, names: tuple[str, ...], rows: list[tuple[Count, float]]) -> Metric:
            return _Rendered(name, "counter", _counter_text(name, doc, names, rows))

        tokens = sink._tokens.copy()  # one copy for the histogram and its sum counter: they agree
        name = f"{PREFIX}_message_tokens"
        shown = tokens if sink.input_histograms else [row for row in tokens if row[0].labels[-1] != "input"]
        yield histogram(name, _HELP["message_tokens"], _MESSAGE_LABELS, sink._tokens, shown)
        les = [floatToGoString(b) for b in sink._tokens.bounds] + ["+Inf"]

        def label_text(series: Hist) -> tuple[Any, ...]:  # the histogram's cache, also for series it leaves out
            return _series_cache(series, name, _MESSAGE_LABELS, les)

        text = _sum_counter_text(f"{PREFIX}_tokens", _HELP["tokens"], tokens, label_text)
        yield _Rendered(f"{PREFIX}_tokens", "counter", text)
        yield histogram(f"{PREFIX}_message_bytes", _HELP["message_bytes"], _MESSAGE_LABELS, sink._bytes)
        yield counter(f"{PREFIX}_bytes", _HELP["bytes"], _MESSAGE_LABELS, sink._byte_sums.copy())
        responses = sink._responses.copy()
        yield counter(f"{PREFIX}_responses", _HELP["responses"], _TIER_LABELS, responses)
        breaches = [row for row in responses if row[0].labels[-1] in BREACH_TIERS]
        yield counter(f"{PREFIX}_risk_breaches", _HELP["breaches"], _TIER_LABELS, breaches)
        yield counter(f"{PREFIX}_call_errors", _HELP["call_errors"], _CALL_LABELS, sink._call_errors.copy())
        yield histogram(f"{PREFIX}_operation_duration_seconds", _HELP["operation"], _CALL_LABELS, sink._operation)
        yield histogram(f"{PREFIX}_overhead_ratio", _HELP["overhead"], _TOOL_LABELS, sink._overhead)
        yield histogram(f"{PREFIX}_session_utilization_ratio", _HELP["utilization"], _SESSION_LABELS, sink._utilization)
        yield histogram(
            f"{PREFIX}_session_duration_seconds", _HELP["session_duration"], _SESSION_LABELS, sink._session_duration
        )
        yield counter(f"{PREFIX}_session_transitions", _HELP["transitions"], _TRANSITION_LABELS,
                      sink._transitions.copy())
        definitions, per_tool, budgets = self._gauges()
        for name, doc, rows in (
            (f"{PREFIX}_tool_definitions_tokens", _HELP["definitions"], definitions),
            (f"{PREFIX}_tool_definition_tokens", _HELP["definition"], per_tool),
        ):
            yield _Rendered(name, "gauge", _gauge_text(name, doc, rows))
        yield counter(f"{PREFIX}_instrumentation_errors", _HELP["errors"], _ERROR_LABELS, sink._errors.copy())
        yield counter(f"{PREFIX}_guard_actions", _HELP["guard"], _GUARD_LABELS, sink._guard.copy())
        yield counter(f"{PREFIX}_cost_usd", _HELP["cost"], _COST_LABELS, sink._cost.copy())
        yield counter(f"{PREFIX}_sessions_evicted", _HELP["evicted"], _SESSION_LABELS, sink._evicted.copy())
        name = f"{PREFIX}_output_rate_budget_tokens_per_second"
        yield _Rendered(name, "gauge", _gauge_text(name, _HELP["budget"], budgets))


class PrometheusMetrics:
    """A recorder metrics sink whose families are scraped from ``registry``.

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
        self._multiprocess = multiprocess_mode()
        self._states = states
        self.rate_budgets = {"tool": tool_output_rate_budget, "service": service_output_rate_budget}
        self.server = label_value(server)
        self._created = created_series
        if self._multiprocess:
            self._files: _SharedFileFamilies | None = _SharedFileFamilies(
                self.registry, states, self.rate_budgets, self.server, input_histograms
            )
            return
        self._files = None
        self._created = created_series
        lock = threading.Lock()
        self._tokens = HistFamily(TOKEN_BUCKETS, lock, _named_labels)
        self._bytes = HistFamily(BYTE_BUCKETS, lock, _named_labels)
        self._byte_sums = CountFamily(lock, _named_labels)
        self._overhead = HistFamily(RATIO_BUCKETS, lock, _named_labels)
        self._operation = HistFamily(DURATION_BUCKETS, lock, _named_labels)
        self._utilization = HistFamily(UTILIZATION_BUCKETS, lock, _plain_labels)
        self._session_duration = HistFamily(DURATION_BUCKETS, lock, _plain_labels)
        self._responses = CountFamily(lock, _named_labels)
        self._call_errors = CountFamily(lock, _named_labels)
        self._transitions = CountFamily(lock, _plain_labels)
        self._errors = CountFamily(lock, _plain_labels)
        self._guard = CountFamily(lock, _plain_labels)
        self._cost = CountFamily(lock, _plain_labels)
        self._evicted = CountFamily(lock, _plain_labels)
        #: server -> (total tokens, {tool: tokens}) of its last tools/list result.
        self._definitions: dict[str, tuple[int, dict[str, int]]] = {}
        self._known_outputs: set[tuple[str, str, str, str | None]] = set()
        self._known_servers: set[tuple[str, str]] = set()
        self.registry.register(_AggregateCollector(self, created_series))
        if states is not None:
            self.registry.register(_SessionsCollector(states, server))
        # Pre-create series that alerts take increase() of: a series born at its first event would hide
        # that event from increase() (it has no earlier sample), and a healthy process should export 0.
        self._errors.touch(("estimate", server))
        for side in ("client", "server", "proxy"):
            self._touch_server(side, server)

    def _touch_server(self, side: str, server: str) -> None:
        """A side's first message for a server: its transition series start at 0 (alerts take increase())."""
        self._known_servers.add((side, server))
        for state in ("warning", "exhausted"):
            self._transitions.touch((side, server, state))

    def exposition(self) -> bytes:
        """The registry's Prometheus text exposition (format 0.0.4): the same bytes as ``generate_latest``
        (a test compares them), several times faster. The aggregate families are rendered straight from
        copies of the aggregate rows with each series' escaped label text and bucket line prefixes cached on
        the series, instead of building a Sample per line and validating and escaping it. Families of any
        other collector in the registry go through ``generate_latest``. Exemplars need OpenMetrics: serve the
        OpenMetrics encoder when the scraper asks for it."""
        if self._files is not None or self._created:  # the client's own layout for these (_created families)
            return generate_latest(self.registry)
        out: list[str] = []
        _TEXT.on = True
        try:
            for metric in self.registry.collect():
                if isinstance(metric, _Rendered):
                    out.append(metric.text)
                else:
                    out.append(generate_latest(_One(metric)).decode("utf-8"))  # type: ignore[arg-type]
        finally:
            _TEXT.on = False
        return "".join(out).encode("utf-8")

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        if self._files is not None:
            self._files.record_message(side, method, tool, direction, measurement, server)
            return
        if (side, server) not in self._known_servers:
            if len(self._known_servers) >= 10_000:
                self._known_servers.clear()
            self._touch_server(side, server)
        tier = measurement.risk_tier
        breach = tier in BREACH_TIERS
        key = (side, server, method, tool, direction)
        # Exemplars where they help: a breach links its bucket to the trace that caused it.
        self._tokens.observe(key, measurement.total_tokens, _exemplar() if breach else None)
        self._byte_sums.add(key, measurement.bytes)
        if direction == "output":  # the size distribution of responses (requests are small; their sum is kept)
            self._bytes.observe(key, measurement.bytes)
            out = (side, server, method, tool)
            self._overhead.observe(out, measurement.overhead_ratio)
            if out not in self._known_outputs:  # breach series exist at 0 before a first breach, for increase()
                if len(self._known_outputs) >= 10_000:
                    self._known_outputs.clear()
                self._known_outputs.add(out)
                for breach_tier in _BREACH_TIERS:
                    self._responses.touch((*out, breach_tier))
            self._responses.add((*out, tier))

    def record_breach(self, side: str, method: str, tool: str | None, tier: str, server: str) -> None:
        if self._files is not None:
            self._files.breaches.labels(side, label_value(server), label_value(method), label_value(tool), tier).inc()
        # Otherwise derived from responses_total (the high and critical tiers): nothing to record twice.

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        error = call.error_type or ""
        if self._files is not None:
            self._files.record_call(side, method, tool, server, call)
            return
        key = (side, server, method, tool, error)
        if call.error_type is not None:
            self._call_errors.add(key)
        if call.duration is not None:
            self._operation.observe(key, call.duration)

    def record_transition(self, side: str, state: str, server: str) -> None:
        if self._files is not None:
            self._files.transitions.labels(side, label_value(server), state).inc()
        else:
            self._transitions.add((side, server, state))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        duration = call.duration
        if self._files is not None:
            self._files.utilization.labels(side, label_value(server)).observe(utilization)
            if duration is not None:
                self._files.session_duration.labels(side, label_value(server)).observe(duration)
            return
        self._utilization.observe((side, server), utilization)
        if duration is not None:
            self._session_duration.observe((side, server), duration)

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        if self._files is not None:
            self._files.definitions.labels(label_value(server)).set(total)
            for tool, tokens in per_tool.items():
                self._files.definition.labels(label_value(server), label_value(tool)).set(tokens)
            return
        self._definitions[server] = (total, dict(per_tool))

    def record_error(self, stage: str, server: str) -> None:
        if self._files is not None:
            self._files.errors.labels(label_value(stage), label_value(server)).inc()
        else:
            self._errors.add((stage, server))

    def record_session_evicted(self, side: str, server: str) -> None:
        if self._files is not None:
            self._files.evicted.labels(side, label_value(server)).inc()
        else:
            self._evicted.add((side, server))

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        """One guard action; ``tool`` arrives bounded by the recorder's tool-name limiter."""
        key = (side, server, policy, action, "true" if enforced else "false", tool or "")
        if self._files is not None:
            self._files.guard.labels(*_plain_labels(key)).inc()
        else:
            self._guard.add(key)

    def touch_guard(
        self, side: str, server: str, tool: str | None, series: list[tuple[str, str, bool]]
    ) -> None:
        """Guard-action series (policy, action, enforced) of a tool at 0 before its first action (alerts take
        increase() of the refusals and padding findings)."""
        for policy, action, enforced in series:
            key = (side, server, policy, action, "true" if enforced else "false", tool or "")
            if self._files is not None:
                self._files.guard.labels(*_plain_labels(key))
            else:
                self._guard.touch(key)

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        """Estimated USD of one result entering the context."""
        key = (side, server, tool or "")
        if self._files is not None:
            self._files.cost.labels(*_plain_labels(key)).inc(usd)
        else:
            self._cost.add(key, usd)


class _SharedFileFamilies:
    """Multiprocess mode: the same families as prometheus-client objects (their values live in shared files)."""

    def __init__(
        self,
        r: CollectorRegistry,
        states: StatesFn | None,
        rate_budgets: Mapping[str, float],
        server: str,
        input_histograms: bool = False,
    ) -> None:
        self._states = states
        self._input_histograms = input_histograms
        self._states_read = float("-inf")
        self._server = server
        self.message_tokens = Histogram(
            f"{PREFIX}_message_tokens", _HELP["message_tokens"], list(_MESSAGE_LABELS), buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(f"{PREFIX}_tokens", _HELP["tokens"], list(_MESSAGE_LABELS), registry=r)
        self.message_bytes = Histogram(
            f"{PREFIX}_message_bytes", _HELP["message_bytes"], list(_MESSAGE_LABELS), buckets=BYTE_BUCKETS,
            registry=r,
        )
        self.bytes = Counter(f"{PREFIX}_bytes", _HELP["bytes"], list(_MESSAGE_LABELS), registry=r)
        self.responses = Counter(f"{PREFIX}_responses", _HELP["responses"], list(_TIER_LABELS), registry=r)
        self.breaches = Counter(f"{PREFIX}_risk_breaches", _HELP["breaches"], list(_TIER_LABELS), registry=r)
        self.call_errors = Counter(f"{PREFIX}_call_errors", _HELP["call_errors"], list(_CALL_LABELS), registry=r)
        self.operation = Histogram(
            f"{PREFIX}_operation_duration_seconds", _HELP["operation"], list(_CALL_LABELS), buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            f"{PREFIX}_overhead_ratio", _HELP["overhead"], list(_TOOL_LABELS), buckets=RATIO_BUCKETS, registry=r
        )
        self.utilization = Histogram(
            f"{PREFIX}_session_utilization_ratio", _HELP["utilization"], list(_SESSION_LABELS),
            buckets=UTILIZATION_BUCKETS, registry=r,
        )
        self.session_duration = Histogram(
            f"{PREFIX}_session_duration_seconds", _HELP["session_duration"], list(_SESSION_LABELS),
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.transitions = Counter(
            f"{PREFIX}_session_transitions", _HELP["transitions"], list(_TRANSITION_LABELS), registry=r
        )
        self.errors = Counter(f"{PREFIX}_instrumentation_errors", _HELP["errors"], list(_ERROR_LABELS), registry=r)
        self.guard = Counter(f"{PREFIX}_guard_actions", _HELP["guard"], list(_GUARD_LABELS), registry=r)
        self.cost = Counter(f"{PREFIX}_cost_usd", _HELP["cost"], list(_COST_LABELS), registry=r)
        self.evicted = Counter(f"{PREFIX}_sessions_evicted", _HELP["evicted"], list(_SESSION_LABELS), registry=r)
        self.definitions = Gauge(
            f"{PREFIX}_tool_definitions_tokens", _HELP["definitions"], ["server"], registry=r, multiprocess_mode="max"
        )
        self.definition = Gauge(
            f"{PREFIX}_tool_definition_tokens", _HELP["definition"], ["server", "tool"], registry=r,
            multiprocess_mode="max",
        )
        budget = Gauge(
            f"{PREFIX}_output_rate_budget_tokens_per_second", _HELP["budget"], ["scope", "server"], registry=r,
            multiprocess_mode="max",
        )
        for scope, value in rate_budgets.items():
            budget.labels(scope, server).set(value)
        # Shared files cannot call back into each worker: each sets its own counts, summed.
        self.live_sessions = Gauge(
            f"{PREFIX}_sessions", _HELP["sessions"], ["side", "server", "state"], registry=r,
            multiprocess_mode="livesum",
        )
        self._series: dict[tuple[str, str, str, str | None, str], tuple[Any, ...]] = {}
        self.errors.labels("estimate", server)
        for side in ("client", "server", "proxy"):
            for state in ("warning", "exhausted"):
                self.transitions.labels(side, server, state)

    def _children(self, side: str, server: str, method: str, tool: str | None, direction: str) -> tuple[Any, ...]:
        """The labelled series one message touches, cached: labels() takes a lock and validates each time."""
        key = (side, server, method, tool, direction)
        children = self._series.get(key)
        if children is None:
            labels = (side, label_value(server), label_value(method), label_value(tool))
            output = direction == "output"
            children = (
                self.message_tokens.labels(*labels, direction) if output or self._input_histograms else None,
                self.tokens.labels(*labels, direction),
                self.message_bytes.labels(*labels, direction) if output else None,
                self.bytes.labels(*labels, direction),
                self.overhead.labels(*labels) if output else None,
                {t: self.responses.labels(*labels, t) for t in RISK_TIERS} if output else None,
            )
            if output:
                for breach_tier in _BREACH_TIERS:  # exist at 0 before a first breach, for increase()
                    self.breaches.labels(*labels, breach_tier)
                for state in ("warning", "exhausted"):
                    self.transitions.labels(side, label_value(server), state)
            if len(self._series) >= _MAX_CACHED_SERIES:  # labels are bounded upstream; this bounds the cache too
                self._series.clear()
            self._series[key] = children
        return children

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, m: Measurement, server: str
    ) -> None:
        tokens_hist, tokens_total, bytes_hist, bytes_total, overhead, responses = self._children(
            side, server, method, tool, direction
        )
        if tokens_hist is not None:
            tokens_hist.observe(m.total_tokens)
        tokens_total.inc(m.total_tokens)
        if bytes_hist is not None:
            bytes_hist.observe(m.bytes)
        bytes_total.inc(m.bytes)
        if overhead is not None:
            overhead.observe(m.overhead_ratio)
            responses[m.risk_tier].inc()
        now = time.monotonic()
        if self._states is not None and now - self._states_read >= _STATES_INTERVAL:
            # Reading the states is a pass over the live sessions: once a second at most, not per message.
            self._states_read = now
            for session_side, server_label, counts in _by_server(self._states(), self._server):
                for state in BUDGET_STATES:
                    self.live_sessions.labels(session_side, label_value(server_label), state).set(counts.get(state, 0))

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        labels = (side, label_value(server), label_value(method), label_value(tool), label_value(call.error_type))
        if call.error_type is not None:
            self.call_errors.labels(*labels).inc()
        if call.duration is not None:
            self.operation.labels(*labels).observe(call.duration)

"""The OpenTelemetry metrics emitter: the catalog's OpenTelemetry instruments (every Prometheus family mirrored,
so dashboards and alerts work through a Collector too, plus the MCP conventions' own duration histograms
``mcp.{client,server}.operation.duration`` and ``mcp.{client,server}.session.duration``)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from ..catalog import BY_OTEL_NAME, Family, otel_families
from ..core.labels import UNKNOWN_SERVER
from ..core.measure import Measurement
from ..core.risk import BREACH_TIERS
from ..semconv import (
    M_FAMILY,
    M_SIDE,
    MCP_CLIENT_OPERATION_DURATION,
    MCP_CLIENT_SESSION_DURATION,
    MCP_SERVER_OPERATION_DURATION,
    MCP_SERVER_SESSION_DURATION,
    SCHEMA_URL,
    SCOPE_NAME,
)
from .aggregate import CountFamily, MessageSlots
from .sink import CallInfo

#: The breach tiers in a fixed order (a frozenset's order changes with the hash seed): series order is stable.
_BREACH_ORDER = tuple(sorted(BREACH_TIERS))
#: Recorded with no span in its context, a point is offered to no exemplar reservoir (the SDK's default
#: trace-based filter samples points recorded inside a sampled span): exemplars only where they help, on the
#: breaches, whose bucket then links to the trace that caused it. An offer costs about 2.5 µs a point.
#: Not empty: the SDK reads an empty context as "none given" and takes the current one.
_NO_SPAN = trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())
#: Where a family's new attribute sets go once it holds MAX_SERIES series: the attribute the SDK itself gives
#: the overflow point of an instrument past its cardinality limit.
_OVERFLOW = (("otel.metric.overflow", True),)
_DROPPED = "mcp_token.instrumentation.dropped"
_CACHE_BOUND = 4096
Pairs = tuple[tuple[str, Any], ...]
#: The sides the conventions' instruments name themselves (mcp.client.*, mcp.server.*). Any other side (the proxy,
#: whose requests go in the client instrument) is added as this project's side attribute, so that a Collector can
#: tell its points from a client's.
_CONVENTION_SIDES = frozenset({"client", "server"})


def pairs(family: Family, values: Iterable[Any]) -> Pairs:
    """A family's attributes for label ``values``; a value that is None or "" (an unknown server, no tool) leaves
    its attribute out, as an empty Prometheus label is."""
    return tuple((name, value) for name, value in zip(family.attributes(), values, strict=True)
                 if value is not None and value != "")


Reader = Callable[[Any], Iterator[metrics.Observation]]


class _MeterInstruments:
    """The instruments of one Meter, created once. The SDK hands back the first instrument for a name it has
    seen and drops a second one's callbacks, so a recorder made after another on the same MeterProvider (an
    uninstrument and instrument again) would report nothing: every sink on a meter shares these, and each
    observable callback reads the sinks alive now (a counter's series summed across them, a gauge's from the
    newest). A closed sink's totals stay readable, frozen, until a new sink on the meter replaces it."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._sinks: list[weakref.ref[OtelMetricsSink]] = []
        #: Closed sinks, held so that their totals outlive their recorder (until the next sink replaces them).
        self._closed: list[OtelMetricsSink] = []
        self.histograms: dict[str, metrics.Histogram] = {}
        # Collection runs observable callbacks (in creation order) before it reads the synchronous
        # instruments, so the drop counter, created first, drains a DeferredSink's queue before anything is
        # read: every export (and the final one at shutdown) is complete.
        for family in sorted(otel_families("recorder"), key=lambda f: f.otel_name != _DROPPED):
            name = family.otel_name
            if family.kind == "histogram":
                self.histograms[name] = meter.create_histogram(
                    name, unit=family.otel_unit, description=family.help,
                    explicit_bucket_boundaries_advisory=family.buckets,
                )
                continue
            create = meter.create_observable_counter if family.kind == "counter" else meter.create_observable_gauge
            create(name, callbacks=[self._reader(name, family.kind == "counter")], unit=family.otel_unit,
                   description=family.help)

    def add(self, sink: OtelMetricsSink) -> None:
        live = [ref for ref in self._sinks if (old := ref()) is not None and all(old is not c for c in self._closed)]
        self._sinks = [*live, weakref.ref(sink)]
        self._closed = []

    def close(self, sink: OtelMetricsSink) -> None:
        self._closed.append(sink)

    def _reader(self, name: str, summed: bool) -> Reader:
        def observe(options: Any) -> Iterator[metrics.Observation]:
            sinks = [sink for sink in (ref() for ref in self._sinks) if sink is not None]
            if len(sinks) == 1:  # the usual case: one recorder per meter, its observations as they are
                yield from sinks[0].readers[name](options)
                return
            merged: dict[frozenset[tuple[str, Any]], tuple[Any, float]] = {}
            for sink in sinks:
                for point in sink.readers[name](options):
                    key = frozenset((point.attributes or {}).items())
                    earlier = merged.get(key)
                    value = point.value + earlier[1] if summed and earlier is not None else point.value
                    merged[key] = (point.attributes, value)
            for attributes, value in merged.values():
                yield metrics.Observation(value, attributes)

        return observe


_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _MeterInstruments] = weakref.WeakKeyDictionary()
_INSTRUMENTS_LOCK = threading.Lock()


def _instruments(meter: metrics.Meter) -> _MeterInstruments:
    with _INSTRUMENTS_LOCK:
        shared = _INSTRUMENTS.get(meter)
        if shared is None:
            shared = _INSTRUMENTS[meter] = _MeterInstruments(meter)
        return shared


class OtelMetricsSink:
    """A :class:`~.sink.MetricsSink` on an OpenTelemetry Meter.

    The SDK costs ~20 µs per synchronous point (attribute cleaning, hashing, exemplar offers), so only the
    histograms are synchronous: the token histogram of a response (of a request too with ``input_histograms``)
    and the conventions' operation duration of a timed call. Counters (tokens, bytes, overhead tokens,
    responses, errors) are pre-aggregated here (a dict increment) and reported through observable instruments
    at collection.
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
        self._definitions: dict[str, int] = {}
        self._tool_definitions: dict[tuple[str, str], int] = {}
        #: (server, part) and (server, tool) of the last tools/list results: swapped whole, like the above.
        self._parts: dict[tuple[str, str], int] = {}
        self._static_max: dict[tuple[str, str], int] = {}
        self._call_attrs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._slots: dict[tuple[Any, ...], MessageSlots] = {}
        self._keys: dict[tuple[Any, ...], Pairs] = {}
        self._deferred: Any = None
        #: The instruments observed from state read at collection; every other counter is pre-aggregated.
        readers: dict[str, Reader] = {
            _DROPPED: self._drain_and_observe,
            "mcp_token.sessions": self._observe_sessions,
            "mcp_token.output_rate_budget": self._observe_budgets,
            "mcp_token.tool_definitions.tokens": self._observe_definitions,
            "mcp_token.tool_definition.tokens": self._observe_tool_definitions,
            "mcp_token.tool_definitions.part.tokens": self._observe_parts,
            "mcp_token.tool.static_max.tokens": self._observe_static_max,
            "mcp_token.series.overflow": self._observe_overflow,
        }
        lock = self._lock = threading.Lock()
        self.counts: dict[str, CountFamily] = {}
        for family in otel_families("recorder"):
            name = family.otel_name
            if family.kind == "histogram" or name in readers:
                continue
            if family.kind != "counter":
                raise ValueError(f"{name}: a gauge the OpenTelemetry sink has no reader for")
            readers[name] = _observer(self.counts.setdefault(name, CountFamily(lock, _no_labels, _OVERFLOW)))
        #: What each observable instrument reads from this sink (the meter's shared instruments call these).
        self.readers = readers
        self._shared = _instruments(meter)
        self._shared.add(self)
        h = self._histograms = self._shared.histograms  # the hot paths' instruments and families, named once
        self._tokens = h["mcp_token.message.tokens"]
        self._utilization = h["mcp_token.session.utilization"]
        self._operation = {"client": h[MCP_CLIENT_OPERATION_DURATION], "server": h[MCP_SERVER_OPERATION_DURATION]}
        self._session = {"client": h[MCP_CLIENT_SESSION_DURATION], "server": h[MCP_SERVER_SESSION_DURATION]}
        self._token_sums, self._byte_sums = self.counts["mcp_token.tokens"], self.counts["mcp_token.bytes"]
        self._responses, self._overhead = self.counts["mcp_token.responses"], self.counts["mcp_token.overhead.tokens"]
        # As on /metrics: series that alerts and panels take increase() of exist at 0 before their first event.
        self._touched: set[tuple[str, str]] = set()
        self._touch("mcp_token.instrumentation.errors", ("estimate", server))

    def _touch(self, name: str, values: tuple[Any, ...]) -> None:
        self.counts[name].touch(self._key(name, values))

    def _touch_server(self, side: str, server: str) -> None:
        """A side's first message for a named server: its transition, unbudgeted and prompt-cache series at 0."""
        if (side, server) in self._touched or not server or server == UNKNOWN_SERVER:
            return  # an unknown name gets its real one later
        self._touched.add((side, server))
        for state in ("warning", "exhausted"):
            self._touch("mcp_token.session.transitions", (side, server, state))
        for name in ("mcp_token.unbudgeted.tokens", "mcp_token.prompt_cache.invalidations",
                     "mcp_token.prompt_cache.resent.tokens"):
            self._touch(name, (side, server))

    def _key(self, name: str, values: tuple[Any, ...]) -> Pairs:
        """The attribute pairs of instrument ``name``'s series for ``values``, cached (built once per series)."""
        cache_key = (name, *values)
        key = self._keys.get(cache_key)
        if key is None:
            if len(self._keys) > _CACHE_BOUND:  # a cache: clearing it loses no value
                self._keys.clear()
            key = self._keys[cache_key] = pairs(BY_OTEL_NAME[name], values)
        return key

    def _add(self, name: str, values: tuple[Any, ...], amount: float = 1.0) -> None:
        self.counts[name].add(self._key(name, values), amount)

    def _observe_sessions(self, _options: Any) -> Iterator[metrics.Observation]:
        if self._states is None:
            return
        family = BY_OTEL_NAME["mcp_token.sessions"]
        for key, counts in self._states().items():
            side, server = key if isinstance(key, tuple) else (key, self._server)
            for state, count in counts.items():
                yield metrics.Observation(count, dict(pairs(family, (side, server, state))))

    def _observe_budgets(self, _options: Any) -> Iterator[metrics.Observation]:
        family = BY_OTEL_NAME["mcp_token.output_rate_budget"]
        for scope, budget in self._rate_budgets.items():
            yield metrics.Observation(budget, dict(pairs(family, (scope, self._server))))

    def _observe_overflow(self, _options: Any) -> Iterator[metrics.Observation]:
        for name, family in self.counts.items():
            yield metrics.Observation(family.folded, {M_FAMILY: name})

    def close(self) -> None:
        """The recorder is done: its totals stay as they are until a new recorder on the same meter starts."""
        self._shared.close(self)

    def set_deferred(self, deferred: Any) -> None:
        """Called by the DeferredSink that wraps this sink."""
        self._deferred = deferred

    def _drain_and_observe(self, _options: Any) -> Iterator[metrics.Observation]:
        deferred = self._deferred
        if deferred is not None:
            deferred.flush()
        attrs = dict(pairs(BY_OTEL_NAME[_DROPPED], (self._server,)))
        yield metrics.Observation(deferred.dropped if deferred is not None else 0, attrs)

    def _observe_definitions(self, _options: Any) -> Iterator[metrics.Observation]:
        family = BY_OTEL_NAME["mcp_token.tool_definitions.tokens"]
        for server, value in list(self._definitions.items()):
            yield metrics.Observation(value, dict(pairs(family, (server,))))

    def _observe_tool_definitions(self, _options: Any) -> Iterator[metrics.Observation]:
        family = BY_OTEL_NAME["mcp_token.tool_definition.tokens"]
        for (server, tool), value in list(self._tool_definitions.items()):
            yield metrics.Observation(value, dict(pairs(family, (server, tool))))

    def _observe_parts(self, _options: Any) -> Iterator[metrics.Observation]:
        family = BY_OTEL_NAME["mcp_token.tool_definitions.part.tokens"]
        for key, value in list(self._parts.items()):
            yield metrics.Observation(value, dict(pairs(family, key)))

    def _observe_static_max(self, _options: Any) -> Iterator[metrics.Observation]:
        family = BY_OTEL_NAME["mcp_token.tool.static_max.tokens"]
        for key, value in list(self._static_max.items()):
            yield metrics.Observation(value, dict(pairs(family, key)))

    def _new_slots(self, key: tuple[str, str, str | None, str, str]) -> MessageSlots:
        side, method, tool, direction, server = key
        attrs = self._key("mcp_token.tokens", (side, server, method, tool, direction))
        output = direction == "output"
        overhead = self._key("mcp_token.overhead.tokens", (side, server, method, tool)) if output else None
        slots = MessageSlots((side, server, method, tool), dict(attrs), (self._token_sums, attrs),
                             (self._byte_sums, attrs), (self._overhead, overhead) if overhead else None)
        if len(self._slots) > _CACHE_BOUND:  # a cache: the series stay in their families
            self._slots.clear()
        self._slots[key] = slots
        self._touch_server(side, server)
        if output:
            for tier in _BREACH_ORDER:
                self._touch("mcp_token.responses", (side, server, method, tool, tier))
        return slots

    def record_message(
        self, side: str, method: str, tool: str | None, direction: str, measurement: Measurement, server: str
    ) -> None:
        # One message's series are found once (the histogram's attribute dict too) and updated under one lock.
        slots = self._slots.get((side, method, tool, direction, server))
        if slots is None:
            slots = self._new_slots((side, method, tool, direction, server))
        tier = measurement.risk_tier
        if direction == "output" or self._input_histograms:
            context = None if tier in BREACH_TIERS else _NO_SPAN  # None: the caller's, its span
            self._tokens.record(measurement.total_tokens, slots.attrs, context)
        response = None
        if slots.tiers is not None:
            response = slots.tiers.get(tier)
            if response is None:
                response = slots.tiers[tier] = self._responses.slot(
                    self._key("mcp_token.responses", (*slots.values, tier)))
        with self._lock:
            slots.add(measurement, response, self._responses)

    def record_transition(self, side: str, state: str, server: str) -> None:
        self._add("mcp_token.session.transitions", (side, server, state))

    def record_session_end(self, side: str, utilization: float, server: str, call: CallInfo) -> None:
        utilization_attrs = dict(self._key("mcp_token.session.utilization", (side, server)))
        self._utilization.record(utilization, utilization_attrs, _NO_SPAN)
        if call.duration is not None:
            instrument = MCP_SERVER_SESSION_DURATION if side == "server" else MCP_CLIENT_SESSION_DURATION
            attrs = dict(self._key(instrument, (server, call.transport, call.protocol)))
            if side not in _CONVENTION_SIDES:
                attrs[M_SIDE] = side
            self._session["server" if side == "server" else "client"].record(call.duration, attrs, _NO_SPAN)

    def record_call(self, side: str, method: str, tool: str | None, server: str, call: CallInfo) -> None:
        """One response: its error (pre-aggregated) and, when the call was timed, the conventions' duration."""
        if call.error_type is not None:
            self._add("mcp_token.call.errors", (side, server, method, tool, call.error_type))
        if call.duration is None:
            return
        key = (side, method, tool, server, call.error_type, call.transport, call.protocol)
        attrs = self._call_attrs.get(key)
        if attrs is None:
            if len(self._call_attrs) > _CACHE_BOUND:
                self._call_attrs.clear()
            # The conventions' attributes (never a session or request id) and the server name.
            values = (server, method, tool, call.error_type, call.transport, call.protocol)
            attrs = self._call_attrs[key] = dict(pairs(BY_OTEL_NAME[MCP_SERVER_OPERATION_DURATION], values))
            if side not in _CONVENTION_SIDES:
                attrs[M_SIDE] = side
        self._operation["server" if side == "server" else "client"].record(call.duration, attrs, _NO_SPAN)

    def record_tool_definitions(self, server: str, total: int, per_tool: Mapping[str, int]) -> None:
        self._definitions[server] = total
        tools = {k: v for k, v in self._tool_definitions.items() if k[0] != server}
        tools.update(((server, tool), tokens) for tool, tokens in per_tool.items())
        self._tool_definitions = tools  # swapped whole: a collection reads one consistent set

    def record_tool_profiles(self, server: str, parts: Mapping[str, int], static_max: Mapping[str, int]) -> None:
        self._parts = {**{k: v for k, v in self._parts.items() if k[0] != server},
                       **{(server, part): tokens for part, tokens in parts.items()}}
        self._static_max = {**{k: v for k, v in self._static_max.items() if k[0] != server},
                            **{(server, tool): tokens for tool, tokens in static_max.items()}}

    def record_prompt_cache_invalidation(self, side: str, server: str, resent_tokens: int) -> None:
        self._add("mcp_token.prompt_cache.invalidations", (side, server))
        self._add("mcp_token.prompt_cache.resent.tokens", (side, server), resent_tokens)

    def record_wasted(self, side: str, server: str, tool: str | None, kind: str, tokens: int) -> None:
        self._add("mcp_token.wasted.tokens", (side, server, tool, kind), tokens)

    def record_error(self, stage: str, server: str) -> None:
        self._add("mcp_token.instrumentation.errors", (stage, server))

    def record_session_evicted(self, side: str, server: str) -> None:
        self._add("mcp_token.sessions.evicted", (side, server))

    def record_unbudgeted(self, side: str, server: str, tokens: int) -> None:
        self._add("mcp_token.unbudgeted.tokens", (side, server), tokens)

    def record_guard_action(
        self, side: str, server: str, policy: str, action: str, enforced: bool, tool: str | None
    ) -> None:
        self._add("mcp_token.guard.actions", (side, server, policy, action, enforced, tool))

    def record_cost(self, side: str, server: str, tool: str | None, usd: float) -> None:
        self._add("mcp_token.cost", (side, server, tool), usd)


def _observer(family: CountFamily) -> Reader:
    def observe(_options: Any) -> Iterator[metrics.Observation]:
        for attrs, value in family.values():
            yield metrics.Observation(value, dict(attrs))

    return observe


def _no_labels(key: Any) -> tuple[str, ...]:
    return ()

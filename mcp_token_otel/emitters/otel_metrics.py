"""The OpenTelemetry instruments of the catalog, reading the recorder's aggregate.

Every counter and gauge is an observable instrument whose callback reads the aggregate at collection (nothing on
the call path); every histogram is a synchronous instrument fed through :class:`OtelPoints` (the aggregate's
``points``), so its exemplars can link a bucket to the trace of the call that landed in it. The MCP conventions'
duration histograms (``mcp.{client,server}.operation.duration``, ``mcp.{client,server}.session.duration``) are
histograms of this kind with the conventions' attributes.

Instruments are made on the global MeterProvider as the OpenTelemetry API hands it out: before an application
sets one, the API's proxy instruments record nothing and turn real once it is set, with no probe of ours.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from ..catalog import Family
from ..semconv import SCHEMA_URL, SCOPE_NAME
from .aggregate import Aggregate

#: Recorded with no span in its context, a point is offered to no exemplar reservoir (the SDK's default
#: trace-based filter samples points recorded inside a sampled span): exemplars only where they help, on the
#: breaches, whose bucket then links to the trace that caused it. Not empty: the SDK reads an empty context as
#: "none given" and takes the current one.
NO_SPAN = trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())
_CACHE_BOUND = 4096
#: Label values that are typed attributes in OpenTelemetry (a Prometheus label is always a string).
_TYPED: dict[str, dict[str, Any]] = {"enforced": {"true": True, "false": False}}
Pairs = tuple[tuple[str, Any], ...]


def pairs(family: Family, values: Iterable[Any]) -> Pairs:
    """A family's attributes for label ``values``; a value that is None or "" (an unknown server, no tool, a
    side the instrument's name already says) leaves its attribute out, as an empty Prometheus label is."""
    out = []
    for label, name, value in zip(family.labels, family.attributes(), values, strict=True):
        if value is None or value == "":
            continue
        typed = _TYPED.get(label)
        out.append((name, typed.get(value, value) if typed is not None else value))
    return tuple(out)


class OtelPoints:
    """The synchronous points of the histogram families, with their attribute dicts built once per label set."""

    def __init__(self, histograms: dict[str, metrics.Histogram]) -> None:
        self._histograms = histograms
        self._attributes: dict[tuple[Any, ...], dict[str, Any]] = {}

    def attributes(self, family: Family, labels: tuple[Any, ...]) -> dict[str, Any]:
        key = (family.key, *labels)
        found = self._attributes.get(key)
        if found is None:
            if len(self._attributes) >= _CACHE_BOUND:  # a cache: clearing it loses no value
                self._attributes.clear()
            found = self._attributes[key] = dict(pairs(family, labels))
        return found

    def record(self, family: Family, labels: tuple[Any, ...], value: float, context: Any = None) -> None:
        self._histograms[family.otel_name].record(value, self.attributes(family, labels), context)

    def record_attributes(self, family: Family, value: float, attributes: dict[str, Any], context: Any) -> None:
        self._histograms[family.otel_name].record(value, attributes, context)


class _MeterInstruments:
    """The instruments of one Meter, created once. The SDK hands back the first instrument for a name it has
    seen and drops a second one's callbacks, so a recorder made after another on the same MeterProvider (an
    uninstrument and instrument again) would report nothing: every aggregate on a meter shares these, and each
    observable callback reads the aggregates alive now (a counter's series summed across them, a gauge's from
    the newest). A closed aggregate's totals stay readable, frozen, until a new one on the meter replaces it."""

    def __init__(self, meter: metrics.Meter, families: Iterable[Family]) -> None:
        self._aggregates: list[weakref.ref[Aggregate]] = []
        #: Closed aggregates, held so that their totals outlive their recorder (until the next one replaces them).
        self._closed: list[Aggregate] = []
        self.histograms: dict[str, metrics.Histogram] = {}
        self._lock = threading.Lock()
        for family in families:
            name = family.otel_name
            if not name:
                continue
            if family.kind == "histogram":
                self.histograms[name] = meter.create_histogram(
                    name, unit=family.otel_unit, description=family.help,
                    explicit_bucket_boundaries_advisory=family.buckets,
                )
                continue
            create = meter.create_observable_counter if family.kind == "counter" else meter.create_observable_gauge
            create(name, callbacks=[self._reader(family)], unit=family.otel_unit, description=family.help)

    def add(self, aggregate: Aggregate) -> None:
        with self._lock:
            live = [ref for ref in self._aggregates
                    if (old := ref()) is not None and all(old is not c for c in self._closed)]
            self._aggregates = [*live, weakref.ref(aggregate)]
            self._closed = []

    def close(self, aggregate: Aggregate) -> None:
        with self._lock:
            self._closed.append(aggregate)

    def _reader(self, family: Family) -> Any:
        summed = family.kind == "counter"

        def observe(_options: Any) -> Iterator[metrics.Observation]:
            aggregates = [a for a in (ref() for ref in self._aggregates) if a is not None and a.present(family)]
            if len(aggregates) == 1:  # the usual case: one recorder per meter, its values as they are
                for labels, value in aggregates[0].values(family.key):
                    yield metrics.Observation(value, dict(pairs(family, labels)))
                return
            merged: dict[Pairs, float] = {}
            for aggregate in aggregates:
                for labels, value in aggregate.values(family.key):
                    key = pairs(family, labels)
                    merged[key] = merged.get(key, 0.0) + value if summed else value
            for key, value in merged.items():
                yield metrics.Observation(value, dict(key))

        return observe


_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _MeterInstruments] = weakref.WeakKeyDictionary()
_INSTRUMENTS_LOCK = threading.Lock()


class OtelMetrics:
    """An aggregate's OpenTelemetry side: its instruments on a meter and the points it records."""

    def __init__(self, aggregate: Aggregate, meter_provider: metrics.MeterProvider | None = None,
                 version: str = "") -> None:
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter(SCOPE_NAME, version, schema_url=SCHEMA_URL)
        with _INSTRUMENTS_LOCK:
            shared = _INSTRUMENTS.get(meter)
            if shared is None:
                shared = _INSTRUMENTS[meter] = _MeterInstruments(meter, aggregate.families.values())
        self._shared = shared
        self._aggregate = aggregate
        shared.add(aggregate)
        self.points = OtelPoints(shared.histograms)

    def close(self) -> None:
        """The recorder is done: its totals stay as they are until a new recorder on the same meter starts."""
        self._shared.close(self._aggregate)

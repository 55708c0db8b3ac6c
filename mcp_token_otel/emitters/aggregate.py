"""The one aggregate of every metric family the recorder records, read by every emitter at collection.

Recording is catalog-driven: ``add(name, labels, value)`` for a counter, ``observe(name, labels, value)`` for a
histogram, ``set``/``replace`` for a gauge, where ``name`` is a family of :mod:`mcp_token_otel.catalog`. Adding a
metric is its catalog entry plus the one call that records it: the Prometheus collector, the OpenTelemetry
instruments and the multiprocess files are all built from the catalog and read (or write) what is recorded here.

A message's series are found once per label set (:meth:`Aggregate.message`) and updated under one hold of the
lock (:meth:`Aggregate.add_message`). The Prometheus collector renders the series on scrape; OpenTelemetry
observes the counters and gauges at collection. Histograms that carry exemplars (the token histogram, the MCP
conventions' durations, the session utilization) are also OpenTelemetry synchronous points, recorded through
``points`` when a meter is attached.

A family holds at most ``MAX_SERIES`` series. Past that, a record for a new label set goes to the family's one
overflow series (every label ``_other``) and the family's ``folded`` count says how many records did; the
existing series keep counting, so nothing recorded is lost, only the detail of the label sets that came last.

Storage is chosen once: this in-process store, or prometheus-client's multiprocess files
(:mod:`.prometheus_multiprocess`, a subclass), the way prometheus-client picks its value class at import.
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .. import catalog
from ..catalog import OVERFLOW_VALUE, Family
from ..core.risk import BREACH_TIERS

#: Bound on distinct series per family; labels are bounded upstream, this bounds memory whatever happens.
MAX_SERIES = 20_000
MAX_LABEL_CHARS = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Cached message series (one per side, server, method, tool and direction), at most; a cache: the series
#: themselves stay in their families when it is cleared.
_MESSAGE_CACHE = 10_000
_TOKENS = "mcp_token_message_tokens"
_DURATION = "mcp_token_operation_duration_seconds"
#: The breach tiers in a fixed order: a response's series for them start at 0 (alerts take increase()).
_BREACH_ORDER = tuple(sorted(BREACH_TIERS))

#: (label values, value) rows of a family read at collection.
Rows = list[tuple[tuple[str, ...], float]]
Reader = Callable[[], Rows]


def label_value(value: Any) -> str:
    """A safe label value: "" for none, valid UTF-8, no control characters, at most 128 characters."""
    if value is None or value == "":
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    text = str(value).encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("_", text)[:MAX_LABEL_CHARS]


def label_values(key: Iterable[Any]) -> tuple[str, ...]:
    """A series key's label values, each made safe (a key's values may be None or a free-form name)."""
    return tuple(label_value(v) for v in key)


class Points(Protocol):
    """Where the synchronous OpenTelemetry points of histogram families go (:mod:`.otel_metrics`)."""

    def record(self, family: Family, labels: tuple[Any, ...], value: float, context: Any = None) -> None: ...

    def attributes(self, family: Family, labels: tuple[Any, ...]) -> dict[str, Any]: ...

    def record_attributes(self, family: Family, value: float, attributes: dict[str, Any], context: Any) -> None: ...


class Count:
    """One counter (or stored gauge) series."""

    __slots__ = ("created", "labels", "text", "value")

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.value = 0.0
        self.created = time.time()
        self.text: Any = None  # the renderer's escaped label text, cached with the series


class Hist:
    """One histogram series: per-bucket counts (not cumulative; the last is +Inf), sum, count."""

    __slots__ = ("buckets", "count", "created", "exemplars", "labels", "sum", "text")

    def __init__(self, labels: tuple[str, ...], size: int) -> None:
        self.labels = labels
        self.buckets = [0] * size
        self.sum = 0.0
        self.count = 0
        self.created = time.time()
        self.exemplars: dict[int, tuple[dict[str, str], float, float]] | None = None
        #: The renderer's cache (escaped label text, line prefixes): it lives and is cleared with the series.
        self.text: Any = None

    def add(self, index: int, value: float, exemplar: dict[str, str] | None = None) -> None:
        """One observation in bucket ``index``; the caller holds the aggregate's lock."""
        self.buckets[index] += 1
        self.sum += value
        self.count += 1
        if exemplar is not None:
            if self.exemplars is None:
                self.exemplars = {}
            self.exemplars[index] = (exemplar, value, time.time())


class Stored:
    """One family's stored series: a key (label values as recorded) -> its series. Keys that make the same safe
    labels share one series (never two lines with the same labels). Capped at ``MAX_SERIES``."""

    __slots__ = ("by_labels", "family", "folded", "series", "size")

    def __init__(self, family: Family) -> None:
        self.family = family
        self.size = len(family.buckets) + 1 if family.kind == "histogram" else 0
        self.series: dict[Any, Any] = {}
        self.by_labels: dict[tuple[str, ...], Any] = {}
        #: Records that went to the overflow series because the family was full.
        self.folded = 0

    def get(self, key: tuple[Any, ...]) -> tuple[Any, bool]:
        """The series for ``key`` (made now if new) and whether the record goes to the overflow series because
        the family is full; under the lock. A key found in ``series`` never folds (folded keys are not kept)."""
        found = self.series.get(key)
        if found is not None:
            return found, False
        labels = label_values(key)
        found = self.by_labels.get(labels)
        full = False
        if found is None:
            if len(self.by_labels) >= MAX_SERIES:
                full = True
                labels = (OVERFLOW_VALUE,) * len(labels)
                found = self.by_labels.get(labels)
            if found is None:
                found = self.by_labels[labels] = Hist(labels, self.size) if self.size else Count(labels)
        if not full and len(self.series) < 4 * MAX_SERIES:  # keys beyond: looked up by their labels each time
            self.series[key] = found
        return found, full


class MessageSeries:
    """The series one message key (side, server, method, tool, direction) updates, found once and updated
    together: the token histogram (whose sums are the token counter), the byte counter and, for a response, the
    overhead counter, the response counter of each risk tier and the operation duration."""

    __slots__ = ("bytes", "duration", "duration_folding", "folding", "out", "overhead", "points", "tiers",
                 "token_count", "tokens")

    def __init__(self, out: tuple[Any, ...]) -> None:
        #: (side, server, method, tool): a response's tier series are keyed by these and the tier.
        self.out = out
        self.tokens: Any = None
        #: The token counter's own series, where it is not the token histogram's sums (multiprocess files).
        self.token_count: Any = None
        self.bytes: Any = None
        self.overhead: Any = None
        self.duration: Any = None
        #: The duration family, when its series is the overflow series (each observation adds 1 to its ``folded``).
        self.duration_folding: Stored | None = None
        #: A response's series per risk tier, made at the tier's first response.
        self.tiers: dict[str, tuple[Any, bool]] | None = None
        #: The stored families whose overflow series these are (each record adds 1 to their ``folded``).
        self.folding: tuple[Stored, ...] = ()
        #: The OpenTelemetry attributes of the token point, or None: no point (a request without
        #: ``metrics.input_histograms``, or no meter).
        self.points: dict[str, Any] | None = None


class Aggregate:
    """Every stored series of the catalog's families, one lock for them all.

    ``families``: the catalog (a test may pass a longer one). ``input_histograms``: also keep the OpenTelemetry
    token points of requests (their stored series always exist: the token counter is their sums).
    """

    def __init__(self, families: Iterable[Family] | None = None, *, input_histograms: bool = False) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, Family] = {f.key: f for f in (catalog.FAMILIES if families is None else families)}
        self.input_histograms = input_histograms
        #: Where OpenTelemetry histogram points go; None until a meter is attached (otel_metrics.attach).
        self.points: Points | None = None
        #: Families read at collection from their owner's state (live sessions, proxy counts, ...).
        self.readers: dict[str, Reader] = {}
        #: The recorder's Prometheus families, stored here (a family of another emitter, the proxy's, exists
        #: once its reader is registered).
        self.stored: dict[str, Stored] = {
            key: Stored(f) for key, f in self.families.items() if f.name and not f.sum_of and f.emitter == "recorder"
        }
        self._messages: dict[tuple[Any, ...], MessageSeries] = {}
        self.read_with("mcp_token_series_overflow", self._overflow_rows)

    # ------------------------------------------------------------------ recording (catalog-driven)

    def add(self, name: str, labels: tuple[Any, ...], value: float = 1.0) -> None:
        """Add ``value`` to counter family ``name``'s series ``labels`` (label values in catalog order)."""
        stored = self.stored[name]
        with self.lock:
            series = stored.series.get(labels)
            if series is None:
                series, folded = stored.get(labels)
                if folded:
                    stored.folded += 1
            series.value += value

    def observe(self, name: str, labels: tuple[Any, ...], value: float, context: Any = None) -> None:
        """One observation of histogram family ``name``: stored (a Prometheus family) and, when a meter is
        attached, an OpenTelemetry point (``context``: for its exemplar; None: the current one)."""
        family = self.families[name]
        stored = self.stored.get(name)
        if stored is not None:
            index = bisect_left(family.buckets, value)
            with self.lock:
                series, folded = stored.get(labels)
                series.add(index, value)
                if folded:
                    stored.folded += 1
        points = self.points
        if points is not None and family.otel_name:
            points.record(family, labels, value, context)

    def set(self, name: str, labels: tuple[Any, ...], value: float) -> None:
        """Set gauge family ``name``'s series ``labels``."""
        stored = self.stored[name]
        with self.lock:
            series, folded = stored.get(labels)
            series.value = value
            if folded:
                stored.folded += 1

    def replace(self, name: str, prefix: tuple[Any, ...], rows: Iterable[tuple[tuple[Any, ...], float]]) -> None:
        """Gauge family ``name``: the series whose labels start with ``prefix`` become exactly ``rows`` (a
        server's tool definitions, from its last tools/list: tools it no longer lists go)."""
        stored = self.stored[name]
        start = label_values(prefix)
        with self.lock:
            for labels in [labels for labels in stored.by_labels if labels[:len(start)] == start]:
                del stored.by_labels[labels]
            stored.series = {k: s for k, s in stored.series.items() if s.labels[:len(start)] != start}
            for labels, value in rows:
                series, folded = stored.get(labels)
                series.value = value
                if folded:
                    stored.folded += 1

    def touch(self, name: str, labels: tuple[Any, ...]) -> None:
        """Start the series at 0 (alerts take increase() of it: it must exist before its first event). A full
        family starts none: nothing was recorded, so nothing is folded."""
        stored = self.stored[name]
        with self.lock:
            if labels not in stored.series and len(stored.by_labels) < MAX_SERIES:
                stored.get(labels)

    def read_with(self, name: str, reader: Reader) -> None:
        """Family ``name`` is read at collection from ``reader`` (its owner's state) instead of stored."""
        self.readers[name] = reader
        self.stored.pop(name, None)

    def write_readers(self, names: Iterable[str] | None = None) -> None:
        """Write the families read from their owner's state where a collector cannot call back (the multiprocess
        files); nothing to do here: in-process collection calls the readers."""

    # ------------------------------------------------------------------ the message path

    def message(self, side: str, server: str, method: str, tool: str | None, direction: str) -> MessageSeries:
        """The series a message with these (bounded) labels updates, found once and cached."""
        key = (side, server, method, tool, direction)
        found = self._messages.get(key)
        if found is None:
            found = self._new_message(key)
        return found

    def _new_message(self, key: tuple[Any, ...]) -> MessageSeries:
        side, server, method, tool, direction = key
        out = (side, server, method, tool)
        output = direction == "output"
        ms = MessageSeries(out)
        folding: list[Stored] = []

        def slot(name: str, labels: tuple[Any, ...]) -> Any:
            stored = self.stored[name]
            series, folded = stored.get(labels)
            if folded:
                folding.append(stored)
            return series

        with self.lock:
            ms.tokens = slot(_TOKENS, key)
            ms.bytes = slot("mcp_token_bytes", key)
            if output:
                ms.overhead = slot("mcp_token_overhead_tokens", out)
                durations = self.stored[_DURATION]
                ms.duration, folded = durations.get(out)
                if folded:
                    ms.duration_folding = durations
                ms.tiers = {}
        ms.folding = tuple(folding)
        if output:
            for tier in _BREACH_ORDER:
                self.touch("mcp_token_responses", (*out, tier))
            self.touch_server(side, server)
        points = self.points
        if points is not None and (output or self.input_histograms):
            ms.points = points.attributes(self.families[_TOKENS], key)
        if len(self._messages) >= _MESSAGE_CACHE:
            self._messages.clear()
        self._messages[key] = ms
        return ms

    def touch_server(self, side: str, server: str) -> None:
        """A side's series for a server that alerts and dashboards take increase() and rate() of, at 0."""
        for state in ("warning", "exhausted"):
            self.touch("mcp_token_session_transitions", (side, server, state))
        for name in ("mcp_token_unbudgeted_tokens", "mcp_token_prompt_cache_invalidations",
                     "mcp_token_prompt_cache_resent_tokens"):
            self.touch(name, (side, server))

    def add_message(self, ms: MessageSeries, tokens: int, size: int, overhead: int, tier: str | None,
                    exemplar: dict[str, str] | None = None, context: Any = None) -> None:
        """One message into its series: its tokens, bytes and, for a response (``tier`` given), overhead and
        response count. ``exemplar``: the trace a breach links its bucket to; ``context``: the OpenTelemetry
        point's (None: the current one)."""
        index = bisect_left(self.families[_TOKENS].buckets, tokens)
        response = None
        if tier is not None and ms.tiers is not None:
            response = ms.tiers.get(tier)
            if response is None:
                with self.lock:
                    response = ms.tiers[tier] = self.stored["mcp_token_responses"].get((*ms.out, tier))
        with self.lock:
            hist = ms.tokens
            hist.buckets[index] += 1
            hist.sum += tokens
            hist.count += 1
            if exemplar is not None:
                if hist.exemplars is None:
                    hist.exemplars = {}
                hist.exemplars[index] = (exemplar, float(tokens), time.time())
            ms.bytes.value += size
            if ms.overhead is not None:
                ms.overhead.value += overhead
            if response is not None:
                response[0].value += 1
                if response[1]:
                    self.stored["mcp_token_responses"].folded += 1
            for stored in ms.folding:
                stored.folded += 1
        attrs = ms.points
        if attrs is not None:
            self.points.record_attributes(self.families[_TOKENS], tokens, attrs, context)  # type: ignore[union-attr]

    def add_duration(self, ms: MessageSeries, seconds: float) -> None:
        """A response's operation duration (the Prometheus family; the conventions' instruments are recorded
        by the caller with their own attributes)."""
        index = bisect_left(self.families[_DURATION].buckets, seconds)
        with self.lock:
            ms.duration.add(index, seconds)
            if ms.duration_folding is not None:
                ms.duration_folding.folded += 1

    # ------------------------------------------------------------------ collection

    def counts(self, name: str) -> list[tuple[Count, float]]:
        """A stored counter or gauge family's series with their values, copied under the lock."""
        with self.lock:
            return [(s, s.value) for s in self.stored[name].by_labels.values()]

    def hists(self, name: str) -> list[tuple[Hist, list[int], float, int]]:
        """A histogram family's series with copies of their buckets, sum and count, taken together under the
        lock (a series is never seen half-updated); only the copying happens under it."""
        with self.lock:
            return [(s, s.buckets[:], s.sum, s.count) for s in self.stored[name].by_labels.values()]

    def values(self, name: str) -> Rows:
        """(label values, value) of any family that has plain values: a stored counter or gauge, a counter that
        is a histogram's sums (``sum_of``), or a family read at collection."""
        reader = self.readers.get(name)
        if reader is not None:
            return reader()
        family = self.families[name]
        if family.sum_of:
            return [(s.labels, total) for s, _b, total, _c in self.hists(family.sum_of)]
        return [(s.labels, value) for s, value in self.counts(name)]

    def present(self, family: Family) -> bool:
        """Whether ``family`` has values here: stored, read at collection, or a stored histogram's sums."""
        key = family.key
        return key in self.stored or key in self.readers or (bool(family.sum_of) and family.sum_of in self.stored)

    def _overflow_rows(self) -> Rows:
        """Records folded into each capped family's overflow series (counters and histograms)."""
        with self.lock:
            return [((key,), float(stored.folded)) for key, stored in self.stored.items()
                    if stored.family.kind != "gauge"]

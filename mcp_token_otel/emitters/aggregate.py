"""Pre-aggregated metric state: the per-message cost is a dict lookup and a few integer increments.

Both metric paths read from here at collection time instead of paying a metrics library per point on
the MCP call: the Prometheus collector renders these series on scrape, and the OpenTelemetry sink
reports its counters through observable instruments. One lock guards every update (uncontended it
costs ~0.1 µs); collection copies under it and formats outside it, so a scrape never holds it long.

A family holds at most ``MAX_SERIES`` series. Past that, a record for a new label set goes to the family's one
overflow series (``overflow_key``) and ``folded`` counts it; the existing series keep counting, so nothing
recorded is lost, only the detail of the label sets that came last.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

#: Bound on distinct series per family; labels are bounded upstream, this bounds memory whatever happens.
MAX_SERIES = 20_000


class _Capped:
    """What both family kinds share: the series map, its cap and the overflow series."""

    def __init__(self, lock: threading.Lock, relabel: Callable[[Any], tuple[str, ...]], overflow_key: Any) -> None:
        self._lock = lock
        self._relabel = relabel
        self.overflow_key = overflow_key
        #: Records that went to the overflow series because the family was full.
        self.folded = 0

    def _room(self, series: dict[Any, Any], key: Any) -> Any:
        """The key a record for the new label set ``key`` goes under: itself, or the overflow key (counted)."""
        if len(series) < MAX_SERIES:
            return key
        self.folded += 1
        return self.overflow_key

    def _slot(self, series: dict[Any, Any], key: Any, make: Callable[[tuple[str, ...]], Any]) -> tuple[Any, bool]:
        with self._lock:
            found = series.get(key)
            if found is not None:
                return found, False
            full = len(series) >= MAX_SERIES
            if full:
                key = self.overflow_key
                found = series.get(key)
            if found is None:
                found = series[key] = make(self._relabel(key))
            return found, full


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

    def add(self, index: int, value: float, exemplar: dict[str, str] | None) -> None:
        """One observation in bucket ``index``; the caller holds the family's lock."""
        self.buckets[index] += 1
        self.sum += value
        self.count += 1
        if exemplar is not None:
            if self.exemplars is None:
                self.exemplars = {}
            self.exemplars[index] = (exemplar, value, time.time())


class Count:
    """One counter series."""

    __slots__ = ("created", "labels", "text", "value")

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self.value = 0.0
        self.created = time.time()
        self.text: str | None = None  # the renderer's escaped label text, cached with the series


class HistFamily(_Capped):
    """Histogram series keyed by a label tuple; ``observe`` is the hot path."""

    def __init__(
        self,
        bounds: tuple[float, ...],
        lock: threading.Lock,
        relabel: Callable[[Any], tuple[str, ...]],
        overflow_key: Any,
    ) -> None:
        super().__init__(lock, relabel, overflow_key)
        self.bounds = bounds
        self.series: dict[Any, Hist] = {}

    def observe(self, key: Any, value: float, exemplar: dict[str, str] | None = None) -> None:
        index = bisect_left(self.bounds, value)  # first bound >= value: Prometheus "le" buckets
        with self._lock:
            series = self.series.get(key)
            if series is None:
                series = self._create(key)
            series.add(index, value, exemplar)

    def slot(self, key: Any) -> tuple[Hist, bool]:
        """The series the records for ``key`` go to (made now if new), to update directly under the family's lock,
        and whether it is the overflow series (the family was full: each such record adds 1 to ``folded``)."""
        size = len(self.bounds) + 1
        return self._slot(self.series, key, lambda labels: Hist(labels, size))

    def _create(self, key: Any) -> Hist:
        key = self._room(self.series, key)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Hist(self._relabel(key), len(self.bounds) + 1)
        return series

    def snapshot(self) -> list[tuple[tuple[str, ...], list[int], float, int, float, dict[int, Any] | None]]:
        with self._lock:
            return [
                (s.labels, list(s.buckets), s.sum, s.count, s.created, dict(s.exemplars) if s.exemplars else None)
                for s in self.series.values()
            ]

    def copy(self) -> list[tuple[Hist, list[int], float, int]]:
        """Each series with a copy of its buckets, sum and count, taken together under the lock (a series is
        never seen half-updated); only the copying happens under it, the rendering after."""
        with self._lock:
            return [(s, s.buckets[:], s.sum, s.count) for s in self.series.values()]


class CountFamily(_Capped):
    """Counter series keyed by a label tuple."""

    def __init__(self, lock: threading.Lock, relabel: Callable[[Any], tuple[str, ...]], overflow_key: Any) -> None:
        super().__init__(lock, relabel, overflow_key)
        self.series: dict[Any, Count] = {}

    def add(self, key: Any, value: float = 1.0) -> None:
        with self._lock:
            series = self.series.get(key)
            if series is None:
                key = self._room(self.series, key)
                series = self.series.get(key)
                if series is None:
                    series = self.series[key] = Count(self._relabel(key))
            series.value += value

    def slot(self, key: Any) -> tuple[Count, bool]:
        """:meth:`HistFamily.slot` for a counter series."""
        return self._slot(self.series, key, Count)

    def touch(self, key: Any) -> None:
        """Create the series at 0 (alerts take increase() of it: it must exist before its first event). A full
        family creates none: nothing was recorded, so nothing is folded."""
        with self._lock:
            if key not in self.series and len(self.series) < MAX_SERIES:
                self.series[key] = Count(self._relabel(key))

    def snapshot(self) -> list[tuple[tuple[str, ...], float, float]]:
        with self._lock:
            return [(s.labels, s.value, s.created) for s in self.series.values()]

    def copy(self) -> list[tuple[Count, float]]:
        """Each series with its value, copied under the lock."""
        with self._lock:
            return [(s, s.value) for s in self.series.values()]

    def values(self) -> Iterator[tuple[Any, float]]:
        with self._lock:
            items = [(key, s.value) for key, s in self.series.items()]
        yield from items


class MessageSlots:
    """The counter series one message key (side, method, tool, direction, server) updates, found once: a sink
    keeps these per key and adds a message to all of them under one hold of the lock (a family's ``folded``
    counts each record that went to its overflow series, as :meth:`CountFamily.add` does). ``tokens``: the
    token counter, where the sink keeps one (the Prometheus sink reads it from its histogram's sums)."""

    __slots__ = ("attrs", "bytes", "folding", "overhead", "tiers", "tokens", "values")

    def __init__(
        self,
        values: tuple[Any, ...],
        attrs: Any,
        tokens: tuple[CountFamily, Any] | None,
        sizes: tuple[CountFamily, Any],
        overhead: tuple[CountFamily, Any] | None,
    ) -> None:
        #: (side, server, method, tool): a response's tier series are keyed by these and the tier.
        self.values = values
        #: What the sink records the message's histogram point with (its attributes or its key).
        self.attrs = attrs
        folding: list[CountFamily] = []

        def slot(family: CountFamily, key: Any) -> Count:
            series, folded = family.slot(key)
            if folded:
                folding.append(family)
            return series

        self.tokens = slot(*tokens) if tokens is not None else None
        self.bytes = slot(*sizes)
        self.overhead = slot(*overhead) if overhead is not None else None
        self.folding = tuple(folding)
        #: A response's series per risk tier (its (series, folded) slot), made at the tier's first response.
        self.tiers: dict[str, tuple[Count, bool]] | None = {} if overhead is not None else None

    def add(self, m: Any, response: tuple[Count, bool] | None, responses: CountFamily) -> None:
        """Add measurement ``m`` (and a response's count to its tier ``response``); the caller holds the lock."""
        if self.tokens is not None:
            self.tokens.value += m.total_tokens
        self.bytes.value += m.bytes
        if self.overhead is not None:
            self.overhead.value += m.overhead_tokens
        if response is not None:
            response[0].value += 1
            if response[1]:
                responses.folded += 1
        for family in self.folding:
            family.folded += 1

"""The aggregate on prometheus-client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR`` set): multi-worker
servers, and every stdio proxy of a host reporting into one directory.

The same catalog families and labels as the in-process aggregate; the values live in the client's shared files,
merged at scrape time by its multiprocess collector (in whichever process serves /metrics). Series are not
capped here (label values arrive bounded, and the files hold what the processes wrote), so the series-overflow
counts are absent; exemplars are off (the client does not support them in this mode). Families read from their
owner's state (live sessions, the proxy's counts) are written into the files once a second by a thread of each
process that records (never on a message: reading live sessions may ask a shared budget store), and at
:meth:`SharedFilesAggregate.write_readers`, which the owner calls before the process ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

from ..catalog import Family
from .aggregate import Aggregate, MessageSeries, Reader, Rows, label_values

#: Seconds between a process's writes of the families read from its state (by its writer thread).
_READERS_INTERVAL = 1.0

log = logging.getLogger(__name__)
_TOKENS = "mcp_token_message_tokens"


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def multiprocess_registry() -> CollectorRegistry:
    """A registry that serves the merged values of every process writing into the directory."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def _metric(family: Family, registry: CollectorRegistry) -> Any:
    labels = list(family.labels)
    if family.kind == "histogram":
        return Histogram(family.name, family.help, labels, buckets=family.buckets, registry=registry)
    if family.kind == "counter":
        return Counter(family.name, family.help, labels, registry=registry)
    mode: Any = family.multiprocess_mode
    return Gauge(family.name, family.help, labels, registry=registry, multiprocess_mode=mode)


class SharedFilesAggregate(Aggregate):
    """An :class:`Aggregate` whose values are prometheus-client children writing the multiprocess files."""

    def __init__(self, families: Iterable[Family] | None = None, *, input_histograms: bool = False) -> None:
        super().__init__(families, input_histograms=input_histograms)
        # No series are capped here (see the module's docstring): no stored series, no overflow counts.
        self.stored = {}
        self.readers.pop("mcp_token_series_overflow", None)
        # Registered nowhere: these processes only write; the serving process's collector reads the files.
        registry = CollectorRegistry()
        self.metrics: dict[str, Any] = {f.name: _metric(f, registry) for f in self.families.values()
                                        if f.name and f.emitter in ("recorder", "proxy") and not f.capped_only}
        self._children: dict[tuple[str, tuple[Any, ...]], Any] = {}
        #: The process whose writer thread runs (a forked worker starts its own at its first message).
        self._writer_pid = 0

    def child(self, name: str, labels: tuple[Any, ...]) -> Any:
        """The labelled child of family ``name``, cached (``labels()`` takes a lock and validates each time)."""
        key = (name, labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= 100_000:  # a cache of children: clearing it loses no value
                self._children.clear()
            found = self._children[key] = self.metrics[name].labels(*label_values(labels))
        return found

    def add(self, name: str, labels: tuple[Any, ...], value: float = 1.0) -> None:
        self.child(name, labels).inc(value)

    def observe(self, name: str, labels: tuple[Any, ...], value: float, context: Any = None) -> None:
        family = self.families[name]
        if family.name:
            self.child(name, labels).observe(value)
        points = self.points
        if points is not None and family.otel_name:
            points.record(family, labels, value, context)

    def set(self, name: str, labels: tuple[Any, ...], value: float) -> None:
        self.child(name, labels).set(value)

    def replace(self, name: str, prefix: tuple[Any, ...], rows: Iterable[tuple[tuple[Any, ...], float]]) -> None:
        # A file keeps what this process wrote; a tool no longer listed keeps its last value (max-merged).
        for labels, value in rows:
            self.child(name, labels).set(value)

    def touch(self, name: str, labels: tuple[Any, ...]) -> None:
        self.child(name, labels)

    def message(self, side: str, server: str, method: str, tool: str | None, direction: str) -> MessageSeries:
        key = (side, server, method, tool, direction)
        found = self._messages.get(key)
        if found is None:
            out = (side, server, method, tool)
            found = MessageSeries(out)
            # A request's tokens go to the counter alone unless metrics.input_histograms (the histogram shows
            # responses); here the counter is a family of its own (the files cannot sum a histogram's series).
            if direction == "output" or self.input_histograms:
                found.tokens = self.child(_TOKENS, key)
            found.token_count = self.child("mcp_token_tokens", key)
            found.bytes = self.child("mcp_token_bytes", key)
            if direction == "output":
                found.overhead = self.child("mcp_token_overhead_tokens", out)
                found.duration = self.child("mcp_token_operation_duration_seconds", out)
                found.tiers = {}
                self.touch_server(side, server)
            points = self.points
            if points is not None and (direction == "output" or self.input_histograms):
                found.points = points.attributes(self.families[_TOKENS], key)
            self._messages[key] = found
        return found

    def add_message(self, ms: MessageSeries, tokens: int, size: int, overhead: int, tier: str | None,
                    exemplar: dict[str, str] | None = None, context: Any = None) -> None:
        if ms.tokens is not None:
            ms.tokens.observe(tokens)
        ms.token_count.inc(tokens)
        ms.bytes.inc(size)
        if ms.overhead is not None and tier is not None:
            ms.overhead.inc(overhead)
            self.child("mcp_token_responses", (*ms.out, tier)).inc()
        attrs = ms.points
        if attrs is not None:
            self.points.record_attributes(self.families[_TOKENS], tokens, attrs, context)  # type: ignore[union-attr]
        if self._writer_pid != os.getpid():
            self._start_writer()

    def add_duration(self, ms: MessageSeries, seconds: float) -> None:
        ms.duration.observe(seconds)

    def read_with(self, name: str, reader: Reader) -> None:
        self.readers[name] = reader

    def _start_writer(self) -> None:
        self._writer_pid = os.getpid()
        threading.Thread(target=self._write_every_second, name="mcp-token-otel-files", daemon=True).start()

    def _write_every_second(self) -> None:
        pid = self._writer_pid
        while self._writer_pid == pid:
            time.sleep(_READERS_INTERVAL)
            try:
                self.write_readers()
            except Exception:  # a reader that fails now may answer next time; the calls never see it
                log.debug("writing the read families failed", exc_info=True)

    def write_readers(self, names: Iterable[str] | None = None) -> None:
        """Write the families read from their owner's state (all, or ``names``) into this process's files (shared
        files cannot call back into each process: each writes its own values, merged by the family's
        multiprocess mode)."""
        for name in list(self.readers) if names is None else names:
            reader, metric = self.readers.get(name), self.metrics.get(name)
            if reader is None or metric is None:
                continue
            for labels, value in reader():
                child = self.child(name, labels)
                if isinstance(metric, Counter):
                    child._value.set(value)  # a cumulative count this process owns: its file holds the total
                else:
                    child.set(value)

    def values(self, name: str) -> Rows:
        reader = self.readers.get(name)
        if reader is not None:
            return reader()
        rows: Rows = []
        for (child_name, labels), child in list(self._children.items()):
            if child_name == name:
                rows.append((label_values(labels), child._value.get()))
        return rows

    def present(self, family: Family) -> bool:
        return family.key in self.readers or family.name in self.metrics or bool(family.sum_of)

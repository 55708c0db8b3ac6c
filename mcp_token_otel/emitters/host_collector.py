"""The merged view of the host store (:mod:`.host_store`) that ``mcp-token-otel serve`` renders on /metrics.

Each scrape, under the store's lock: the files of writers that are gone are compacted first (their ``live*``
gauges then drop out), then every file is merged with prometheus-client's multiprocess merge. Gauges that keep
a dead writer's value (``max`` mode: tool definitions, rate budgets) come from the archive only for series no
live writer has, so a proxy running now shows its own current value. Counters and histograms never go
backwards between two scrapes of one ``serve``: adding the same float figures in another grouping (the
archive's sum plus the live files', where the scrape before added each file) can differ in the last binary
digit, which Prometheus would take for a counter reset; such a difference is served as the higher value.
"""

from __future__ import annotations

import json
import logging
import threading

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample

from .host_store import ARCHIVE, Compaction, Store, merge_kind, readable

logger = logging.getLogger(__name__)

#: A decrease smaller than this share of the value is rounding, not a reset.
_ROUNDING = 1e-9
_MONOTONIC = frozenset({"counter", "histogram", "summary"})


class StoreLocked(Exception):
    """The store's lock could not be taken in time (another process holds it): no scrape rather than a wrong one."""


class HostCollector:
    """A prometheus-client collector over a host store directory."""

    def __init__(self, path: str, *, lock_timeout: float = 10.0) -> None:
        self.store = Store(path)
        self.lock_timeout = lock_timeout
        self._lock = threading.Lock()  # the flock is per process: threads take turns before it
        self._served: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        #: The last compaction's report (tests and troubleshooting).
        self.last_compaction = Compaction()

    def describe(self) -> list[Metric]:
        return []

    def compact(self) -> Compaction:
        with self._lock:
            result = self.store.compact(timeout=self.lock_timeout)
            if result.merged:
                self.last_compaction = result
            return result

    def collect(self) -> list[Metric]:
        with self._lock:
            with self.store.locked(self.lock_timeout) as ok:
                if not ok:
                    raise StoreLocked(f"the metrics store {self.store.path} stayed locked for {self.lock_timeout:g} s")
                compaction = self.store.compact_locked()
                if compaction.merged:
                    self.last_compaction = compaction
                merged: list[str] = []
                kept: list[str] = []  # archives of gauges whose live values win
                for name, prefix, ident in self.store.db_files():
                    path = self.store._p(name)
                    (kept if ident == ARCHIVE and merge_kind(prefix) == "latest" else merged).append(path)
                metrics = _merge(merged)
                archived = [row for path in kept for row in _rows(path)]
            _fill_in(metrics, archived)
            return [self._monotonic(metric) for metric in sorted(metrics.values(), key=lambda m: m.name)]

    def _monotonic(self, metric: Metric) -> Metric:
        if metric.type not in _MONOTONIC:
            return metric
        served = self._served
        samples = []
        for sample in metric.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            before = served.get(key)
            value = sample.value
            if before is not None and before - max(abs(before), 1.0) * _ROUNDING <= value < before:
                sample = sample._replace(value=before)
                value = before
            served[key] = value
            samples.append(sample)
        metric.samples = samples
        return metric


def _merge(paths: list[str]) -> dict[str, Metric]:
    try:
        metrics = MultiProcessCollector.merge(paths, accumulate=True)
    except Exception:  # a file caught being created (empty) or damaged: merge the others
        good = [path for path in paths if readable(path)]
        logger.debug("mcp_token_otel: unreadable metrics files skipped: %s", sorted(set(paths) - set(good)))
        metrics = MultiProcessCollector.merge(good, accumulate=True)
    return {metric.name: metric for metric in metrics}


def _rows(path: str) -> list[tuple[str, str, dict[str, str], str, float]]:
    """(metric, sample name, labels, help, value) of each value in an archive file."""
    try:
        values = list(MmapedDict.read_all_values_from_file(path))
    except Exception:
        logger.debug("mcp_token_otel: unreadable archive %s", path, exc_info=True)
        return []
    rows = []
    for key, value, _, _ in values:
        metric, name, labels, help_text = json.loads(key)
        rows.append((metric, name, labels, help_text, value))
    return rows


def _fill_in(metrics: dict[str, Metric], archived: list[tuple[str, str, dict[str, str], str, float]]) -> None:
    """The archived gauge values of series that no live writer has."""
    present: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {}
    for metric_name, name, labels, help_text, value in archived:
        metric = metrics.get(metric_name)
        if metric is None:
            metric = metrics[metric_name] = Metric(metric_name, help_text, "gauge")
        seen = present.get(metric_name)
        if seen is None:
            seen = present[metric_name] = {(s.name, tuple(sorted(s.labels.items()))) for s in metric.samples}
        key = (name, tuple(sorted(labels.items())))
        if key not in seen:
            seen.add(key)
            metric.samples.append(Sample(name, dict(labels), value))


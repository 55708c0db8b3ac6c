"""The catalog's Prometheus families, read from the recorder's aggregate at scrape time.

The collector yields prometheus-client Metric objects (for ``generate_latest`` and the OpenMetrics encoder, which
carries a breach's ``trace_id`` exemplar); :meth:`PrometheusCollector.exposition` serves the same bytes from
:mod:`.prometheus_text`, which writes them straight from copies of the aggregate rows. No ``_created`` series
unless ``created_series``. The token histogram leaves out the requests' series unless
``metrics.input_histograms`` (their tokens stay in ``mcp_token_tokens_total``): it shows responses only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from ..catalog import Family
from . import prometheus_text as text
from .aggregate import Aggregate, Hist

_TOKENS = "mcp_token_message_tokens"

#: Set in the thread of an exposition() while it collects: the collector then yields its families already
#: rendered as text instead of Sample objects (other encoders, other threads, get Samples as before).
_TEXT = threading.local()


class _One:
    """One family as a collector, for generate_latest (families from other collectors in the registry)."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


class PrometheusCollector(Collector):
    """The aggregate's Prometheus families, in catalog order."""

    def __init__(self, aggregate: Aggregate, *, created_series: bool = False) -> None:
        self._aggregate = aggregate
        self._created = created_series

    def families(self) -> list[Family]:
        agg = self._aggregate
        return [f for f in agg.families.values() if f.name and agg.present(f)]

    def collect(self) -> Iterator[Metric]:
        as_text = getattr(_TEXT, "on", False)
        copies: dict[str, Any] = {}  # a histogram's rows, shared with the counter of its sums: they agree
        for family in self.families():
            yield self._text(family, copies) if as_text else self._metric(family)

    def _hides_input(self, family: Family) -> bool:
        return family.name == _TOKENS and not self._aggregate.input_histograms

    def _text(self, family: Family, copies: dict[str, Any]) -> Metric:
        agg = self._aggregate
        if family.kind == "histogram":
            rows = copies[family.name] = agg.hists(family.name)
            if self._hides_input(family):
                rows = [row for row in rows if row[0].labels[-1] == "output"]
            body = text.histogram_text(family, rows)
        elif family.sum_of:
            of = agg.families[family.sum_of]
            les = text.bucket_les(of)

            def cache(series: Hist) -> tuple[Any, ...]:  # the histogram's, also for series it leaves out
                return text.series_cache(series, of, les)

            hist_rows = copies.get(of.name)
            body = text.sum_counter_text(family, hist_rows if hist_rows is not None else agg.hists(of.name), cache)
        elif family.key in agg.readers:
            body = text.plain_text(family, agg.values(family.key))
        else:
            body = text.counter_text(family, agg.counts(family.name))
        return text.Rendered(family.name, family.kind, body)

    def _metric(self, family: Family) -> Metric:
        agg = self._aggregate
        metric = Metric(family.name, family.help, family.kind)
        if family.kind == "histogram":
            self._histogram_samples(family, metric.samples)
        elif family.sum_of:
            for hist, _b, value_sum, _c in agg.hists(family.sum_of):
                self._counter_sample(family, metric.samples, hist.labels, value_sum, hist.created)
        elif family.key in agg.readers:
            for values, value in agg.values(family.key):
                metric.samples.append(Sample(family.sample_name, dict(zip(family.labels, values, strict=True)), value))
        else:
            for series, value in agg.counts(family.name):
                self._counter_sample(family, metric.samples, series.labels, value, series.created)
        return metric

    def _counter_sample(
        self, family: Family, samples: list[Sample], labels: tuple[str, ...], value: float, created: float
    ) -> None:
        base = dict(zip(family.labels, labels, strict=True))
        samples.append(Sample(family.sample_name, base, value))
        if self._created and family.kind == "counter":
            samples.append(Sample(f"{family.name}_created", base, created))

    def _histogram_samples(self, family: Family, samples: list[Sample]) -> None:
        name = family.name
        les = text.bucket_les(family)
        bucket, total, count, created = f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"
        hides_input = self._hides_input(family)
        for series, buckets, value_sum, value_count in self._aggregate.hists(name):
            if hides_input and series.labels[-1] != "output":
                continue
            base = dict(zip(family.labels, series.labels, strict=True))
            exemplars = series.exemplars
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
                samples.append(Sample(created, base, series.created))

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """``registry``'s Prometheus text exposition (format 0.0.4): the same bytes as ``generate_latest``
        (a test compares them), several times faster (see :mod:`.prometheus_text`). Families of any other
        collector in the registry go through ``generate_latest``. Exemplars need OpenMetrics: serve the
        OpenMetrics encoder when the scraper asks for it."""
        if self._created:  # the client's own layout for the _created series
            return generate_latest(registry)
        out: list[str] = []
        _TEXT.on = True
        try:
            for metric in registry.collect():
                if isinstance(metric, text.Rendered):
                    out.append(metric.text)
                else:
                    out.append(generate_latest(_One(metric)).decode("utf-8"))
        finally:
            _TEXT.on = False
        return "".join(out).encode("utf-8")

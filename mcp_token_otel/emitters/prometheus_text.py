"""The Prometheus text format (0.0.4) of catalog families, written straight from copies of the aggregate rows:
the same bytes as ``generate_latest``, about 17 times faster at 100 tools (benchmarks/scrape_cost.py).

``generate_latest`` builds a Sample per line, then validates and escapes each; here each series caches its
escaped label text and bucket line prefixes (kept on the series, cleared with it), so a scrape formats numbers
only. Every name, help text, label name and bucket comes from the family's catalog entry.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ..catalog import Family
from .aggregate import Count, Hist

#: A histogram family's rows as Aggregate.hists() returns them: (series, buckets, sum, count).
HistRows = list[tuple[Hist, list[int], float, int]]
#: Rows of a family read at scrape time (gauges, the overflow counts): (label values, value).
PlainRows = list[tuple[tuple[str, ...], float]]
_MINUS_INF = float("-inf")


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class Rendered(Metric):
    """A family already rendered in the text format (only exposition() ever receives one)."""

    def __init__(self, name: str, typ: str, text: str) -> None:
        super().__init__(name, "", typ)
        self.text = text


def _label_text(pairs: list[tuple[str, str]]) -> str:
    """Label pairs as generate_latest writes them: sorted by name, values escaped."""
    return ",".join(f'{name}="{_escape_value(value)}"' for name, value in sorted(pairs))


def go_float(value: float) -> str:
    """floatToGoString(value) for the usual values at about half its cost: below 1e6 (where Go switches to
    exponents) a finite float's repr is its answer; the rest (1e6 and up, infinities, NaN) go to it."""
    if _MINUS_INF < value < 1e6:
        return repr(float(value))
    return floatToGoString(value)


def _header(family: Family) -> str:
    return f"# HELP {family.sample_name} {_escape_help(family.help)}\n# TYPE {family.sample_name} {family.kind}\n"


def bucket_les(family: Family) -> list[str]:
    return [floatToGoString(b) for b in family.buckets] + ["+Inf"]


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


def series_cache(series: Hist, family: Family, les: list[str]) -> tuple[Any, ...]:
    """``series``' line prefixes (see _hist_cache), built on its first rendering and kept on it."""
    cache = series.text
    if cache is None or cache[0] != family.name:
        cache = series.text = _hist_cache(family.name, family.labels, series.labels, les)
    return cache


def histogram_text(family: Family, rows: HistRows) -> str:
    """A histogram family, byte for byte as generate_latest writes it, from copied aggregate rows."""
    les = bucket_les(family)
    out = [_header(family)]
    for series, buckets, value_sum, count in rows:
        cache = series_cache(series, family, les)
        prefixes = cache[2]
        if count < 1_000_000:  # every cumulative count is <= count: floatToGoString's "n.0" for all of them
            out += [f"{prefix}{running}.0\n" for prefix, running in zip(prefixes, accumulate(buckets), strict=True)]
            out.append(f"{cache[3]}{count}.0\n")
        else:  # Go's exponent form from 1e6 on
            out += [f"{prefix}{floatToGoString(running)}\n"
                    for prefix, running in zip(prefixes, accumulate(buckets), strict=True)]
            out.append(f"{cache[3]}{floatToGoString(count)}\n")
        out.append(f"{cache[4]}{go_float(value_sum)}\n")
    return "".join(out)


def counter_text(family: Family, rows: list[tuple[Count, float]]) -> str:
    """A counter family from copied aggregate rows; the label text is cached on the series."""
    total = family.sample_name
    out = [_header(family)]
    for series, value in rows:
        text = series.text
        if text is None:
            text = series.text = _label_text(list(zip(family.labels, series.labels, strict=True)))
        out.append(f"{total}{{{text}}} {go_float(value)}\n")
    return "".join(out)


def sum_counter_text(family: Family, rows: HistRows, cache: Callable[[Hist], tuple[Any, ...]]) -> str:
    """A counter equal to a histogram's sums, from its rows; ``cache`` gives a series' cached label text
    (the histogram's, also for the series the histogram leaves out)."""
    total = family.sample_name
    out = [_header(family)]
    out += [f"{total}{{{cache(series)[1]}}} {go_float(value_sum)}\n" for series, _b, value_sum, _c in rows]
    return "".join(out)


def plain_text(family: Family, rows: PlainRows) -> str:
    """A family read at scrape time (gauges, the overflow counts)."""
    name = family.sample_name
    out = [_header(family)]
    out += [f"{name}{{{_label_text(list(zip(family.labels, values, strict=True)))}}} {go_float(value)}\n"
            for values, value in rows]
    return "".join(out)

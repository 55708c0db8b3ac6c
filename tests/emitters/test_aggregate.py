"""The aggregate's message path (a message key's series found once, updated under one hold of the lock) gives
exactly what the general per-family records give: the same series, in the same order, with the same values, the
same records folded past a family's series cap (the cap set low so that every family reaches it), the same
/metrics bytes and the same OpenTelemetry points."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from mcp_token_otel.catalog import FAMILIES
from mcp_token_otel.core.risk import RISK_TIERS
from mcp_token_otel.emitters import aggregate
from mcp_token_otel.emitters.aggregate import Aggregate
from mcp_token_otel.emitters.otel_metrics import OtelMetrics
from mcp_token_otel.emitters.prometheus_collector import PrometheusCollector

#: (side, method, tool, direction, tokens, bytes, overhead, risk tier, duration, server)
Message = tuple[str, str, str | None, str, int, int, int, str, float, str]


def messages(seed: int, count: int = 3000) -> list[Message]:
    rng = random.Random(seed)
    out: list[Message] = []
    for _ in range(count):
        tokens = rng.choice((3, 700, 3000, 6000, 20_000))
        tool = rng.choice((None, *(f"tool{i}" for i in range(40))))
        out.append((rng.choice(("client", "server")), rng.choice(("tools/call", "tools/list")), tool,
                    rng.choice(("input", "output")), tokens, rng.randint(1, 90_000), rng.randint(0, tokens),
                    rng.choice(RISK_TIERS), rng.choice((0.004, 0.3, 7.0)), rng.choice(("srv", "", "other"))))
    return out


def fast(agg: Aggregate, msg: Message) -> None:
    """What the recorder records for one message: its series found once, updated together."""
    side, method, tool, direction, tokens, size, overhead, tier, duration, server = msg
    ms = agg.message(side, server, method, tool, direction)
    output = direction == "output"
    agg.add_message(ms, tokens, size, overhead, tier if output else None)
    if output:
        agg.add_duration(ms, duration)


def general(agg: Aggregate, msg: Message) -> None:
    """The same message, family by family, through the catalog-driven records."""
    side, method, tool, direction, tokens, size, overhead, tier, duration, server = msg
    key = (side, server, method, tool, direction)
    out = key[:4]
    agg.observe("mcp_token_message_tokens", key, tokens)
    agg.add("mcp_token_bytes", key, size)
    if direction == "output":
        agg.add("mcp_token_overhead_tokens", out, overhead)
        agg.observe("mcp_token_operation_duration_seconds", out, duration)
        for breach in ("critical", "high"):
            agg.touch("mcp_token_responses", (*out, breach))
        agg.touch_server(side, server)
        agg.add("mcp_token_responses", (*out, tier))


def state(agg: Aggregate) -> dict[str, Any]:
    """Every stored family's series (labels and values, in order)."""
    out: dict[str, Any] = {}
    for family in FAMILIES:
        name = family.name
        if name not in agg.stored:
            continue
        if family.kind == "histogram":
            rows: list[Any] = [(s.labels, buckets, total, count) for s, buckets, total, count in agg.hists(name)]
        else:
            rows = [(s.labels, value) for s, value in agg.counts(name)]
        out[name] = rows
    return out


def exposition(agg: Aggregate) -> bytes:
    registry = CollectorRegistry()
    collector = PrometheusCollector(agg)
    registry.register(collector)
    return collector.exposition(registry)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_message_path_matches_the_general_records(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "MAX_SERIES", 60)
    quick, slow = Aggregate(), Aggregate()
    for msg in messages(seed):
        fast(quick, msg)
        general(slow, msg)
    assert state(quick) == state(slow)
    folded = dict(quick.values("mcp_token_series_overflow"))
    assert folded == dict(slow.values("mcp_token_series_overflow"))  # the records each family folded
    for name in ("mcp_token_responses", "mcp_token_message_tokens", "mcp_token_bytes", "mcp_token_overhead_tokens",
                 "mcp_token_operation_duration_seconds"):
        assert folded[(name,)] > 0, name  # the cap is reached: the folds are compared too
    assert exposition(quick) == exposition(slow)


def otel_points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, Any] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = []
                for p in metric.data.data_points:
                    value = (p.count, p.sum, tuple(p.bucket_counts)) if hasattr(p, "bucket_counts") else p.value
                    points.append((tuple(sorted(p.attributes.items())), value))
                out[metric.name] = sorted(points, key=repr)
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_opentelemetry_sees_the_same_from_both_paths(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters read the aggregate, the token histogram gets a point per message either way (requests'
    points too, with input_histograms)."""
    monkeypatch.setattr(aggregate, "MAX_SERIES", 60)
    seen = []
    for record in (fast, general):
        reader = InMemoryMetricReader()
        agg = Aggregate(input_histograms=True)
        otel = OtelMetrics(agg, MeterProvider(metric_readers=[reader]))
        agg.points = otel.points
        for msg in messages(seed, 1000):
            record(agg, msg)
        seen.append(otel_points(reader))
    quick, slow = seen
    for name in ("mcp_token.tokens", "mcp_token.bytes", "mcp_token.overhead.tokens", "mcp_token.responses",
                 "mcp_token.message.tokens", "mcp_token.series.overflow"):
        assert quick[name] == slow[name], name
    assert any(("mcp_token.family", "mcp_token_responses") in attrs and value > 0
               for attrs, value in quick["mcp_token.series.overflow"])

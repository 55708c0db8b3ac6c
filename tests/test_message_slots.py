"""The sinks' per-message shortcut (a message key's series found once, updated under one hold of the lock) gives
exactly what the general per-family records give: the same series, in the same order, with the same values, and
the same records folded past a family's series cap (the cap set low so that every family reaches it)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from mcp_token_otel.core.measure import Measurement
from mcp_token_otel.core.risk import RISK_TIERS
from mcp_token_otel.emitters import aggregate
from mcp_token_otel.emitters.otel_metrics import OtelMetricsSink
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics

Message = tuple[str, str, str | None, str, Measurement, str]


def messages(seed: int, count: int = 3000) -> list[Message]:
    rng = random.Random(seed)
    out: list[Message] = []
    for _ in range(count):
        tokens = rng.choice((3, 700, 3000, 6000, 20_000))
        overhead = rng.randint(0, tokens)
        tier = rng.choice(RISK_TIERS)
        m = Measurement("output", "tools/call", None, (), tokens, tokens - overhead, overhead, overhead / tokens,
                        tier, bytes=rng.randint(1, 90_000))
        tool = rng.choice((None, *(f"tool{i}" for i in range(40))))
        out.append((rng.choice(("client", "server")), rng.choice(("tools/call", "tools/list")), tool,
                    rng.choice(("input", "output")), m, rng.choice(("srv", "", "other"))))
    return out


def general_prometheus(sink: PrometheusMetrics, msg: Message) -> None:
    """What the Prometheus sink records for one message, family by family."""
    side, method, tool, direction, m, server = msg
    key = (side, server, method, tool, direction)
    sink._touch_server(side, server)
    sink.hists["mcp_token_message_tokens"].observe(key, m.total_tokens)
    sink.counts["mcp_token_bytes"].add(key, m.bytes)
    if direction == "output":
        out = key[:4]
        sink.counts["mcp_token_overhead_tokens"].add(out, m.overhead_tokens)
        for tier in ("critical", "high"):
            sink.counts["mcp_token_responses"].touch((*out, tier))
        sink.counts["mcp_token_responses"].add((*out, m.risk_tier))


def general_otel(sink: OtelMetricsSink, msg: Message) -> None:
    """What the OpenTelemetry sink pre-aggregates for one message, family by family."""
    side, method, tool, direction, m, server = msg
    key = sink._key("mcp_token.tokens", (side, server, method, tool, direction))
    sink._touch_server(side, server)
    if direction == "output":
        for tier in ("critical", "high"):
            sink._touch("mcp_token.responses", (side, server, method, tool, tier))
    sink.counts["mcp_token.tokens"].add(key, m.total_tokens)
    sink.counts["mcp_token.bytes"].add(key, m.bytes)
    if direction == "output":
        values = (side, server, method, tool)
        sink.counts["mcp_token.overhead.tokens"].add(sink._key("mcp_token.overhead.tokens", values), m.overhead_tokens)
        sink.counts["mcp_token.responses"].add(sink._key("mcp_token.responses", (*values, m.risk_tier)))


def state(families: dict[str, Any]) -> dict[str, Any]:
    """Every family's series (labels and values, in order, without creation times) and its folded records."""
    out: dict[str, Any] = {}
    for name, family in families.items():
        rows = [row[:2] if len(row) == 3 else row[:4] for row in family.snapshot()]  # no creation time
        out[name] = (rows, family.folded)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prometheus_message_slots_match_the_general_records(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "MAX_SERIES", 60)
    fast, general = PrometheusMetrics(server="srv"), PrometheusMetrics(server="srv")
    for msg in messages(seed):
        fast.record_message(*msg)
        general_prometheus(general, msg)
    assert state({**fast.hists, **fast.counts}) == state({**general.hists, **general.counts})
    assert fast.counts["mcp_token_responses"].folded > 0 and fast.hists["mcp_token_message_tokens"].folded > 0
    assert fast.exposition() == general.exposition()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_opentelemetry_message_slots_match_the_general_records(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "MAX_SERIES", 60)
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    fast, general = OtelMetricsSink(provider, server="srv"), OtelMetricsSink(provider, server="srv")
    for msg in messages(seed):
        fast.record_message(*msg)
        general_otel(general, msg)
    assert state(fast.counts) == state(general.counts)
    assert fast.counts["mcp_token.responses"].folded > 0 and fast.counts["mcp_token.tokens"].folded > 0

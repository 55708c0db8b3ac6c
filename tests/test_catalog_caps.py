"""No silent data loss at a family's series cap: new label sets fold into one overflow series, counted; the
series that exist keep counting (the Prometheus and the OpenTelemetry pre-aggregated families)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import View
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.catalog import OVERFLOW_VALUE
from mcp_token_otel.emitters.aggregate import MAX_SERIES
from mcp_token_otel.emitters.otel_metrics import OtelMetricsSink
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.emitters.sink import CallInfo

LABEL_SETS = 30_000
FOLDED = LABEL_SETS - MAX_SERIES


def failed_calls(sink: PrometheusMetrics | OtelMetricsSink, duration: float | None = None) -> None:
    """30,000 distinct tools fail once each (one call-errors series apiece, and one duration series when timed),
    then the first tool fails again: past the cap."""
    call = CallInfo("-32603", duration)
    for i in range(LABEL_SETS):
        sink.record_call("server", "tools/call", f"tool{i}", "srv", call)
    sink.record_call("server", "tools/call", "tool0", "srv", call)


def test_prometheus_folds_new_label_sets_past_the_cap_and_counts_them() -> None:
    sink = PrometheusMetrics()
    failed_calls(sink, 0.05)
    body = sink.exposition().decode()
    # The two families this test reads (parsing the 20,000-series duration histogram as well takes a minute).
    kept = ("mcp_token_call_errors_total", "mcp_token_series_overflow_total")
    text = "".join(line for line in body.splitlines(keepends=True) if line.removeprefix("# HELP ").removeprefix(
        "# TYPE ").startswith(kept))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    first = {"side": "server", "server": "srv", "method": "tools/call", "tool": "tool0", "error_type": "-32603"}
    other = {label: OVERFLOW_VALUE for label in first}
    assert value("mcp_token_call_errors_total", **first) == 2  # an existing series keeps counting
    assert value("mcp_token_call_errors_total", **other) == FOLDED
    durations = {labels: count for labels, _b, _s, count, _c, _e
                 in sink.hists["mcp_token_operation_duration_seconds"].snapshot()}
    timed = tuple(value for label, value in first.items() if label != "error_type")  # durations have no error_type
    assert durations[timed] == 2 and durations[(OVERFLOW_VALUE,) * len(timed)] == FOLDED
    assert value("mcp_token_series_overflow_total", family="mcp_token_call_errors") == FOLDED
    assert value("mcp_token_series_overflow_total", family="mcp_token_operation_duration_seconds") == FOLDED
    assert value("mcp_token_series_overflow_total", family="mcp_token_message_tokens") == 0
    # Nothing recorded is lost: the series sum to every call.
    total = sum(v for (name, _), v in samples.items() if name == "mcp_token_call_errors_total")
    assert total == LABEL_SETS + 1
    series = [key for key in samples if key[0] == "mcp_token_call_errors_total"]
    assert len(series) == MAX_SERIES + 1


def test_opentelemetry_folds_new_attribute_sets_past_the_cap_and_counts_them() -> None:
    # A cardinality limit above ours, so that the SDK's own (2,000 by default) does not fold first.
    reader = InMemoryMetricReader()
    view = View(instrument_name="mcp_token.*", aggregation_cardinality_limit=2 * LABEL_SETS)
    sink = OtelMetricsSink(MeterProvider(metric_readers=[reader], views=[view]), server="srv")
    failed_calls(sink)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, Any] = {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    errors = {p.attributes.get("gen_ai.tool.name"): p for p in points["mcp_token.call.errors"]}
    assert errors["tool0"].value == 2
    overflow = [p for p in points["mcp_token.call.errors"] if p.attributes.get("otel.metric.overflow") is True]
    assert len(overflow) == 1 and overflow[0].value == FOLDED
    assert len(points["mcp_token.call.errors"]) == MAX_SERIES + 1
    assert sum(p.value for p in points["mcp_token.call.errors"]) == LABEL_SETS + 1
    folded = {p.attributes["mcp_token.family"]: p.value for p in points["mcp_token.series.overflow"]}
    assert folded["mcp_token.call.errors"] == FOLDED
    assert folded["mcp_token.tokens"] == 0

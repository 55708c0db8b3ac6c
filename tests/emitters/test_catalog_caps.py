"""No silent data loss at a family's series cap: new label sets fold into one overflow series, counted; the
series that exist keep counting. Prometheus and OpenTelemetry read the same aggregate, so both show it.

The cap is set low (``MAX_SERIES``, read at each new series) so that a few dozen label sets reach it."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from mcp_token_otel.catalog import OVERFLOW_VALUE
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters import aggregate
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.calls import exchange
from tests.helpers.support import scrape

CAP = 40
LABEL_SETS = 60
FOLDED = LABEL_SETS - CAP


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "MAX_SERIES", CAP)


def otel_points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def failed_calls(rec: TokenRecorder) -> None:
    """LABEL_SETS distinct tools fail once each (one call-errors series and one duration series apiece), then the
    first tool fails again: past the cap. Recorded on the aggregate, by catalog family."""
    agg = rec.aggregate
    for i in range(LABEL_SETS):
        agg.add("mcp_token_call_errors", ("server", "srv", "tools/call", f"tool{i}", "-32603"))
        agg.observe("mcp_token_operation_duration_seconds", ("server", "srv", "tools/call", f"tool{i}"), 0.05)
    agg.add("mcp_token_call_errors", ("server", "srv", "tools/call", "tool0", "-32603"))
    agg.observe("mcp_token_operation_duration_seconds", ("server", "srv", "tools/call", "tool0"), 0.05)


@pytest.mark.usefixtures("capped")
def test_prometheus_folds_new_label_sets_past_the_cap_and_counts_them() -> None:
    rec = TokenRecorder(config_from_dict({}), TracerProvider(), MeterProvider(), server_name="srv")
    try:
        failed_calls(rec)
        found = scrape(rec)
    finally:
        rec.close()
    first = {"side": "server", "server": "srv", "method": "tools/call", "tool": "tool0", "error_type": "-32603"}
    other = {label: OVERFLOW_VALUE for label in first}
    assert found.value("mcp_token_call_errors_total", **first) == 2  # an existing series keeps counting
    assert found.value("mcp_token_call_errors_total", **other) == FOLDED
    timed = {label: value for label, value in first.items() if label != "error_type"}  # durations: no error_type
    assert found.value("mcp_token_operation_duration_seconds_count", **timed) == 2
    assert found.value("mcp_token_operation_duration_seconds_count",
                       **{label: OVERFLOW_VALUE for label in timed}) == FOLDED
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_call_errors") == FOLDED
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_operation_duration_seconds") == FOLDED
    assert found.has("mcp_token_series_overflow_total", family="mcp_token_message_tokens")
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_message_tokens") == 0
    # Nothing recorded is lost: the series sum to every call, in CAP series and the overflow one.
    assert found.value("mcp_token_call_errors_total") == LABEL_SETS + 1
    assert len(found.pick("mcp_token_call_errors_total")) == CAP + 1
    assert found.value("mcp_token_operation_duration_seconds_count") == LABEL_SETS + 1


@pytest.mark.usefixtures("capped")
def test_opentelemetry_shows_the_same_overflow_series_and_counts() -> None:
    # Redesign: OpenTelemetry reads the shared aggregate, so its overflow is the aggregate's `_other` series and
    # mcp_token.series.overflow names the Prometheus family (it had its own per-instrument fold before).
    reader = InMemoryMetricReader()
    rec = TokenRecorder(config_from_dict({}), TracerProvider(), MeterProvider(metric_readers=[reader]),
                        server_name="srv")
    try:
        failed_calls(rec)
        points = otel_points(reader)
    finally:
        rec.close()
    errors = points["mcp_token.call.errors"]
    by_tool = {p.attributes.get("gen_ai.tool.name"): p for p in errors}
    assert by_tool["tool0"].value == 2
    assert by_tool[OVERFLOW_VALUE].value == FOLDED
    assert by_tool[OVERFLOW_VALUE].attributes["mcp_token.server.name"] == OVERFLOW_VALUE
    assert len(errors) == CAP + 1
    assert sum(p.value for p in errors) == LABEL_SETS + 1
    folded = {p.attributes["mcp_token.family"]: p.value for p in points["mcp_token.series.overflow"]}
    assert folded["mcp_token_call_errors"] == FOLDED
    assert folded["mcp_token_message_tokens"] == 0


@pytest.mark.usefixtures("capped")
def test_real_calls_past_the_cap_fold_every_message_family_and_count_every_record() -> None:
    """The message path (a message's series found once, updated together) folds and counts like the general
    records: every record past the cap is in the overflow series and in mcp_token_series_overflow_total."""
    config = config_from_dict({"metrics": {"max_tool_names": 10 * LABEL_SETS, "input_histograms": True}})
    rec = TokenRecorder(config, TracerProvider(), MeterProvider(), server_name="srv")
    tools = [f"tool{i}" for i in range(LABEL_SETS)]
    try:
        # Declared names become labels before their first call (an error alone admits no tool name).
        exchange(rec, "server", "tools/list", {}, "s", result={"tools": [{"name": t} for t in tools]})
        for tool in [*tools, tools[0]]:
            exchange(rec, "server", "tools/call", {"name": tool, "arguments": {}}, "s",
                     error={"code": -32603, "message": "boom"})
        found = scrape(rec)
    finally:
        rec.close()
    calls = LABEL_SETS + 1
    other = {"tool": OVERFLOW_VALUE, "server": OVERFLOW_VALUE}
    # call errors: only the tools/call series.
    assert found.value("mcp_token_call_errors_total", tool="tool0") == 2
    assert found.value("mcp_token_call_errors_total", **other) == FOLDED
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_call_errors") == FOLDED
    # Durations: tools/list's series is one of the CAP, so one more tool folds.
    assert found.value("mcp_token_operation_duration_seconds_count", tool="tool0") == 2
    assert found.value("mcp_token_operation_duration_seconds_count", **other) == FOLDED + 1
    assert found.value("mcp_token_operation_duration_seconds_count") == calls + 1
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_operation_duration_seconds") == FOLDED + 1
    # Tokens and bytes, both directions: every message is counted; each label set past the cap (a tools/list
    # request and response, then each tool's request and response) is one record folded.
    keys = 2 * (LABEL_SETS + 1)
    assert found.value("mcp_token_message_tokens_count") == 2 * (calls + 1)
    assert found.value("mcp_token_message_tokens_count", **other) == keys - CAP
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_message_tokens") == keys - CAP
    assert found.value("mcp_token_series_overflow_total", family="mcp_token_bytes") == keys - CAP
    assert found.value("mcp_token_tokens_total") == found.value("mcp_token_message_tokens_sum") > 0

"""The metric catalog is the one list of families: every output carries exactly the catalog's families.

Each output is produced for real: a recorder's Prometheus exposition (both renderers), the multiprocess files
of a worker process merged by prometheus-client's collector, the OpenTelemetry instruments read by an
InMemoryMetricReader, and the proxy's families on a served /metrics and on OpenTelemetry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.catalog import FAMILIES, Emitter, otel_families, prometheus_families
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.core.measure import measure_result
from mcp_token_otel.emitters.metrics_server import MetricsServer
from mcp_token_otel.emitters.otel_metrics import OtelMetricsSink
from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics
from mcp_token_otel.emitters.sink import CallInfo, MetricsSink
from mcp_token_otel.recorder import TokenRecorder

BIG = {"content": [{"type": "text", "text": "word " * 12000}]}


def names_in(text: str) -> set[str]:
    """The families of a text exposition, named as the catalog names them (prometheus-client's parser drops
    a counter's ``_total``)."""
    return {family.name for family in text_string_to_metric_families(text)}


def expected(emitter: Emitter = "recorder", *, multiprocess: bool = False) -> set[str]:
    return {f.name for f in prometheus_families(emitter) if not (multiprocess and f.capped_only)}


def record_everything(sink: MetricsSink) -> None:
    """One call of every sink method, on both sides, so that every family has a point to show."""
    big = measure_result("tools/call", BIG)
    call, session = CallInfo("-32603", 0.2, "pipe", "2025-06-18"), CallInfo(None, 3.0, "pipe", "2025-06-18")
    for side in ("client", "server"):
        sink.record_message(side, "tools/call", "dump", "input", big, "srv")
        sink.record_message(side, "tools/call", "dump", "output", big, "srv")
        sink.record_call(side, "tools/call", "dump", "srv", call)
        sink.record_transition(side, "warning", "srv")
        sink.record_session_end(side, 0.7, "srv", session)
        sink.record_session_evicted(side, "srv")
        sink.record_unbudgeted(side, "srv", big.total_tokens)
        sink.record_guard_action(side, "srv", "max_tokens", "truncated", True, "dump")
        sink.record_cost(side, "srv", "dump", 0.25)
        sink.record_prompt_cache_invalidation(side, "srv", 120)
        sink.record_wasted(side, "srv", "dump", "repeated", big.total_tokens)
    sink.record_error("estimate", "srv")
    sink.record_tool_definitions("srv", 120, {"dump": 70, "ping": 50})
    sink.record_tool_profiles("srv", {"description": 40, "schema": 60, "names": 20}, {"ping": 90})


def test_catalog_entries_are_consistent() -> None:
    prom = [f.name for f in FAMILIES if f.name]
    otel = [f.otel_name for f in FAMILIES if f.otel_name]
    assert len(prom) == len(set(prom)) and len(otel) == len(set(otel))
    assert all(f.name or f.otel_name for f in FAMILIES)
    for family in FAMILIES:
        assert family.help and family.unit and family.labels, family
        assert bool(family.buckets) == (family.kind == "histogram"), family
        assert list(family.buckets) == sorted(family.buckets), family
        assert not family.otel_name or family.otel_unit, family
        assert len(family.attributes()) == len(family.labels), family
        assert not family.name.endswith("_total"), family  # counters take it on their samples
        assert family.kind != "gauge" or family.emitter != "recorder" or family.multiprocess_mode, family
    for at, family in enumerate(FAMILIES):  # a counter of a histogram's sums is rendered from its rows: after it
        if family.sum_of:
            earlier = [f.name for f in FAMILIES[:at] if f.kind == "histogram"]
            assert family.kind == "counter" and family.sum_of in earlier, family


def test_a_real_run_exposes_exactly_the_catalog_families() -> None:
    reader = InMemoryMetricReader()
    config = config_from_dict({"budget": {"context_window": 20_000}, "guard": {"model": "gpt-5.4-mini"}})
    recorder = TokenRecorder(config, TracerProvider(), MeterProvider(metric_readers=[reader]))
    sink = PrometheusMetrics(states=recorder.session_states)
    recorder.add_sink(sink, inline=True)
    recorder.record_output(None, "server", "tools/list", None, result={"tools": [{"name": "dump"}]})
    recorder.record_input(None, "server", "tools/call", {"name": "dump", "arguments": {}}, "s1")
    recorder.record_output(None, "server", "tools/call", "dump", result=BIG, session_id="s1", duration_s=0.3)
    recorder.record_output(None, "client", "tools/call", "dump", error={"code": -32602, "message": "bad"})
    recorder.end_session("server", "s1")
    try:
        served = generate_latest(sink.registry).decode()
        assert names_in(served) == expected()
        assert sink.exposition().decode() == served  # the fast renderer: the same families, the same bytes
    finally:
        recorder.close()


MULTIPROCESS_WORKER = textwrap.dedent(
    """
    import sys
    from prometheus_client import generate_latest
    from mcp_token_otel.emitters.prometheus_metrics import PrometheusMetrics, multiprocess_registry
    sys.path.insert(0, sys.argv[1])
    from test_catalog import record_everything
    sink = PrometheusMetrics(states=lambda: {("server", "srv"): {"ok": 1, "warning": 0, "exhausted": 0}})
    record_everything(sink)
    print(generate_latest(multiprocess_registry()).decode())
    """
)


def test_multiprocess_output_has_exactly_the_catalog_families(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", MULTIPROCESS_WORKER, str(Path(__file__).parent)], env=env,
                         check=True, capture_output=True, timeout=120)
    assert names_in(out.stdout.decode()) == expected(multiprocess=True)


def test_opentelemetry_instruments_are_exactly_the_catalog_ones() -> None:
    reader = InMemoryMetricReader()
    states = {("server", "srv"): {"ok": 1, "warning": 0, "exhausted": 0}}
    sink = OtelMetricsSink(MeterProvider(metric_readers=[reader]), states=lambda: states,
                           rate_budgets={"tool": 100.0}, server="srv")
    record_everything(sink)
    data = reader.get_metrics_data()
    assert data is not None
    found = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert found == {f.otel_name for f in otel_families("recorder")}



def test_the_proxy_side_rides_on_the_conventions_client_durations() -> None:
    """The conventions' instruments name only client and server: the proxy's requests, recorded in the client
    ones, carry mcp_token.side="proxy" (a Collector sets `side` from it); a client's points do not."""
    reader = InMemoryMetricReader()
    sink = OtelMetricsSink(MeterProvider(metric_readers=[reader]), server="srv")
    for side in ("proxy", "client"):
        sink.record_call(side, "tools/call", "t", "srv", CallInfo(None, 0.02, "pipe", "2025-11-25"))
        sink.record_session_end(side, 0.1, "srv", CallInfo(None, 5.0, "pipe", "2025-11-25"))
    data = reader.get_metrics_data()
    assert data is not None
    sides = {m.name: sorted(str(p.attributes.get("mcp_token.side")) for p in m.data.data_points)
             for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert sides["mcp.client.operation.duration"] == ["None", "proxy"]
    assert sides["mcp.client.session.duration"] == ["None", "proxy"]

PROXY_OTEL = textwrap.dedent(
    """
    import json
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from mcp_token_otel.proxy.jsonrpc import ProxyStats
    from mcp_token_otel.proxy.telemetry import _otel_counters
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    stats = ProxyStats("srv")
    _otel_counters(stats)
    data = reader.get_metrics_data()
    print(json.dumps(sorted({m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics})))
    """
)


def test_the_proxy_families_are_exactly_the_catalog_ones_on_metrics_and_opentelemetry() -> None:
    from mcp_token_otel.proxy.jsonrpc import ProxyStats
    from mcp_token_otel.proxy.telemetry import _StatsCollector

    registry = CollectorRegistry()
    registry.register(_StatsCollector(ProxyStats("srv")))
    server = MetricsServer.start("127.0.0.1", 0, registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            body = response.read().decode()
    finally:
        server.close()
    assert names_in(body) == expected("proxy")
    # The proxy's OpenTelemetry counters need the global meter provider: set in a fresh interpreter.
    out = subprocess.run([sys.executable, "-c", PROXY_OTEL], check=True, capture_output=True, timeout=120)
    assert set(json.loads(out.stdout)) == {f.otel_name for f in otel_families("proxy")}


def test_the_docs_metrics_table_is_the_catalog() -> None:
    from mcp_token_otel.catalog import markdown_table

    doc = (Path(__file__).resolve().parent.parent / "docs" / "instrumentation.md").read_text(encoding="utf-8")
    assert markdown_table() in doc, "run: python -m mcp_token_otel.catalog docs/instrumentation.md"
    for family in FAMILIES:  # not vacuous: the table names every family
        assert f"`{family.sample_name if family.name else family.otel_name}`" in doc

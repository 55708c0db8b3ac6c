"""The metric catalog is the one list of families: every output carries exactly the catalog's families.

Each output is produced for real: a recorder's Prometheus exposition (both renderers), the multiprocess files
of a worker process merged by prometheus-client's collector, the OpenTelemetry instruments read by an
InMemoryMetricReader, and the proxy's families on a served /metrics and on OpenTelemetry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.catalog import FAMILIES, Emitter, otel_families, prometheus_families
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.emitters.prometheus_service import start_prometheus
from mcp_token_otel.recorder import TokenRecorder
from mcp_token_otel.semconv import A_PROTOCOL, A_TRANSPORT
from tests.helpers.calls import exchange

ROOT = Path(__file__).resolve().parent.parent
BIG = {"content": [{"type": "text", "text": "word " * 12000}]}
#: A tool whose result its definition bounds (a static maximum), and one whose result nothing bounds.
SEARCH = {
    "name": "search",
    "description": "Search the index.",
    "inputSchema": {"type": "object", "properties": {"limit": {"type": "integer", "maximum": 20}},
                    "required": ["limit"]},
    "outputSchema": {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "string"}}}}}},
}
DUMP = {"name": "dump", "description": "Dump everything.", "inputSchema": {"type": "object"}}
#: Every family gets a point: small budgets (transitions, evictions), a response cap (guard actions), a price
#: (cost), a repeat window (wasted tokens), the spill (room for one cut result: the next evicts it).
EVERYTHING = {"budget": {"context_window": 20_000, "max_sessions": 2},
              "guard": {"mode": "enforce", "max_response_tokens": 5000, "model": "gpt-5.4-mini", "spill": True,
                        "spill_max_bytes": 100_000},
              "metrics": {"repeat_window": 60}}
CONVENTION = {A_TRANSPORT: "pipe", A_PROTOCOL: "2025-06-18"}


def names_in(text: str) -> set[str]:
    """The families of a text exposition, named as the catalog names them (prometheus-client's parser drops
    a counter's ``_total``)."""
    return {family.name for family in text_string_to_metric_families(text)}


def expected(emitter: Emitter = "recorder", *, multiprocess: bool = False) -> set[str]:
    return {f.name for f in prometheus_families(emitter) if not (multiprocess and f.capped_only)}


def everything_recorder(meter_provider: MeterProvider | None = None) -> TokenRecorder:
    return TokenRecorder(config_from_dict(EVERYTHING), TracerProvider(), meter_provider, server_name="srv")


def record_everything(rec: TokenRecorder) -> None:
    """Real exchanges on both sides through the recorder's call path, so that every family has a point to show
    (a recorder made by everything_recorder)."""
    for side in ("client", "server"):
        for tools in ([SEARCH, DUMP], [DUMP, SEARCH]):  # definitions; the order changed: a prompt-cache change
            exchange(rec, side, "tools/list", {}, "s1", result={"tools": tools}, attributes=CONVENTION)
        for _ in range(2):  # the same call again: wasted (repeated); cut by the response cap: a guard action
            # (the server side keeps the cut result, the second one evicts the first)
            cut, _ = exchange(rec, side, "tools/call", {"name": "dump", "arguments": {"all": True}}, "s1",
                              result=BIG, attributes=CONVENTION)
        if side == "server":  # a page of the kept result read back
            exchange(rec, side, "resources/read", {"uri": cut["content"][-1]["uri"]}, "s1", guard=True)
        exchange(rec, side, "tools/call", {"name": "dump", "arguments": {}}, "s1",
                 error={"code": -32603, "message": "boom"}, attributes=CONVENTION)
        exchange(rec, side, "tools/call", {"name": "dump", "arguments": {}}, None, result=BIG)  # unbudgeted: not kept
        # A call that asks first (2026-07-28): an input_required answer, then the retry's final result (the logical
        # call's duration).
        asked = {"resultType": "input_required", "requestState": "sealed-1",
                 "inputRequests": {"ok": {"method": "elicitation/create", "params": {"message": "Sure?"}}}}
        exchange(rec, side, "tools/call", {"name": "dump", "arguments": {"path": "x"}}, "s1", result=asked,
                 attributes=CONVENTION)
        exchange(rec, side, "tools/call", {"name": "dump", "arguments": {"path": "x"}, "requestState": "sealed-1",
                                           "inputResponses": {"ok": {"action": "accept"}}}, "s1",
                 result={"content": [{"type": "text", "text": "done"}], "resultType": "complete"},
                 attributes=CONVENTION)
        rec.end_session(side, "s1")  # utilization and durations
        for session in ("s2", "s3", "s4"):  # past budget.max_sessions: s2 is evicted
            exchange(rec, side, "tools/list", {}, session, result={"tools": [DUMP, SEARCH]}, attributes=CONVENTION)
    rec.flush()


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
    recorder = everything_recorder()
    try:
        record_everything(recorder)
        service = start_prometheus(recorder, recorder.config.prometheus, serve=False)
        assert service.collector is not None
        served = generate_latest(service.registry).decode()
        assert names_in(served) == expected()
        # The fast renderer /metrics serves: the same families, the same bytes.
        assert service.collector.exposition(service.registry).decode() == served
        assert service.exposition().decode() == served
        every = {s.name for family in text_string_to_metric_families(served) for s in family.samples}
        assert {f.sample_name for f in prometheus_families("recorder") if f.kind != "histogram"} <= every
    finally:
        recorder.close()


MULTIPROCESS_WORKER = textwrap.dedent(
    """
    from prometheus_client import generate_latest
    from mcp_token_otel.emitters.prometheus_multiprocess import multiprocess_registry
    from tests.test_catalog import everything_recorder, record_everything
    recorder = everything_recorder()
    record_everything(recorder)
    recorder.close()  # writes the families read from the recorder's state
    print(generate_latest(multiprocess_registry()).decode())
    """
)


def test_multiprocess_output_has_exactly_the_catalog_families(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    out = subprocess.run([sys.executable, "-c", MULTIPROCESS_WORKER], env=env, cwd=ROOT, check=True,
                         capture_output=True, timeout=120)
    assert names_in(out.stdout.decode()) == expected(multiprocess=True)


def test_opentelemetry_instruments_are_exactly_the_catalog_ones() -> None:
    reader = InMemoryMetricReader()
    recorder = everything_recorder(MeterProvider(metric_readers=[reader]))
    try:
        record_everything(recorder)
        data = reader.get_metrics_data()
    finally:
        recorder.close()
    assert data is not None
    found = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert found == {f.otel_name for f in otel_families("recorder")}


def test_the_proxy_side_rides_on_the_conventions_client_durations() -> None:
    """The conventions' instruments name only client and server: the proxy's requests, recorded in the client
    ones, carry mcp_token.side="proxy" (a Collector sets `side` from it); a client's points do not."""
    reader = InMemoryMetricReader()
    recorder = TokenRecorder(config_from_dict({}), TracerProvider(), MeterProvider(metric_readers=[reader]),
                             server_name="srv")
    try:
        for side in ("proxy", "client"):
            exchange(recorder, side, "tools/call", {"name": "t", "arguments": {}}, "s",
                     result={"content": []}, attributes={A_TRANSPORT: "pipe", A_PROTOCOL: "2025-11-25"})
            recorder.end_session(side, "s")
        data = reader.get_metrics_data()
    finally:
        recorder.close()
    assert data is not None
    sides = {m.name: sorted(str(p.attributes.get("mcp_token.side")) for p in m.data.data_points)
             for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert sides["mcp.client.operation.duration"] == ["None", "proxy"]
    assert sides["mcp.client.session.duration"] == ["None", "proxy"]
    assert "mcp.server.operation.duration" not in sides


def test_the_proxy_families_are_exactly_the_catalog_ones_on_metrics_and_opentelemetry() -> None:
    """The proxy's telemetry serves its own families beside the recorder's, on /metrics and OpenTelemetry."""
    from opentelemetry import metrics

    from mcp_token_otel.proxy.telemetry import Telemetry
    from tests.helpers.support import fresh_otel_globals

    reader = InMemoryMetricReader()
    with fresh_otel_globals():  # the proxy's recorder takes the global meter provider
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        telemetry = Telemetry(config_from_dict({}), "srv", metrics_host="127.0.0.1", metrics_port=0)
        try:
            port = telemetry.metrics_port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                body = response.read().decode()
            data = reader.get_metrics_data()
        finally:
            telemetry.close()
    assert names_in(body) == expected("recorder") | expected("proxy")
    assert data is not None
    found = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    proxy = {f.otel_name for f in otel_families("proxy")}
    assert found & {f.otel_name for f in FAMILIES if f.emitter == "proxy"} == proxy and proxy
    assert found <= {f.otel_name for f in FAMILIES}


def test_the_docs_metrics_table_is_the_catalog() -> None:
    from mcp_token_otel.catalog import markdown_table

    doc = (Path(__file__).resolve().parent.parent / "docs" / "instrumentation.md").read_text(encoding="utf-8")
    assert markdown_table() in doc, "run: python -m mcp_token_otel.catalog docs/instrumentation.md"
    for family in FAMILIES:  # not vacuous: the table names every family
        assert f"`{family.sample_name if family.name else family.otel_name}`" in doc

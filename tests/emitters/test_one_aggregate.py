"""Adding a metric is its catalog entry plus the one call that records it.

Two families that are not in the catalog (a counter, and a histogram that is an OpenTelemetry instrument too) are
added to ``catalog.FAMILIES`` (and to the module-level names the emitters import it under), with no other change
to the package; a new recorder records them with ``recorder.aggregate.add`` / ``.observe``, and they are found on
/metrics, in an OpenTelemetry reader and in the merged multiprocess files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families

from mcp_token_otel.catalog import Family
from mcp_token_otel.config import config_from_dict
from mcp_token_otel.recorder import TokenRecorder
from tests.helpers.support import ROOT, scrape

WIDGETS = Family("mcp_token_test_widgets", "counter", "widgets", "Widgets made (a family only this test declares).",
                 ("side", "server"), otel_name="mcp_token.test.widgets", otel_unit="{widget}")
LATENCY = Family("mcp_token_test_latency_seconds", "histogram", "seconds", "Widget latency (this test's only).",
                 ("side", "server"), (0.1, 1.0), "mcp_token.test.latency", "s")
NEW = (WIDGETS, LATENCY)


def add_to_catalog(setattr_: Callable[[Any, str, Any], None]) -> None:
    """The catalog entries: NEW appended to the catalog's FAMILIES (and its lookups); nothing else changes."""
    from mcp_token_otel import catalog

    families = (*catalog.FAMILIES, *NEW)
    setattr_(catalog, "FAMILIES", families)
    setattr_(catalog, "BY_NAME", {f.name: f for f in families if f.name})
    setattr_(catalog, "BY_OTEL_NAME", {f.otel_name: f for f in families if f.otel_name})


def record(recorder: TokenRecorder) -> None:
    """The one call per family that records it."""
    recorder.aggregate.add("mcp_token_test_widgets", ("server", "srv"), 3)
    for seconds in (0.05, 0.5, 5.0):
        recorder.aggregate.observe("mcp_token_test_latency_seconds", ("server", "srv"), seconds)
    recorder.flush()


@pytest.fixture
def catalog_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    add_to_catalog(monkeypatch.setattr)


@pytest.mark.usefixtures("catalog_entry")
def test_a_new_family_is_on_metrics() -> None:
    recorder = TokenRecorder(config_from_dict({}), TracerProvider(), MeterProvider(), server_name="srv")
    try:
        record(recorder)
        found = scrape(recorder)
    finally:
        recorder.close()
    assert found.value("mcp_token_test_widgets_total", side="server", server="srv") == 3
    assert found.value("mcp_token_test_latency_seconds_count", side="server", server="srv") == 3
    assert found.value("mcp_token_test_latency_seconds_bucket", side="server", server="srv", le="1.0") == 2
    assert found.value("mcp_token_test_latency_seconds_sum") == pytest.approx(5.55)
    assert "# HELP mcp_token_test_widgets_total Widgets made" in found.text


@pytest.mark.usefixtures("catalog_entry")
def test_a_new_family_is_an_opentelemetry_instrument() -> None:
    reader = InMemoryMetricReader()
    recorder = TokenRecorder(config_from_dict({}), TracerProvider(), MeterProvider(metric_readers=[reader]),
                             server_name="srv")
    try:
        record(recorder)
        data = reader.get_metrics_data()
    finally:
        recorder.close()
    assert data is not None
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    (widgets,) = metrics["mcp_token.test.widgets"].data.data_points
    assert widgets.value == 3
    assert dict(widgets.attributes) == {"mcp_token.side": "server", "mcp_token.server.name": "srv"}
    assert metrics["mcp_token.test.widgets"].unit == "{widget}"
    (latency,) = metrics["mcp_token.test.latency"].data.data_points
    assert latency.count == 3 and latency.sum == pytest.approx(5.55)
    assert list(latency.explicit_bounds) == [0.1, 1.0] and list(latency.bucket_counts) == [1, 1, 1]


MULTIPROCESS_WORKER = textwrap.dedent(
    """
    from prometheus_client import generate_latest
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.emitters.prometheus_multiprocess import multiprocess_registry
    from mcp_token_otel.recorder import TokenRecorder
    from tests.emitters.test_one_aggregate import add_to_catalog, record
    add_to_catalog(setattr)
    recorder = TokenRecorder(config_from_dict({}), server_name="srv")
    record(recorder)
    recorder.close()
    print(generate_latest(multiprocess_registry()).decode())
    """
)


def test_a_new_family_is_in_the_multiprocess_files(tmp_path: Path) -> None:
    # A fresh interpreter: prometheus-client chooses its file-backed values at import, from the environment.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", MULTIPROCESS_WORKER], env=env, cwd=ROOT, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(done.stdout.decode()) for s in family.samples}
    labels = (("server", "srv"), ("side", "server"))
    assert samples[("mcp_token_test_widgets_total", labels)] == 3
    assert samples[("mcp_token_test_latency_seconds_count", labels)] == 3
    assert samples[("mcp_token_test_latency_seconds_bucket", (("le", "1.0"), *labels))] == 2


LIVE_FAMILIES_WORKER = textwrap.dedent(
    """
    import json, threading, time
    from prometheus_client import generate_latest
    from mcp_token_otel.config import config_from_dict
    from mcp_token_otel.emitters.prometheus_multiprocess import multiprocess_registry
    from mcp_token_otel.recorder import TokenRecorder
    recorder = TokenRecorder(config_from_dict({}), server_name="srv")
    call = recorder.begin("server", "tools/call", {"name": "t", "arguments": {}}, "conversation")
    call.open()
    call.result({"content": [{"type": "text", "text": "hello " * 200}]})
    call.close()
    threads = [t.name for t in threading.enumerate()]
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline and 'mcp_token_sessions{' not in text:
        time.sleep(0.1)  # no message, no close: only the writer thread can put the live sessions in the files
        text = generate_latest(multiprocess_registry()).decode()
    print(json.dumps({"threads": threads, "metrics": text,
                      "overflow": recorder.aggregate.values("mcp_token_series_overflow"),
                      "overflow_present": any(f.key == "mcp_token_series_overflow" and recorder.aggregate.present(f)
                                              for f in recorder.aggregate.families.values())}))
    """
)


def test_live_families_reach_the_files_from_a_thread_not_the_message_path(tmp_path: Path) -> None:
    """The families read from live state (the sessions gauge) are written by each process's own writer thread
    about once a second, without another message and before close; the series-overflow counts, which the files
    do not keep, are absent rather than a row of zeros."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", LIVE_FAMILIES_WORKER], env=env, cwd=ROOT, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    found = json.loads(done.stdout)
    assert "mcp-token-otel-files" in found["threads"]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(found["metrics"]) for s in family.samples}
    assert samples[("mcp_token_sessions", (("server", "srv"), ("side", "server"), ("state", "ok")))] == 1
    assert found["overflow"] == [] and found["overflow_present"] is False

"""Fault-injection doubles shared by the SDK suites: every one raises where the real part would work."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def raising_estimator(_text: str) -> int:
    raise RuntimeError("estimator fault")


class RaisingProcessor(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("processor on_start fault")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor on_end fault")


class RaisingExporter(SpanExporter):
    """Counts its attempts, so a test can show the exporter really ran before its fault was absorbed."""

    def __init__(self) -> None:
        self.attempts = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.attempts += 1
        raise RuntimeError("exporter fault")


class BrokenSink:
    """A MetricsSink whose every method raises."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> None:
            raise RuntimeError(f"sink fault in {name}")

        return fail


class BrokenInstrument:
    def record(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("meter fault")

    add = record


class BrokenMeter:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: BrokenInstrument()


class BrokenMeterProvider(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        return BrokenMeter()


class BrokenRegistry:
    """A budget SessionRegistry whose every method raises (install with ``break_budgets``)."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"budget registry fault in {name}")

        return fail

    def __len__(self) -> int:
        raise RuntimeError("budget registry fault in __len__")


def break_budgets(recorder: Any) -> None:
    for side in list(recorder.sessions):
        recorder.sessions[side] = BrokenRegistry()


def break_prometheus(sink: Any) -> int:
    """Make every prometheus-client family of a PrometheusMetrics sink raise when used; the count broken."""
    from prometheus_client.metrics import MetricWrapperBase

    from mcp_token_otel.emitters.aggregate import CountFamily, HistFamily

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("prometheus-client fault")

    broken = 0
    families = [*vars(sink).values(), *getattr(sink, "hists", {}).values(), *getattr(sink, "counts", {}).values()]
    for value in {id(v): v for v in families}.values():  # each family once, however it is reached
        if isinstance(value, (HistFamily, CountFamily)):  # the pre-aggregated families
            for method in ("observe", "add", "touch"):
                if hasattr(value, method):
                    setattr(value, method, fail)
            broken += 1
        if isinstance(value, MetricWrapperBase):
            value.labels = fail  # type: ignore[method-assign]
            for method in ("inc", "set", "observe", "dec"):
                if hasattr(value, method):
                    setattr(value, method, fail)
            broken += 1
    return broken


class SlowSink:
    """A MetricsSink that takes a few milliseconds for everything (a sink on a slow lock or disk)."""

    def __init__(self, seconds: float = 0.003) -> None:
        self.seconds = seconds
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        def slow(*args: Any) -> None:
            self.calls += 1
            time.sleep(self.seconds)

        return slow


class BlockingSink:
    """A MetricsSink whose first ``record_message`` blocks until ``release`` is set (at most ``limit`` s).

    ``blocked_the_call`` tells whether it had to give up waiting: true when the MCP call could not finish
    while the sink was stuck, i.e. the sink ran on the call's own path.
    """

    def __init__(self, limit: float = 5.0) -> None:
        self.release = threading.Event()
        self.limit = limit
        self.entered = threading.Event()
        self.blocked_the_call = False

    def record_message(self, *args: Any) -> None:
        if self.entered.is_set():
            return
        self.entered.set()
        self.blocked_the_call = not self.release.wait(self.limit)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def otel_pipeline_with_failing_exporters(monkeypatch: Any) -> tuple[Any, Any, RaisingExporter, Any]:
    """The project's own ``configure_otel`` building its pipeline (BatchSpanProcessor + OTLP-style span
    exporter, PeriodicExportingMetricReader + metric exporter) with exporters that raise; the providers are
    captured instead of replacing the process-wide ones. Returns (tracer_provider, meter_provider,
    span_exporter, metric_exporter)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    from mcp_token_otel.emitters import otel_setup

    class RaisingMetricExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self.attempts = 0

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            self.attempts += 1
            raise RuntimeError("metric exporter fault")

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    span_exporter, metric_exporter = RaisingExporter(), RaisingMetricExporter()
    captured: dict[str, Any] = {}
    monkeypatch.setattr(otel_setup, "span_exporter", lambda: span_exporter)
    monkeypatch.setattr(otel_setup, "metric_exporter", lambda: metric_exporter)
    monkeypatch.setattr(otel_setup, "_tracing_unconfigured", lambda: True)
    monkeypatch.setattr(otel_setup, "_metrics_unconfigured", lambda: True)
    monkeypatch.setattr(trace, "set_tracer_provider", lambda p: captured.__setitem__("tracer", p))
    monkeypatch.setattr(metrics, "set_meter_provider", lambda p: captured.__setitem__("meter", p))
    monkeypatch.setattr(otel_setup.atexit, "register", lambda *a, **k: None)  # the test shuts them down
    assert otel_setup.configure_otel(shutdown_timeout=1.0)
    return captured["tracer"], captured["meter"], span_exporter, metric_exporter
